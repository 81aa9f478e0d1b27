-- unnominate: end the nomination of a pod (its preemption was given up); see 'Nominations' in common.lua.
-- ARGV: prefix, uid. Reply: {'dropped', 1 | 0 (there was none)} | NOT_READY
if not is_ready() then
  return NOT_READY
end
if drop_nomination(next_arg()) then
  return {'dropped', 1}
end
return {'dropped', 0}
