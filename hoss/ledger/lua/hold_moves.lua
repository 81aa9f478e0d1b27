-- hold_moves: the defragmenting rescheduler holds the room of a plan before it evicts anything: all holds are
-- written, or none (see 'Nominations' in common.lua; rescheduler/execute.py).
-- ARGV: prefix, ttl_ms, priority, then the holds as one JSON array:
--   [[key, node, owner, [resource, amount, ...], {resource: amount freed on node by the plan's evictions}], ...]
--   key: the pending pod's uid (its own hold, pinned by uid), or 'move/<uid of the moved pod>' with owner = the
--   moved pod's controller uid: its replacement claims the hold by owner (see claims in common.lua).
-- Each hold must fit on its node beside what is used there, less what the plan's evictions free there, the room
-- already held for others (every nomination, whatever its priority), and the holds before it in this call.
-- A pending pod that holds an entry already answers {'placed', node}.
-- Reply: {'held', count} | {'conflict', node, resource, wanted, free} | {'unknown_node', node}
--        | {'placed', uid, node} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local ttl_ms = next_number()
local priority = next_number()
local holds = cjson.decode(next_arg())
local adding = {}
for _, h in ipairs(holds) do
  local key, node, owner, flat, freeing = h[1], h[2], h[3], h[4], h[5]
  if redis.call('SISMEMBER', NODES, node) == 0 then
    return {'unknown_node', node}
  end
  if string.sub(key, 1, 5) ~= 'move/' then
    local entry = read_entry(key)
    if entry then
      return {'placed', key, entry.node}
    end
  end
  local held = held_for_others(node, key, -math.huge, '', nil)
  adding[node] = adding[node] or {}
  for i = 1, #flat, 2 do
    local resource, wanted = flat[i], tonumber(flat[i + 1])
    local alloc = tonumber(redis.call('HGET', node_key(node, 'alloc'), resource)) or 0
    local used = tonumber(redis.call('HGET', node_key(node, 'used'), resource)) or 0
    local freed = tonumber((type(freeing) == 'table' and freeing[resource]) or 0) or 0
    local free = alloc - used + freed - (held[resource] or 0) - (adding[node][resource] or 0)
    if wanted > 0 and wanted > free then
      return {'conflict', node, resource, wanted, free}
    end
    adding[node][resource] = (adding[node][resource] or 0) + wanted
  end
end
local deadline = int_str(now_ms() + ttl_ms)
for _, h in ipairs(holds) do
  local key, node, owner, flat = h[1], h[2], h[3], h[4]
  drop_nomination(key)
  local amounts = {}
  for i = 1, #flat, 2 do
    amounts[flat[i]] = flat[i + 1]
  end
  local raw = cjson.encode({node = node, priority = priority, deadline = deadline, request = amounts,
                            owner = owner, pin = 1})
  redis.call('HSET', NOMINATED, key, raw)
  redis.call('SADD', node_key(node, 'nominated'), key)
  announce_hold(key, raw)
end
return {'held', #holds}
