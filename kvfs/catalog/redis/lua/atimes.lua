-- ARGV: [ino atime_ns atime_ms prio uses]* (prio '' when the pool keeps no order by priority)
local n = 0
for i = 1, #ARGV, 5 do
  local k = P .. 'n:' .. ARGV[i]
  if redis.call('EXISTS', k) == 1 then
    redis.call('HSET', k, 'a', ARGV[i + 1])
    redis.call('ZADD', P .. 'atime', ARGV[i + 2], ARGV[i])
    if ARGV[i + 3] ~= '' then
      redis.call('HSET', k, 'r', ARGV[i + 3], 'q', ARGV[i + 4])
      redis.call('ZADD', P .. 'prio', ARGV[i + 3], ARGV[i])
    end
    n = n + 1
  end
end
return n
