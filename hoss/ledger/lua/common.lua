-- Shared helpers; ledger.py prepends this file to every ledger script, so each script stays one atomic call.
--
-- Calling convention: KEYS[1] is one key under the prefix (declared so a cluster client routes the call to the
-- slot of the hash tag: the ready flag for the read-only scripts, the change stream for the others, see
-- hoss/ledger/scripts.py); ARGV[1] is the key prefix with its hash tag, e.g. '{hoss}'. Every key is derived from
-- the prefix below, so all keys of a script share one slot.
--
-- Numbers: Lua numbers are doubles, exact up to 2^53. Amounts arrive as decimal strings; totals change only
-- through HINCRBY (64-bit integers in Redis) and every computed number written to Redis goes through int_str,
-- because Lua would otherwise print large numbers as '1e+15'.
local PREFIX = ARGV[1]
local READY = PREFIX .. ':ready'
-- A fenced writer's own counter (see 'The write fence' at the end of this file), or nil.
local FENCE = KEYS[2]
local NODES = PREFIX .. ':nodes'
local ASSUMED = PREFIX .. ':assumed'
local EPOCH = PREFIX .. ':epoch'
local CHANGES = PREFIX .. ':changes'
local PODVER = PREFIX .. ':podver'
-- Admitted entries (the webhook allowed their binding or pod creation) wait here, by the Redis time (ms) at which
-- the sync should look at them again: it GETs the pod and drops the entry only on proof that the write the
-- webhook admitted failed or the pod is gone (see verify_due and drop_admitted).
local VERIFY = PREFIX .. ':verify'
local RESIZED = PREFIX .. ':resized'
-- Counters every replica reports (/status, /metrics): overcommits = bound entries the apiserver's truth put on a
-- node that had no room for them (see bind_placement).
local STATS = PREFIX .. ':stats'
-- Entry states: 'assumed' (a worker's reservation: expires, may be released or moved by its worker), 'admitted'
-- (the webhook allowed the write: counted until the sync sees the pod bound or proves the write failed; never
-- expires, never moves), 'bound' (the apiserver's truth, from the sync).
local STATES = {'assumed', 'admitted', 'bound'}
local CHANGES_MAXLEN = '100000'
local NOT_READY = {'not_ready', 'the ledger has not been rebuilt since Redis started or lost its data'}

-- The change stream: every script that changes a node's used totals, its description or the node set appends
-- one entry, so workers follow the ledger as deltas instead of re-reading it. An entry is a flat list of
-- field/value pairs whose first pair is ('t', kind):
--   t u  n:<node> <used> ... the nodes' used totals after the call ('cpu=100,memory=5,pods=1'; '' = nothing used),
--        then per pod whose entry the call placed or removed, its state after the call:
--        p:<uid> '<node>\n<meta>'  the pod holds an entry on node (meta: its compact description, see hold)
--        x:<uid> <node>            the pod holds no entry any more (node: where it was)
--   t s  n:<node> <spec>     a node's compact description (JSON) was set; a 'u' entry for it follows
--   t d  n:<node> ''         a node left the ledger
-- (node fields carry the 'n:' prefix so that a node named 't' cannot clash with the kind)
--   t r  epoch  <epoch>      the ledger was rebuilt: readers load it again
-- Inter-pod domains: how two workers racing never break required pod (anti-)affinity.
-- A worker decides a pod from its pod index, which is the change stream applied up to some position. The
-- decision for pod P on node n can only be wrong if a pod was placed in or removed from one of n's topology
-- domains that matter to P after that position: the domains of the topologyKeys of P's own inter-pod terms, and
-- the domains where pods with required anti-affinity terms run (they may reject P). So the ledger keeps, per
-- topology domain 'key=value' of the keys any term uses, the id of the last change-stream entry that placed or
-- removed a pod there, and reserve_batch refuses P on n (a conflict, retried by the worker once its index has
-- caught up) when such a domain changed after the position the worker decided on, or changes earlier in the
-- same call (marked '~' until the entry is written). Optimistic and per domain: pods without inter-pod terms
-- pay nothing unless their node's domain holds an anti-affinity pod, and workers never wait for each other.
--   {hoss}:ipa:keys   set of topology keys some inter-pod term uses (tracked from the moment they are added)
--   {hoss}:ipa:since  hash key -> the last change id when the key was added (a decision older than that is
--                     refused: changes before it were not tracked)
--   {hoss}:ipa:last   hash 'key=value' -> id of the last entry that placed or removed a pod in that domain
--   {hoss}:ipa:anti   hash 'key=value' -> how many entries there hold pods with anti-affinity terms on that key
local IPA_KEYS = PREFIX .. ':ipa:keys'
local IPA_SINCE = PREFIX .. ':ipa:since'
local IPA_LAST = PREFIX .. ':ipa:last'
local IPA_ANTI = PREFIX .. ':ipa:anti'
local IN_CALL = '~'
local ipa_touched = {}

local touched = {}
local touched_list = {}
-- Pods placed or removed by this call: uid -> {node, meta} (placed) or {node} (removed, meta nil); the last
-- state wins, in the order the uids were first seen.
local pod_events = {}
local pod_event_list = {}
local function pod_event(uid, node, meta)
  if not pod_events[uid] then
    table.insert(pod_event_list, uid)
  end
  pod_events[uid] = {node, meta}
end
local function touch(node)
  if not touched[node] then
    touched[node] = true
    table.insert(touched_list, node)
  end
end

-- part is one of: alloc, used, labels (hashes); assumed, bound (sets of pod uids held on the node)
local function node_key(node, part)
  return PREFIX .. ':node:' .. node .. ':' .. part
end

local function pod_key(uid)
  return PREFIX .. ':pod:' .. uid
end

local function int_str(n)
  return string.format('%d', n)
end

local function is_ready()
  return redis.call('EXISTS', READY) == 1
end

-- Milliseconds from the Redis server's clock: every deadline is on one clock, whichever client set it.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A cursor over ARGV, after the prefix (and after a fenced call's answered count).
local arg_index = FENCE and 2 or 1
local function next_arg()
  arg_index = arg_index + 1
  return ARGV[arg_index]
end

local function next_number()
  return tonumber(next_arg())
end

-- A count, then that many name/value pairs; returns an ordered list of {name, value} (values stay strings).
local function next_pairs()
  local list = {}
  for i = 1, next_number() do
    local name = next_arg()
    list[i] = {name, next_arg()}
  end
  return list
end

-- uid, pod (namespace/name), node, request pairs, host ports ('TCP/0.0.0.0/80,UDP/10.0.0.1/53' or ''), meta
-- (the pod's compact description for the workers' pod index: JSON, or '')
local function next_placement()
  return {uid = next_arg(), pod = next_arg(), node = next_arg(), request = next_pairs(), ports = next_arg(),
          meta = next_arg()}
end

-- Host ports: per node a hash of counts, '<protocol>/<port>' (held on any IP) and '<protocol>/<ip>/<port>'.
-- kube-scheduler's rule: a port on 0.0.0.0 conflicts with the same protocol and port on any IP; a port on a
-- specific IP conflicts with the same IP or 0.0.0.0.
local ANY_IP = '0.0.0.0'
local function split_ports(text)
  local ports = {}
  if text and text ~= '' then
    for item in string.gmatch(text, '[^,]+') do
      local protocol, ip, port = string.match(item, '^([^/]+)/(.+)/([0-9]+)$')
      if protocol then
        table.insert(ports, {protocol, ip, port})
      end
    end
  end
  return ports
end

local function ports_conflict(a, b)
  return a[1] == b[1] and a[3] == b[3] and (a[2] == b[2] or a[2] == ANY_IP or b[2] == ANY_IP)
end

local function change_ports(node, text, delta)
  local key = node_key(node, 'ports')
  for _, p in ipairs(split_ports(text)) do
    for _, field in ipairs({p[1] .. '/' .. p[3], p[1] .. '/' .. p[2] .. '/' .. p[3]}) do
      if redis.call('HINCRBY', key, field, delta) <= 0 then
        redis.call('HDEL', key, field)
      end
    end
  end
end

-- The first wanted port ('TCP/0.0.0.0/80') that conflicts on node with the ports of its entries (not counting
-- those of `current`, the pod's own entry, when it is on that node) or with `claimed` (a list of ports other
-- placements of this call take there), or nil.
local function port_conflict(node, text, current, claimed)
  local wanted = split_ports(text)
  if #wanted == 0 then
    return nil
  end
  local own = {}
  if current and current.node == node then
    own = split_ports(current.ports)
  end
  local key = node_key(node, 'ports')
  for _, w in ipairs(wanted) do
    local held
    if w[2] == ANY_IP then
      held = tonumber(redis.call('HGET', key, w[1] .. '/' .. w[3]) or '0')
    else
      held = tonumber(redis.call('HGET', key, w[1] .. '/' .. w[2] .. '/' .. w[3]) or '0')
        + tonumber(redis.call('HGET', key, w[1] .. '/' .. ANY_IP .. '/' .. w[3]) or '0')
    end
    for _, o in ipairs(own) do
      if ports_conflict(w, o) then
        held = held - 1
      end
    end
    for _, c in ipairs(claimed or {}) do
      if ports_conflict(w, c) then
        held = held + 1
      end
    end
    if held > 0 then
      return w[1] .. '/' .. w[2] .. '/' .. w[3]
    end
  end
  return nil
end

local function flat_append(reply, flat)
  table.insert(reply, #flat / 2)
  for _, item in ipairs(flat) do
    table.insert(reply, item)
  end
end

local function set_hash(key, list)
  redis.call('DEL', key)
  local flat = {}
  for _, item in ipairs(list) do
    table.insert(flat, item[1])
    table.insert(flat, item[2])
  end
  if #flat > 0 then
    redis.call('HSET', key, unpack(flat))
  end
end

-- The pod entry of uid: {uid, node, pod, state, owner, deadline, request = list of {resource, amount}}, or nil.
local function read_entry(uid)
  local flat = redis.call('HGETALL', pod_key(uid))
  if #flat == 0 then
    return nil
  end
  local entry = {uid = uid, request = {}}
  for i = 1, #flat, 2 do
    local field, value = flat[i], flat[i + 1]
    if string.sub(field, 1, 2) == 'r:' then
      table.insert(entry.request, {string.sub(field, 3), value})
    else
      entry[field] = value
    end
  end
  return entry
end

-- sign is '' to add the request to the node's used totals, '-' to take it off.
local function change_used(node, request, sign)
  touch(node)
  local used = node_key(node, 'used')
  for _, item in ipairs(request) do
    if tonumber(item[2]) ~= 0 then
      if redis.call('HINCRBY', used, item[1], sign .. item[2]) == 0 then
        redis.call('HDEL', used, item[1])
      end
    end
  end
end

local function last_change_id()
  local last = redis.call('XREVRANGE', CHANGES, '+', '-', 'COUNT', 1)
  if #last > 0 then
    return last[1][1]
  end
  return '0-0'
end

local function register_key(key)
  if redis.call('SADD', IPA_KEYS, key) == 1 then
    redis.call('HSET', IPA_SINCE, key, last_change_id())
  end
end

-- The topology keys of the required anti-affinity terms in a pod's meta.
local function anti_keys(meta)
  local keys = {}
  if not meta or meta == '' or not string.find(meta, '"anti"', 1, true) then
    return keys
  end
  local ok, value = pcall(cjson.decode, meta)
  if ok and type(value) == 'table' and type(value.anti) == 'table' then
    for _, term in ipairs(value.anti) do
      if type(term) == 'table' and type(term.topologyKey) == 'string' then
        table.insert(keys, term.topologyKey)
      end
    end
  end
  return keys
end

local function domain_of(node, key)
  local value = redis.call('HGET', node_key(node, 'labels'), key)
  if value then
    return key .. '=' .. value
  end
  return nil
end

-- A pod was placed on or removed from node: mark its tracked domains changed in this call, and count the
-- anti-affinity pods there (delta +1 placed, -1 removed).
local function domains_changed(node, meta, delta)
  for _, key in ipairs(anti_keys(meta)) do
    register_key(key)
    local domain = domain_of(node, key)
    if domain and redis.call('HINCRBY', IPA_ANTI, domain, delta) <= 0 then
      redis.call('HDEL', IPA_ANTI, domain)
    end
  end
  for _, key in ipairs(redis.call('SMEMBERS', IPA_KEYS)) do
    local domain = domain_of(node, key)
    if domain then
      redis.call('HSET', IPA_LAST, domain, IN_CALL)
      table.insert(ipa_touched, domain)
    end
  end
end

-- The domains this call changed now carry the id of the entry that records the change.
local function settle_domains(id)
  for _, domain in ipairs(ipa_touched) do
    redis.call('HSET', IPA_LAST, domain, id)
  end
  ipa_touched = {}
end

local function id_after(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if not am or not bm then
    return true
  end
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am > bm or (am == bm and as > bs)
end

-- The reason a decision made at change-stream position pos for a pod whose inter-pod terms use own_keys (a
-- comma-separated list) can no longer be trusted on node, or nil. pos '' (a caller that does not say) skips.
local function inter_pod_stale(node, own_keys, pos)
  if not pos or pos == '' then
    return nil
  end
  local keys = {}
  for key in string.gmatch(own_keys or '', '[^,]+') do
    register_key(key)
    keys[key] = true
  end
  for _, key in ipairs(redis.call('SMEMBERS', IPA_KEYS)) do
    if not keys[key] then
      local domain = domain_of(node, key)
      if domain and tonumber(redis.call('HGET', IPA_ANTI, domain) or '0') > 0 then
        keys[key] = true
      end
    end
  end
  for key in pairs(keys) do
    local since = redis.call('HGET', IPA_SINCE, key)
    if since and id_after(since, pos) then
      return 'inter-pod topology key ' .. key .. ' (newly tracked)'
    end
    local domain = domain_of(node, key)
    if domain then
      local last = redis.call('HGET', IPA_LAST, domain)
      if last and (last == IN_CALL or id_after(last, pos)) then
        return 'inter-pod domain ' .. domain
      end
    end
  end
  return nil
end

-- Elastic quotas (scheduler-plugins' ElasticQuota, one per namespace; written by the resolver's sync).
--   {hoss}:quotas          set of the namespaces that have an ElasticQuota
--   {hoss}:quota:ns:<ns>   hash 'min:<resource>' / 'max:<resource>' -> amount (a resource missing from max is
--                          not limited; one missing from min is guaranteed 0)
--   {hoss}:nsused          hash '<ns>/<resource>' -> sum of the requests of the namespace's entries (every
--                          namespace, every state: assumed, admitted and bound all count, as kube-scheduler's
--                          assumed pods do for CapacityScheduling)
--   {hoss}:quota:sum:used  hash resource -> sum of nsused over the namespaces that have a quota
--   {hoss}:quota:sum:min   hash resource -> sum of the quotas' min (only resources some quota names in min)
-- The rule is CapacityScheduling's PreFilter: a new entry (or a growth) of amount a of resource r for a pod in
-- namespace ns with a quota is refused when used(ns, r) + a > max(ns, r), or, for a resource some quota names
-- in min, when sum over quota namespaces of used(r) + a > sum of min(r): tenants borrow only the guaranteed
-- share other tenants leave idle, so every tenant can always get back to its min by reclaiming borrowed pods.
-- Pods of namespaces without a quota are not limited and not counted in the sums.
local QUOTAS = PREFIX .. ':quotas'
local NS_USED = PREFIX .. ':nsused'
local QUOTA_SUM_USED = PREFIX .. ':quota:sum:used'
local QUOTA_SUM_MIN = PREFIX .. ':quota:sum:min'
local function quota_key(ns)
  return PREFIX .. ':quota:ns:' .. ns
end

local function namespace_of(pod)
  return string.match(pod or '', '^([^/]*)/') or ''
end

local has_quota_cache = {}
local function has_quota(ns)
  if has_quota_cache[ns] == nil then
    has_quota_cache[ns] = redis.call('SISMEMBER', QUOTAS, ns) == 1
  end
  return has_quota_cache[ns]
end

-- sign '' adds the request to the namespace's used totals, '-' takes it off.
local function change_ns_used(pod, request, sign)
  local ns = namespace_of(pod)
  local quota = has_quota(ns)
  for _, item in ipairs(request) do
    if tonumber(item[2]) ~= 0 then
      if redis.call('HINCRBY', NS_USED, ns .. '/' .. item[1], sign .. item[2]) == 0 then
        redis.call('HDEL', NS_USED, ns .. '/' .. item[1])
      end
      if quota and redis.call('HINCRBY', QUOTA_SUM_USED, item[1], sign .. item[2]) == 0 then
        redis.call('HDEL', QUOTA_SUM_USED, item[1])
      end
    end
  end
end

-- The refusal of `request` for pod (namespace/name) by its namespace's quota, or nil. `back` is a request the
-- call gives back in the same namespace (the pod's current entry it replaces); `extra` per resource what other
-- placements of the same call add in that namespace (a gang). The refusal is a conflict on node '' whose
-- resource field is the message, e.g. 'quota team-a: nvidia.com/gpu 6 used + 2 requested > max 6'.
local function quota_conflict(pod, request, back, extra)
  local ns = namespace_of(pod)
  if not has_quota(ns) then
    return nil
  end
  local given = {}
  for _, item in ipairs(back or {}) do
    given[item[1]] = (given[item[1]] or 0) + tonumber(item[2])
  end
  local key = quota_key(ns)
  for _, item in ipairs(request) do
    local resource = item[1]
    local wanted = tonumber(item[2]) + ((extra or {})[resource] or 0)
    local net = wanted - (given[resource] or 0)
    if net > 0 then
      local used = (tonumber(redis.call('HGET', NS_USED, ns .. '/' .. resource)) or 0) - (given[resource] or 0)
      local max = tonumber(redis.call('HGET', key, 'max:' .. resource))
      if max and used + wanted > max then
        return {'conflict', '', 'quota ' .. ns .. ': ' .. resource .. ' ' .. int_str(used) .. ' used + '
                .. int_str(wanted) .. ' requested > max ' .. int_str(max), wanted, max - used}
      end
      local min_sum = tonumber(redis.call('HGET', QUOTA_SUM_MIN, resource))
      if min_sum then
        local total = (tonumber(redis.call('HGET', QUOTA_SUM_USED, resource)) or 0) - (given[resource] or 0)
        if total + wanted > min_sum then
          return {'conflict', '', 'quota ' .. ns .. ': ' .. resource .. ' ' .. int_str(total)
                  .. ' used by all quotas + ' .. int_str(wanted) .. ' requested > ' .. int_str(min_sum)
                  .. ' guaranteed (sum of min)', wanted, min_sum - total}
        end
      end
    end
  end
  return nil
end

-- Writes the entry of uid (which must not exist) and adds its request to the node's used totals and its host
-- ports to the node's ports. deadline (ms) only for state 'assumed'; bound entries never expire. ports and meta
-- ('' or nil: none) are kept in the entry; meta is published on the change stream for the workers' pod index.
local function hold(uid, pod, node, request, state, owner, deadline, ports, meta, extra)
  local fields = {'node', node, 'pod', pod, 'state', state, 'owner', owner}
  for _, item in ipairs(extra or {}) do
    table.insert(fields, item)
  end
  if ports and ports ~= '' then
    table.insert(fields, 'ports')
    table.insert(fields, ports)
    change_ports(node, ports, 1)
  end
  if meta and meta ~= '' then
    table.insert(fields, 'meta')
    table.insert(fields, meta)
  end
  pod_event(uid, node, meta or '')
  domains_changed(node, meta, 1)
  for _, item in ipairs(request) do
    table.insert(fields, 'r:' .. item[1])
    table.insert(fields, item[2])
  end
  if state == 'assumed' then
    table.insert(fields, 'deadline')
    table.insert(fields, int_str(deadline))
    redis.call('ZADD', ASSUMED, int_str(deadline), uid)
  end
  redis.call('HSET', pod_key(uid), unpack(fields))
  redis.call('SADD', node_key(node, state), uid)
  change_used(node, request, '')
  change_ns_used(pod, request, '')
end

-- Reservations' shares. A Reservation's room is a bound entry whose pod is 'Reservation/<name>'; its request is
-- the room still held (what its owners have not taken), and it carries 'total' (the reserved amounts,
-- 'cpu=4000,pods=1') and 'once' ('1': allocateOnce, one owner; '0': several owners while they fit). An owner pod
-- that took room from it carries 'resv' (the Reservation's uid) and 'share' (the amounts taken, part of its own
-- request), and is a member of '{hoss}:resv:<uid>'. Whenever an owner's entry goes (released, expired, its pod
-- deleted or finished, moved), its share goes back to the Reservation's entry in the same call, so the room stays
-- closed to everyone else; the share of an entry the sync turns bound on the same node stays taken.
local function is_reservation(pod)
  return string.sub(pod or '', 1, 12) == 'Reservation/'
end

local function owners_key(uid)
  return PREFIX .. ':resv:' .. uid
end

local function encode_amounts(list)
  local parts = {}
  for _, item in ipairs(list) do
    table.insert(parts, item[1] .. '=' .. item[2])
  end
  return table.concat(parts, ',')
end

local function decode_amounts(text)
  local list = {}
  for name, amount in string.gmatch(text or '', '([^,=]+)=([0-9]+)') do
    table.insert(list, {name, amount})
  end
  return list
end

-- Moves `share` between the Reservation entry `held` and its node's used totals: sign '' gives it back to the
-- Reservation (the entry's request and the node's used grow), '-' lets an owner take it.
local function shift_share(held, share, sign)
  local key = pod_key(held.uid)
  for _, item in ipairs(share) do
    if tonumber(item[2]) ~= 0 then
      redis.call('HINCRBY', key, 'r:' .. item[1], sign .. item[2])
    end
  end
  change_used(held.node, share, sign)
  change_ns_used(held.pod, share, sign)
end

local function return_share(entry)
  redis.call('SREM', owners_key(entry.resv), entry.uid)
  local held = read_entry(entry.resv)
  if held and held.state == 'bound' and held.node == entry.node and is_reservation(held.pod) then
    shift_share(held, decode_amounts(entry.share), '')
  end
end

-- What a pod asking `request` takes from the Reservation entry `held`, or nil when it may not take from it:
-- with once '1' only while no other owner holds a share (the owner takes what the Reservation has of each
-- resource it asks for, the rest from the node's free room); with once '0' only when, for every reserved
-- resource the pod asks for, what is left holds all of it (else it is placed as any pod). `current` is the pod's
-- own entry: a share it already holds of this Reservation counts as left. With once '0' the pod count ('pods')
-- is no share: every owner is a pod of its own on the node, as in Koordinator, where a Reservation's allocatable
-- is what its template requests.
local function reservation_share(held, request, current)
  local left = {}
  for _, item in ipairs(held.request) do
    left[item[1]] = tonumber(item[2])
  end
  local own = current and current.resv == held.uid and current.node == held.node
  if own then
    for _, item in ipairs(decode_amounts(current.share)) do
      left[item[1]] = (left[item[1]] or 0) + tonumber(item[2])
    end
  end
  local once = held.once ~= '0'
  if once and redis.call('SCARD', owners_key(held.uid)) > (own and 1 or 0) then
    return nil
  end
  local share = {}
  for _, item in ipairs(request) do
    local have = left[item[1]]
    local want = tonumber(item[2])
    if have and want > 0 and (once or item[1] ~= 'pods') then
      if want > have then
        if not once then
          return nil
        end
        want = have
      end
      if want > 0 then
        table.insert(share, {item[1], int_str(want)})
      end
    end
  end
  return share
end

-- The room a Reservation entry holds: `total` minus its owners' shares (members whose entry no longer names it
-- are forgotten). `attach`: uids of bound or placed owner pods the apiserver names in the Reservation's status
-- (its currentOwners, after a rebuild or a missed share): each on the Reservation's node that holds no share
-- takes its share now, as it did when it was placed. `dry`: the same room, and nothing written (the fit check of
-- a Reservation entering the ledger, see reservation_refusal).
local function reservation_room(uid, node, total, once, attach, dry)
  local key = owners_key(uid)
  local left = {}
  for _, item in ipairs(total) do
    left[item[1]] = tonumber(item[2])
  end
  local members = {}
  for _, owner in ipairs(redis.call('SMEMBERS', key)) do
    local fields = redis.call('HMGET', pod_key(owner), 'resv', 'share')
    if fields[1] == uid then
      members[owner] = true
      for _, item in ipairs(decode_amounts(fields[2])) do
        if left[item[1]] then
          left[item[1]] = math.max(0, left[item[1]] - tonumber(item[2]))
        end
      end
    elseif not dry then
      redis.call('SREM', key, owner)
    end
  end
  for _, owner in ipairs(attach or {}) do
    local entry = read_entry(owner)
    if entry and entry.node == node and not entry.resv and not members[owner]
        and (once == '0' or next(members) == nil) then
      local share = {}
      for _, item in ipairs(entry.request) do
        local have = left[item[1]]
        if have and (once == '1' or item[1] ~= 'pods') then
          local take = math.min(have, tonumber(item[2]))
          left[item[1]] = have - take
          if take > 0 then
            table.insert(share, {item[1], int_str(take)})
          end
        end
      end
      members[owner] = true
      if not dry then
        redis.call('HSET', pod_key(owner), 'resv', uid, 'share', encode_amounts(share))
        redis.call('SADD', key, owner)
      end
    end
  end
  local room = {}
  for _, item in ipairs(total) do
    table.insert(room, {item[1], int_str(left[item[1]])})
  end
  return room
end

-- Reservation settings the sync and the placing worker put in its meta (hoss/model/reservations.py, meta).
local function reservation_settings(meta)
  local once = string.find(meta or '', '"allocateOnce":false', 1, true) and '0' or '1'
  local attach = {}
  local owners = string.match(meta or '', '"owners":%[([^%]]*)%]')
  for owner in string.gmatch(owners or '', '"([^"]+)"') do
    table.insert(attach, owner)
  end
  return once, attach
end

-- Removes an entry read by read_entry and gives its request back to its node (an owner's share back to its
-- Reservation, see above; entry.keep_share: the sync turns it bound in place, the share stays taken).
local function drop(entry)
  if entry.resv and not entry.keep_share then
    return_share(entry)
  end
  if is_reservation(entry.pod) and not entry.rebinding then
    redis.call('DEL', owners_key(entry.uid))
  end
  change_used(entry.node, entry.request, '-')
  change_ns_used(entry.pod, entry.request, '-')
  change_ports(entry.node, entry.ports, -1)
  pod_event(entry.uid, entry.node, nil)
  domains_changed(entry.node, entry.meta, -1)
  redis.call('SREM', node_key(entry.node, entry.state), entry.uid)
  redis.call('ZREM', ASSUMED, entry.uid)
  redis.call('ZREM', VERIFY, entry.uid)
  redis.call('DEL', pod_key(entry.uid))
end

local function drop_uid(uid)
  local entry = read_entry(uid)
  if entry then
    drop(entry)
  end
  return entry
end

-- Drops every entry on node and the node itself; returns the dropped uids.
local function remove_node(node)
  local dropped = {}
  for _, state in ipairs(STATES) do
    for _, uid in ipairs(redis.call('SMEMBERS', node_key(node, state))) do
      drop_uid(uid)
      table.insert(dropped, uid)
    end
  end
  for _, part in ipairs({'alloc', 'used', 'labels', 'assumed', 'admitted', 'bound', 'spec', 'ports'}) do
    redis.call('DEL', node_key(node, part))
  end
  redis.call('SREM', NODES, node)
  return dropped
end

-- The fit check. Each placement {uid, node, request, current} adds its request to its node and gives back the
-- request of its current entry (current: an assumed entry it replaces, on any node). Per node and resource, only
-- a growing total is checked, against alloc - used + given back (a resource missing from alloc has 0), so
-- refreshing a reservation never fails on a node that is overcommitted for other reasons.
-- Returns nil when everything fits, else {'conflict', node, resource, wanted, free} for the first misfit in
-- placement and request order (wanted: all the placements want of it on that node).
local function check_fit(placements)
  local added, given_back = {}, {}
  local function count(totals, node, request)
    totals[node] = totals[node] or {}
    for _, item in ipairs(request) do
      totals[node][item[1]] = (totals[node][item[1]] or 0) + tonumber(item[2])
    end
  end
  for _, p in ipairs(placements) do
    count(added, p.node, p.request)
    if p.current then
      count(given_back, p.current.node, p.current.request)
    end
  end
  for _, p in ipairs(placements) do
    for _, item in ipairs(p.request) do
      local resource = item[1]
      local wanted = added[p.node][resource]
      local back = (given_back[p.node] or {})[resource] or 0
      if wanted > back then
        local alloc = tonumber(redis.call('HGET', node_key(p.node, 'alloc'), resource)) or 0
        local used = tonumber(redis.call('HGET', node_key(p.node, 'used'), resource)) or 0
        local free = alloc - used + back
        if wanted > free then
          return {'conflict', p.node, resource, wanted, free}
        end
      end
    end
  end
  return nil
end

local function used_text(node)
  local flat = redis.call('HGETALL', node_key(node, 'used'))
  local parts = {}
  for i = 1, #flat, 2 do
    table.insert(parts, flat[i] .. '=' .. flat[i + 1])
  end
  return table.concat(parts, ',')
end

local function add_change(fields)
  return redis.call('XADD', CHANGES, 'MAXLEN', '~', CHANGES_MAXLEN, '*', unpack(fields))
end

-- Appends the used totals of every node this call touched (one entry); call before returning a change. Returns
-- the entry's id (nil when the call touched nothing): a worker counts its reservation until it applied that entry.
local function publish()
  if #touched_list == 0 then
    return
  end
  local fields = {'t', 'u'}
  for _, node in ipairs(touched_list) do
    if redis.call('SISMEMBER', NODES, node) == 1 then
      table.insert(fields, 'n:' .. node)
      table.insert(fields, used_text(node))
    end
  end
  for _, uid in ipairs(pod_event_list) do
    local event = pod_events[uid]
    if event[2] then
      table.insert(fields, 'p:' .. uid)
      table.insert(fields, event[1] .. '\n' .. event[2])
    else
      table.insert(fields, 'x:' .. uid)
      table.insert(fields, event[1])
    end
  end
  touched = {}
  touched_list = {}
  pod_events = {}
  pod_event_list = {}
  if #fields > 2 then
    local id = add_change(fields)
    settle_domains(id)
    return id
  end
  return nil
end

-- The fields of an admitted entry: when the webhook admitted it (ms), what it admitted ('binding', 'create' or
-- 'resize'), and '1' under 'answered' once the binder saw the apiserver answer with an error.
local function admitted_fields(at, via)
  return {'admitted', int_str(at), 'via', via}
end

-- Admit a new entry of p on p.node for owner (the webhook allowed its binding or creation); the sync looks at it
-- again from verify_at (ms).
local function admit(p, owner, via, verify_at)
  local at = now_ms()
  hold(p.uid, p.pod, p.node, p.request, 'admitted', owner, nil, p.ports, p.meta, admitted_fields(at, via))
  redis.call('ZADD', VERIFY, int_str(verify_at), p.uid)
end

-- Turn an existing assumed or admitted entry into an admitted one admitted now (a refreshed admission clears
-- 'answered': this write is in flight again).
local function admit_entry(entry, via, verify_at)
  if entry.state == 'assumed' then
    redis.call('SMOVE', node_key(entry.node, 'assumed'), node_key(entry.node, 'admitted'), entry.uid)
    redis.call('ZREM', ASSUMED, entry.uid)
    redis.call('HDEL', pod_key(entry.uid), 'deadline')
  end
  redis.call('HSET', pod_key(entry.uid), 'state', 'admitted', unpack(admitted_fields(now_ms(), via)))
  redis.call('HDEL', pod_key(entry.uid), 'answered')
  redis.call('ZADD', VERIFY, int_str(verify_at), entry.uid)
end

-- Growth. A pod's request changes only by an in-place resize, and a pod not bound yet can be resized too. Every
-- writer that puts the pod on a node read its request earlier (a worker from its work item, the webhook from the
-- sync's index or a GET), so each write that may grow what a node holds is checked against the pod's entry:
--   {hoss}:grown:<uid>  the largest request a resize of the pod allowed while it had no node ('cpu=64000,pods=1',
--                       see encode_amounts), kept for a while (the caller's ttl): a binding judged from a view of
--                       the pod older than the resize still counts it (confirm).
local function grown_key(uid)
  return PREFIX .. ':grown:' .. uid
end

-- Per resource the larger of the requests a and b (lists of {resource, amount}).
local function larger_of(a, b)
  local out, at = {}, {}
  for _, list in ipairs({a, b}) do
    for _, item in ipairs(list) do
      local i = at[item[1]]
      if not i then
        table.insert(out, {item[1], item[2]})
        at[item[1]] = #out
      elseif tonumber(item[2]) > tonumber(out[i][2]) then
        out[i][2] = item[2]
      end
    end
  end
  return out
end

-- Whether `request` asks more than `held` of any resource.
local function grows(held, request)
  local had = {}
  for _, item in ipairs(held) do
    had[item[1]] = tonumber(item[2])
  end
  for _, item in ipairs(request) do
    if tonumber(item[2]) > (had[item[1]] or 0) then
      return true
    end
  end
  return false
end

-- What resizes of the pod while it had no node allowed it (an empty list when nothing is remembered).
local function read_grown(uid)
  return decode_amounts(redis.call('GET', grown_key(uid)) or '')
end

local function remember_growth(uid, request, ttl_ms)
  redis.call('SET', grown_key(uid), encode_amounts(larger_of(read_grown(uid), request)), 'PX', int_str(ttl_ms))
end

-- The entry takes `request` in place (the caller checked the growth): it keeps its state, owner, ports, meta and
-- admission; its node's and its namespace's used totals follow.
local function regrow_entry(entry, request)
  change_used(entry.node, entry.request, '-')
  change_ns_used(entry.pod, entry.request, '-')
  local key = pod_key(entry.uid)
  for _, item in ipairs(entry.request) do
    redis.call('HDEL', key, 'r:' .. item[1])
  end
  for _, item in ipairs(request) do
    redis.call('HSET', key, 'r:' .. item[1], item[2])
  end
  change_used(entry.node, request, '')
  change_ns_used(entry.pod, request, '')
  entry.request = request
end

-- The resources of request that exceed the node's allocatable after the call, among those it added (more than
-- `previous`, the request it had on that node before, gives back); '' when none.
local function overcommitted(node, request, previous)
  local before = {}
  for _, item in ipairs(previous or {}) do
    before[item[1]] = tonumber(item[2])
  end
  local over = {}
  for _, item in ipairs(request) do
    local amount = tonumber(item[2])
    if amount > (before[item[1]] or 0) then
      local alloc = tonumber(redis.call('HGET', node_key(node, 'alloc'), item[1])) or 0
      local used = tonumber(redis.call('HGET', node_key(node, 'used'), item[1])) or 0
      if used > alloc then
        table.insert(over, item[1] .. ' used ' .. int_str(used) .. ' of ' .. int_str(alloc))
      end
    end
  end
  return table.concat(over, ', ')
end

-- Fields of an entry that describe the pod on its node; any other field (deadline, admitted, via, answered) is
-- about how the entry got there and goes when it becomes bound.
local BOUND_FIELDS = {uid = true, request = true, node = true, pod = true, state = true, owner = true, resv = true,
                      share = true, ports = true, meta = true}

-- Same non-zero amounts, in any order.
local function same_amounts(a, b)
  local left = {}
  for _, item in ipairs(a) do
    if tonumber(item[2]) ~= 0 then
      left[item[1]] = tonumber(item[2])
    end
  end
  for _, item in ipairs(b) do
    local amount = tonumber(item[2])
    if amount ~= 0 then
      if left[item[1]] ~= amount then
        return false
      end
      left[item[1]] = nil
    end
  end
  return next(left) == nil
end

-- The common case of bind: the sync sees a pod bound where its entry already holds it, with the same request,
-- host ports and description (a worker's reservation the webhook admitted). Dropping and holding it again would
-- leave every total, count, port and domain as it was; so the entry only changes state in place, and the call
-- appends nothing to the change stream for it (the workers already hold it where it is). Returns false when the
-- entry is not such a one.
-- The node joins the node set unless it is there: a read when it is, so a caller whose ACL may not write the set
-- (a hoss worker binding its own Reservation in place) runs this as long as the node is known.
local function register_node(node)
  if redis.call('SISMEMBER', NODES, node) == 0 then
    redis.call('SADD', NODES, node)
  end
end

local function bind_in_place(previous, p)
  if previous.node ~= p.node or is_reservation(p.pod) or is_reservation(previous.pod)
      or (previous.ports or '') ~= (p.ports or '') or (previous.meta or '') ~= (p.meta or '')
      or not same_amounts(previous.request, p.request) then
    return false
  end
  local key = pod_key(p.uid)
  local stale = {}
  for field in pairs(previous) do
    if not BOUND_FIELDS[field] then
      table.insert(stale, field)
    end
  end
  if #stale > 0 then
    redis.call('HDEL', key, unpack(stale))
  end
  redis.call('HSET', key, 'state', 'bound', 'pod', p.pod)
  if previous.state ~= 'bound' then
    redis.call('SMOVE', node_key(p.node, previous.state), node_key(p.node, 'bound'), p.uid)
  end
  redis.call('ZREM', ASSUMED, p.uid)
  redis.call('ZREM', VERIFY, p.uid)
  register_node(p.node)
  return true
end

-- A Reservation entering the ledger: marked Available by someone other than the worker that held its room on that
-- node (Koordinator's scheduler, anyone with reservations/status), or met again by a rebuild after Redis lost its
-- entry. Its status is a claim, not the apiserver's truth about a pod: it holds room only if its room (less what
-- its owners hold already) fits beside the node's entries, as any reservation must. nil when it fits, else the
-- first misfit: {resource, wanted, free}. A refused Reservation holds nothing, so no owner can take room from it.
local function reservation_refusal(p)
  local once, attach = reservation_settings(p.meta)
  local conflict = check_fit({{node = p.node, request = reservation_room(p.uid, p.node, p.request, once, attach,
                                                                        true)}})
  if conflict then
    return {conflict[3], conflict[4], conflict[5]}
  end
  return nil
end

-- The apiserver says p.uid runs on p.node: its entry becomes bound there with this request, whatever it was
-- before and even if the node is overcommitted (a node not synced yet is registered without allocatable).
-- Returns the entry it replaced (or nil) and the overcommit it caused ('' when the node had room): never silent,
-- every overcommit is counted in STATS and returned to the sync, which logs it.
-- A Reservation entering the ledger is the exception (see reservation_refusal): when it does not fit, nothing is
-- held (an entry of it elsewhere is dropped) and the refusal comes third. Used by bind and bind_many.
local function bind_placement(p)
  local previous = read_entry(p.uid)
  if previous and bind_in_place(previous, p) then
    return previous, ''
  end
  if is_reservation(p.pod) and not (previous and previous.node == p.node) then
    local refusal = reservation_refusal(p)
    if refusal then
      if previous then
        drop(previous)
      end
      return previous, '', refusal
    end
  end
  local owner = ''
  local before = nil
  local extra = nil
  local request = p.request
  if previous then
    owner = previous.owner or ''
    if previous.node == p.node then
      before = previous.request
    end
    if is_reservation(p.pod) then
      previous.rebinding = true
    elseif previous.resv and previous.node == p.node then
      previous.keep_share = true
      extra = {'resv', previous.resv, 'share', previous.share}
    end
    drop(previous)
  end
  register_node(p.node)
  if is_reservation(p.pod) then
    -- the Reservation's room: the reserved amounts less what its owners hold (see 'Reservations' shares')
    local once, attach = reservation_settings(p.meta)
    request = reservation_room(p.uid, p.node, p.request, once, attach)
    extra = {'total', encode_amounts(p.request), 'once', once}
  end
  hold(p.uid, p.pod, p.node, request, 'bound', owner, nil, p.ports, p.meta, extra)
  local over = ''
  if redis.call('EXISTS', node_key(p.node, 'alloc')) == 1 then
    over = overcommitted(p.node, request, before)
    if over ~= '' then
      redis.call('HINCRBY', STATS, 'overcommits', 1)
      redis.call('HSET', STATS, 'last_overcommit', p.pod .. ' on ' .. p.node .. ': ' .. over)
    end
  end
  return previous, over
end

-- Nominations: room held on a node for a preempting pod while the pods it evicts leave (workers/preempt.py).
--   {hoss}:nominated            hash uid -> JSON {node, priority, deadline (ms, Redis clock), request: {resource:
--                               amount (decimal string)}}
--   {hoss}:node:<n>:nominated   set of the uids nominated to node n
-- A new entry for pod P on node n (reserve_batch, reserve, or a foreign binding through confirm) must fit beside
-- the room held on n for the other nominated pods whose priority is at least P's: kube-scheduler counts such
-- nominated pods as if they ran when it filters P, and ignores those of lower priority (P may take their room,
-- and they preempt again). A nomination never changes `used` and never touches an entry: it only narrows what a
-- new entry may take, so it cannot free or double-count room a bound pod uses. It ends when its pod reserves
-- (anywhere), when the dispatcher sees the pod leave the pending set (hoss/queue.py, mark gone), when a
-- worker drops it, or at its deadline.
local NOMINATED = PREFIX .. ':nominated'
local any_nominated = nil

local function read_nomination(uid)
  local raw = redis.call('HGET', NOMINATED, uid)
  if not raw then
    return nil
  end
  local ok, value = pcall(cjson.decode, raw)
  if not ok or type(value) ~= 'table' then
    return {node = '', priority = 0, deadline = 0, request = {}}
  end
  return value
end

-- A rescheduler's hold (field pin) is announced on the change stream ('h' entries: uid -> the nomination's
-- JSON, or '' once it ended), so that workers steer the pod it is for onto its node (hoss/framework/feed.py).
local function announce_hold(uid, raw)
  add_change({'t', 'h', uid, raw})
end

local function drop_nomination(uid)
  local nomination = read_nomination(uid)
  if not nomination then
    return false
  end
  redis.call('HDEL', NOMINATED, uid)
  if type(nomination.node) == 'string' and nomination.node ~= '' then
    redis.call('SREM', node_key(nomination.node, 'nominated'), uid)
  end
  if nomination.pin then
    announce_hold(uid, '')
  end
  return true
end

-- The priority a placement's meta carries (`hoss.model.compact.pod_meta`: absent means 0).
local function meta_priority(meta)
  if not meta or meta == '' or not string.find(meta, '"priority"', 1, true) then
    return 0
  end
  local ok, value = pcall(cjson.decode, meta)
  if ok and type(value) == 'table' and tonumber(value.priority) then
    return tonumber(value.priority)
  end
  return 0
end

-- The controller a placement's meta names (`hoss.model.compact.pod_meta` field owner: its controller's uid), or ''.
local function meta_owner(meta)
  if not meta or meta == '' or not string.find(meta, '"owner"', 1, true) then
    return ''
  end
  local ok, value = pcall(cjson.decode, meta)
  if ok and type(value) == 'table' and type(value.owner) == 'string' then
    return value.owner
  end
  return ''
end

-- Whether a rescheduler's hold for pods of `owner` covers `request` (the replacement of a moved pod: same
-- controller, a request no larger than the hold's).
local function claims(nomination, owner, request)
  if owner == '' or nomination.owner ~= owner or type(nomination.request) ~= 'table' then
    return false
  end
  for _, item in ipairs(request or {}) do
    if tonumber(item[2]) > (tonumber(nomination.request[item[1]]) or 0) then
      return false
    end
  end
  return true
end

-- Per resource, the room held on node for nominated pods other than uid with priority >= priority; drops the
-- expired nominations it meets. One rescheduler's hold that a pod of `owner` with `request` may claim (see
-- claims) is not counted: its uid is returned second.
local function held_for_others(node, uid, priority, owner, request)
  local held = {}
  local claim = nil
  local key = node_key(node, 'nominated')
  local uids = redis.call('SMEMBERS', key)
  if #uids == 0 then
    return held, claim
  end
  local now = now_ms()
  -- Two preempting pods of equal priority nominated to one node (two workers may pick the same victims) would
  -- each keep the other out for the holds' lifetime: between them, the one nominated first (earlier deadline,
  -- then smaller uid) counts for the later one and not the other way round.
  local mine = read_nomination(uid)
  local my_deadline = nil
  if mine and mine.node == node then
    my_deadline = tonumber(mine.deadline) or 0
  end
  local function counts(nomination, other)
    local p = tonumber(nomination.priority) or 0
    if p ~= priority or my_deadline == nil then
      return p >= priority
    end
    local d = tonumber(nomination.deadline) or 0
    return d < my_deadline or (d == my_deadline and other < uid)
  end
  for _, other in ipairs(uids) do
    if other ~= uid then
      local nomination = read_nomination(other)
      if not nomination or nomination.node ~= node or (tonumber(nomination.deadline) or 0) <= now then
        redis.call('SREM', key, other)
        if nomination and nomination.node == node then
          redis.call('HDEL', NOMINATED, other)
          if nomination.pin then
            announce_hold(other, '')
          end
        end
      elseif claim == nil and claims(nomination, owner or '', request) then
        claim = other
      elseif counts(nomination, other) then
        for resource, amount in pairs(type(nomination.request) == 'table' and nomination.request or {}) do
          held[resource] = (held[resource] or 0) + (tonumber(amount) or 0)
        end
      end
    end
  end
  return held, claim
