"""A node's part in a shared pool: the shared pool's space (space.py), over the Redis link
(kvfs/redis/). May call space/, catalog/ (its Redis leases), pool/ and redis/."""
