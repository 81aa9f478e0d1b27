-- unpromise_disks: drop the disks promised to a pod on a node whose reservation or binding failed (see
-- promise_disks); the promises to other pods stay.
-- ARGV: prefix, uid, node. Reply: {'dropped', n} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local uid = next_arg()
local key = PREFIX .. ':disk:' .. next_arg()
local mine = uid .. '|'
local dropped = 0
for _, member in ipairs(redis.call('ZRANGE', key, 0, -1)) do
  if member:sub(1, #mine) == mine then
    redis.call('ZREM', key, member)
    dropped = dropped + 1
  end
end
return {'dropped', dropped}
