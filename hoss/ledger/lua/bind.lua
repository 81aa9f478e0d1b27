-- bind: the apiserver says uid runs on node. Its entry becomes bound there with this request, whatever it was
-- before and even if the node is overcommitted; a node not synced yet is registered without allocatable.
-- ARGV: prefix, then one placement (uid, pod, node, n, n resource/amount pairs, ports, meta).
-- Reply: {'bound', previous node or '', previous state or ''} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local previous = bind_placement(next_placement())
publish()
if previous then
  return {'bound', previous.node, previous.state}
end
return {'bound', '', ''}
