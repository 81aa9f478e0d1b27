-- resize: the admission webhook judges an in-place resize of a pod on node to `request` (the larger of the new
-- spec and what the kubelet allocated, as kube-scheduler counts a pod being resized), or of a pod not bound yet
-- (node '') to its new spec.
-- ARGV: prefix, owner, verify_after_ms, dry_run (0|1), grown_ttl_ms, check_after_ms, then one placement (uid, pod,
-- node, n, n resource/amount pairs, ports, meta).
-- The pod's entry on node takes the new request when it fits (and its namespace's elastic quota allows the growth)
-- (only growth is checked, counting what its current request gives back); its state stays. No entry (the sync has
-- not seen the pod bound yet): fit-checked and held as admitted, as a foreign binding is. An entry on another node
-- is refused. A pod not bound yet is judged on the node of its entry (a worker's reservation, or a binding the
-- webhook admitted: it may still commit), which grows to the larger of both requests when that fits; with or
-- without an entry, the growth is remembered for grown_ttl_ms (see 'Growth' in common.lua). check_after_ms > 0 (the
-- review was not authenticated): an entry grown is put in {hoss}:resized to be checked that much later, when the
-- sync sets it back to its pod's request unless the apiserver shows the resize (resized_due). dry_run 1 writes
-- nothing.
-- Reply: {'confirmed', node ('' for a pod without node or entry), 0|1 (1: no entry before)} | {'conflict', ...}
--        | {'unknown_node', node} | {'held_elsewhere', node, state} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local owner = next_arg()
local verify_after_ms = next_number()
local dry_run = next_number() == 1
local grown_ttl_ms = next_number()
local check_after_ms = next_number()
local p = next_placement()
local entry = read_entry(p.uid)
local pending = p.node == ''
if pending then
  if not entry then
    if not dry_run then
      remember_growth(p.uid, p.request, grown_ttl_ms)
    end
    return {'confirmed', '', 0}
  end
  p.node = entry.node
  p.request = larger_of(entry.request, p.request)
end
if redis.call('SISMEMBER', NODES, p.node) == 0 then
  return {'unknown_node', p.node}
end
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
if pending then
  remember_growth(p.uid, p.request, grown_ttl_ms)
end
regrow_entry(entry, p.request)
if check_after_ms > 0 then
  redis.call('ZADD', RESIZED, int_str(now_ms() + check_after_ms), p.uid)
end
publish()
return {'confirmed', p.node, 0}
