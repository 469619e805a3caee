"""Direct readers' leases and direct writers' allocations (kvfs.client.direct).

Readers: a block's extents are not reused while leased.
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


class Leases:
    def __init__(self, store: BlockStore):
        self.store = store
        self.held: dict[int, list[tuple[float, BlobRec]]] = {}  # generation -> [(expiry, rec)]
        self.stats = LeaseStats()

    def lease(self, node: Node, generation: int, ttl: float) -> None:
        """Hold the file's committed version `generation` for up to `ttl` seconds. ESTALE if
        the file's current version is another one."""
        if node.blob is None or node.blob.id != generation:
            raise KvfsError(
                errno.ESTALE,
                f"version {generation} is not the file's current one"
                f" ({node.blob.id if node.blob else 'none'})",
            )
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
    """Space handed to a direct writer: a block's stripe units, not yet published."""

    id: int
    ino: int
    layout: Layout  # the units' places (checksums unknown until commit)
    expires: float  # trio clock


@dataclass
class AllocationStats:
    allocations: int = 0
    direct_writes: int = 0  # blocks committed by direct writers
    direct_write_bytes: int = 0
    expired_allocations: int = 0


class Allocations:
    """Pool space for direct writers (kvfs.client.direct): `allocate` places a block's units like a
    commit would, the writer writes them straight to the namespaces, then commits them with
    their checksums (DirectAccess.direct_commit). Space not committed within its time is given back,
    as is an abandoned write session's."""

    def __init__(self, pool: Pool, space: Space):
        self.pool = pool
        self.space = space
        self.pending: dict[int, Allocation] = {}
        self.stats = AllocationStats()
        self._next = 1

    async def allocate(self, ino: int, size: int, ttl: float) -> Allocation:
        while True:
            try:
                ns, offsets = self.pool.allocate(size)
                break
            except KvfsError as e:
                if e.errno != errno.ENOSPC or not await self.space.make_room(ino, size):
                    raise
        layout = Layout(size, self.pool.unit, ns, offsets, (0,) * len(ns))
        a = Allocation(self._next, ino, layout, trio.current_time() + ttl)
        self._next += 1
        self.pending[a.id] = a
        self.stats.allocations += 1
        return a

    def latest(self, ino: int) -> Allocation:
        for a in reversed(self.pending.values()):
            if a.ino == ino:
                return a
        raise KvfsError(errno.ENODATA, "no direct-write allocation is pending for this file")

    def take(self, alloc_id: int, ino: int) -> Allocation:
        """The allocation to commit (it leaves the pending set); ESTALE if it expired."""
        a = self.pending.get(alloc_id)
        if a is None or a.ino != ino:
            raise KvfsError(
                errno.ESTALE,
                f"no live direct-write allocation {alloc_id} on this "
                f"file (expired, or committed already?)",
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

    @staticmethod
    def describe(a: Allocation, namespace_paths: list[str]) -> dict:
        lay = a.layout
        return {
            "alloc": a.id,
            "size": lay.size,
            "stripe_unit": lay.unit,
            "unit_map": [[lay.ns[k], lay.offsets[k]] for k in range(lay.nunits)],
            "namespace_paths": namespace_paths,
            "expires_in": round(max(0.0, a.expires - trio.current_time()), 3),
        }
