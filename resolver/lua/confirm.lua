-- confirm: the admission webhook allows a binding of uid to node.
-- ARGV: prefix, owner, ttl_ms, has_request (0|1), then one placement (uid, pod, node, n, n resource/amount pairs,
-- ports, meta).
-- Without a request (has_request 0, a hoss binding whose reservation holds it) a uid with no entry answers
-- {'need_request'}: the caller looks the pod's request up and calls again with it.
-- An entry on this node (assumed or bound) confirms it, refreshing an assumed entry's deadline; no entry (a
-- foreign scheduler's binding) is fit-checked (beside the room held for preempting pods of at least its priority,
-- read from its meta; see 'Nominations' in common.lua) and held as assumed for owner; an entry elsewhere is
-- refused.
-- Reply: {'confirmed', node, foreign (0|1)} | {'conflict', ...} | {'unknown_node', node}
--        | {'held_elsewhere', node, state} | {'need_request'} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local owner = next_arg()
local ttl_ms = next_number()
local has_request = next_number()
local p = next_placement()
if redis.call('SISMEMBER', NODES, p.node) == 0 then
  return {'unknown_node', p.node}
end
local entry = read_entry(p.uid)
if entry then
  if entry.node ~= p.node then
    return {'held_elsewhere', entry.node, entry.state}
  end
  if entry.state == 'assumed' then
    local deadline = int_str(now_ms() + ttl_ms)
    redis.call('HSET', pod_key(p.uid), 'deadline', deadline)
    redis.call('ZADD', ASSUMED, deadline, p.uid)
  end
  return {'confirmed', p.node, 0}
end
if has_request == 0 then
  return {'need_request'}
end
local conflict = check_fit({p}) or nominated_conflict(p.node, p.uid, p.meta, p.request, nil)
if conflict then
  return conflict
end
hold(p.uid, p.pod, p.node, p.request, 'assumed', owner, now_ms() + ttl_ms, p.ports, p.meta)
publish()
return {'confirmed', p.node, 1}
