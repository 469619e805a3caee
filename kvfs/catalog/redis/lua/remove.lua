-- ARGV: origin ino parent name want(file|dir) expect_blob grace ptime [ghost uses limit]
-- (ghost: remember the name's uses among the `limit` names evicted last: pool.evict = "prefix")
local origin, ino, parent, name, want = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local expect, grace, ptime = ARGV[6], ARGV[7], ARGV[8]
if redis.call('HGET', P .. 'd:' .. parent, name) ~= ino then
  return err('ENOENT', 'renamed or removed by another node')
end
if want == 'dir' and redis.call('HLEN', P .. 'd:' .. ino) > 0 then
  return err('ENOTEMPTY', 'directory not empty (another node added to it)')
end
if expect ~= '' and redis.call('HGET', P .. 'n:' .. ino, 'b') ~= expect then
  return err('ESTALE', 'the file was rewritten by another node')
end
local retired = {}
redis.call('HDEL', P .. 'd:' .. parent, name)
drop_node(ino, grace, retired)
touch_dir(parent, ptime)
if ARGV[9] then
  local seq = redis.call('INCR', P .. 'ghostseq')
  redis.call('HSET', P .. 'ghost', ARGV[9], ARGV[10])
  redis.call('ZADD', P .. 'ghosts', seq, ARGV[9])
  local over = redis.call('ZCARD', P .. 'ghosts') - tonumber(ARGV[11])
  if over > 0 then
    local old = redis.call('ZRANGE', P .. 'ghosts', 0, over - 1)
    redis.call('ZREMRANGEBYRANK', P .. 'ghosts', 0, over - 1)
    redis.call('HDEL', P .. 'ghost', unpack(old))
  end
end
event(origin, {ino, parent}, retired)
return retired
