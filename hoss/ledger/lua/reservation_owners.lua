-- reservation_owners: the owner pods holding a share of each given Reservation, and the room it still holds (see
-- 'Reservations' shares' in common.lua). Read-only.
-- ARGV: prefix, count, then count Reservation uids.
-- Reply: per uid: {held (1: its entry is there, 0: not), room (its request, 'cpu=1000,...'), n, then n x (owner
-- uid, pod (namespace/name), node, state, share)}, in the order asked, owners sorted by uid.
local reply = {}
for _ = 1, next_number() do
  local uid = next_arg()
  local held = read_entry(uid)
  table.insert(reply, held and 1 or 0)
  table.insert(reply, held and encode_amounts(held.request) or '')
  local owners = redis.call('SMEMBERS', owners_key(uid))
  table.sort(owners)
  local rows = {}
  for _, owner in ipairs(owners) do
    local entry = read_entry(owner)
    if entry and entry.resv == uid then
      table.insert(rows, {owner, entry.pod, entry.node, entry.state, entry.share or ''})
    end
  end
  table.insert(reply, #rows)
  for _, row in ipairs(rows) do
    for _, value in ipairs(row) do
      table.insert(reply, value)
    end
  end
end
return reply
