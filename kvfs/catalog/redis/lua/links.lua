-- ARGV: origin [pred succ source delta]*   (delta '-' removes the link)
local preds, seen = {}, {}
for i = 2, #ARGV, 4 do
  local pred, succ, src, d = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3]
  local k = P .. 'l:' .. pred
  if d == '-' then
    redis.call('HDEL', k, succ)
  elseif redis.call('EXISTS', P .. 'n:' .. pred) == 1 and redis.call('EXISTS', P .. 'n:' .. succ) == 1 then
    local v, nv = redis.call('HGET', k, succ), nil
    if v then
      local s, w = string.match(v, '^(%d+) (%S+)$')
      s, w = tonumber(s), tonumber(w)
      if src > s then nv = string.format('%d %.6g', src, tonumber(d))
      elseif src == s then nv = string.format('%d %.6g', s, w + tonumber(d)) end
    else
      nv = string.format('%d %.6g', src, tonumber(d))
    end
    if nv then redis.call('HSET', k, succ, nv) end
    if redis.call('HLEN', k) > 8 then
      local all = redis.call('HGETALL', k)
      local weakest, ws, ww = nil, nil, nil
      for j = 1, #all, 2 do
        local s, w = string.match(all[j + 1], '^(%d+) (%S+)$')
        s, w = tonumber(s), tonumber(w)
        if weakest == nil or s < ws or (s == ws and w < ww) then weakest, ws, ww = all[j], s, w end
      end
      redis.call('HDEL', k, weakest)
    end
  end
  if not seen[pred] then seen[pred] = true; table.insert(preds, pred) end
end
if #preds > 0 then event(ARGV[1], {}, {}, 'l', table.concat(preds, ' ')) end
return #preds
