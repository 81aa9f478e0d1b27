-- promise_claims: hold a pod's ReadWriteOncePod claims for it while its binding is under way, all or none, so two
-- workers that decide at the same instant never both bind a pod using one such claim. Once the pod is bound its
-- ledger entry's meta names the claim (pod_meta 'claims'), which every worker's pod index reads; the promise
-- only covers the moments before, and expires by itself (a worker that dies leaves nothing held for long).
--   {hoss}:rwop:<namespace>/<claim>   the uid of the pod the claim is promised to (PX: the promise's lifetime)
-- ARGV: prefix, uid, ttl_ms, count, then count claim keys '<namespace>/<claim>'.
-- Reply: {'promised'} | {'taken', '<namespace>/<claim>', holder uid} | NOT_READY
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
  local holder = redis.call('GET', PREFIX .. ':rwop:' .. claims[i])
  if holder and holder ~= uid then
    return {'taken', claims[i], holder}
  end
end
for i = 1, count do
  redis.call('SET', PREFIX .. ':rwop:' .. claims[i], uid, 'PX', ttl)
end
return {'promised'}
