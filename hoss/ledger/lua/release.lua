-- release: drop uid's entry, optionally only when it is on a given node and in a given state (a worker whose
-- binding failed drops its reservation, never an entry the webhook admitted or the sync recorded bound meanwhile).
-- ARGV: prefix, uid, node or '' (any), state or '' (any), answered (0|1).
-- answered 1: the binder saw the apiserver answer its binding with an error. An admitted entry on that node then
-- is only marked 'answered' and put first in line for the sync's check (the write is over, so a pod the sync
-- finds unbound proves it failed); it is not dropped here, since the pod may be bound after all (a 409 for a
-- pod another binding of the same uid already placed).
-- Reply: {'released', 1|0} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local entry = read_entry(next_arg())
local node = next_arg()
local state = next_arg()
local answered = next_arg() == '1'
if entry and (node == '' or entry.node == node) and (state == '' or entry.state == state) then
  drop(entry)
  publish()
  return {'released', 1}
end
if answered and entry and entry.state == 'admitted' and (node == '' or entry.node == node) then
  redis.call('HSET', pod_key(entry.uid), 'answered', '1')
  redis.call('ZADD', VERIFY, int_str(now_ms()), entry.uid)
end
return {'released', 0}
