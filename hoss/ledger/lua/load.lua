-- load: everything a worker needs to start following the ledger, read at one instant: the ready flag, the
-- epoch, the id of the last change-stream entry (follow from there), and per node its compact description and
-- used totals, then every pod entry (uid, node, meta). Read-only.
-- Reply: {ready (0|1), epoch or '', last change id or '0-0', count, then per node: name, spec, used text}
--        then count, then per pod: uid, node, meta
local ready = 0
if is_ready() then
  ready = 1
end
local last = redis.call('XREVRANGE', CHANGES, '+', '-', 'COUNT', 1)
local last_id = '0-0'
if #last > 0 then
  last_id = last[1][1]
end
local names = redis.call('SMEMBERS', NODES)
table.sort(names)
local reply = {ready, redis.call('GET', EPOCH) or '', last_id, #names}
for _, node in ipairs(names) do
  table.insert(reply, node)
  table.insert(reply, redis.call('GET', node_key(node, 'spec')) or '')
  table.insert(reply, used_text(node))
end
-- Then the pod index: count, then per entry uid, node, meta (as the change stream's p: entries give them).
local pods = {}
for _, node in ipairs(names) do
  for _, state in ipairs(STATES) do
    for _, uid in ipairs(redis.call('SMEMBERS', node_key(node, state))) do
      table.insert(pods, uid)
      table.insert(pods, node)
      table.insert(pods, redis.call('HGET', pod_key(uid), 'meta') or '')
    end
  end
end
table.insert(reply, #pods / 3)
for _, item in ipairs(pods) do
  table.insert(reply, item)
end
return reply
