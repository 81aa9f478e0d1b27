-- fence: the write fence's check alone (see 'The write fence' at the end of common.lua), for a fenced writer that
-- may not write for a while: the resolver runs it every few seconds, so a loss is found even while no review
-- comes. It pushes back the expiry of the writer's counter (a day), so the counters of writers that are gone do
-- not stay.
-- ARGV: prefix (and, for a fenced call, the answered count). Reply: {'fence', ready (0|1)}
if FENCE then
  redis.call('PEXPIRE', FENCE, '86400000')
end
if is_ready() then
  return {'fence', 1}
end
return {'fence', 0}
