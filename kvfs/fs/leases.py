"""Direct readers' leases and direct writers' allocations (kvfs.client.direct).

Readers: a block's extents are not reused while leased.
A direct reader leases files by path in one request on the daemon's socket
(kvfs/fs/direct_socket.py), which answers with each file's current version and its layout,
reads the stripe units straight from the namespaces, and releases the leases in one more
request (a release counts the read as a hit). While leased, the store holds the block
(`BlockStore.hold`), so a rewrite or eviction retires it without freeing its space. A lease
belongs to the connection that took it: released by it, dropped when it closes, and expired
if it is not released in time (its reader died or stalled); a release that finds no live
lease fails with ESTALE, telling the reader its bytes may come from reused extents.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass

import trio

from kvfs.catalog.records import BlobRec, Node
from kvfs.errors import KvfsError
from kvfs.pool.layout import Layout
from kvfs.pool.pool import Pool
from kvfs.space import Space
from kvfs.tiers.store import BlockStore


@dataclass
class LeaseStats:
    leases: int = 0
    expired_leases: int = 0
    stale_releases: int = 0
    direct_reads: int = 0


@dataclass
class Lease:
    """A version held for a direct reader."""

    id: int
    owner: int  # the connection that took it
    ino: int
    rec: BlobRec
    expires: float  # trio clock


class Leases:
    def __init__(self, store: BlockStore):
        self.store = store
        self.held: dict[int, Lease] = {}  # by id
        self.stats = LeaseStats()
        self._next = 1

    def lease(self, node: Node, owner: int, ttl: float) -> Lease:
        """Hold the file's current version for up to `ttl` seconds."""
        rec = node.blob
        if rec is None:
            raise KvfsError(errno.EAGAIN, "the file has no committed content yet")
        self.store.hold(rec)
        lease = Lease(self._next, owner, node.ino, rec, trio.current_time() + ttl)
        self._next += 1
        self.held[lease.id] = lease
        self.stats.leases += 1
        return lease

    def release(self, lease_id: int, owner: int, hit: bool) -> Lease:
        """End a lease of this owner's; `hit`: the reader read the block (counted as a
        direct read). ESTALE if no live lease was left (it expired: the extents may have
        been reused)."""
        lease = self.held.get(lease_id)
        if lease is None or lease.owner != owner:
            self.stats.stale_releases += 1
            raise KvfsError(errno.ESTALE, f"no live lease {lease_id} (expired?)")
        del self.held[lease_id]
        self.store.unhold(lease.rec)
        if hit:
            self.stats.direct_reads += 1
            self.store.access_direct(lease.rec)
        return lease

    def live(self, lease_id: int, owner: int) -> Lease | None:
        lease = self.held.get(lease_id)
        return lease if lease is not None and lease.owner == owner else None

    def expire(self) -> int:
        """Drop leases past their time (their readers died or stalled)."""
        now = trio.current_time()
        gone = [lease for lease in self.held.values() if lease.expires < now]
        for lease in gone:
            del self.held[lease.id]
            self.store.unhold(lease.rec)
        self.stats.expired_leases += len(gone)
        return len(gone)

    def drop(self, owner: int) -> int:
        """End every lease of an owner that went away (a connection closed): its reads
        are over, or nobody will trust them."""
        gone = [lease for lease in self.held.values() if lease.owner == owner]
        for lease in gone:
            del self.held[lease.id]
            self.store.unhold(lease.rec)
        return len(gone)

    async def expire_periodically(self, allocations: "Allocations", log) -> None:
        while True:
            await trio.sleep(1.0)
            n = self.expire()
            if n:
                log.warning("%d direct-read lease(s) expired unreleased", n)
            n = allocations.expire()
            if n:
                log.warning("%d direct-write allocation(s) expired uncommitted", n)


@dataclass
class Allocation:
    """Space handed to a direct writer: a block's stripe units, not yet published, and the
    file it is for."""

    id: int
    owner: int  # the connection that asked
    layout: Layout  # the units' places (checksums unknown until commit)
    expires: float  # trio clock
    path: bytes  # the file to make, from the mount's root
    mode: int
    xattrs: dict[bytes, bytes]


@dataclass
class AllocationStats:
    allocations: int = 0
    direct_writes: int = 0  # blocks committed by direct writers
    direct_write_bytes: int = 0
    expired_allocations: int = 0


class Allocations:
    """Pool space for direct writers (kvfs.client.direct): `allocate` places a block's units like a
    commit would, the writer writes them straight to the namespaces, then commits them with
    their checksums (DirectAccess.commit). Space not committed within its time is given back,
    as is an abandoned write session's. (Not when its connection closes: a writer whose
    connection broke may still be writing there, until the deadline it was given.)"""

    def __init__(self, pool: Pool, space: Space):
        self.pool = pool
        self.space = space
        self.pending: dict[int, Allocation] = {}
        self.stats = AllocationStats()
        self._next = 1

    async def allocate(
        self, owner: int, size: int, ttl: float, path: bytes, mode: int, xattrs: dict
    ) -> Allocation:
        while True:
            try:
                ns, offsets = self.pool.allocate(size)
                break
            except KvfsError as e:
                if e.errno != errno.ENOSPC or not await self.space.make_room(0, size):
                    raise
        layout = Layout(size, self.pool.unit, ns, offsets, (0,) * len(ns))
        a = Allocation(self._next, owner, layout, trio.current_time() + ttl, path, mode, xattrs)
        self._next += 1
        self.pending[a.id] = a
        self.stats.allocations += 1
        return a

    def take(self, alloc_id: int, owner: int) -> Allocation:
        """The allocation to commit (it leaves the pending set); ESTALE if it expired."""
        a = self.pending.get(alloc_id)
        if a is None or a.owner != owner:
            raise KvfsError(
                errno.ESTALE,
                f"no live direct-write allocation {alloc_id} (expired, or committed already?)",
            )
        del self.pending[alloc_id]
        if a.expires < trio.current_time():
            self.pool.release(a.layout)
            self.stats.expired_allocations += 1
            raise KvfsError(errno.ESTALE, f"direct-write allocation {alloc_id} expired")
        return a

    def expire(self) -> int:
        now = trio.current_time()
        gone = [a for a in self.pending.values() if a.expires < now]
        for a in gone:
            del self.pending[a.id]
            self.pool.release(a.layout)
        self.stats.expired_allocations += len(gone)
        return len(gone)
