-- entries: one consistent read of every pod entry, by node (sorted) and uid (sorted). Read-only.
-- ARGV: prefix. Reply: {count, then per entry: uid, node, pod, state, owner, deadline or '', r, r request pairs}
local reply = {0}
local nodes = redis.call('SMEMBERS', NODES)
table.sort(nodes)
for _, node in ipairs(nodes) do
  for _, state in ipairs(STATES) do
    local uids = redis.call('SMEMBERS', node_key(node, state))
    table.sort(uids)
    for _, uid in ipairs(uids) do
      local entry = read_entry(uid)
      if entry then
        reply[1] = reply[1] + 1
        for _, value in ipairs({uid, entry.node, entry.pod, entry.state, entry.owner, entry.deadline or ''}) do
          table.insert(reply, value)
        end
        table.insert(reply, #entry.request)
        for _, item in ipairs(entry.request) do
          table.insert(reply, item[1])
          table.insert(reply, item[2])
        end
      end
    end
  end
end
return reply
