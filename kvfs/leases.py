"""Leases for direct readers (kvfs.direct): a block's extents are not reused while leased.

A direct reader reads a file's layout through the mount, leases that version
(`user.kvfs.lease`), reads the stripe units straight from the namespaces, and releases the
lease (`user.kvfs.release`, which counts the read as a hit). While leased, the store holds the
block (`BlockStore.hold`), so a rewrite or eviction retires it without freeing its space. A
lease that is not released in time (its reader died or stalled) expires; a release that finds
no live lease fails with ESTALE, telling the reader its bytes may come from reused extents.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass

import trio

from kvfs.catalog.base import BlobRec, Node
from kvfs.errors import KvfsError
from kvfs.store import BlockStore


@dataclass
class LeaseStats:
    leases: int = 0
    expired_leases: int = 0
    stale_releases: int = 0
    direct_reads: int = 0


class Leases:
    def __init__(self, store: BlockStore):
        self.store = store
        self.held: dict[int, list[tuple[float, BlobRec]]] = {}   # generation -> [(expiry, rec)]
        self.stats = LeaseStats()

    def lease(self, node: Node, generation: int, ttl: float) -> None:
        """Hold the file's committed version `generation` for up to `ttl` seconds. ESTALE if
        the file's current version is another one."""
        if node.blob is None or node.blob.id != generation:
            raise KvfsError(errno.ESTALE, f"version {generation} is not the file's current one"
                                          f" ({node.blob.id if node.blob else 'none'})")
        self.store.hold(node.blob)
        self.held.setdefault(generation, []).append((trio.current_time() + ttl, node.blob))
        self.stats.leases += 1

    def release(self, generation: int, hit: bool) -> BlobRec:
        """End a lease; `hit`: the reader read the block (counted as a direct read). ESTALE if
        no live lease was left (it expired: the extents may have been reused)."""
        held = self.held.get(generation)
        if not held:
            self.stats.stale_releases += 1
            raise KvfsError(errno.ESTALE, f"no live lease on version {generation} (expired?)")
        _, rec = held.pop(0)
        if not held:
            del self.held[generation]
        self.store.unhold(rec)
        if hit:
            self.stats.direct_reads += 1
            self.store.access_direct(rec)
        return rec

    def expire(self) -> int:
        """Drop leases past their time (their readers died or stalled)."""
        now = trio.current_time()
        n = 0
        for gen in list(self.held):
            keep = []
            for item in self.held[gen]:
                if item[0] < now:
                    self.store.unhold(item[1])
                    n += 1
                else:
                    keep.append(item)
            if keep:
                self.held[gen] = keep
            else:
                del self.held[gen]
        self.stats.expired_leases += n
        return n

    async def expire_periodically(self, log) -> None:
        while True:
            await trio.sleep(1.0)
            n = self.expire()
            if n:
                log.warning("%d direct-read lease(s) expired unreleased", n)
