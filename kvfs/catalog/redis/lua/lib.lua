-- --- Lua -----------------------------------------------------------------------------------------
local P = KEYS[1]
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function err(code, msg) return redis.error_reply(code .. ' ' .. msg) end
-- a directory: its record is in this shard, or (a pool of several shards: docs/cluster.md)
-- its marker `o:<ino>` is, where its record is in its parent's shard and its entries here
local function is_dir(ino)
  return redis.call('HEXISTS', P .. 'n:' .. ino, 'd') == 1 or redis.call('EXISTS', P .. 'o:' .. ino) == 1
end
-- a directory's new mtime and ctime, where its record is in this shard
local function touch_dir(ino, t)
  if redis.call('EXISTS', P .. 'n:' .. ino) == 1 then
    redis.call('HSET', P .. 'n:' .. ino, 't', t, 'k', t)
    return true
  end
  return false
end
-- cache: region -> whether `token` holds its lease (one GET per region per script call)
local function leases_ok(token, regions, cache)
  for r in string.gmatch(regions, '%S+') do
    if cache[r] == nil then cache[r] = redis.call('GET', P .. 'lease:' .. r) == token end
    if not cache[r] then return false end
  end
  return true
end
local function bury(bid, grace, retired)
  if bid and bid ~= '' then
    redis.call('ZADD', P .. 'grave', now_ms() + tonumber(grace), bid)
    table.insert(retired, bid)
  end
end
local function drop_node(ino, grace, retired)
  local k = P .. 'n:' .. ino
  bury(redis.call('HGET', k, 'b'), grace, retired)
  redis.call('DEL', k, P .. 'd:' .. ino, P .. 'l:' .. ino)
  redis.call('ZREM', P .. 'atime', ino)
  redis.call('ZREM', P .. 'prio', ino)
end
-- records: pairs after the entry's own fields ('@n' ino [k v]*, '@b' id [k v]*, '@-' ino,
-- '@t' "parent time", '@l' ino [k v]*: kvfs/catalog/redis/codec.py). Many records go in
-- several entries, split between records (XADD's arguments pass through Lua's stack)
local function event(origin, inos, retired, key, value, records)
  local a = {P .. 'log', 'MAXLEN', '~', '@LOG_MAXLEN@', '*', 'o', origin}
  if #inos > 0 then table.insert(a, 'i'); table.insert(a, table.concat(inos, ' ')) end
  if #retired > 0 then table.insert(a, 'r'); table.insert(a, table.concat(retired, ' ')) end
  if key then table.insert(a, key); table.insert(a, value) end
  for i = 1, #(records or {}), 2 do
    if #a > 4000 and string.sub(records[i], 1, 1) == '@' then
      redis.call('XADD', unpack(a))
      a = {P .. 'log', 'MAXLEN', '~', '@LOG_MAXLEN@', '*', 'o', origin}
    end
    table.insert(a, records[i]); table.insert(a, records[i + 1])
  end
  return redis.call('XADD', unpack(a))
end
local function tail()
  local last = redis.call('XREVRANGE', P .. 'log', '+', '-', 'COUNT', 1)
  if last[1] then return last[1][1] end
  return '0-0'
end
