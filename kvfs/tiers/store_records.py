"""What the block store keeps per block, and what it counts (kvfs/tiers/store.py is the store)."""

from __future__ import annotations

import resource
from dataclasses import dataclass, field

from kvfs.catalog.records import BlobRec
from kvfs.pool.buffer import Buffer
from kvfs.tiers.fetch import Fetch


def _soft_nofile() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 22


def resident_limit() -> int:
    """How many blocks may be resident at once where each holds a descriptor for as long as
    it is resident (memfds): half of the descriptors the process may open (small blocks
    would otherwise exhaust them long before the DRAM tier's bytes, and a commit would fail
    with EMFILE). Named files (the private tmpfs) need no such limit: see `open_file_limit`."""
    return max(64, _soft_nofile() // 2)


def open_file_limit() -> int:
    """How many block files (on the private tmpfs) may be open at once before the store
    closes those of resident blocks nobody uses (`Buffer.park`): a quarter of the
    descriptors the process may open. Blocks in use (open handles, I/O, fetches, write
    sessions) keep theirs."""
    return max(32, _soft_nofile() // 4)


class CachedBlob:
    __slots__ = ("rec", "holders", "retired", "resident", "fetch", "owner", "pinned", "prefetched")

    def __init__(self, rec: BlobRec, owner: int):
        self.rec = rec
        self.owner = owner  # inode of the file whose version this is
        self.holders = 0
        self.retired = False
        self.resident: Buffer | None = None
        self.fetch: Fetch | None = None
        self.pinned = False
        self.prefetched = False  # resident through readahead and not read since


@dataclass
class TierStats:
    hits: int = 0  # block accesses (opens) served by this tier
    misses: int = 0  # block accesses that had to go to a slower tier
    bytes_in: int = 0  # bytes placed into this tier
    bytes_out: int = 0  # bytes read out of this tier
    evictions: int = 0


@dataclass
class StoreStats:
    read_requests: int = 0
    dram_request_hits: int = 0  # read requests served from a resident copy
    bytes_from_dram: int = 0  # requested bytes served from resident copies
    bytes_from_pool: int = 0  # block bytes read from the pool
    bytes_to_pool: int = 0
    fetches: int = 0
    fetch_errors: int = 0
    read_timeouts: int = 0  # readers that waited out read_timeout_ms (BlockStore._late)
    blocks_written: int = 0
    direct_reads: int = 0  # blocks read by direct readers (kvfs.client.direct), not through FUSE
    parked: int = 0  # resident blocks' files closed while unused (Buffer.park)
    prefetch_issued: int = 0
    prefetch_used: int = 0  # prefetched blocks a reader then read
    prefetch_joined: int = 0  # readers that arrived while the block's prefetch was running
    prefetch_wasted: int = 0  # prefetched blocks evicted or cancelled unread
    prefetch_cancelled: int = 0
    prefetch_skipped: int = 0  # not issued: no cold DRAM to displace
    tiers: dict = field(
        default_factory=lambda: {"dram": TierStats(), "local": TierStats(), "pool": TierStats()}
    )
