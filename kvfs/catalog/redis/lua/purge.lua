-- ARGV: origin limit
local ids = redis.call('ZRANGEBYSCORE', P .. 'grave', '-inf', now_ms(), 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do
  redis.call('DEL', P .. 'b:' .. id)
  redis.call('ZREM', P .. 'grave', id)
end
if #ids > 0 then event(ARGV[1], {}, {}, 'g', table.concat(ids, ' ')) end
return ids
