-- drop_admitted: the sync proved that the write the webhook admitted for uid failed, or that the pod is gone:
-- drop the entry, but only when it is still the admitted entry the proof is about (same node, same admission
-- time); one admitted again, bound or moved meanwhile stays.
-- ARGV: prefix, uid, node, admitted (ms). Reply: {'dropped', 1|0} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local entry = read_entry(next_arg())
local node = next_arg()
local admitted = next_arg()
if entry and entry.state == 'admitted' and entry.node == node and entry.admitted == admitted then
  drop(entry)
  publish()
  return {'dropped', 1}
end
return {'dropped', 0}
