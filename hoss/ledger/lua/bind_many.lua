-- bind_many: the apiserver says each uid runs on its node; as bind, for many pods in one call (the sync's
-- batch). ARGV: prefix, count, then count placements (uid, pod, node, n, n resource/amount pairs, ports, meta); a
-- uid listed twice ends on its last placement. A Reservation entering the ledger holds room only if it fits
-- (reservation_refusal in common.lua).
-- Reply: {'bound', count, o, then o triples, per placement that overcommitted its node: pod, node, what; then per
--         Reservation refused: uid, pod, node, resource, wanted, free} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local count = next_number()
local overcommits = {}
local overcommitted_count = 0
local refusals = {}
for _ = 1, count do
  local p = next_placement()
  local _, over, refusal = bind_placement(p)
  if over ~= '' then
    overcommitted_count = overcommitted_count + 1
    for _, item in ipairs({p.pod, p.node, over}) do
      table.insert(overcommits, item)
    end
  end
  if refusal then
    for _, item in ipairs({p.uid, p.pod, p.node, refusal[1], int_str(refusal[2]), int_str(refusal[3])}) do
      table.insert(refusals, item)
    end
  end
end
publish()
local reply = {'bound', count, overcommitted_count}
for _, list in ipairs({overcommits, refusals}) do
  for _, item in ipairs(list) do
    table.insert(reply, item)
  end
end
return reply
