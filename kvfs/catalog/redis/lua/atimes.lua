-- ARGV: [ino atime_ns atime_ms]*
local n = 0
for i = 1, #ARGV, 3 do
  if redis.call('EXISTS', P .. 'n:' .. ARGV[i]) == 1 then
    redis.call('HSET', P .. 'n:' .. ARGV[i], 'a', ARGV[i + 1])
    redis.call('ZADD', P .. 'atime', ARGV[i + 2], ARGV[i])
    n = n + 1
  end
end
return n
