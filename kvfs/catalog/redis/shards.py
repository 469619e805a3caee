"""Which Redis shard holds what, when one pool's catalog is spread over several
(`[cluster] shards`, docs/cluster.md "More than one Redis").

A directory's entries (`d:<ino>`), and the records of the files and directories named in it
(`n:<ino>`, their blocks `b:<id>`, chain links `l:<ino>`), are in the shard `of(directory
inode)`: a stable hash of the inode number, so every node computes it alike and a file's
record never moves (a rename to a directory of another shard is EXDEV, as across file
systems). A directory's own record is in its parent's shard; where its entries' shard differs,
that shard holds its marker `o:<ino>` (what a script there checks the directory by). Shard 0
also holds what the pool has one of: the node epochs, the allocation leases (copied to every
shard, where a publish checks them: leasecopy.lua), the eviction floor and the cleaner's lock.
With one shard everything is in shard 0, as before there were shards.
"""

from __future__ import annotations

import zlib


def shard_of(ino: int, count: int) -> int:
    """The shard that holds directory `ino`'s entries (of `count` shards)."""
    if count == 1:
        return 0
    return zlib.crc32(ino.to_bytes(8, "little")) % count
