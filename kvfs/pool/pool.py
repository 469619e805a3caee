"""The pool: N namespaces, a superblock on each, and blocks striped RAID-0 across them.

`Pool.open` validates the namespaces against each other, against the config and against the
catalog's pool id, and refuses (StartupError, one line) a namespace from another pool, a missing
or reordered one, or changed geometry. `Pool.format` writes fresh superblocks.

Free space lives only in memory: `attach()` rebuilds each namespace's `ExtentAllocator` from the
extents of the blocks the catalog holds. The pool allocates only inside its `Area` (all of every
namespace, or, in a pool shared by several nodes, the regions this node leases); how much of
that space writers may still claim is the space layer's business (kvfs/space/).
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import logging
import time
from typing import Iterable

import numpy as np
import trio

from kvfs.config import PoolConfig
from kvfs.errors import DeviceError, KvfsError, StartupError
from kvfs.pool import linux_aio
from kvfs.pool.alloc import ExtentAllocator
from kvfs.pool.buffer import MEMORY, Buffer, chunk_size_for, zero_chunk
from kvfs.pool.checks import check_paths, format_pool, validate, write_superblocks
from kvfs.pool.io_workers import IoWorkers
from kvfs.pool.layout import DATA_START, Layout, align_up, stored_length
from kvfs.pool.members import Members, open_members, open_namespace
from kvfs.pool.namespace import Namespace
from kvfs.pool.placement import Placement
from kvfs.pool.requests import WriteRequest
from kvfs.tasks import run_all

log = logging.getLogger("kvfs.pool.pool")

RUN_UNITS = 8  # stripe units one I/O moves at most (back to back on a namespace)


class Area:
    """Where this node may allocate: here, the whole of every namespace (a pool of one node).

    A pool shared by several nodes gives the pool a narrower area (kvfs/cluster/space.py
    `Regions`): only the regions this node holds a lease on, with a write fence. The pool asks
    its area, and tells it what it allocates, frees and publishes; it never asks who it is.
    """

    whole = True  # every namespace entirely: free space in the area is all free space

    def ranges(self, ns_size: int) -> list[tuple[int, int]]:
        """The [lo, hi) spans of a namespace of `ns_size` bytes this node may allocate in."""
        return [(DATA_START, ns_size)]

    def allocated(self, offset: int, length: int) -> None:
        """An extent was allocated (not yet published)."""

    def freed(self, offset: int, length: int) -> None:
        """An extent allocated here and never published was given back."""

    def published(self, offset: int, length: int) -> None:
        """An extent allocated here is now part of a published block."""

    def fence(self, offset: int, length: int) -> None:
        """Raise KvfsError(EIO) if this node may no longer write there."""


# Blocks whose memory is at least this large are fetched by the I/O worker processes
# (kvfs/pool/io_workers.py) where block memory has huge pages (the daemon's private tmpfs):
# a worker maps such a file for one read at little cost, and the units land in it with no
# copy. A smaller block, or block memory of 4 KiB pages (memfds), stays on this process's path
# (staged): mapping 4 KiB pages for one read costs twice the staged read and its copy
# (bench/io_floor.py), and measured side by side (docs/performance.md, "Cold loads by I/O
# worker processes") a worker cost the 2-core machine more CPU per 1 MiB load than it saved the
# trio thread.
WORKER_MIN_BLOCK = 2 << 20


class Pool(Placement):
    def __init__(
        self,
        namespaces: list[Namespace],
        pool_id: str,
        unit: int,
        *,
        adaptive: bool = True,
        area: Area | None = None,
        io_workers: int = 0,
        cfg: PoolConfig | None = None,
    ):
        self.namespaces = namespaces
        self.cfg = cfg  # what it was opened with (a namespace added while mounted opens by it)
        # worker processes for fetches (kvfs/pool/io_workers.py), run by `serve`
        self.workers = (
            IoWorkers(
                [("" if ns.removed else str(ns.path), ns.direct) for ns in namespaces], io_workers
            )
            if io_workers > 0
            else None
        )
        self.pool_id = pool_id
        self.unit = unit
        self.adaptive = adaptive
        self.balance = [1.0] * len(namespaces)  # learned per-namespace factors (see observe)
        self._obs_units = [0] * len(namespaces)
        self._obs_seconds = [0.0] * len(namespaces)
        self._busy_until = [0.0] * len(namespaces)  # end of the busy time counted (observe)
        self._obs_since = 0.0  # when the transfers observed since the last update began
        self.chunk = chunk_size_for(unit)
        self.allocators: list[ExtentAllocator] = [
            ExtentAllocator(DATA_START, ns.size, unit) for ns in namespaces
        ]
        self.area = area or Area()  # where this node may allocate (see Area)
        self.created = False  # formatted by this open (a brand-new pool)
        # shared pool: the extents of claimed blocks that were still counted as used here when
        # claimed (see claim), by block layout
        self._contested: dict[Layout, list] = {}
        self.frees_stopped: str | None = None  # see stop_freeing
        self.rebuilt_superblocks: list[str] = []  # damaged superblocks rewritten at open
        self._rotation = 0
        self._credit = [0.0] * len(self.namespaces)  # place_units' round robin, block to block
        self.zero = zero_chunk(self.chunk)  # the source of padding and holes in unit writes

    # --- opening and formatting --------------------------------------------------------------
    @classmethod
    def open(
        cls,
        cfg: PoolConfig,
        *,
        expect_pool_id: str | None,
        create_new: bool,
        members: Members | None = None,
    ) -> "Pool":
        """Open and validate the namespaces of `cfg`.

        `expect_pool_id` is the pool id the catalog remembers (None for a new catalog).
        `create_new`: if none of the namespaces exists yet and all are files with a size, create
        and format them as a new pool. Block devices are never formatted implicitly.
        `members`: the catalog's record of namespaces removed and added while mounted
        (kvfs/pool/members.py): removed ones are not opened, added ones are.
        """
        if members is not None and members.changed:
            return open_members(cls, cfg, expect_pool_id, members)
        found = check_paths(cfg)
        missing = [nc.path for nc, f in zip(cfg.namespaces, found) if not f[0]]
        fresh = len(missing) == len(found)
        if missing and not fresh:
            raise StartupError(
                f"namespace {missing[0]}: does not exist, but other namespaces of "
                f"the pool do (missing namespace?)",
                errno.ENOENT,
            )
        if fresh and (not create_new or expect_pool_id is not None):
            if expect_pool_id is not None:
                raise StartupError(
                    f"namespace {missing[0]}: does not exist, but the catalog "
                    f"belongs to pool {expect_pool_id}",
                    errno.ENOENT,
                )
            raise StartupError(f"namespace {missing[0]}: does not exist", errno.ENOENT)
        namespaces: list[Namespace] = []
        try:
            for i, nc in enumerate(cfg.namespaces):
                ns = open_namespace(i, nc.path, cfg, nc, nc.size if fresh else None)
                if ns.size <= DATA_START:
                    raise StartupError(
                        f"namespace {nc.path}: {ns.size} bytes is too small "
                        f"(kvfs needs more than {DATA_START})"
                    )
                namespaces.append(ns)
            rebuilt: list[str] = []
            if fresh:
                pool_id = write_superblocks(namespaces, cfg.stripe_unit)
                log.info("created pool %s on %d new namespace file(s)", pool_id, len(namespaces))
            else:
                pool_id = validate(namespaces, cfg, expect_pool_id, rebuilt)
            pool = cls(
                namespaces,
                pool_id,
                cfg.stripe_unit,
                adaptive=cfg.adaptive_placement,
                io_workers=cfg.io_workers,
                cfg=cfg,
            )
            pool.created = fresh
            pool.rebuilt_superblocks = rebuilt
            return pool
        except BaseException:
            for ns in namespaces:
                ns.close()
            if fresh:
                for nc in cfg.namespaces:
                    try:
                        nc.path.unlink()
                    except OSError:
                        pass
            raise

    # --- membership while mounted (kvfs/pool/members.py, kvfs/fs/pool_admin.py) -------------
    def removed_in(self, layout: Layout) -> str | None:
        """Why a block written to `layout` must not be committed (a namespace it has units on
        left the pool while it was written), or None."""
        for j in set(layout.ns):
            if self.namespaces[j].removed:
                return f"namespace {j} was removed from the pool while the block was written"
        return None

    format = staticmethod(format_pool)  # `kvfs format` (kvfs/pool/checks.py)

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run the I/O worker processes, if any, until cancelled."""
        if self.workers is None:
            task_status.started()
            await trio.sleep_forever()
        await self.workers.serve(task_status=task_status)

    def close(self) -> None:
        if self.workers is not None:
            self.workers.close()
        for ns in self.namespaces:
            ns.close()

    # --- space -------------------------------------------------------------------------------
    def attach(self, layouts: Iterable[Layout]) -> None:
        """Rebuild free space from the layouts of every block the catalog holds."""
        ns: list[int] = []
        off: list[int] = []
        length: list[int] = []
        units = set()
        for layout in layouts:
            units.add(layout.unit)
            for e in layout.unit_extents():
                ns.append(e.ns)
                off.append(e.offset)
                length.append(e.length)
        self.attach_extents(
            np.asarray(ns, dtype=np.int64),
            np.asarray(off, dtype=np.int64),
            np.asarray(length, dtype=np.int64),
            units,
        )

    def attach_extents(self, ns, off, length, units: Iterable[int] = ()) -> None:
        """Rebuild free space from the (namespace, offset, length) arrays of every stripe unit
        the catalog holds (`units`: the stripe units of its blocks), sorted here."""
        for u in units:
            if int(u) != self.unit:
                raise StartupError(
                    f"catalog holds a block with stripe unit {int(u)}, the pool uses {self.unit}"
                )
        if len(ns) and int(ns.max()) >= len(self.namespaces):
            raise StartupError(
                f"catalog refers to namespace {int(ns.max())}, the pool has {len(self.namespaces)}"
            )
        order = np.lexsort((off, ns))
        ns, off, length = ns[order], off[order], length[order]
        bounds = np.searchsorted(ns, np.arange(len(self.namespaces) + 1))
        try:
            self.allocators = [
                ExtentAllocator.from_sorted(
                    DATA_START,
                    nsp.size,
                    off[bounds[j] : bounds[j + 1]],
                    length[bounds[j] : bounds[j + 1]],
                    self.unit,
                )
                for j, nsp in enumerate(self.namespaces)
            ]
        except ValueError as e:
            raise StartupError(f"catalog is inconsistent with the pool: {e}") from None

    @property
    def capacity(self) -> int:
        return sum(a.capacity for a in self.allocators)

    @property
    def max_block_size(self) -> int:
        """The largest block a file may hold: `[pool] max_block_size`, or the pool's capacity
        now (it changes with `kvfs pool remove|add`: a block past it is EFBIG, not ENOSPC)."""
        return (self.cfg.max_block_size if self.cfg else None) or self.capacity

    @property
    def free(self) -> int:
        """Free bytes in the pool (for a shared pool: as this node sees the cluster's blocks)."""
        return sum(a.free_bytes for a in self.allocators)

    @property
    def writable(self) -> int:
        """Free bytes this node may allocate now (in its area)."""
        if self.area.whole:
            return self.free
        return sum(
            a.free_in(lo, hi)[0]
            for a, ns in zip(self.allocators, self.namespaces)
            for lo, hi in self.area.ranges(ns.size)
        )

    @property
    def unit_free(self) -> int:
        """Free bytes in whole stripe units (see ExtentAllocator): what blocks of several units
        can use; free pieces smaller than a unit are left out."""
        return sum(a.unit_bytes for a in self.allocators)

    def writable_in(self, grain: int) -> int:
        """The free bytes this node may allocate now (in its area) that lie in pieces of
        `grain` bytes (a multiple of 4 KiB, at most the unit): what units of that length can
        use. Each free extent counts its length rounded down to a multiple of `grain`."""
        if self.area.whole and grain == self.unit:
            return self.unit_free
        return sum(
            a.unit_bytes_in(lo, hi, grain)
            for a, ns in zip(self.allocators, self.namespaces)
            for lo, hi in self.area.ranges(ns.size)
        )

    def statistics(self) -> dict:
        """The pool tier's geometry and space, and each namespace's counters."""
        return {
            "tier": {
                "capacity": self.capacity,
                "used": self.capacity - self.free,
                "free": self.free,
                "stripe_unit": self.unit,
                "pool_id": self.pool_id,
                "placement_weights": [round(w, 3) for w in self.placement_weights()],
                "rebuilt_superblocks": self.rebuilt_superblocks,
                "io_workers": self.workers.statistics() if self.workers is not None else None,
            },
            "namespaces": [
                {
                    "index": ns.index,
                    "path": str(ns.path),
                    "size": ns.size,
                    "direct_io": ns.direct,
                    "queue_depth": ns.queue_depth,
                    "io_engine": "aio" if ns.aio and linux_aio.available() else "threads",
                    "used": a.capacity - a.free_bytes,
                    **dataclasses.asdict(ns.stats),
                }
                for ns, a in zip(self.namespaces, self.allocators)
            ],
        }

    # --- blocks other nodes of a shared pool wrote ------------------------------------------------
    def claim(self, layout: Layout) -> bool:
        """Mark a block another node published as used. Part of it may still be counted as
        used here by a block whose purge this node has not applied yet (a node reads a file's
        current state, which may be newer than the change log it has applied): that part
        becomes this block's when the old block is unclaimed. False (logged) if so."""
        short = []  # (extent, the pieces of it this block holds so far)
        for e in layout.unit_extents():
            parts = self.allocators[e.ns].take_free_parts(e.offset, e.length)
            if sum(n for _, n in parts) < e.length:
                short.append((e, parts))
        if short:
            self._contested[layout] = short
            log.warning(
                "block of %d bytes published by another node overlaps space this node "
                "still counts as in use (a purge not applied here yet, or two nodes "
                "wrote the same space) (namespace extents %s)",
                layout.size,
                [(e.ns, e.offset, e.length) for e, _ in short][:4],
            )
        return not short

    def unclaim(self, layout: Layout) -> None:
        """A retired block's grace period is over (shared pool): the space it holds here is
        free again. Only that: of an extent it shares with a block whose purge this node has
        not applied yet (it was claimed contested), it frees the pieces it took, never the
        other block's, or that block's purge, applied later, would free space allocated here
        since (two blocks in one place: seen in the cluster torture as two current blocks of
        one node sharing an extent). Then blocks still contested take what became free."""
        contested = self._contested.pop(layout, None)
        held = {(e.ns, e.offset): parts for e, parts in contested} if contested else {}
        for e in layout.unit_extents():
            for off, n in held.get((e.ns, e.offset), [(e.offset, e.length)]):
                try:
                    self.allocators[e.ns].free(off, n)
                except ValueError:
                    log.error("freeing a purged block's extent (%d, %d, %d) twice", e.ns, off, n)
        for other, short in list(self._contested.items()):
            still = []
            for e, parts in short:
                parts = parts + self.allocators[e.ns].take_free_parts(e.offset, e.length)
                if sum(n for _, n in parts) < e.length:
                    still.append((e, parts))
            if still:
                self._contested[other] = still
            else:
                del self._contested[other]

    def committed(self, layout: Layout) -> None:
        """The block is published: its extents are no longer this node's in-flight writes."""
        for e in layout.unit_extents():
            self.area.published(e.offset, e.length)

    def alloc_extent(self, j: int, length: int) -> int | None:
        """An extent of `length` bytes on namespace j inside this node's area, or None (always
        on a removed namespace)."""
        if self.namespaces[j].removed:
            return None
        off = self.allocators[j].alloc_in(length, self.area.ranges(self.namespaces[j].size))
        if off is not None:
            self.area.allocated(off, length)
        return off

    def free_extent(self, j: int, off: int, length: int) -> None:
        """Give back an extent this node allocated and did not publish."""
        if self.frees_stopped or self.namespaces[j].removed:
            return
        self.allocators[j].free(off, length)
        self.area.freed(off, length)

    def stop_freeing(self, why: str) -> None:
        """The catalog can no longer make changes durable, and what it holds on disk may differ
        from memory (a transaction that failed may still have reached the disk): free no
        extent until a restart rebuilds the free space from the catalog, so none that the
        disk's catalog references is ever written again."""
        self.frees_stopped = why

    def fence(self, off: int, length: int) -> None:
        """Refuse to write where this node may no longer write (see Area.fence)."""
        self.area.fence(off, length)

    def stored_size(self, size: int) -> int:
        """Bytes a block of `size` takes in the pool."""
        return align_up(size)

    async def bounded(self, j: int, job, nbytes: int, late: list):
        """Namespace j's `job` within its I/O deadline (Namespace.bounded); one past it adds
        the Event of its end to `late` (for `free_after` / `release_after`) and raises EIO."""
        try:
            return await self.namespaces[j].bounded(job, nbytes)
        except DeviceError as e:
            if e.pending is not None:
                late.append(e.pending)
            raise

    def free_after(self, extents, late: list) -> None:
        """`free_extent` of each (namespace, offset, length), once every I/O in `late` (trio
        Events of I/Os past their deadline, which may still be writing there) has ended:
        until then nothing else may be placed there. At once if none is late."""

        def free() -> None:
            for j, off, length in extents:
                self.free_extent(j, off, length)

        if not late:
            free()
            return

        async def later() -> None:
            for ev in late:
                await ev.wait()
            free()

        trio.lowlevel.spawn_system_task(later)

    def release_after(self, layout: Layout, late: list) -> None:
        """`release`, once every I/O in `late` has ended (see `free_after`)."""
        self.free_after([(e.ns, e.offset, e.length) for e in layout.unit_extents()], late)

    def release(self, layout: Layout) -> None:
        """Return the space of a block this node wrote (no reader may use its extents any
        more; in a shared pool: a block that was never published)."""
        for e in layout.unit_extents():
            self.free_extent(e.ns, e.offset, e.length)

    # --- I/O -----------------------------------------------------------------------------------
    def runs(self, ns_of, offsets, size: int, ks=None, limit: int = RUN_UNITS) -> list[list[int]]:
        """Units grouped into runs one I/O can move: on one namespace, back to back there (a
        block's units on a namespace are usually allocated as one extent), at most `limit`."""
        by_ns: dict[int, list[int]] = {}
        for k in range(len(ns_of)) if ks is None else ks:
            by_ns.setdefault(ns_of[k], []).append(k)
        out = []
        for kk in by_ns.values():
            kk.sort(key=lambda k: offsets[k])
            run = [kk[0]]
            for k in kk[1:]:
                p = run[-1]
                if (
                    offsets[p] + stored_length(size, self.unit, p) == offsets[k]
                    and len(run) < limit
                ):
                    run.append(k)
                else:
                    out.append(run)
                    run = [k]
            out.append(run)
        return out

    async def write_block(self, buf: Buffer, size: int, *, deadline: bool = False) -> Layout:
        """Allocate, write every unit in parallel (a run of units per I/O), make them durable;
        return the layout. On failure the space is released and the error (ENOSPC or EIO)
        raised. With `deadline` (the daemon's commits always ask for it), each namespace's
        I/O is bounded (Namespace.bounded: EIO past it, the namespace failed, the block
        written again elsewhere by the caller: Sessions.write_block)."""
        ns_of, offsets = self.allocate(size)
        n = len(ns_of)
        sums = [0] * n
        t0 = time.perf_counter()
        done: dict[int, float] = {}
        # A block no larger than a chunk goes through the worker thread's staging memory
        # (Buffer.stage_out): its file is never mapped.
        small = size <= buf.chunk

        runs = self.runs(ns_of, offsets, size)
        per_ns = collections.Counter(ns_of[run[0]] for run in runs)

        async def write(run: list[int]) -> None:
            lengths, spans = [], []
            for k in run:
                stored = stored_length(size, self.unit, k)
                self.fence(offsets[k], stored)
                length = min(self.unit, size - k * self.unit)
                spans.append((k * self.unit, stored, length))
                lengths.append(length)

            def staged() -> list[list[memoryview]]:
                return buf.stage_out(spans)

            j = ns_of[run[0]]
            ns = self.namespaces[j]
            nbytes = sum(stored for _, stored, _ in spans)

            def job():
                # the only run on its namespace: written and made durable in one job
                return ns.write_units(
                    staged
                    if small
                    else [buf.io_views(start, stored, self.zero) for start, stored, _ in spans],
                    offsets[run[0]],
                    lengths,
                    sync=per_ns[j] == 1,
                    nbytes=nbytes,
                    verify=buf.shared and not small,
                )

            digests = await (self.bounded(j, job, nbytes, late) if deadline else job())
            for k, d in zip(run, digests):
                sums[k] = d
            done[j] = time.perf_counter() - t0

        late: list = []  # I/Os past their deadline, still in flight

        async def sync(j: int) -> None:
            ns = self.namespaces[j]
            await (self.bounded(j, ns.sync, 0, late) if deadline else ns.sync())

        try:
            if len(runs) == 1:  # one I/O (a small block): no nursery
                await write(runs[0])
            else:
                await run_all((lambda r=r: write(r)) for r in runs)
                await run_all((lambda j=j: sync(j)) for j in sorted(per_ns) if per_ns[j] > 1)
        except BaseException:
            self.release_after(Layout(size, self.unit, ns_of, offsets, (0,) * n), late)
            raise
        counts = {j: ns_of.count(j) for j in done}
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "wrote %d bytes in %.3f s: units per namespace %s, seconds %s",
                size,
                time.perf_counter() - t0,
                counts,
                {j: round(t, 3) for j, t in done.items()},
            )
        self.observe(counts, t0, done)
        return Layout(size, self.unit, ns_of, offsets, tuple(sums))

    def _write_requests(
        self, buf: Buffer, size: int, ns_of, offsets
    ) -> list[tuple[list[int], WriteRequest]]:
        """A block's write requests, one per run of units back to back on a namespace: a
        small block's units staged (copied in the worker thread), a large one's written from
        its own memory (checked again after the write where the kernel may change it)."""
        small = size <= buf.chunk
        out = []
        for run in self.runs(ns_of, offsets, size):
            spans = [
                (
                    k * self.unit,
                    stored_length(size, self.unit, k),
                    min(self.unit, size - k * self.unit),
                )
                for k in run
            ]
            units = (
                (lambda b=buf, sp=spans: b.stage_out(sp))
                if small
                else [buf.io_views(start, stored, self.zero) for start, stored, _ in spans]
            )
            req = WriteRequest(
                units,
                None if small else [v for u in units for v in u],
                offsets[run[0]],
                [length for _, _, length in spans],
                sum(stored for _, stored, _ in spans),
                verify=buf.shared and not small,
            )
            out.append((run, req))
        return out

    async def write_batch(
        self, blocks: list[tuple[Buffer, int, Layout | None]]
    ) -> list[Layout | KvfsError]:
        """Write several blocks at once (the write-back flusher's batch, kvfs/write/writeback.py):
        each goes where it was allocated (its Layout, checksums unknown), or is allocated now
        (None); then every namespace gets one worker job for all the runs placed on it (more
        for more than `device.BATCH_JOB_BYTES`) and one fdatasync, all namespaces in parallel.
        Returns each block's layout, durable, or its error: ENOSPC where it did not fit
        (nothing allocated), EIO where a namespace it used failed (its space released)."""
        out: list[Layout | KvfsError | None] = [None] * len(blocks)
        plans = []
        by_ns: dict[int, list] = {}
        for i, (buf, size, alloc) in enumerate(blocks):
            if alloc is not None:
                ns_of, offsets = alloc.ns, alloc.offsets
            else:
                try:
                    ns_of, offsets = self.allocate(size)
                except KvfsError as e:
                    out[i] = e
                    continue
            try:
                for k in range(len(ns_of)):
                    self.fence(offsets[k], stored_length(size, self.unit, k))
            except KvfsError as e:
                self.release(Layout(size, self.unit, ns_of, offsets, (0,) * len(ns_of)))
                out[i] = e
                continue
            runs = self._write_requests(buf, size, ns_of, offsets)
            plans.append((i, size, ns_of, offsets, [0] * len(ns_of), runs))
            for run, req in runs:
                by_ns.setdefault(ns_of[run[0]], []).append(req)
        t0 = time.perf_counter()
        done: dict[int, float] = {}

        async def write(j: int) -> None:
            ns, reqs = self.namespaces[j], by_ns[j]
            try:
                await ns.bounded(lambda: ns.write_batch(reqs), sum(r.nbytes for r in reqs))
            except KvfsError as e:  # past its deadline (it goes on: `e.pending`)
                for r in reqs:
                    r.error = e
            except Exception as e:  # noqa: BLE001 - per-block results, never a dead flusher
                log.exception("namespace %d: a write-back batch failed", j)
                for r in reqs:
                    r.error = r.error or KvfsError(errno.EIO, f"namespace {j}: {e}")
            done[j] = time.perf_counter() - t0

        if by_ns:
            await run_all((lambda j=j: write(j)) for j in by_ns)
        units: collections.Counter[int] = collections.Counter()
        for i, size, ns_of, offsets, sums, runs in plans:
            layout = Layout(size, self.unit, ns_of, offsets, (0,) * len(ns_of))
            try:
                for run, req in runs:
                    if not _late(req.error):  # (else still in use)
                        req.units = req.flat = None  # (the block's memory: not needed)
                    for k, d in zip(run, req.result()):
                        sums[k] = d
            except KvfsError as e:
                self.release_after(
                    layout,
                    [r.error.pending for _, r in runs if _late(r.error)],
                )
                out[i] = e
                continue
            out[i] = Layout(size, self.unit, ns_of, offsets, tuple(sums))
            units.update(ns_of)
        self.observe(dict(units), t0, done)
        return out

    async def sync(self, namespaces: list[int]) -> None:
        """Make completed writes on these namespaces durable (also writes another process made
        through its own descriptors: kvfs.client.direct)."""
        await run_all(self.namespaces[j].sync for j in namespaces)

    # --- reads under faults (kvfs/pool/read_health.py) ------------------------------------------
    def read_limit(self, nbytes: int) -> float | None:
        """How long a reader waits for `nbytes` of a block from the pool at most (None: no
        limit): `[pool] read_timeout_ms` plus the bytes at 64 MB/s."""
        return next(ns for ns in self.namespaces if not ns.removed).health.limit(nbytes)

    def failed_for_reads(self) -> list[int]:
        """The namespaces reads are refused on now (usually none)."""
        return [ns.index for ns in self.namespaces if ns.health.failed_at]

    def failed_among(self, namespaces: Iterable[int]) -> list[int]:
        """Those of `namespaces` (a block's, say) that reads are refused on now, sorted; the
        iterable is not consumed when none is (the usual case)."""
        failed = self.failed_for_reads()
        return sorted(set(namespaces).intersection(failed)) if failed else []

    def suspect(self, j: int, offset: int, length: int, why: str) -> bool:
        """A direct reader had no answer in time from namespace j: check it (ReadHealth)."""
        if not 0 <= j < len(self.namespaces):
            return False
        return self.namespaces[j].health.suspect(offset, length, why)

    def stalled(self, namespaces) -> tuple[int, ...]:
        """A reader waited its deadline out for units on `namespaces`: those with a read in
        flight past its own deadline are failed for reads (ReadHealth.stalled); returns every
        one of them failed for reads now."""
        return tuple(j for j in sorted(set(namespaces)) if self.namespaces[j].health.stalled())

    async def read_run(
        self, layout: Layout, run: list[int], buf: Buffer, *, prefetch: bool = False
    ) -> list[int]:
        """Read units that lie back to back on one namespace (`runs`) into their places in
        `buf` with one I/O, and verify their checksums; returns the units that failed theirs.
        Raises EIO if the read itself failed. A `prefetch` read yields to demand reads."""
        checks, spans = [], []
        for k in run:
            start, length = layout.unit_span(k)
            spans.append((start, layout.stored(k), length))
            checks.append((length, layout.sums[k]))

        def zero_padding(units: list[list[memoryview]]) -> None:
            for (_, stored, length), unit_views in zip(spans, units):
                pad = stored - length
                if pad:  # keep the bytes past the content zero, whatever the padding held
                    last = unit_views[-1]
                    last[len(last) - pad :] = bytes(pad) if pad <= len(last) else last[:0]

        ns = self.namespaces[layout.ns[run[0]]]
        if (
            self.workers is not None
            and buf.size >= WORKER_MIN_BLOCK
            and MEMORY.huge
            and self.workers.ready
        ):
            # straight into the block's own pages, by a worker process (one copy, none of
            # it on this thread); None: the worker died, nothing read, read here instead
            bad = await ns.read_into_file(
                self.workers, buf.fd, buf.size, spans, layout.offsets[run[0]], checks, prefetch
            )
            if bad is not None:
                return [run[i] for i in bad]
        sizes = [stored for _, stored, _ in spans]
        if buf.size <= buf.chunk:
            # a small block: read into the worker thread's staging memory, then its content
            # into the buffer's file (Buffer.stage_in); the file is never mapped
            bad = await ns.read_units(
                lambda: buf.stage_in(spans),
                layout.offsets[run[0]],
                checks,
                prefetch,
                sizes=sizes,
                after=lambda units: buf.unstage(spans, units),
            )
        else:
            bad = await ns.read_units(
                [buf.io_views(start, stored) for start, stored, _ in spans],
                layout.offsets[run[0]],
                checks,
                prefetch,
                sizes=sizes,
                after=zero_padding,
            )
        return [run[i] for i in bad]


def _late(err) -> bool:
    """Whether a request's error is an I/O past its deadline, still in flight (its memory
    and extents in use until `err.pending` is set)."""
    return isinstance(err, DeviceError) and err.pending is not None
