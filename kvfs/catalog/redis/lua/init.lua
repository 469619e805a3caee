-- ARGV: pool_id schema shard shards [root k v]*  -> the pool id Redis holds
-- (shard: this shard's index among `shards`; the root's record goes in the shard that holds
-- its entries: kvfs.catalog.redis.shards)
local cur = redis.call('HGET', P .. 'meta', 'pool_id')
if cur then return cur end
redis.call('HSET', P .. 'meta', 'pool_id', ARGV[1], 'schema', ARGV[2], 'shard', ARGV[3], 'shards', ARGV[4])
if #ARGV > 4 then redis.call('HSET', P .. 'n:1', unpack(ARGV, 5, #ARGV)) end
return ARGV[1]
