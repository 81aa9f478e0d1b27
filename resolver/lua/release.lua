-- release: drop uid's entry, optionally only when it is on a given node and in a given state (a worker whose
-- binding failed drops its reservation, never a bound entry the sync recorded meanwhile).
-- ARGV: prefix, uid, node or '' (any), state or '' (any). Reply: {'released', 1|0} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local entry = read_entry(next_arg())
local node = next_arg()
local state = next_arg()
if entry and (node == '' or entry.node == node) and (state == '' or entry.state == state) then
  drop(entry)
  publish()
  return {'released', 1}
end
return {'released', 0}
