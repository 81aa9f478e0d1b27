-- bind_many: the apiserver says each uid runs on its node; as bind, for many pods in one call (the sync's
-- batch). ARGV: prefix, count, then count placements (uid, pod, node, n, n resource/amount pairs, ports, meta); a
-- uid listed twice ends on its last placement.
-- Reply: {'bound', count, then per placement that overcommitted its node: pod, node, what} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local count = next_number()
local reply = {'bound', count}
for _ = 1, count do
  local p = next_placement()
  local _, over = bind_placement(p)
  if over ~= '' then
    table.insert(reply, p.pod)
    table.insert(reply, p.node)
    table.insert(reply, over)
  end
end
publish()
return reply
