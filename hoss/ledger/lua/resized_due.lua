-- resized_due: the entries a resize grew from a review nobody authenticated whose check time passed on the Redis
-- clock (see resize.lua), at most `limit`, taken out of line: the sync sets each bound one back to its pod's
-- request as the apiserver has it, once.
-- ARGV: prefix, limit.
-- Reply: NOT_READY | {'due', uid, ...}
if not is_ready() then
  return NOT_READY
end
local limit = next_number()
local due = redis.call('ZRANGEBYSCORE', RESIZED, '-inf', int_str(now_ms()), 'LIMIT', 0, limit)
local reply = {'due'}
for _, uid in ipairs(due) do
  redis.call('ZREM', RESIZED, uid)
  table.insert(reply, uid)
end
return reply
