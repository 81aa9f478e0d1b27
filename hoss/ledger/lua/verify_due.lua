-- verify_due: the admitted entries the sync should look at now (their check time passed on the Redis clock), at
-- most `limit`; each is put back in line retry_ms later, so one the checker could not settle comes round again.
-- ARGV: prefix, limit, retry_ms.
-- Reply: NOT_READY | {now_ms, count, then per entry: uid, node, pod, via, admitted (ms), answered (0|1)}
if not is_ready() then
  return NOT_READY
end
local limit = next_number()
local retry_ms = next_number()
local now = now_ms()
local reply = {int_str(now), 0}
for _, uid in ipairs(redis.call('ZRANGEBYSCORE', VERIFY, '-inf', int_str(now), 'LIMIT', 0, limit)) do
  local entry = read_entry(uid)
  if entry and entry.state == 'admitted' then
    reply[2] = reply[2] + 1
    for _, value in ipairs({uid, entry.node, entry.pod, entry.via or 'binding', entry.admitted or '0'}) do
      table.insert(reply, value)
    end
    if entry.answered == '1' then
      table.insert(reply, 1)
    else
      table.insert(reply, 0)
    end
    redis.call('ZADD', VERIFY, int_str(now + retry_ms), uid)
  else
    redis.call('ZREM', VERIFY, uid)
  end
end
return reply
