-- ARGV: grace_ms id*  -> how many graves were pushed back (a reader here still uses them)
local until_ms = now_ms() + tonumber(ARGV[1])
local n = 0
for i = 2, #ARGV do
  local s = redis.call('ZSCORE', P .. 'grave', ARGV[i])
  if s and tonumber(s) < until_ms then
    redis.call('ZADD', P .. 'grave', until_ms, ARGV[i])
    n = n + 1
  end
end
return n
