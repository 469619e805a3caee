-- --- Lua -----------------------------------------------------------------------------------------
local P = KEYS[1]
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function err(code, msg) return redis.error_reply(code .. ' ' .. msg) end
local function is_dir(ino) return redis.call('HEXISTS', P .. 'n:' .. ino, 'd') == 1 end
local function leases_ok(token, regions)
  for r in string.gmatch(regions, '%S+') do
    if redis.call('GET', P .. 'lease:' .. r) ~= token then return false end
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
-- '@t' "parent time": kvfs/catalog/redis/codec.py)
local function event(origin, inos, retired, key, value, records)
  local a = {P .. 'log', 'MAXLEN', '~', '@LOG_MAXLEN@', '*', 'o', origin}
  if #inos > 0 then table.insert(a, 'i'); table.insert(a, table.concat(inos, ' ')) end
  if #retired > 0 then table.insert(a, 'r'); table.insert(a, table.concat(retired, ' ')) end
  if key then table.insert(a, key); table.insert(a, value) end
  if records then for i = 1, #records do table.insert(a, records[i]) end end
  return redis.call('XADD', unpack(a))
end
local function tail()
  local last = redis.call('XREVRANGE', P .. 'log', '+', '-', 'COUNT', 1)
  if last[1] then return last[1][1] end
  return '0-0'
end
