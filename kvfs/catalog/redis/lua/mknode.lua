-- A new directory or symlink (a file's first publish is publish.lua's).
-- ARGV: origin ino parent name policy(excl|replace) grace ptime [node k v]*
local origin, ino, parent, name, policy = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local grace, ptime = ARGV[6], ARGV[7]
if not is_dir(parent) then return err('ENOENT', 'the directory was removed (by another node?)') end
local retired, inos = {}, {ino, parent}
local cur = redis.call('HGET', P .. 'd:' .. parent, name)
if cur then
  if policy == 'excl' then return err('EEXIST', 'already exists (made by another node?)') end
  if is_dir(cur) then return err('EISDIR', 'another node made a directory of that name') end
  drop_node(cur, grace, retired)
  table.insert(inos, cur)
end
local nf = {}
for i = 8, #ARGV do table.insert(nf, ARGV[i]) end
redis.call('HSET', P .. 'n:' .. ino, unpack(nf))
redis.call('HSET', P .. 'd:' .. parent, name, ino)
touch_dir(parent, ptime)
event(origin, inos, retired)
return retired
