-- release_many: drop the entries of many uids wherever they are (pods deleted or finished), in one call.
-- ARGV: prefix, count, then count uids. Reply: {'released', how many had an entry} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local released = 0
for _ = 1, next_number() do
  if drop_uid(next_arg()) then
    released = released + 1
  end
end
publish()
return {'released', released}
