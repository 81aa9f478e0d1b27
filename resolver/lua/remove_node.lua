-- remove_node: forget a node and every entry on it. ARGV: prefix, node. Reply: {'removed', uids...} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local reply = {'removed'}
for _, uid in ipairs(remove_node(next_arg())) do
  table.insert(reply, uid)
end
return reply
