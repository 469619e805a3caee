-- ARGV: token  -> release the creation lock if this caller holds it
if redis.call('GET', P .. 'init') == ARGV[1] then redis.call('DEL', P .. 'init') end
return 1
