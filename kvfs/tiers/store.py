"""Block placement and caching: the DRAM tier (and an optional local tier) over the pool.

The store knows blocks (`BlobRec`s), not names. For each block it tracks:

* holders: open handles (and in-flight fetches) that may still read it. A block's extents are
  released (`on_free`, to the space layer) only when it is retired (no longer any file's current
  version) *and* has no holders, so a reader that opened an old version keeps reading it.
* residency: a complete copy in DRAM (`resident`, a memfd the kernel may serve directly through
  FUSE passthrough), or a fetch in progress (kvfs/tiers/fetch.py) whose units become readable one by
  one, so a read through the daemon returns once the units it covers have arrived.

Tiers, fastest first: DRAM (volatile), local (optional: a node-local NVMe device or file,
`kvfs/tiers/local.py`), pool. DRAM holds clean copies only: a block is durable in the pool
before it is resident, so dropping a resident copy is always free; write buffers of open sessions
are charged to the same budget but cannot be evicted. Which resident block leaves is decided by
the tier's eviction policy (`kvfs/tiers/policy.py`); pinned blocks never leave, blocks someone
holds open leave last (never, under passthrough: the kernel holds their memory). A block evicted
from DRAM is demoted to the local tier when that tier's admission policy agrees; a block read
from a slower tier is promoted into faster ones the same way.

Fetches run at one of two priorities: demand (a reader waits) and prefetch (readahead). Demand
I/O always goes first on every namespace; a prefetch may only displace blocks the DRAM policy
considers cold, and can be cancelled while its units are still queued.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import itertools
import logging
from typing import Callable

import trio

from kvfs.catalog.records import BlobRec
from kvfs.errors import KvfsError
from kvfs.pool.buffer import MEMORY, Buffer, Spares
from kvfs.pool.layout import PAGE, Layout, align_up, units_covering
from kvfs.pool.pool import Pool
from kvfs.tiers.fetch import FETCH_RUN, Fetch, Fetcher
from kvfs.tiers.index import TierIndex
from kvfs.tiers.policy import AlwaysAdmit, make_policy
from kvfs.tiers.store_records import CachedBlob, StoreStats, open_file_limit, resident_limit
from kvfs.tiers.waits import ReadWaits

log = logging.getLogger("kvfs.tiers.store")

# Prefetches fetched at the same time (more would share the bandwidth and delay the next block).
PREFETCH_FETCHES = 2


class BlockStore:
    def __init__(
        self,
        pool: Pool,
        dram_capacity: int,
        *,
        policy: str = "prefix",
        local=None,
        on_free: Callable[[Layout], None] | None = None,
    ):
        self.pool = pool
        # on_free(layout): a retired block nobody here reads any more (the space layer decides
        # when its extents may be reused)
        self.on_free = on_free
        self.capacity = dram_capacity
        self.dram = TierIndex(dram_capacity, make_policy(policy, dram_capacity, pool.chunk))
        # A resident block's file holds a descriptor while it is open. Named files (the private
        # tmpfs) are closed when unused and too many are open (`_park_idle`): the blocks in
        # DRAM are then bounded by its bytes alone. Memfds cannot be reopened: their count is.
        self.max_resident = resident_limit() if not MEMORY.named else 1 << 62
        self.max_open_files = open_file_limit()
        self._open: collections.OrderedDict[int, CachedBlob] = collections.OrderedDict()
        self.admission = AlwaysAdmit()
        self.local = local  # LocalTier or None
        self.blobs: dict[int, CachedBlob] = {}
        self.charged = 0  # write-session buffers
        self.inflight = 0  # buffers of fetches in progress
        # memory of evicted blocks, kept (within the unused capacity) for the next fetches
        self.spares = Spares(self._unused)
        self.pinned_bytes = 0
        self._prefetch_queue: collections.OrderedDict[int, tuple] = collections.OrderedDict()
        self._prefetch_running = 0
        self.stats = StoreStats()
        self.fetcher = Fetcher(pool, local, self.stats)
        self.waits = ReadWaits(pool, self.stats)  # a reader's bounded wait (read_timeout_ms)
        self._nursery: trio.Nursery | None = None
        self.passthrough = False  # open handles may be served by the kernel itself

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run the store's background work (fetches, demotions) until cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self.spares.close()

    def _unused(self) -> int:
        """DRAM capacity no resident copy, write buffer or fetch takes (what spares may fill)."""
        return self.capacity - self.dram.used - self.charged - self.inflight

    @property
    def dram_used(self) -> int:
        return self.dram.used

    def memfd_bytes(self) -> int:
        """Memory the resident copies, fetches in flight and spares occupy (their pages)."""
        total = self.spares.bytes
        total += sum(cb.resident.nbytes for cb in self.blobs.values() if cb.resident is not None)
        return total + sum(
            cb.fetch.buffer.nbytes for cb in self.blobs.values() if cb.fetch is not None
        )

    def statistics(self) -> dict:
        """{"tiers": per-tier counters and the DRAM tier's state, "store": request and fetch
        counters, "prefetch": readahead counters} (a snapshot)."""
        st = self.stats
        tiers = {name: dataclasses.asdict(t) for name, t in st.tiers.items()}
        policy = self.dram.policy
        tiers["dram"].update(
            {
                "capacity": self.capacity,
                "used": self.dram.used + self.charged + self.inflight,
                "resident": self.dram.used,
                "write_buffers": self.charged,
                "fetching": self.inflight,
                "spare": self.spares.bytes,
                "pinned": self.pinned_bytes,
                "blocks": len(self.dram.sizes),
                "policy": policy.name,
                "policy_mode": getattr(policy, "mode_name", policy.name),
            }
        )
        # (tiers.pool.blocks, the files with a committed block, is the catalog's: service.py)
        # blocks held now (open handles, fetches, leases, copies): a leak shows here
        tiers["pool"]["held_blocks"] = sum(1 for cb in self.blobs.values() if cb.holders > 0)
        if self.local is None:
            del tiers["local"]
        else:
            tiers["local"].update(self.local.statistics())
        counters = dataclasses.asdict(st)
        del counters["tiers"]
        counters["spares_kept"] = self.spares.kept
        counters["open_block_files"] = MEMORY.open_files
        counters["spares_reused"] = self.spares.reused
        prefetch = {
            k[len("prefetch_") :]: counters.pop(k)
            for k in list(counters)
            if k.startswith("prefetch_")
        }
        return {"tiers": tiers, "store": counters, "prefetch": prefetch}

    # --- lifecycle of a block ----------------------------------------------------------------
    def _get(self, rec: BlobRec, owner: int = 0) -> CachedBlob:
        cb = self.blobs.get(rec.id)
        if cb is None:
            cb = self.blobs[rec.id] = CachedBlob(rec, owner)
        elif owner and not cb.owner:
            cb.owner = owner
        return cb

    def hold(self, rec: BlobRec, owner: int = 0) -> None:
        """Someone reads the block (`owner`: the file it is a version of, when known)."""
        cb = self._get(rec, owner)
        cb.holders += 1
        if cb.resident is not None:
            self._used(cb)

    def unhold(self, rec: BlobRec) -> None:
        cb = self.blobs.get(rec.id)
        if cb is None:
            return
        cb.holders -= 1
        self._maybe_forget(cb)
        if cb.holders == 0:
            self._park_idle()

    # --- descriptors of resident blocks ------------------------------------------------------
    def _used(self, cb: CachedBlob) -> None:
        """A resident block is used (its file may be open now): most recently used last."""
        self._open[cb.rec.id] = cb
        self._open.move_to_end(cb.rec.id)

    def _park_idle(self) -> None:
        """Over `max_open_files` open block files, close those of the resident blocks used
        least recently that nobody holds, down to three quarters of it (they are reopened by
        name when used again). Only the trio thread parks, and only blocks no handle, lease,
        copy or fetch holds: no worker thread has their descriptor then."""
        if not MEMORY.named or MEMORY.open_files <= self.max_open_files:
            return
        target = self.max_open_files * 3 // 4
        # (a bounded look at the least recently used: blocks held open stay at the front, and
        # a long scan past them at every release would be quadratic)
        scan = 4 * (MEMORY.open_files - target) + 64
        for bid, cb in list(itertools.islice(self._open.items(), scan)):
            if cb.resident is None or self.blobs.get(bid) is not cb:
                del self._open[bid]
            elif cb.holders == 0 and cb.fetch is None:
                cb.resident.park()
                del self._open[bid]
                self.stats.parked += 1
            if MEMORY.open_files <= target:
                return

    def retire(self, rec: BlobRec) -> None:
        """The block is no longer any file's version: free it once nobody reads it."""
        cb = self._get(rec)
        cb.retired = True
        if cb.pinned:
            self._set_pinned(cb, False)
        if self.local is not None:
            self.local.drop(rec.id)
        self._maybe_forget(cb)

    def _maybe_forget(self, cb: CachedBlob) -> None:
        if cb.holders > 0 or cb.fetch is not None:
            return
        if cb.retired:
            self._drop_resident(cb)
            if self.on_free is not None:
                self.on_free(cb.rec.layout)
            del self.blobs[cb.rec.id]
        elif cb.resident is None and not cb.pinned:
            del self.blobs[cb.rec.id]

    def is_held(self, blob_id: int) -> bool:
        cb = self.blobs.get(blob_id)
        return cb is not None and (cb.holders > 0 or cb.fetch is not None or cb.pinned)

    # --- DRAM accounting -----------------------------------------------------------------------
    def tier_of(self, rec: BlobRec) -> str:
        cb = self.blobs.get(rec.id)
        if cb is not None and cb.resident is not None:
            return "dram"
        if self.local is not None and self.local.has(rec.id):
            return "local"
        return "pool"

    def is_resident(self, rec: BlobRec) -> bool:
        cb = self.blobs.get(rec.id)
        return cb is not None and cb.resident is not None

    def set_capacity(self, capacity: int) -> None:
        """Resize the DRAM tier (the control file's `set dram.capacity`): its index and its
        policy's simulations take the new size; resident copies over it are evicted."""
        self.capacity = capacity
        self.dram.policy.resize(capacity)
        self._make_room(0)

    def charge(self, nbytes: int) -> None:
        """Account write-buffer memory; make room by evicting clean copies."""
        self.charged += nbytes
        if nbytes > 0:
            self._make_room(0)

    def _drop_resident(self, cb: CachedBlob) -> None:
        if cb.resident is not None:
            self.dram.remove(cb.rec.id)  # first: the buffer may become a spare now
            self._unload(cb)

    def _unload(self, cb: CachedBlob):
        """The block is no longer resident: its buffer (the caller demotes or drops it). Every
        place a resident copy ends goes through here, so `_open` (which `_park_idle` prunes
        only over its descriptor limit) does not keep the CachedBlob of every block ever
        evicted: it did, about 1 KB each, the soak's steady growth."""
        buf, cb.resident = cb.resident, None
        self._open.pop(cb.rec.id, None)
        if cb.prefetched:
            cb.prefetched = False
            self.stats.prefetch_wasted += 1
        return buf

    def _evictable(self, strict: bool):
        blobs = self.blobs

        def ok(bid) -> bool:
            cb = blobs.get(bid)
            if cb is None or cb.pinned or cb.resident is None:
                return False
            return cb.holders == 0 or not strict

        return ok

    def _make_room(self, need: int, *, cold_only: bool = False) -> bool:
        """Evict resident copies until `need` more bytes fit; with `cold_only` (prefetch) only
        blocks the policy calls cold and nobody holds. False if that is not possible. Blocks
        someone holds open go last, and never while the kernel may read them itself
        (`passthrough`: dropping them would free no memory)."""
        self.dram.capacity = max(0, self.capacity - self.charged - self.inflight)
        self.spares.trim(self._unused())
        victims = self.dram.make_room(need, self._evictable(True), cold_only)
        if not self.dram.fits(need) and not cold_only and not self.passthrough:
            victims += self.dram.make_room(need, self._evictable(False))
        for bid in victims:  # out of the index: drop them (also when not enough)
            self._evicted(bid)
        return self.dram.fits(need)

    def _room_for_one(self) -> bool:
        """Make room for one more resident block under `max_resident` (evicting by the policy,
        blocks nobody holds); False if that is not possible."""
        ok = self._evictable(True)
        while len(self.dram.sizes) >= self.max_resident:
            bid = self.dram.policy.victim(ok)
            if bid is None:
                return False
            self.dram.used -= self.dram.sizes.pop(bid)
            self._evicted(bid)
        return True

    def _evicted(self, bid: int) -> None:
        """The DRAM policy evicted block `bid` (it is out of the tier's index): its resident
        copy goes, to the local tier if that admits it (`_demote`)."""
        cb = self.blobs.get(bid)
        if cb is not None:
            self.stats.tiers["dram"].evictions += 1
            self._demote(cb, self._unload(cb))
            self._maybe_forget(cb)

    def _demote(self, cb: CachedBlob, buf: Buffer | None) -> None:
        """A block leaves DRAM: keep a copy in the local tier if its admission agrees."""
        local = self.local
        if local is None or buf is None or cb.retired or local.has(cb.rec.id):
            return
        if not local.admission.admit(cb.rec.id, cb.rec.size):
            return
        if self._nursery is not None:
            self.hold(cb.rec)
            self._nursery.start_soon(self._copy_to_local, cb, buf)

    async def _copy_to_local(self, cb: CachedBlob, buf: Buffer) -> None:
        try:
            if await self.local.store(cb.rec, buf):
                self.stats.tiers["local"].bytes_in += cb.rec.size
        except KvfsError as e:
            log.warning("local tier: copy of block %d failed: %s", cb.rec.id, e)
        finally:
            self.unhold(cb.rec)

    def drop_dram(self) -> int:
        """Drop every unpinned resident copy (they are all in the pool); return the bytes freed."""
        before = self.dram.used
        for bid in list(self.dram.keys()):
            cb = self.blobs.get(bid)
            if cb is not None and not cb.pinned:
                self._drop_resident(cb)
                self._maybe_forget(cb)
        return before - self.dram.used

    def adopt(
        self,
        rec: BlobRec,
        buf: Buffer,
        ino: int,
        charged: int,
        parent=None,
        nbytes: int | None = None,
    ) -> None:
        """Keep a just-committed buffer as the resident copy of `rec`: the `charged` bytes it
        was accounted as a write buffer now count as a clean, evictable copy (`nbytes`, its
        memory, if the caller knows it)."""
        cb = self._get(rec, ino)
        self.charged -= charged
        buf.recycle(self.spares)
        if cb.resident is not None or cb.retired:  # it has a copy already, or is gone
            return
        # an empty block counts as a page: the policy's history (ghosts, simulated experts) is
        # bounded in bytes, and blocks of 0 bytes would otherwise fill it without bound
        nbytes = max(buf.nbytes if nbytes is None else nbytes, PAGE)
        self._make_room(nbytes)
        if not self._room_for_one():
            self._maybe_forget(cb)  # durable in the pool; not kept in DRAM
            return
        cb.resident = buf
        self.dram.add(rec.id, nbytes, parent)
        self.stats.tiers["dram"].bytes_in += rec.size
        self._used(cb)
        self._park_idle()

    # --- pinning -------------------------------------------------------------------------------
    def _set_pinned(self, cb: CachedBlob, on: bool) -> None:
        if cb.pinned == on:
            return
        cb.pinned = on
        self.pinned_bytes += cb.rec.size if on else -cb.rec.size

    async def pin(self, rec: BlobRec) -> None:
        """Keep the block resident until unpinned (fetched now if needed). ENOSPC if pinned
        blocks would not fit in the DRAM tier."""
        cb = self._get(rec)
        if cb.pinned:
            return
        if self.pinned_bytes + rec.size > self.capacity - self.charged:
            raise KvfsError(
                errno.ENOSPC,
                f"pinning {rec.size} bytes would exceed the DRAM "
                f"tier ({self.pinned_bytes} bytes pinned of "
                f"{self.capacity})",
            )
        self._set_pinned(cb, True)
        self.hold(rec)
        try:
            if cb.resident is None and rec.size:
                await self.read(rec, 0, rec.size)
                if cb.fetch is not None:  # the fetch is settling in
                    await cb.fetch.done.wait()
        except BaseException:
            self._set_pinned(cb, False)
            raise
        finally:
            self.unhold(rec)

    def unpin(self, rec: BlobRec) -> None:
        cb = self.blobs.get(rec.id)
        if cb is not None:
            self._set_pinned(cb, False)
            self._maybe_forget(cb)

    # --- reads ---------------------------------------------------------------------------------
    def access(self, rec: BlobRec, parent=None) -> str:
        """Record a use of the block (an open for reading); return the tier that serves it.

        `parent`: the block the same reader read just before, if it precedes this one in a
        chain (the policy credits prefix hits with it)."""
        tier = self.tier_of(rec)
        tiers = self.stats.tiers
        cb = self.blobs.get(rec.id)
        if tier == "dram":
            tiers["dram"].hits += 1
            self.dram.lookup(rec.id, parent)
            if cb.prefetched:
                cb.prefetched = False
                self.stats.prefetch_used += 1
            return tier
        tiers["dram"].misses += 1
        if cb is not None and cb.fetch is not None:
            if cb.fetch.prefetch:
                self.stats.prefetch_joined += 1
            cb.fetch.prefetch = False  # a reader waits for it now
            cb.fetch.parent = parent
        if tier == "local":
            tiers["local"].hits += 1
        else:
            if self.local is not None:
                tiers["local"].misses += 1
            tiers["pool"].hits += 1
        return tier

    def access_direct(self, rec: BlobRec) -> None:
        """A direct reader (kvfs.client.direct) read the block from the namespaces."""
        self.stats.tiers["pool"].hits += 1
        self.stats.tiers["pool"].bytes_out += rec.size
        self.stats.direct_reads += 1

    async def read(self, rec: BlobRec, offset: int, length: int, parent=None):
        """Bytes [offset, offset+length) of a block, clipped to its size.

        A memoryview into the resident copy when there is one (zero-copy); otherwise waits only
        for the units that cover the range. Raises KvfsError(EIO) if one of them cannot be read
        or fails its checksum; the next read retries.
        """
        stats = self.stats
        stats.read_requests += 1
        cb = self.blobs.get(rec.id)
        if cb is not None and cb.resident is not None:  # the hot path: one dict lookup
            stats.dram_request_hits += 1
            data = cb.resident.view(offset, length)
            stats.bytes_from_dram += len(data)
            return data
        if offset >= rec.size:
            return b""
        length = min(length, rec.size - offset)  # a buffer being filled has whole pages
        if rec.size > self.capacity:
            return await self._read_uncached(rec, offset, length)
        if cb is None:
            cb = self._get(rec)
        fetch = cb.fetch
        if fetch is None:
            fetch = self._start_fetch(cb, prefetch=False, parent=parent, streaming=True)
        else:
            fetch.prefetch = False
            fetch.run = 1  # a reader streams it now: first units first
        await self.waits.units(
            rec, fetch, units_covering(offset, length, rec.size, rec.layout.unit)
        )
        return fetch.buffer.view(offset, length)

    def check_readable(self, rec: BlobRec) -> None:
        """Unreadable if the block must come from the pool and a namespace with units of it
        is failed for reads (an open checks: the engine gets a miss at once)."""
        if not self.pool.failed_for_reads():  # (the usual case: one look per namespace)
            return
        cb = self.blobs.get(rec.id)
        if cb is not None and cb.resident is not None:
            return
        fetch = cb.fetch if cb is not None else None
        if fetch is None and self.local is not None and self.local.has(rec.id):
            return
        self.waits.refuse_stalled(rec, fetch, range(rec.layout.nunits))

    async def materialize(self, rec: BlobRec) -> Buffer:
        """The whole block in DRAM (for a passthrough open): the resident copy, or a fetch of
        every unit in parallel (joining a prefetch in progress), checksums verified. Raises
        KvfsError(EIO) if a unit cannot be read or fails its checksum. The caller holds the
        block; the buffer it gets stays valid while it keeps it, resident or not."""
        cb = self.blobs.get(rec.id)
        if cb is not None and cb.resident is not None:
            return cb.resident
        if not rec.size:
            return Buffer(self.pool.chunk)
        cb = self._get(rec)
        fetch = cb.fetch
        if fetch is None:
            if self.pool.read_limit(rec.size) is None:
                # the opener runs the fetch itself (shielded: others may join it), rather
                # than starting a task and waiting for it
                fetch = self._start_fetch(cb, prefetch=False, run=False)
                if fetch is not None:
                    with trio.CancelScope(shield=True):
                        await self._run_fetch(cb, fetch)
            else:  # a task of the store's, so the opener can give up at its deadline
                fetch = self._start_fetch(cb, prefetch=False)
        elif fetch.prefetch:
            fetch.prefetch = False
        await self.waits.whole(rec, fetch)
        return fetch.buffer

    async def read_all(self, rec: BlobRec) -> Buffer:
        """The whole block in a Buffer (resident, or fetched); raises EIO on failure."""
        if rec.size:
            await self.read(rec, 0, rec.size)
        cb = self.blobs.get(rec.id)
        if cb is not None and cb.resident is not None:
            return cb.resident
        if cb is not None and cb.fetch is not None:  # completed units, fetch still finishing
            fetch = cb.fetch
            await self.read(rec, 0, rec.size)
            await fetch.done.wait()  # then its buffer is cut from whole pages to rec.size
            return fetch.buffer
        buf = Buffer(self.pool.chunk, align_up(rec.size))  # larger than DRAM: uncached
        await self.fetcher.read_units(rec, range(rec.layout.nunits), buf)
        buf.resize(rec.size)
        return buf

    async def _read_uncached(self, rec: BlobRec, offset: int, length: int):
        """Read the covering units into a temporary buffer (blocks larger than the DRAM tier)."""
        ks = units_covering(offset, length, rec.size, rec.layout.unit)
        tmp = Buffer(self.pool.chunk, align_up(rec.size))  # pages appear where units land
        self.hold(rec)
        try:
            await self.fetcher.read_units(rec, ks, tmp)
        finally:
            self.unhold(rec)
        return bytes(tmp.view(offset, min(length, rec.size - offset)))

    def _start_fetch(
        self,
        cb: CachedBlob,
        *,
        prefetch: bool,
        parent=None,
        on_done=None,
        streaming: bool = False,
        run: bool = True,
    ) -> Fetch | None:
        """Start bringing a whole block into DRAM. A `streaming` fetch (a reader waits for its
        units in order) reads one unit per I/O, so its first bytes come early; others read
        runs of FETCH_RUN units back to back on a namespace per I/O. With `run` False the
        caller runs it (`_run_fetch`) instead of a task of the store's."""
        rec = cb.rec
        chunk = self.pool.chunk
        need = (rec.size + chunk - 1) // chunk * chunk
        if not self._make_room(need, cold_only=prefetch) and prefetch:
            return None
        source = "local" if self.local is not None and self.local.has(rec.id) else "pool"
        layout = self.local.layout(rec.id) if source == "local" else rec.layout
        # whole pages while it is filled (O_DIRECT); cut to the block's size when complete
        # (a spare's old bytes are fine: the fetch overwrites every page)
        fetch = Fetch(
            Buffer(chunk, align_up(rec.size), self.spares),
            layout.nunits,
            prefetch,
            source,
            parent,
            run=1 if streaming else FETCH_RUN,
        )
        for k in range(layout.nunits):
            fetch.queues.setdefault(layout.ns[k], collections.deque()).append(k)
        cb.fetch = fetch
        self.inflight += fetch.buffer.reserved_bytes
        self.stats.fetches += 1
        if run:
            assert self._nursery is not None, "BlockStore.serve() is not running"
            self._nursery.start_soon(self._run_fetch, cb, fetch, on_done)
        return fetch

    async def _run_fetch(self, cb: CachedBlob, fetch: Fetch, on_done=None) -> None:
        rec = cb.rec
        units, t0, done = await self.fetcher.fill(rec, fetch)
        cb.fetch = None
        self.inflight -= fetch.buffer.reserved_bytes
        fetch.done.set()
        fetch.settled.set()
        if on_done is not None:
            on_done()
        complete = all(ev.is_set() for ev in fetch.ready) and not fetch.errors
        if fetch.errors:
            self.stats.fetch_errors += 1
        if not complete:
            if fetch.cancelled:
                self.stats.prefetch_cancelled += 1
                self.stats.prefetch_wasted += 1
            for k, ev in enumerate(fetch.ready):  # nobody may wait for a unit never read
                if not ev.is_set():
                    fetch.errors[k] = KvfsError(errno.EIO, "fetch cancelled")
                    ev.set()
        else:
            if fetch.buffer.size != rec.size:  # (the fetcher's buffer: its size is known)
                fetch.buffer.resize(rec.size)
            if fetch.source == "pool":
                self.pool.observe(units, t0, done)
            admit = not cb.retired and (cb.pinned or self.admission.admit(rec.id, rec.size))
            if (
                admit
                and not self._make_room(fetch.buffer.reserved_bytes, cold_only=fetch.prefetch)
                and fetch.prefetch
            ):
                admit = False  # readahead never displaces hotter blocks
                self.stats.prefetch_wasted += 1
            if admit and not self._room_for_one():
                admit = False
            if admit:
                cb.resident = fetch.buffer
                cb.prefetched = fetch.prefetch
                self._used(cb)
                self.dram.add(rec.id, fetch.buffer.reserved_bytes, fetch.parent)
                self.stats.tiers["dram"].bytes_in += rec.size
                if (
                    fetch.source == "pool"
                    and self.local is not None
                    and not self.local.has(rec.id)
                    and self.local.admission.admit(rec.id, rec.size)
                ):
                    self.hold(rec)
                    self._nursery.start_soon(self._copy_to_local, cb, fetch.buffer)
        self._maybe_forget(cb)
        self._park_idle()

    # --- explicit eviction and warming (control actions) ----------------------------------------
    def evict(self, rec: BlobRec) -> int:
        """Drop a block's copies from DRAM and the local tier; returns the bytes dropped.
        EBUSY if it is pinned."""
        cb = self.blobs.get(rec.id)
        if cb is not None and cb.pinned:
            raise KvfsError(errno.EBUSY, "the block is pinned: unpin it first")
        dropped = 0
        if cb is not None and cb.resident is not None:
            dropped += cb.resident.nbytes
            self._drop_resident(cb)
            self.stats.tiers["dram"].evictions += 1
            self._maybe_forget(cb)
        if self.local is not None and self.local.has(rec.id):
            self.local.drop(rec.id)
            self.stats.tiers["local"].evictions += 1
            dropped += rec.size
        return dropped

    def evict_cold(self, n: int) -> list[tuple[int, int]]:
        """Drop the `n` DRAM blocks the policy would evict first; returns their (blob id,
        inode of the file, 0 if not known)."""
        out = []
        ok = self._evictable(True)
        while len(out) < n:
            bid = self.dram.policy.victim(ok)
            if bid is None:
                break
            self.dram.used -= self.dram.sizes.pop(bid)
            cb = self.blobs.get(bid)
            if cb is not None:
                self._unload(cb)
                self.stats.tiers["dram"].evictions += 1
                self._maybe_forget(cb)
            out.append((bid, cb.owner if cb is not None else 0))
        return out

    def warm(self, rec: BlobRec) -> bool:
        """Start fetching a block into DRAM at demand priority (not awaited)."""
        cb = self._get(rec)
        if (
            cb.resident is not None
            or cb.fetch is not None
            or not rec.size
            or rec.size > self.capacity
        ):
            self._maybe_forget(cb)
            return False
        return self._start_fetch(cb, prefetch=False) is not None

    # --- prefetch ------------------------------------------------------------------------------
    def prefetch(self, rec: BlobRec, parent=None) -> bool:
        """Queue a block to be fetched into DRAM in the background (readahead). Queued blocks
        are fetched in the order they were asked for, PREFETCH_FETCHES at a time, so the block
        a reader needs next arrives first. False if the block is resident, being fetched or
        queued already, or cannot be cached."""
        cb = self.blobs.get(rec.id)
        if (
            (cb is not None and (cb.resident is not None or cb.fetch is not None))
            or rec.id in self._prefetch_queue
            or rec.size > self.capacity
            or not rec.size
        ):
            return False
        self._prefetch_queue[rec.id] = (rec, parent)
        self.hold(rec)  # its extents must stay valid while it waits
        self._prefetch_wakeup()
        return True

    def _prefetch_wakeup(self) -> None:
        while self._prefetch_queue and self._prefetch_running < PREFETCH_FETCHES:
            bid, (rec, parent) = self._prefetch_queue.popitem(last=False)
            cb = self._get(rec)
            started = (
                cb.resident is None
                and cb.fetch is None
                and not cb.retired
                and self._start_fetch(cb, prefetch=True, parent=parent, on_done=self._prefetch_done)
            )
            if started:
                self._prefetch_running += 1
                self.stats.prefetch_issued += 1
            elif cb.resident is None and cb.fetch is None and not cb.retired:
                self.stats.prefetch_skipped += 1
            self.unhold(rec)

    def _prefetch_done(self) -> None:
        self._prefetch_running -= 1
        self._prefetch_wakeup()

    def cancel_prefetch(self, rec: BlobRec) -> bool:
        """Drop a prefetch nobody waits for: a queued one leaves the queue; a running one stops
        issuing units (units already on their way finish). False if there is none."""
        queued = self._prefetch_queue.pop(rec.id, None)
        if queued is not None:
            self.unhold(rec)
            self.stats.prefetch_cancelled += 1
            return True
        cb = self.blobs.get(rec.id)
        if cb is None or cb.fetch is None or not cb.fetch.prefetch:
            return False
        cb.fetch.cancelled = True
        return True

    # --- writes --------------------------------------------------------------------------------
    @property
    def nursery(self) -> trio.Nursery | None:
        """Where background I/O of the layers above runs (write-behind)."""
        return self._nursery

    async def write(self, buf: Buffer, size: int) -> Layout:
        """Write a block to the pool (durable on return, each namespace's I/O within its
        deadline: Pool.write_block); raises ENOSPC or EIO. (A block written behind is
        finished by its writer, kvfs/write/behind.py, which the write layer calls: `wrote`
        counts it.)"""
        layout = await self.pool.write_block(buf, size, deadline=True)
        self.wrote(size)
        return layout

    def wrote(self, nbytes: int, blocks: int = 1) -> None:
        """Count blocks written to the pool (`write`, or the write-back flusher's batches)."""
        self.stats.blocks_written += blocks
        self.stats.bytes_to_pool += nbytes
        self.stats.tiers["pool"].bytes_in += nbytes
