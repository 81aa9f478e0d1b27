-- rebuild: replace nodes and bound entries with the apiserver's truth, keep assumed and admitted entries whose
-- node is still listed and whose uid is not bound (admitted ones keep their admission and place in the sync's
-- check line), recompute every used total, then set a fresh epoch and the ready flag.
-- Runs whether or not the ledger is ready (it is how the ledger becomes ready).
-- ARGV: prefix, epoch, n, n nodes (name, a, a alloc pairs, l, l label pairs, spec JSON), b, b bound placements
-- (as bind's).
-- Appends a 'r' entry to the change stream: readers load the whole ledger again.
-- A bound pod on a node that is not listed registers that node without allocatable, as bind does.
-- Reply: {'rebuilt', epoch, then per Reservation refused: uid, pod, node, resource, wanted, free}
local epoch = next_arg()
local nodes = {}
local listed = {}
for i = 1, next_number() do
  local name = next_arg()
  nodes[i] = {name = name, alloc = next_pairs(), labels = next_pairs(), spec = next_arg()}
  listed[name] = true
end
local bound = {}
local bound_uids = {}
for i = 1, next_number() do
  bound[i] = next_placement()
  bound_uids[bound[i].uid] = true
end

-- A Reservation whose entry is on its node already was fit-checked when it entered the ledger; any other enters
-- now, and holds room only if it fits (reservation_refusal in common.lua).
local entered = {}
for _, p in ipairs(bound) do
  if is_reservation(p.pod) and redis.call('HGET', pod_key(p.uid), 'node') == p.node then
    entered[p.uid] = true
  end
end
local kept = {}
for _, node in ipairs(redis.call('SMEMBERS', NODES)) do
  if listed[node] then
    for _, state in ipairs({'assumed', 'admitted'}) do
      for _, uid in ipairs(redis.call('SMEMBERS', node_key(node, state))) do
        local entry = read_entry(uid)
        if entry and not bound_uids[uid] then
          entry.verify_at = redis.call('ZSCORE', VERIFY, uid)
          table.insert(kept, entry)
        end
      end
    end
  end
  remove_node(node)
end
-- Namespace totals are recomputed from the entries below (elastic quotas' definitions stay).
redis.call('DEL', NS_USED, QUOTA_SUM_USED)

for _, node in ipairs(nodes) do
  redis.call('SADD', NODES, node.name)
  set_hash(node_key(node.name, 'alloc'), node.alloc)
  set_hash(node_key(node.name, 'labels'), node.labels)
  redis.call('SET', node_key(node.name, 'spec'), node.spec or '')
end
-- Pods first, then the kept entries (an owner's share of a Reservation stays with it), then the Reservations,
-- whose room is what their owners do not hold (see 'Reservations' shares' in common.lua).
local reservations_bound = {}
for _, p in ipairs(bound) do
  -- a uid listed twice: the last placement wins, as in bind
  drop_uid(p.uid)
  redis.call('SADD', NODES, p.node)
  if is_reservation(p.pod) then
    if not reservations_bound[p.uid] then
      table.insert(reservations_bound, p.uid)
    end
    reservations_bound[p.uid] = p
  else
    hold(p.uid, p.pod, p.node, p.request, 'bound', '', nil, p.ports, p.meta)
  end
end
for _, entry in ipairs(kept) do
  local extra = {}
  if entry.resv then
    extra = {'resv', entry.resv, 'share', entry.share}
    redis.call('SADD', owners_key(entry.resv), entry.uid)
  end
  if entry.state == 'admitted' then
    for _, item in ipairs(admitted_fields(tonumber(entry.admitted), entry.via or 'binding')) do
      table.insert(extra, item)
    end
    if entry.answered then
      table.insert(extra, 'answered')
      table.insert(extra, entry.answered)
    end
    hold(entry.uid, entry.pod, entry.node, entry.request, 'admitted', entry.owner, nil, entry.ports, entry.meta,
         extra)
    redis.call('ZADD', VERIFY, entry.verify_at or int_str(now_ms()), entry.uid)
  else
    hold(entry.uid, entry.pod, entry.node, entry.request, 'assumed', entry.owner, tonumber(entry.deadline),
         entry.ports, entry.meta, extra)
  end
end
local reply = {'rebuilt', epoch}
for _, uid in ipairs(reservations_bound) do
  local p = reservations_bound[uid]
  local refusal = not entered[uid] and reservation_refusal(p)
  if refusal then
    for _, item in ipairs({p.uid, p.pod, p.node, refusal[1], int_str(refusal[2]), int_str(refusal[3])}) do
      table.insert(reply, item)
    end
  else
    local once, attach = reservation_settings(p.meta)
    hold(p.uid, p.pod, p.node, reservation_room(p.uid, p.node, p.request, once, attach), 'bound', '', nil,
         p.ports, p.meta, {'total', encode_amounts(p.request), 'once', once})
  end
end
redis.call('SET', EPOCH, epoch)
redis.call('SET', READY, '1')
touched = {}
touched_list = {}
local rebuilt = add_change({'t', 'r', 'epoch', epoch})
-- Workers load everything again after this entry: every tracked domain is settled as of it.
ipa_touched = {}
redis.call('DEL', IPA_LAST)
for _, key in ipairs(redis.call('SMEMBERS', IPA_KEYS)) do
  redis.call('HSET', IPA_SINCE, key, rebuilt)
end
return reply
