-- promise_attach: hold a pod's CSI volumes' attach slots on its chosen node while its reservation and binding are
-- under way, so two workers that decide at the same instant never both fill a node's last slot (NodeVolumeLimits).
-- Once the pod is bound its ledger entry's meta names its claims, which every worker's pod index reads and counts;
-- the promise only covers the moments before, and expires by itself.
--   {hoss}:attach:<node>:<driver>   sorted set of '<uid>|<volume handle>', scored by the promise's deadline (ms)
-- Per driver the worker passes the limit, the handles its pod index counts on the node (the pods there, but this
-- one) and the pod's own handles. The handles attached, those promised to other pods and the pod's own, each
-- counted once, must not exceed the limit when the pod adds any (kube-scheduler's check, with the promises). A pod
-- that holds a promise there already has it renewed (its new deadline), never refused: it was granted, and a
-- VolumeAttachment made for its own volume meanwhile must not take it back.
-- ARGV: prefix, uid, ttl_ms, node, count, then count drivers (driver, limit, n, n attached handles, m, m handles).
-- Reply: {'promised'} | {'full', driver, counted, limit} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local uid = next_arg()
local ttl = next_number()
local node = next_arg()
local now = now_ms()
local mine = uid .. '|'
local plans = {}
local full = nil
for _ = 1, next_number() do
  local driver = next_arg()
  local limit = next_number()
  local key = PREFIX .. ':attach:' .. node .. ':' .. driver
  local seen = {}
  local counted = 0
  for _ = 1, next_number() do
    local handle = next_arg()
    if not seen[handle] then
      seen[handle] = true
      counted = counted + 1
    end
  end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local renewing = false
  for _, member in ipairs(redis.call('ZRANGE', key, 0, -1)) do
    if member:sub(1, #mine) == mine then
      renewing = true
    else
      local handle = member:match('^[^|]*|(.*)$')
      if handle and not seen[handle] then
        seen[handle] = true
        counted = counted + 1
      end
    end
  end
  local own = {}
  local added = 0
  for _ = 1, next_number() do
    local handle = next_arg()
    table.insert(own, handle)
    if not seen[handle] then
      seen[handle] = true
      counted = counted + 1
      added = added + 1
    end
  end
  if added > 0 and counted > limit and not renewing and not full then
    full = {'full', driver, tostring(counted), tostring(limit)}
  end
  table.insert(plans, {key, own})
end
if full then
  return full
end
local deadline = now + ttl
for _, plan in ipairs(plans) do
  local key = plan[1]
  for _, member in ipairs(redis.call('ZRANGE', key, 0, -1)) do
    if member:sub(1, #mine) == mine then
      redis.call('ZREM', key, member)
    end
  end
  for _, handle in ipairs(plan[2]) do
    redis.call('ZADD', key, deadline, mine .. handle)
  end
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIRE', key, math.max(1, tonumber(last[2]) - now))
  end
end
return {'promised'}
