-- A directory whose record is in another shard (its parent's) than its entries (this one):
-- its marker here, `o:<ino>` (lib.lua is_dir). docs/cluster.md, "More than one Redis".
-- ARGV: op(open|close) ino parent
--   open: mark it (a mkdir, before its record is published in the parent's shard)
--   close: unmark it if it holds no entry (an rmdir, before its record is removed there):
--          from then on nothing is created in it; ENOTEMPTY if something is
local op, ino = ARGV[1], ARGV[2]
if op == 'open' then
  redis.call('SET', P .. 'o:' .. ino, ARGV[3])
  return 1
end
if redis.call('HLEN', P .. 'd:' .. ino) > 0 then
  return err('ENOTEMPTY', 'directory not empty (another node added to it)')
end
return redis.call('DEL', P .. 'o:' .. ino)
