-- release_owner: drop every assumed entry of one owner (a worker shutting down); bound entries stay.
-- ARGV: prefix, owner. Reply: {'released', uids...} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local owner = next_arg()
local reply = {'released'}
for _, uid in ipairs(redis.call('ZRANGE', ASSUMED, 0, -1)) do
  if redis.call('HGET', pod_key(uid), 'owner') == owner then
    drop_uid(uid)
    table.insert(reply, uid)
  end
end
publish()
return reply
