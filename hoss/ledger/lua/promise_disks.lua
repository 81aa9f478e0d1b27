-- promise_disks: hold a pod's in-tree disks (gcePersistentDisk, awsElasticBlockStore, rbd, iscsi) on its chosen
-- node while its reservation and binding are under way, so two workers that decide at the same instant never both
-- place a pod mounting one disk on one node where VolumeRestrictions forbids it. Once the pod is bound its ledger
-- entry's meta names its disks (pod_meta 'disks'), which every worker's pod index reads; the promise only covers the
-- moments before, and expires by itself.
--   {hoss}:disk:<node>   sorted set of '<uid>|<ro: 0|1>|<kind>/<id>', scored by the promise's deadline (ms)
-- A disk promised to another pod conflicts unless both mount it read-only (never for awsElasticBlockStore); rbd
-- images are compared by pool and image alone (the monitors are not: at worst a pod is decided again).
-- ARGV: prefix, uid, ttl_ms, node, count, then count disks (kind, id, ro 0|1).
-- Reply: {'promised'} | {'taken', '<kind>/<id>', holder uid} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local uid = next_arg()
local ttl = next_number()
local node = next_arg()
local key = PREFIX .. ':disk:' .. node
local now = now_ms()
local mine = uid .. '|'
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
local held = {}
local renewing = false
for _, member in ipairs(redis.call('ZRANGE', key, 0, -1)) do
  local holder, ro, disk = member:match('^([^|]*)|([01])|(.*)$')
  if holder == uid then
    renewing = true
  elseif holder then
    table.insert(held, {holder, ro == '1', disk})
  end
end
if renewing then
  held = {}  -- granted before: renewed, never refused
end
local own = {}
for _ = 1, next_number() do
  local kind = next_arg()
  local id = next_arg()
  local ro = next_arg() == '1'
  local disk = kind .. '/' .. id
  for _, other in ipairs(held) do
    if other[3] == disk and (kind == 'awsElasticBlockStore' or not (ro and other[2])) then
      return {'taken', disk, other[1]}
    end
  end
  table.insert(own, mine .. (ro and '1' or '0') .. '|' .. disk)
end
for _, member in ipairs(redis.call('ZRANGE', key, 0, -1)) do
  if member:sub(1, #mine) == mine then
    redis.call('ZREM', key, member)
  end
end
local deadline = now + ttl
for _, member in ipairs(own) do
  redis.call('ZADD', key, deadline, member)
end
local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
if last[2] then
  redis.call('PEXPIRE', key, math.max(1, tonumber(last[2]) - now))
end
return {'promised'}
