-- ARGV: origin both [pred succ source delta]*   (delta '-' removes the link; both: '1' if
-- the successor's record is in this shard too, and checked to exist, as the predecessor's is)
-- A predecessor keeps its 8 strongest links. The change-log entry carries each changed
-- predecessor's links as they are now ('@l' pred [succ "source weight"]*), so the other nodes
-- install them without reading anything back.
local preds, seen, records = {}, {}, {}
local both = ARGV[2] == '1'
for i = 3, #ARGV, 4 do
  local pred, succ, src, d = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3]
  local k = P .. 'l:' .. pred
  local changed = false
  if d == '-' then
    changed = redis.call('HDEL', k, succ) == 1
  elseif (both and redis.call('EXISTS', P .. 'n:' .. pred, P .. 'n:' .. succ) == 2)
      or (not both and redis.call('EXISTS', P .. 'n:' .. pred) == 1) then
    changed = true
    if redis.call('HSETNX', k, succ, string.format('%d %.6g', src, tonumber(d))) == 0 then
      local s, w = string.match(redis.call('HGET', k, succ), '^(%d+) (%S+)$')
      s, w = tonumber(s), tonumber(w)
      local nv = nil
      if src > s then nv = string.format('%d %.6g', src, tonumber(d))
      elseif src == s then nv = string.format('%d %.6g', s, w + tonumber(d)) end
      if nv then redis.call('HSET', k, succ, nv) else changed = false end
    end
  end
  if changed and not seen[pred] then seen[pred] = true; table.insert(preds, pred) end
end
for _, pred in ipairs(preds) do
  local k = P .. 'l:' .. pred
  local all = redis.call('HGETALL', k)
  while #all > 16 do
    local weakest, ws, ww = nil, nil, nil
    for j = 1, #all, 2 do
      local s, w = string.match(all[j + 1], '^(%d+) (%S+)$')
      s, w = tonumber(s), tonumber(w)
      if weakest == nil or s < ws or (s == ws and w < ww) then weakest, ws, ww = j, s, w end
    end
    redis.call('HDEL', k, all[weakest])
    table.remove(all, weakest + 1)
    table.remove(all, weakest)
  end
  table.insert(records, '@l'); table.insert(records, pred)
  for j = 1, #all do table.insert(records, all[j]) end
end
if #records > 0 then event(ARGV[1], {}, {}, nil, nil, records) end
return #preds
