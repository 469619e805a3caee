-- ARGV: token region*
local n = 0
for i = 2, #ARGV do
  if redis.call('GET', P .. 'lease:' .. ARGV[i]) == ARGV[1] then
    redis.call('DEL', P .. 'lease:' .. ARGV[i])
    n = n + 1
  end
end
return n
