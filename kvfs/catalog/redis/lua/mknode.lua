-- ARGV: origin ino parent name policy token regions grace ptime bid nblob [blob k v]* [node k v]*
local origin, ino, parent, name, policy = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local token, regions, grace, ptime, bid = ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10]
local nb = tonumber(ARGV[11])
if not is_dir(parent) then return err('ENOENT', 'the directory was removed (by another node?)') end
local retired, inos = {}, {ino, parent}
local cur = redis.call('HGET', P .. 'd:' .. parent, name)
if cur then
  if policy == 'excl' then return err('EEXIST', 'already exists (made by another node?)') end
  if is_dir(cur) then return err('EISDIR', 'another node made a directory of that name') end
  drop_node(cur, grace, retired)
  table.insert(inos, cur)
end
if bid ~= '' then
  if not leases_ok(token, regions) then
    return err('ESTALE', 'this node lost its allocation lease on the space it wrote; not publishing')
  end
  local bf = {}
  for i = 12, 11 + 2 * nb do table.insert(bf, ARGV[i]) end
  redis.call('HSET', P .. 'b:' .. bid, unpack(bf))
  redis.call('ZADD', P .. 'atime', now_ms(), ino)
end
local nf = {}
for i = 12 + 2 * nb, #ARGV do table.insert(nf, ARGV[i]) end
redis.call('HSET', P .. 'n:' .. ino, unpack(nf))
local prio = redis.call('HGET', P .. 'n:' .. ino, 'r')
if bid ~= '' and prio then redis.call('ZADD', P .. 'prio', prio, ino) end
redis.call('HSET', P .. 'd:' .. parent, name, ino)
redis.call('HSET', P .. 'n:' .. parent, 't', ptime, 'k', ptime)
event(origin, inos, retired)
return retired
