-- nominations: the nominations still in force (deadline not passed on the Redis clock); see 'Nominations' in
-- common.lua. ARGV: prefix. Reply: {'nominations', uid, JSON, uid, JSON, ...} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local reply = {'nominations'}
local now = now_ms()
local flat = redis.call('HGETALL', NOMINATED)
for i = 1, #flat, 2 do
  local ok, value = pcall(cjson.decode, flat[i + 1])
  if ok and type(value) == 'table' and (tonumber(value.deadline) or 0) > now then
    table.insert(reply, flat[i])
    table.insert(reply, flat[i + 1])
  end
end
return reply
