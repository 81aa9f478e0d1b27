-- unpromise_claims: drop the promises made to a pod whose binding failed (see promise_claims); a promise made to
-- another pod stays.
-- ARGV: prefix, uid, count, then count keys 'rwop:<namespace>/<claim>' or 'device:<driver>/<pool>/<device>'. Reply: {'dropped', n} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local uid = next_arg()
local count = next_number()
local dropped = 0
for i = 1, count do
  local key = PREFIX .. ':' .. next_arg()
  if redis.call('GET', key) == uid then
    redis.call('DEL', key)
    dropped = dropped + 1
  end
end
return {'dropped', dropped}
