-- reserve_batch: reserve many independent pods in one call, each on the first of its candidate nodes it fits.
-- ARGV: prefix, owner, ttl_ms, then the pods as one JSON array (one argument is far cheaper for the client to
--       send than thousands): [[uid, pod (namespace/name), digest, [candidate nodes], [resource, amount, ...],
--       host ports, meta, inter-pod topology keys ('k1,k2'), change-stream position of the decision, tentative
--       (1: the worker counted the pod as placed when deciding the later pods of the batch), reservation uid
--       (a Reservation the pod may consume, '' for none; see 'Reservations' below)], ...] with amounts as
--       decimal strings (kept exact); host ports and meta as placements carry them (see next_placement in
--       common.lua).
-- Per pod, in order (earlier pods' reservations count for later ones):
--   the dispatcher marked the pod changed or gone since this version was queued ('{hoss}:podver' holds
--     another digest)                                  -> stale, the marker
--   bound already (the sync saw it bound), or admitted (the webhook allowed a binding of it: it may be bound
--     already, and an admitted entry never moves)    -> bound, that node
--   a pod with inter-pod keys after a tentative pod of this call that was not reserved on its first candidate
--     (the decision may have counted that pod there: a spread count, a pod to be affine to)
--                                                      -> conflict, its first candidate, resource 'inter-pod
--                                                         batch'
--   the pod's namespace has an elastic quota it would exceed (see 'Elastic quotas' in common.lua)
--                                                      -> conflict, node '', resource 'quota <ns>: ...' (the
--                                                         message), wanted, room left
--   else the first candidate that is a node, fits, has the pod's host ports free, whose inter-pod domains
--     did not change since the decision (see 'Inter-pod domains' in common.lua) and where the room held for
--     preempting pods of at least the pod's priority (from its meta) stays free (see 'Nominations')
--                                                      -> reserved, that node (an assumed entry elsewhere moves;
--                                                         the pod's own nomination ends, and so does the
--                                                         rescheduler's hold it claimed there, if any)
--   else                                               -> conflict, the last candidate's misfit (node, resource,
--                                                         wanted, free; a taken host port reads resource
--                                                         'hostPort <protocol>/<ip>/<port>', wanted 1, free 0), or
--                                                         unknown when no candidate is a node
-- Reservations: a Reservation's room is a bound entry whose pod is 'Reservation/<name>' (written by the worker
-- that placed it, kept by the sync while the Reservation is Available). A pod that names it takes a share of it
-- on the Reservation's node (see 'Reservations' shares' in common.lua: allocateOnce serves one owner,
-- allocateOnce false every owner that fits in what is left): the fit check gives the share back, and on success
-- the Reservation's entry shrinks by the share in the same call as the pod's entry is added, so the room passes
-- from one to the other and no other pod or scheduler can take it between, and two pods can never both take the
-- last share. The share goes back to the Reservation when the pod's entry goes. On any other node, when the
-- entry is gone or when the pod may not take from it, the pod is checked as usual.
-- Reply: NOT_READY, or a flat list of count results of 5 items each:
--   {'reserved', node, '', 0, 0} | {'reserved', node, 'consumed', 0, 0} (the pod took its Reservation's room)
--   | {'bound', node, '', 0, 0} | {'stale', marker, '', 0, 0}
--   | {'conflict', node, resource, wanted, free} | {'unknown', node, '', 0, 0}
--   then one more item: the id of the change-stream entry the call wrote ('' when it wrote none).
if not is_ready() then
  return NOT_READY
end
local owner = next_arg()
local ttl_ms = next_number()
local deadline = now_ms() + ttl_ms
local reply = {}
local function answer(kind, node, resource, wanted, free)
  table.insert(reply, kind)
  table.insert(reply, node)
  table.insert(reply, resource or '')
  table.insert(reply, wanted or 0)
  table.insert(reply, free or 0)
end
local refused_tentative = false
for _, item in ipairs(cjson.decode(next_arg())) do
  local uid = item[1]
  local pod = item[2]
  local version = item[3]
  local candidates = item[4]
  local ports = item[6] or ''
  local meta = item[7] or ''
  local inter_pod_keys = item[8] or ''
  local position = item[9] or ''
  local tentative = item[10] == 1
  local reservation = nil
  if item[11] and item[11] ~= '' then
    local held = read_entry(item[11])
    if held and held.state == 'bound' and is_reservation(held.pod) then
      reservation = held
    end
  end
  local request = {}
  for i = 1, #item[5], 2 do
    table.insert(request, {item[5][i], item[5][i + 1]})
  end
  local marker = redis.call('HGET', PODVER, uid)
  local entry = read_entry(uid)
  if marker and marker ~= version then
    if marker == 'gone' then
      drop_nomination(uid)
    end
    answer('stale', marker)
    refused_tentative = refused_tentative or tentative
  elseif entry and entry.state ~= 'assumed' then
    answer('bound', entry.node)
    refused_tentative = refused_tentative or tentative
  elseif refused_tentative and inter_pod_keys ~= '' and position ~= '' then
    answer('conflict', candidates[1] or '', 'inter-pod batch', 1, 0)
  else
    -- The namespace's elastic quota (see 'Elastic quotas' in common.lua) is the same on every node.
    local result = quota_conflict(pod, request, entry and entry.request, nil)
    for _, node in ipairs(result and {} or candidates) do
      if redis.call('SISMEMBER', NODES, node) == 1 then
        local p = {uid = uid, pod = pod, node = node, request = request, current = entry}
        local consumed = reservation and reservation.node == node and reservation or nil
        local share = consumed and reservation_share(consumed, request, entry)
        if not share then
          consumed = nil
        end
        local placements = {p}
        if consumed then
          -- the share is given back for the check; a share the pod's own entry holds of it is counted once
          table.insert(placements, {node = node, request = {}, current = {node = node, request = share}})
          if entry and entry.resv == consumed.uid and entry.node == node then
            table.insert(placements, {node = node, request = decode_amounts(entry.share)})
          end
        end
        local conflict = check_fit(placements)
        local port = not conflict and port_conflict(node, ports, entry, nil)
        if port then
          conflict = {'conflict', node, 'hostPort ' .. port, 1, 0}
        end
        local stale = not conflict and inter_pod_stale(node, inter_pod_keys, position)
        if stale then
          conflict = {'conflict', node, stale, 1, 0}
        end
        if not conflict then
          conflict = nominated_conflict(node, uid, meta, request, entry)
        end
        if conflict then
          result = conflict
        else
          if entry then
            drop(entry)
          end
          local extra = nil
          if consumed then
            shift_share(consumed, share, '-')
            redis.call('SADD', owners_key(consumed.uid), uid)
            extra = {'resv', consumed.uid, 'share', encode_amounts(share)}
          end
          local claim = move_claim
          hold(uid, pod, node, request, 'assumed', owner, deadline, ports, meta, extra)
          drop_nomination(uid)
          consume_claim(claim)
          result = {'reserved', node, consumed and 'consumed' or ''}
          break
        end
      elseif not result then
        result = {'unknown', node}
      end
    end
    if not result then
      result = {'unknown', ''}
    end
    if tentative and (result[1] ~= 'reserved' or result[2] ~= candidates[1]) then
      refused_tentative = true
    end
    answer(result[1], result[2], result[3], result[4], result[5])
  end
end
table.insert(reply, publish() or '')
return reply
