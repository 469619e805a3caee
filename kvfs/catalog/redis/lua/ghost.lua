-- ARGV: key -> the uses an evicted name had (then forgotten: the new file carries them), or nil
local uses = redis.call('HGET', P .. 'ghost', ARGV[1])
if uses then
  redis.call('HDEL', P .. 'ghost', ARGV[1])
  redis.call('ZREM', P .. 'ghosts', ARGV[1])
end
return uses
