-- confirm: the admission webhook allows a binding of uid to node, or the creation of a pod with spec.nodeName.
-- ARGV: prefix, count, then count confirms, each: owner, verify_after_ms, has_request (0|1), dry_run (0|1), via
-- ('binding' | 'create'), limit_owner (0|1), one placement (uid, pod, node, n, n resource/amount pairs, ports,
-- meta). The webhook's concurrent reviews share a call this way (Ledger.confirm); each confirm sees the writes of
-- those before it, as separate calls in that order would.
-- Without a request (has_request 0, a hoss binding whose reservation holds it) a uid with no entry answers
-- {'need_request'}: the caller looks the pod's request up and calls again with it.
-- An entry on this node confirms it: an assumed or admitted one becomes admitted (it no longer expires, moves or
-- is released by its worker; the sync looks at it again after verify_after_ms), a bound one stays. Whatever the
-- pod asks beyond its assumed or admitted entry (the request sent, or what a resize allowed while it had no node:
-- see 'Growth' in common.lua) is fit-checked first, and the entry grows to it. No entry (a
-- foreign scheduler's binding, a pod created on a node) is fit-checked (beside the room held for preempting pods of
-- at least its priority, read from its meta; see 'Nominations' in common.lua; and against its namespace's
-- elastic quota, see 'Elastic quotas') and held as admitted for owner. An
-- entry elsewhere is refused. dry_run 1 (the apiserver's dryRun) gives the same answer and writes nothing.
-- limit_owner 1 (a foreign user's create of a pod on a node): a new entry is refused when the owner's unconfirmed
-- creates (admitted creates the sync has not yet seen bound or failed), with this one, would hold more of a
-- resource than the node's allocatable: however many of one user's creates fail after the webhook (ResourceQuota,
-- another webhook), they pin at most one node's room until the sync settles them.
-- Reply: NOT_READY, or one reply per confirm, in order: {'confirmed', node, foreign (0|1)} | {'conflict', ...}
--        | {'unknown_node', node} | {'held_elsewhere', node, state} | {'need_request'}
--        | {'unconfirmed', node, resource, held, wanted, alloc}
if not is_ready() then
  return NOT_READY
end

-- The refusal of p when its owner's unconfirmed creates, p included, would hold more of a resource p asks for
-- than p's node has allocatable; nil when they fit. Every admitted uid is in VERIFY until it settles, so this
-- reads each admitted entry's owner: only foreign creates pay for it, bindings (the hot path) never do.
local function unconfirmed_limit(owner, p)
  local held = {}
  for _, uid in ipairs(redis.call('ZRANGE', VERIFY, 0, -1)) do
    local key = pod_key(uid)
    if redis.call('HGET', key, 'owner') == owner and redis.call('HGET', key, 'via') == 'create'
        and redis.call('HGET', key, 'state') == 'admitted' then
      for _, item in ipairs(read_entry(uid).request) do
        held[item[1]] = (held[item[1]] or 0) + tonumber(item[2])
      end
    end
  end
  for _, item in ipairs(p.request) do
    local resource, wanted = item[1], tonumber(item[2])
    local already = held[resource] or 0
    if wanted > 0 and already > 0 then
      local alloc = tonumber(redis.call('HGET', node_key(p.node, 'alloc'), resource)) or 0
      if already + wanted > alloc then
        return {'unconfirmed', p.node, resource, already, wanted, alloc}
      end
    end
  end
  return nil
end

local function confirm_one()
  local owner = next_arg()
  local verify_after_ms = next_number()
  local has_request = next_number()
  local dry_run = next_number() == 1
  local via = next_arg()
  local limit_owner = next_number() == 1
  local p = next_placement()
  if redis.call('SISMEMBER', NODES, p.node) == 0 then
    return {'unknown_node', p.node}
  end
  local entry = read_entry(p.uid)
  local grown = read_grown(p.uid)
  if entry then
    if entry.node ~= p.node then
      return {'held_elsewhere', entry.node, entry.state}
    end
    if entry.state ~= 'bound' then
      -- The pod may ask more than its entry holds (resized since the entry was made): the growth is checked, and
      -- the entry grows with it.
      local wanted = larger_of(entry.request, larger_of(grown, has_request == 1 and p.request or {}))
      if grows(entry.request, wanted) then
        p.request, p.current = wanted, entry
        local conflict = quota_conflict(entry.pod, wanted, entry.request, nil) or check_fit({p})
        if conflict then
          return conflict
        end
        if not dry_run then
          regrow_entry(entry, wanted)
          publish()
        end
      end
      if not dry_run then
        admit_entry(entry, via, now_ms() + verify_after_ms)
      end
    end
    return {'confirmed', p.node, 0}
  end
  if has_request == 0 then
    return {'need_request'}
  end
  p.request = larger_of(p.request, grown)
  -- The quota first, as CapacityScheduling's PreFilter runs before any node filter.
  local conflict = quota_conflict(p.pod, p.request, nil, nil) or check_fit({p})
    or nominated_conflict(p.node, p.uid, p.meta, p.request, nil)
  if conflict then
    return conflict
  end
  local claim = move_claim
  local port = port_conflict(p.node, p.ports, nil, nil)
  if port then
    return {'conflict', p.node, 'hostPort ' .. port, 1, 0}
  end
  local over = limit_owner and unconfirmed_limit(owner, p)
  if over then
    return over
  end
  if not dry_run then
    admit(p, owner, via, now_ms() + verify_after_ms)
    drop_nomination(p.uid)
    consume_claim(claim)
    publish()
  end
  return {'confirmed', p.node, 1}
end

local replies = {}
for i = 1, next_number() do
  replies[i] = confirm_one()
end
return replies
