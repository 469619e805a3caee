-- Publish a batch of files' new versions (one close in "close" mode; a write-back batch in
-- "fsync" mode), each file on its own: one that fails is named in the reply, the others go on.
-- ARGV: origin token grace ptime nfiles, then per file:
--   ino parent name kind(new|old) regions bid ghost prio bpack npack nn [node k v]*nn
-- (kvfs.catalog.redis.codec.publish_args). bpack: the block record's fields, packed; stored as
-- the block's hash's one field `*`. npack: the node's fields packed (a new file: all of them;
-- a new version: those it changed), as the change-log entry carries them. A new file whose
-- nn is 0 is stored packed too: `p`, `n` and `b` (which the scripts read) and `*`; the node
-- fields given one by one (a new file with xattrs, a new version) are stored one by one, and
-- a field stored on its own overrides the packed one (kvfs.catalog.redis.codec.record).
-- Packed, a file costs Redis about 0.7x the time of a field per argument (docs/cluster.md).
-- new: a file this node created, first published under its name (replacing whatever file of
--      that name Redis holds: the last close wins); old: a new version of a published file.
-- prio: the file's priority in the pool's order (pool.evict = "prefix"), or ''.
-- ghost: the name's key among the evicted names whose uses the pool remembers (pool.evict =
--        "prefix"), or '': taken (forgotten) here, and the uses named in the reply.
-- The change-log entry carries the records it wrote (kvfs/catalog/redis/codec.py), so the
-- other nodes apply them without reading anything back.
-- Reply: {retired block ids, {"<ino> <ERRNO> message", ...} for the files not published,
--         {"<ino> <uses>", ...} for the files whose name's ghost was taken}.
local origin, token, grace, ptime = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local n = tonumber(ARGV[5])
local retired, failed, revived, entry = {}, {}, {}, {}
local atimes, prios, names, parents, leases, dirs = {}, {}, {}, {}, {}, {}
local now = now_ms()
local function dir_ok(ino)
  if dirs[ino] == nil then dirs[ino] = is_dir(ino) end
  return dirs[ino]
end
local a = 6
for _ = 1, n do
  local ino, parent, name, kind = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local regions, bid, ghost, prio = ARGV[a + 4], ARGV[a + 5], ARGV[a + 6], ARGV[a + 7]
  local bpack, npack, nn = ARGV[a + 8], ARGV[a + 9], tonumber(ARGV[a + 10])
  local n0 = a + 11
  a = n0 + 2 * nn
  local k = P .. 'n:' .. ino
  local why = nil
  local cur = nil
  if kind == 'new' then
    if not dir_ok(parent) then
      why = 'ENOENT the directory was removed (by another node?)'
    else
      cur = redis.call('HGET', P .. 'd:' .. parent, name)
      if cur == ino then cur = nil end
      if cur and is_dir(cur) then why = 'EISDIR another node made a directory of that name' end
    end
  elseif redis.call('EXISTS', k) == 0 then
    why = 'ENOENT the file was removed by another node'
  end
  if not why and not leases_ok(token, regions, leases) then
    why = 'ESTALE this node lost its allocation lease on the space it wrote; not publishing'
  end
  if why then
    table.insert(failed, ino .. ' ' .. why)
  else
    if cur then
      drop_node(cur, grace, retired)
      table.insert(entry, '@-'); table.insert(entry, cur)
    end
    if kind == 'old' then bury(redis.call('HGET', k, 'b'), grace, retired) end
    redis.call('HSET', P .. 'b:' .. bid, '*', bpack)
    if nn > 0 then
      redis.call('HSET', k, unpack(ARGV, n0, a - 1))
    else
      redis.call('HSET', k, 'p', parent, 'n', name, 'b', bid, '*', npack)
    end
    table.insert(entry, '@B' .. bid); table.insert(entry, bpack)
    if kind == 'new' then
      if names[parent] == nil then names[parent] = {}; table.insert(parents, parent) end
      table.insert(names[parent], name); table.insert(names[parent], ino)
      table.insert(entry, '@N' .. ino)  -- the node's whole hash
    else
      table.insert(entry, '@U' .. ino)  -- the fields this version changed
    end
    table.insert(entry, npack)
    table.insert(atimes, now); table.insert(atimes, ino)
    if prio ~= '' then table.insert(prios, prio); table.insert(prios, ino) end
    if ghost ~= '' then
      local uses = redis.call('HGET', P .. 'ghost', ghost)
      if uses then
        redis.call('HDEL', P .. 'ghost', ghost)
        redis.call('ZREM', P .. 'ghosts', ghost)
        table.insert(revived, ino .. ' ' .. uses)
      end
    end
  end
end
if #atimes > 0 then redis.call('ZADD', P .. 'atime', unpack(atimes)) end
if #prios > 0 then redis.call('ZADD', P .. 'prio', unpack(prios)) end
for _, parent in ipairs(parents) do
  redis.call('HSET', P .. 'd:' .. parent, unpack(names[parent]))
  if touch_dir(parent, ptime) then
    table.insert(entry, '@t'); table.insert(entry, parent .. ' ' .. ptime)
  end
end
if #entry > 0 then event(origin, {}, retired, nil, nil, entry) end
return {retired, failed, revived}
