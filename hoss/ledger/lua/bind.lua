-- bind: the apiserver says uid runs on node. Its entry becomes bound there with this request, whatever it was
-- before and even if the node is overcommitted; a node not synced yet is registered without allocatable. A
-- Reservation entering the ledger holds room only if it fits (reservation_refusal in common.lua).
-- ARGV: prefix, then one placement (uid, pod, node, n, n resource/amount pairs, ports, meta).
-- Reply: {'bound', previous node or '', previous state or ''} | {'refused', resource, wanted, free} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local previous, _, refusal = bind_placement(next_placement())
publish()
if refusal then
  return {'refused', refusal[1], int_str(refusal[2]), int_str(refusal[3])}
end
if previous then
  return {'bound', previous.node, previous.state}
end
return {'bound', '', ''}
