-- The copies of this node's allocation leases in a shard other than the pool's first, which
-- holds the leases themselves (docs/cluster.md, "More than one Redis"): a publish here checks
-- the copy (lib.lua leases_ok). ARGV: mode(take|keep) token ttl_ms region*
--   take: this node was just given the lease: its copy replaces whatever is there;
--   keep: renewed: the copy is set again unless another node's copy is there.
-- Reply: this shard's change-log tail (the node applies the log up to it before allocating)
local mode, token, ttl = ARGV[1], ARGV[2], ARGV[3]
for i = 4, #ARGV do
  local k = P .. 'lease:' .. ARGV[i]
  if mode == 'take' then
    redis.call('SET', k, token, 'PX', ttl)
  else
    local cur = redis.call('GET', k)
    if cur == false or cur == token then redis.call('SET', k, token, 'PX', ttl) end
  end
end
return tail()
