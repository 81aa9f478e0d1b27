-- resize: the admission webhook judges an in-place resize of a pod on node to `request` (the larger of the new
-- spec and what the kubelet allocated, as kube-scheduler counts a pod being resized).
-- ARGV: prefix, owner, verify_after_ms, dry_run (0|1), then one placement (uid, pod, node, n, n resource/amount
-- pairs, ports, meta).
-- The pod's entry on node takes the new request when it fits (and its namespace's elastic quota allows the growth) (only growth is checked, counting what its current
-- request gives back); its state stays. No entry (the sync has not seen the pod bound yet): fit-checked and held
-- as admitted, as a foreign binding is. An entry on another node is refused. dry_run 1 writes nothing.
-- Reply: {'confirmed', node, 0|1 (1: no entry before)} | {'conflict', ...} | {'unknown_node', node}
--        | {'held_elsewhere', node, state} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local owner = next_arg()
local verify_after_ms = next_number()
local dry_run = next_number() == 1
local p = next_placement()
if redis.call('SISMEMBER', NODES, p.node) == 0 then
  return {'unknown_node', p.node}
end
local entry = read_entry(p.uid)
if entry and entry.node ~= p.node then
  return {'held_elsewhere', entry.node, entry.state}
end
p.current = entry
local conflict = quota_conflict(p.pod, p.request, entry and entry.request, nil) or check_fit({p})
if conflict then
  return conflict
end
if dry_run then
  return {'confirmed', p.node, entry and 0 or 1}
end
if not entry then
  admit(p, owner, 'resize', now_ms() + verify_after_ms)
  publish()
  return {'confirmed', p.node, 1}
end
-- Replace the request in place: the entry keeps its state, owner, ports, meta and admission.
change_used(entry.node, entry.request, '-')
change_ns_used(entry.pod, entry.request, '-')
local key = pod_key(entry.uid)
for _, item in ipairs(entry.request) do
  redis.call('HDEL', key, 'r:' .. item[1])
end
for _, item in ipairs(p.request) do
  redis.call('HSET', key, 'r:' .. item[1], item[2])
end
change_used(entry.node, p.request, '')
change_ns_used(entry.pod, p.request, '')
publish()
return {'confirmed', p.node, 0}
