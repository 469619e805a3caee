"""Block placement and caching: the DRAM tier over the pool.

The store knows blocks (`BlobRec`s), not names. For each block it tracks:

* holders: open handles (and in-flight fetches) that may still read it. A block's extents are
  released to the pool only when it is retired (no longer any file's current version) *and* has
  no holders, so a reader that opened an old version keeps reading it after a rewrite.
* residency: a complete copy in DRAM (`resident`), or a fetch in progress whose units become
  readable one by one (`Fetch.ready[k]`), so a read at offset o returns as soon as the units
  covering o have arrived while the rest keep streaming.

DRAM holds clean copies only: a block is durable in the pool before it is resident, so dropping
a resident copy is always free. Write buffers of open write sessions are charged to the same
budget but cannot be evicted. Eviction from DRAM is least-recently-used among unpinned,
resident blocks, preferring blocks nobody holds open.

The store also keeps the recency of every current block (`pool_victims`), which the files
layer uses to pick what to delete when the pool is full and `evict = "lru"`.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass
from typing import Iterator

import trio

from kvfs.aio import run_all
from kvfs.buffer import Buffer
from kvfs.catalog.base import BlobRec
from kvfs.errors import KvfsError
from kvfs.layout import Layout, units_covering
from kvfs.pool import Pool

log = logging.getLogger("kvfs.store")


class Fetch:
    """One attempt to bring a whole block into DRAM."""

    __slots__ = ("buffer", "ready", "errors", "queues", "started")

    def __init__(self, buffer: Buffer, nunits: int):
        self.buffer = buffer
        self.ready = [trio.Event() for _ in range(nunits)]
        self.errors: dict[int, KvfsError] = {}
        self.queues: dict[int, collections.deque[int]] = {}   # namespace -> units not yet issued
        self.started = 0


class CachedBlob:
    __slots__ = ("rec", "holders", "retired", "resident", "fetch", "owner")

    def __init__(self, rec: BlobRec, owner: int):
        self.rec = rec
        self.owner = owner            # inode of the file whose version this is
        self.holders = 0
        self.retired = False
        self.resident: Buffer | None = None
        self.fetch: Fetch | None = None


@dataclass
class StoreStats:
    read_requests: int = 0
    dram_hits: int = 0            # read requests served from a resident copy
    dram_misses: int = 0          # read requests that waited for the pool
    bytes_from_dram: int = 0      # requested bytes served from resident copies
    bytes_from_pool: int = 0      # block bytes read from the pool (fetches and uncached reads)
    bytes_to_pool: int = 0
    fetches: int = 0
    fetch_errors: int = 0
    dram_evictions: int = 0
    blocks_written: int = 0


class BlockStore:
    def __init__(self, pool: Pool, dram_capacity: int):
        self.pool = pool
        self.capacity = dram_capacity
        self.blobs: dict[int, CachedBlob] = {}
        self.dram: collections.OrderedDict[int, CachedBlob] = collections.OrderedDict()
        self.dram_used = 0            # resident copies and fetch buffers
        self.charged = 0              # write-session buffers
        self.recency: collections.OrderedDict[int, int] = collections.OrderedDict()  # blob -> ino
        self.stats = StoreStats()
        self._nursery: trio.Nursery | None = None

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run the store's background work (fetches) until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    # --- lifecycle of a block ----------------------------------------------------------------
    def _get(self, rec: BlobRec, owner: int = 0) -> CachedBlob:
        cb = self.blobs.get(rec.id)
        if cb is None:
            cb = self.blobs[rec.id] = CachedBlob(rec, owner or self.recency.get(rec.id, 0))
        return cb

    def track(self, rec: BlobRec, ino: int) -> None:
        """A block became (or at start-up, is) the current version of file `ino`."""
        self.recency[rec.id] = ino
        self.recency.move_to_end(rec.id)

    def hold(self, rec: BlobRec) -> None:
        self._get(rec).holders += 1

    def unhold(self, rec: BlobRec) -> None:
        cb = self.blobs.get(rec.id)
        if cb is None:
            return
        cb.holders -= 1
        self._maybe_forget(cb)

    def retire(self, rec: BlobRec) -> None:
        """The block is no longer any file's version: free it once nobody reads it."""
        self.recency.pop(rec.id, None)
        cb = self._get(rec)
        cb.retired = True
        self._maybe_forget(cb)

    def _maybe_forget(self, cb: CachedBlob) -> None:
        if cb.holders > 0 or cb.fetch is not None:
            return
        if cb.retired:
            self._drop_resident(cb)
            self.pool.release(cb.rec.layout)
            del self.blobs[cb.rec.id]
        elif cb.resident is None:
            del self.blobs[cb.rec.id]

    def is_held(self, blob_id: int) -> bool:
        cb = self.blobs.get(blob_id)
        return cb is not None and (cb.holders > 0 or cb.fetch is not None)

    def pool_victims(self) -> Iterator[tuple[int, int]]:
        """(blob id, inode) of current blocks from least to most recently used, skipping held ones."""
        for bid, ino in list(self.recency.items()):
            if not self.is_held(bid):
                yield bid, ino

    # --- DRAM accounting -----------------------------------------------------------------------
    def is_resident(self, rec: BlobRec) -> bool:
        cb = self.blobs.get(rec.id)
        return cb is not None and cb.resident is not None

    def charge(self, nbytes: int) -> None:
        """Account write-buffer memory; make room by evicting clean copies."""
        self.charged += nbytes
        if nbytes > 0:
            self._make_room(0)

    def _drop_resident(self, cb: CachedBlob) -> None:
        if cb.resident is not None:
            self.dram_used -= cb.resident.nbytes
            cb.resident = None
            self.dram.pop(cb.rec.id, None)

    def _make_room(self, need: int) -> None:
        """Evict resident copies until `need` more bytes fit (unheld ones first)."""
        excess = self.dram_used + self.charged + need - self.capacity
        if excess <= 0:
            return
        for pass_held in (False, True):
            for bid, cb in list(self.dram.items()):
                if excess <= 0:
                    return
                if (cb.holders > 0) != pass_held:
                    continue
                excess -= cb.resident.nbytes
                self._drop_resident(cb)
                self.stats.dram_evictions += 1
                self._maybe_forget(cb)

    def drop_dram(self) -> int:
        """Drop every resident copy (they are all in the pool); return the bytes freed."""
        before = self.dram_used
        for cb in list(self.dram.values()):
            self._drop_resident(cb)
            self._maybe_forget(cb)
        return before - self.dram_used

    def adopt(self, rec: BlobRec, buf: Buffer, ino: int, charged: int) -> None:
        """Keep a just-committed buffer as the resident copy of `rec`: the `charged` bytes it
        was accounted as a write buffer now count as a clean, evictable copy."""
        self.track(rec, ino)
        cb = self._get(rec, ino)
        self.charged -= charged
        cb.resident = buf
        self.dram_used += buf.nbytes
        self.dram[rec.id] = cb
        self._make_room(0)

    # --- reads ---------------------------------------------------------------------------------
    def touch(self, rec: BlobRec) -> None:
        """Record a use of the block (an open): it becomes the most recently used."""
        if rec.id in self.recency:
            self.recency.move_to_end(rec.id)
        if rec.id in self.dram:
            self.dram.move_to_end(rec.id)

    async def read(self, rec: BlobRec, offset: int, length: int):
        """Bytes [offset, offset+length) of a block, clipped to its size.

        A memoryview into the resident copy when there is one (zero-copy); otherwise waits only
        for the units that cover the range. Raises KvfsError(EIO) if one of them cannot be read
        or fails its checksum; the next read retries.
        """
        stats = self.stats
        stats.read_requests += 1
        cb = self.blobs.get(rec.id)
        if cb is not None and cb.resident is not None:     # the hot path: one dict lookup
            stats.dram_hits += 1
            data = cb.resident.view(offset, length)
            stats.bytes_from_dram += len(data)
            return data
        if offset >= rec.size:
            return b""
        stats.dram_misses += 1
        if rec.size > self.capacity:
            return await self._read_uncached(rec, offset, length)
        if cb is None:
            cb = self._get(rec)
        fetch = cb.fetch or self._start_fetch(cb)
        layout = rec.layout
        for k in units_covering(offset, length, rec.size, layout.unit):
            if not fetch.ready[k].is_set():
                self._expedite(fetch, layout, k)
                await fetch.ready[k].wait()
            err = fetch.errors.get(k)
            if err is not None:
                raise KvfsError(err.errno, str(err))
        return fetch.buffer.view(offset, length)

    async def read_all(self, rec: BlobRec) -> Buffer:
        """The whole block in a Buffer (resident, or fetched); raises EIO on failure."""
        if rec.size:
            await self.read(rec, 0, rec.size)
        cb = self.blobs.get(rec.id)
        if cb is not None and cb.resident is not None:
            return cb.resident
        if cb is not None and cb.fetch is not None:      # completed units, fetch still finishing
            buf = cb.fetch.buffer
            await self.read(rec, 0, rec.size)
            return buf
        buf = Buffer(self.pool.chunk, rec.size, allocate=True)   # larger than DRAM: uncached
        await self._read_units(rec.layout, range(rec.layout.nunits), buf)
        return buf

    async def _read_uncached(self, rec: BlobRec, offset: int, length: int):
        """Read the covering units into a temporary buffer (blocks larger than the DRAM tier)."""
        layout = rec.layout
        ks = units_covering(offset, length, rec.size, layout.unit)
        tmp = Buffer(self.pool.chunk, rec.size)      # chunks appear only where units land
        self.hold(rec)
        try:
            await self._read_units(layout, ks, tmp)
        finally:
            self.unhold(rec)
        return bytes(tmp.view(offset, length))

    async def _read_units(self, layout: Layout, ks, buf: Buffer) -> None:
        await run_all((lambda k=k: self._read_unit(layout, k, buf)) for k in ks)

    async def _read_unit(self, layout: Layout, k: int, buf: Buffer) -> None:
        await self.pool.read_unit(layout, k, buf)
        self.stats.bytes_from_pool += layout.unit_span(k)[1]

    def _start_fetch(self, cb: CachedBlob) -> Fetch:
        rec = cb.rec
        layout = rec.layout
        chunk = self.pool.chunk
        self._make_room((rec.size + chunk - 1) // chunk * chunk)
        fetch = Fetch(Buffer(self.pool.chunk, rec.size, allocate=True), layout.nunits)
        for k in range(layout.nunits):
            fetch.queues.setdefault(layout.ns[k], collections.deque()).append(k)
        cb.fetch = fetch
        self.dram_used += fetch.buffer.nbytes
        self.stats.fetches += 1
        assert self._nursery is not None, "BlockStore.serve() is not running"
        self._nursery.start_soon(self._run_fetch, cb, fetch)
        return fetch

    @staticmethod
    def _expedite(fetch: Fetch, layout: Layout, k: int) -> None:
        """A reader waits for unit k: issue it before the namespace's other queued units."""
        q = fetch.queues.get(layout.ns[k])
        if q and q[0] != k and k in q:
            q.remove(k)
            q.appendleft(k)

    async def _run_fetch(self, cb: CachedBlob, fetch: Fetch) -> None:
        layout = cb.rec.layout
        units = {j: len(q) for j, q in fetch.queues.items()}
        t0 = time.perf_counter()
        done: dict[int, float] = {}

        async def worker(j: int, q: collections.deque[int]) -> None:
            while q:
                k = q.popleft()
                try:
                    await self._read_unit(layout, k, fetch.buffer)
                except KvfsError as e:
                    fetch.errors[k] = e
                finally:
                    fetch.ready[k].set()
                done[j] = time.perf_counter() - t0

        async with trio.open_nursery() as nursery:
            for j, q in fetch.queues.items():
                for _ in range(min(len(q), self.pool.namespaces[j].queue_depth)):
                    nursery.start_soon(worker, j, q)
        cb.fetch = None
        if not fetch.errors:
            self.pool.observe(units, done)
        if fetch.errors:
            self.stats.fetch_errors += 1
            self.dram_used -= fetch.buffer.nbytes
        else:
            cb.resident = fetch.buffer
            self.dram[cb.rec.id] = cb
            self._make_room(0)
        self._maybe_forget(cb)

    # --- writes --------------------------------------------------------------------------------
    async def write(self, buf: Buffer, size: int) -> Layout:
        """Write a block to the pool (durable on return); raises ENOSPC or EIO."""
        layout = await self.pool.write_block(buf, size)
        self.stats.blocks_written += 1
        self.stats.bytes_to_pool += size
        return layout
