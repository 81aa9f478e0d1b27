-- bind_many: the apiserver says each uid runs on its node; as bind, for many pods in one call (the sync's
-- batch). ARGV: prefix, count, then count placements (uid, pod, node, n, n resource/amount pairs, ports, meta); a uid listed
-- twice ends on its last placement. Reply: {'bound', count} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local count = next_number()
for _ = 1, count do
  bind_placement(next_placement())
end
publish()
return {'bound', count}
