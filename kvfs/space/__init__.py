"""Pool space: who may write how much where, and what is deleted to make room.

One interface, two implementations (the daemon picks one at start-up, nothing above branches):

* `LocalSpace` (kvfs/space/local.py): a pool used by this node alone. A retired block's space
  is free as soon as nobody reads it; a full pool evicts this node's files in the order of the
  pool's policy (`pool.evict = "prefix"`, kept in the catalog's rows) or least recently used.
* `ClusterSpace` (kvfs/cluster/space.py): a pool shared by several nodes through Redis. This
  node allocates only in regions it leases; retired blocks wait out a grace period in a grave
  (so another node still reading them is safe); eviction follows the cluster-wide order (the
  policy's, kept in Redis, or LRU) and one node at a time keeps `free_target` of the pool free
  ahead of writers.

The pool's policy (kvfs.tiers.scoring.PrefixScore) is shared by both (`Space.score_*`): it
scores each file at commit, read and rename; the catalog persists the scores.

Both hold the write sessions' reservations (a writer learns that the pool is full at write()),
and delete files through the `Evictor` they are built with (kvfs/space/base.py; the file layer's
answer, kvfs/fs/eviction.py, decides whether a file may go and tells the kernel).
"""

from kvfs.space.base import Evictor, Space
from kvfs.space.local import LocalSpace

__all__ = ["Evictor", "LocalSpace", "Space"]
