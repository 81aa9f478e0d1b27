-- reserve / reserve_gang: all placements become assumed entries of one owner, or nothing changes.
-- ARGV: prefix, owner, ttl_ms, count, then count placements (uid, pod, node, n, n resource/amount pairs,
-- ports, meta), then optionally the change-stream position of the decision and, per placement, its inter-pod
-- topology keys ('k1,k2' or ''). Host ports must be free on each node, counting the other placements of the
-- call, and the room held there for preempting pods of at least the placement's priority must stay free. With a
-- position, no placement's inter-pod domains may have changed since (see 'Inter-pod domains' in common.lua):
-- a gang planned member after member on the worker's pod index is reserved only if that index still holds.
-- A stale domain answers {'conflict', node, 'inter-pod domain <key=value>', 1, 0}.
-- A member its namespace's elastic quota refuses answers {'conflict', '', 'quota <ns>: ...', wanted, left}.
-- A port conflict answers {'conflict', node, 'hostPort <protocol>/<ip>/<port>', 1, 0}.
-- Per placement: assumed on the same node -> refreshed (request and owner replaced); assumed on another node ->
-- moved; bound or admitted (the webhook allowed its binding: it may be bound already) on the same node -> left
-- as is; bound or admitted elsewhere -> refused.
-- Reply: {'reserved', id of the change-stream entry the call wrote} | {'conflict', node, resource, wanted, free}
--        | {'unknown_node', node}
--        | {'held_elsewhere', node, 'bound' | 'admitted'} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local owner = next_arg()
local ttl_ms = next_number()
local placements = {}
local all = {}
for _ = 1, next_number() do
  local p = next_placement()
  table.insert(all, p)
end
local position = next_arg() or ''
for _, p in ipairs(all) do
  p.inter_pod_keys = position ~= '' and next_arg() or ''
end
for _, p in ipairs(all) do
  if redis.call('SISMEMBER', NODES, p.node) == 0 then
    return {'unknown_node', p.node}
  end
  local stale = inter_pod_stale(p.node, p.inter_pod_keys, position)
  if stale then
    return {'conflict', p.node, stale, 1, 0}
  end
  local entry = read_entry(p.uid)
  if entry and entry.state ~= 'assumed' then
    if entry.node ~= p.node then
      return {'held_elsewhere', entry.node, entry.state}
    end
  else
    p.current = entry
    table.insert(placements, p)
  end
end
-- Elastic quotas first (CapacityScheduling's PreFilter): the members of a namespace count together (see
-- 'Elastic quotas' in common.lua).
local quota_adding = {}
for _, p in ipairs(placements) do
  local ns = namespace_of(p.pod)
  local refusal = quota_conflict(p.pod, p.request, p.current and p.current.request, quota_adding[ns])
  if refusal then
    return refusal
  end
  quota_adding[ns] = quota_adding[ns] or {}
  for _, item in ipairs(p.request) do
    quota_adding[ns][item[1]] = (quota_adding[ns][item[1]] or 0) + tonumber(item[2])
  end
  for _, item in ipairs(p.current and p.current.request or {}) do
    quota_adding[ns][item[1]] = (quota_adding[ns][item[1]] or 0) - tonumber(item[2])
  end
end
local conflict = check_fit(placements)
if conflict then
  return conflict
end
-- Room held for preempting pods of at least a member's priority stays theirs (see 'Nominations' in common.lua).
local adding = {}
for _, p in ipairs(placements) do
  local held = nominated_conflict(p.node, p.uid, p.meta, p.request, p.current, adding[p.node])
  if held then
    return held
  end
  p.claim = move_claim
  adding[p.node] = adding[p.node] or {}
  for _, item in ipairs(p.request) do
    adding[p.node][item[1]] = (adding[p.node][item[1]] or 0) + tonumber(item[2])
  end
end
local claimed = {}
for _, p in ipairs(placements) do
  local port = port_conflict(p.node, p.ports, p.current, claimed[p.node])
  if port then
    return {'conflict', p.node, 'hostPort ' .. port, 1, 0}
  end
  claimed[p.node] = claimed[p.node] or {}
  for _, item in ipairs(split_ports(p.ports)) do
    table.insert(claimed[p.node], item)
  end
end
local deadline = now_ms() + ttl_ms
for _, p in ipairs(placements) do
  if p.current then
    drop(p.current)
  end
  hold(p.uid, p.pod, p.node, p.request, 'assumed', owner, deadline, p.ports, p.meta)
  consume_claim(p.claim)
  drop_nomination(p.uid)  -- a member that preempted has its room now (as reserve_batch ends a pod's hold)
end
return {'reserved', publish() or ''}
