-- ARGV: origin ino nset [k v]* [field to delete]*
local origin, ino, nset = ARGV[1], ARGV[2], tonumber(ARGV[3])
local k = P .. 'n:' .. ino
if redis.call('EXISTS', k) == 0 then return err('ENOENT', 'removed by another node') end
if nset > 0 then
  local f = {}
  for i = 4, 3 + 2 * nset do table.insert(f, ARGV[i]) end
  redis.call('HSET', k, unpack(f))
end
for i = 4 + 2 * nset, #ARGV do redis.call('HDEL', k, ARGV[i]) end
event(origin, {ino}, {})
return 'OK'
