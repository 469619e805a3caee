-- ARGV: origin ino token regions grace bid nblob [blob k v]* [node k v]*
local origin, ino, token, regions, grace, bid = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local nb = tonumber(ARGV[7])
local k = P .. 'n:' .. ino
if redis.call('EXISTS', k) == 0 then return err('ENOENT', 'the file was removed by another node') end
if not leases_ok(token, regions) then
  return err('ESTALE', 'this node lost its allocation lease on the space it wrote; not publishing')
end
local retired = {}
bury(redis.call('HGET', k, 'b'), grace, retired)
local bf = {}
for i = 8, 7 + 2 * nb do table.insert(bf, ARGV[i]) end
redis.call('HSET', P .. 'b:' .. bid, unpack(bf))
local nf = {'b', bid}
for i = 8 + 2 * nb, #ARGV do table.insert(nf, ARGV[i]) end
redis.call('HSET', k, unpack(nf))
redis.call('ZADD', P .. 'atime', now_ms(), ino)
local prio = redis.call('HGET', k, 'r')
if prio then redis.call('ZADD', P .. 'prio', prio, ino) end
event(origin, {ino}, retired)
return retired
