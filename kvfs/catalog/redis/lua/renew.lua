-- ARGV: token ttl_ms region*  -> regions still held
local ok = {}
for i = 3, #ARGV do
  if redis.call('GET', P .. 'lease:' .. ARGV[i]) == ARGV[1] then
    redis.call('PEXPIRE', P .. 'lease:' .. ARGV[i], ARGV[2])
    table.insert(ok, ARGV[i])
  end
end
return ok
