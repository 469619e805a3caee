-- ARGV: token ttl_ms region*  -> {region or '', log tail}
for i = 3, #ARGV do
  if redis.call('SET', P .. 'lease:' .. ARGV[i], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return {ARGV[i], tail()}
  end
end
return {'', tail()}
