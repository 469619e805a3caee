-- ARGV: priority -> the pool order's floor, raised to it if below (pool.evict = "prefix")
local f = tonumber(redis.call('GET', P .. 'floor') or '0')
local x = tonumber(ARGV[1])
if x > f then
  redis.call('SET', P .. 'floor', ARGV[1])
  f = x
end
return tostring(f)
