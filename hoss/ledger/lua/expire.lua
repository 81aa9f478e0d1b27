-- expire: drop assumed entries whose deadline has passed on the Redis clock (their worker died or gave up).
-- ARGV: prefix. Reply: {'expired', uids...} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local reply = {'expired'}
for _, uid in ipairs(redis.call('ZRANGEBYSCORE', ASSUMED, '-inf', int_str(now_ms()))) do
  drop_uid(uid)
  table.insert(reply, uid)
end
publish()
return reply