end

-- The rescheduler's hold the last successful nominated_conflict let its pod claim (nil: none); the caller ends
-- it once the pod holds its entry there (consume_claim).
local move_claim = nil

local function consume_claim(claim)
  if claim then
    drop_nomination(claim)
  end
end

-- A conflict when `request` (of pod uid with that meta; `current` its entry, whose request on this node is given
-- back) does not fit on node beside the room held there for others (see above), or nil. `extra`, when given,
-- is what other placements of the same call add to node (per resource).
local function nominated_conflict(node, uid, meta, request, current, extra)
  move_claim = nil
  if any_nominated == nil then
    any_nominated = redis.call('HLEN', NOMINATED) > 0
  end
  if not any_nominated then
    return nil
  end
  local held, claim = held_for_others(node, uid, meta_priority(meta), meta_owner(meta), request)
  move_claim = claim
  if next(held) == nil then
    return nil
  end
  for _, item in ipairs(request) do
    local resource, wanted = item[1], tonumber(item[2])
    local h = held[resource] or 0
    if h > 0 and wanted > 0 then
      local alloc = tonumber(redis.call('HGET', node_key(node, 'alloc'), resource)) or 0
      local used = tonumber(redis.call('HGET', node_key(node, 'used'), resource)) or 0
      local back = 0
      if current and current.node == node then
        for _, mine in ipairs(current.request) do
          if mine[1] == resource then
            back = tonumber(mine[2])
          end
        end
      end
      local others = (extra or {})[resource] or 0
      local free = alloc - used + back - h - others
      if wanted > free then
        return {'conflict', node, resource .. ' (held for a preempting pod)', wanted + others, free + others}
      end
    end
  end
  return nil
end

-- The write fence (hoss/ledger/fence.py). A fenced writer declares its own counter as KEYS[2] and passes, as
-- ARGV[2], how many of its calls Redis answered. Every call increments the counter in the same atomic call as its
-- writes, so while Redis keeps every write the counter is at least that count, whatever other writers do. A
-- counter below it means Redis came back without writes this writer made (an older copy that still says it is
-- ready): the ledger is marked not ready, so that every write but a rebuild refuses until the sync has rebuilt it
-- from the apiserver, the stale copy is counted, and this call writes nothing: {'lost_writes', at least how many
-- calls' writes were lost}.
if FENCE then
  local counted = redis.call('INCR', FENCE)
  if counted == 1 then
    redis.call('PEXPIRE', FENCE, '86400000')
  end
  local answered = tonumber(ARGV[2]) or 0
  if counted <= answered then
    local lost = int_str(answered - counted + 1)
    if is_ready() then
      redis.call('DEL', READY)
      redis.call('HINCRBY', STATS, 'stale_ledger', 1)
      redis.call('HSET', STATS, 'last_stale_ledger', 'Redis lost the writes of at least ' .. lost
                  .. ' calls of a resolver')
    end
    return {'lost_writes', lost}
  end
end
