-- ARGV: pool_id schema [root k v]*  -> the pool id Redis holds
local cur = redis.call('HGET', P .. 'meta', 'pool_id')
if cur then return cur end
redis.call('HSET', P .. 'meta', 'pool_id', ARGV[1], 'schema', ARGV[2])
local f = {}
for i = 3, #ARGV do table.insert(f, ARGV[i]) end
redis.call('HSET', P .. 'n:1', unpack(f))
return ARGV[1]
