-- promise_claims: hold what a pod claims for it while its binding is under way, all or none, so two workers that
-- decide at the same instant never both bind a pod using one such thing: a ReadWriteOncePod volume claim, or a
-- device its ResourceClaims are allocated. Once the pod is bound its ledger entry's meta names its volume claims
-- (pod_meta 'claims'), which every worker's pod index reads, and the ResourceClaims' allocations are in the
-- apiserver, which the dispatcher reads; the promise only covers the moments before, and expires by itself (a
-- worker that dies leaves nothing held for long).
--   {hoss}:rwop:<namespace>/<claim>           the uid of the pod the volume claim is promised to (PX: its lifetime)
--   {hoss}:device:<driver>/<pool>/<device>    the uid of the pod the device is promised to (PX: its lifetime)
-- ARGV: prefix, uid, ttl_ms, count, then count keys 'rwop:<namespace>/<claim>' or 'device:<driver>/<pool>/<device>'.
-- Reply: {'promised'} | {'taken', key, holder uid} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local uid = next_arg()
local ttl = next_arg()
local count = next_number()
local claims = {}
for i = 1, count do
  claims[i] = next_arg()
end
for i = 1, count do
  local holder = redis.call('GET', PREFIX .. ':' .. claims[i])
  if holder and holder ~= uid then
    return {'taken', claims[i], holder}
  end
end
for i = 1, count do
  redis.call('SET', PREFIX .. ':' .. claims[i], uid, 'PX', ttl)
end
return {'promised'}
