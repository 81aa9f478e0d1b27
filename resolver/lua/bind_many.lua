-- bind_many: the apiserver says each uid runs on its node; as bind, for many pods in one call (the sync's
-- batch). ARGV: prefix, count, then count placements (uid, pod, node, n, n resource/amount pairs, ports, meta); a uid listed
-- twice ends on its last placement. Reply: {'bound', count} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local count = next_number()
for _ = 1, count do
  local p = next_placement()
  local previous = drop_uid(p.uid)
  local owner = ''
  if previous then
    owner = previous.owner or ''
  end
  redis.call('SADD', NODES, p.node)
  hold(p.uid, p.pod, p.node, p.request, 'bound', owner, nil, p.ports, p.meta)
end
publish()
return {'bound', count}
