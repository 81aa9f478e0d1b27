-- unpromise_attach: drop the attach slots promised to a pod whose reservation or binding failed (see
-- promise_attach); the promises to other pods stay.
-- ARGV: prefix, uid, node, count, then count driver names. Reply: {'dropped', n} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local uid = next_arg()
local node = next_arg()
local mine = uid .. '|'
local dropped = 0
for _ = 1, next_number() do
  local key = PREFIX .. ':attach:' .. node .. ':' .. next_arg()
  for _, member in ipairs(redis.call('ZRANGE', key, 0, -1)) do
    if member:sub(1, #mine) == mine then
      redis.call('ZREM', key, member)
      dropped = dropped + 1
    end
  end
end
return {'dropped', dropped}
