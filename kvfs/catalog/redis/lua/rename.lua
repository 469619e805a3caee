-- ARGV: origin src pold nold pnew nnew flags grace cookie_src cookie_tgt now shard
-- (shard: this shard's index; a directory's record names where its entries are, `h`)
local origin, src, pold, nold, pnew, nnew = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local flags, grace, csrc, ctgt, now = tonumber(ARGV[7]), ARGV[8], ARGV[9], ARGV[10], ARGV[11]
local shard = ARGV[12] or '0'
if redis.call('HGET', P .. 'd:' .. pold, nold) ~= src then
  return err('ENOENT', 'renamed or removed by another node')
end
if not is_dir(pnew) then return err('ENOENT', 'the target directory was removed') end
if is_dir(src) then
  local x = pnew
  for _ = 1, 4096 do
    if x == src then return err('EINVAL', 'cannot move a directory into itself') end
    if x == '1' then break end
    x = redis.call('HGET', P .. 'n:' .. x, 'p')
    if not x then break end
  end
end
local tgt = redis.call('HGET', P .. 'd:' .. pnew, nnew)
local retired, inos = {}, {src, pold, pnew}
if tgt == src then return retired end
if flags == 2 then
  if not tgt then return err('ENOENT', 'the other name is gone') end
  redis.call('HSET', P .. 'd:' .. pold, nold, tgt)
  redis.call('HSET', P .. 'd:' .. pnew, nnew, src)
  redis.call('HSET', P .. 'n:' .. src, 'p', pnew, 'n', nnew, 'c', ctgt, 'k', now)
  redis.call('HSET', P .. 'n:' .. tgt, 'p', pold, 'n', nold, 'c', csrc, 'k', now)
  table.insert(inos, tgt)
else
  if tgt then
    if flags == 1 then return err('EEXIST', 'already exists (made by another node?)') end
    local sd, td = is_dir(src), is_dir(tgt)
    if sd and not td then return err('ENOTDIR', 'not a directory') end
    if td and not sd then return err('EISDIR', 'is a directory') end
    if td and (redis.call('HGET', P .. 'n:' .. tgt, 'h') or '0') ~= shard then
      return err('EXDEV', 'the directory replaced keeps its entries in another shard')
    end
    if td and redis.call('HLEN', P .. 'd:' .. tgt) > 0 then
      return err('ENOTEMPTY', 'directory not empty')
    end
    drop_node(tgt, grace, retired)
    table.insert(inos, tgt)
  end
  redis.call('HDEL', P .. 'd:' .. pold, nold)
  redis.call('HSET', P .. 'd:' .. pnew, nnew, src)
  redis.call('HSET', P .. 'n:' .. src, 'p', pnew, 'n', nnew, 'c', csrc, 'k', now)
end
touch_dir(pold, now)
touch_dir(pnew, now)
event(origin, inos, retired)
return retired
