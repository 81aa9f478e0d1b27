-- unpromise_counters: drop what promise_counters took for a pod whose binding failed; other pods' promises stay.
-- ARGV: prefix, uid, count, then count set keys '<driver>/<pool>/<set>'. Reply: {'dropped', n} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local uid = next_arg()
local dropped = 0
for i = 1, next_number() do
  local key = PREFIX .. ':counters:' .. next_arg()
  local entries = redis.call('HGETALL', key)
  for j = 1, #entries, 2 do
    if string.sub(entries[j + 1], 1, #uid + 1) == uid .. '|' then
      redis.call('HDEL', key, entries[j])
      dropped = dropped + 1
    end
  end
end
return {'dropped', dropped}
