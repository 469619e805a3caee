"""Fetches: bringing a block's stripe units from the pool (or the local tier) into a buffer.

A `Fetch` is one attempt to bring a whole block into DRAM: per namespace, a queue of the units
still to read, and per unit an event a reader waits on. `Fetcher.fill` reads them, up to
FETCH_WINDOW I/Os in flight per namespace (units issued together share the namespace's
bandwidth and finish together: a small window, issued in order, brings a block's first bytes
early while other fetches and the other namespaces keep every device busy). Each I/O moves a run
of units that lie back to back on the namespace (`fetch.run` of them: one while a reader streams
the block, so its first bytes come early; more for a whole-block fetch). Every unit's checksum is
verified in the worker thread that read it; a mismatch fails that unit (EIO), never the others.
The block's lifecycle (admission into DRAM, holds) is the store's (kvfs/tiers/store.py).
"""

from __future__ import annotations

import collections
import errno
import time

import trio

from kvfs.catalog.records import BlobRec
from kvfs.errors import KvfsError
from kvfs.pool.buffer import Buffer
from kvfs.pool.layout import Layout
from kvfs.pool.pool import Pool
from kvfs.tasks import run_all

# Units of one fetch in flight per namespace. Units issued together share the namespace's
# bandwidth and finish together; a small window, issued in order, brings a block's first bytes
# early while other fetches (and the other namespaces) keep every device busy.
FETCH_WINDOW = 2
# Units one fetch I/O reads at most (back to back on a namespace): fewer, larger I/Os for a
# whole-block fetch, while the first units still arrive early for a reader streaming it.
FETCH_RUN = 4


class Fetch:
    """One attempt to bring a whole block into DRAM."""

    __slots__ = (
        "buffer",
        "ready",
        "errors",
        "queues",
        "prefetch",
        "cancelled",
        "source",
        "parent",
        "done",
        "settled",
        "run",
    )

    def __init__(
        self, buffer: Buffer, nunits: int, prefetch: bool, source: str, parent, run: int = 1
    ):
        self.buffer = buffer
        self.ready = [trio.Event() for _ in range(nunits)]
        self.errors: dict[int, KvfsError] = {}
        self.queues: dict[int, collections.deque[int]] = {}  # namespace -> units not yet issued
        self.prefetch = prefetch
        self.cancelled = False
        self.source = source  # "pool" or "local"
        self.parent = parent  # the block before it in its chain walk, for the policy
        self.done = trio.Event()
        # done, or a unit failed: a reader of the whole block has its answer (the fetch goes
        # on: a reader streaming other units may still want them)
        self.settled = trio.Event()
        self.run = run  # units per I/O: 1 while a reader streams it

    def expedite(self, layout: Layout, k: int) -> None:
        """A reader waits for unit k: issue it before the namespace's other queued units."""
        q = self.queues.get(layout.ns[k] if self.source == "pool" else 0)
        if q and q[0] != k and k in q:
            q.remove(k)
            q.appendleft(k)


class Fetcher:
    """Moves units from the pool or the local tier into buffers, counting what it moved in the
    store's statistics."""

    def __init__(self, pool: Pool, local, stats):
        self.pool = pool
        self.local = local
        self.stats = stats

    async def read_units(self, rec: BlobRec, ks, buf: Buffer) -> None:
        """Read units of a block from the pool into `buf` (runs in parallel); EIO if any fails."""
        lay = rec.layout

        async def run_reader(run: list[int]) -> None:
            if await self.read_run(rec, run, buf, "pool", False):
                raise KvfsError(errno.EIO, f"checksum mismatch in block {rec.id}")

        await run_all(
            (lambda r=r: run_reader(r)) for r in self.pool.runs(lay.ns, lay.offsets, lay.size, ks)
        )

    async def read_run(
        self, rec: BlobRec, run: list[int], buf: Buffer, source: str, prefetch: bool
    ) -> list[int]:
        """Read a run of units (back to back on one device) from the pool or the local tier;
        returns the units that failed their checksums."""
        length = sum(rec.layout.unit_span(k)[1] for k in run)
        if source == "local":
            bad = await self.local.read_run(rec, run, buf, prefetch)
            self.stats.tiers["local"].bytes_out += length
        else:
            bad = await self.pool.read_run(rec.layout, run, buf, prefetch=prefetch)
            self.stats.bytes_from_pool += length
            self.stats.tiers["pool"].bytes_out += length
        return bad

    @staticmethod
    def _take_run(q: collections.deque[int], layout: Layout, limit: int) -> list[int]:
        """The next units of a namespace's queue that lie back to back there (`limit` at
        most): one I/O. The queue's head is what a reader waits for first."""
        run = [q.popleft()]
        while q and len(run) < limit:
            p, k = run[-1], q[0]
            if layout.ns[k] != layout.ns[p] or layout.offsets[k] != layout.offsets[
                p
            ] + layout.stored(p):
                break
            run.append(q.popleft())
        return run

    async def fill(
        self, rec: BlobRec, fetch: Fetch
    ) -> tuple[dict[int, int], float, dict[int, float]]:
        """Read the fetch's queued units (all of them, unless a prefetch is cancelled); returns
        (units per namespace, the start, seconds until each namespace's last unit) for
        placement (`Placement.observe`)."""
        units = {j: len(q) for j, q in fetch.queues.items()}
        t0 = time.perf_counter()
        done: dict[int, float] = {}
        local = fetch.source == "local"
        layout = self.local.layout(rec.id) if local else rec.layout

        async def worker(j: int, q: collections.deque[int]) -> None:
            while q and not fetch.cancelled:
                run = self._take_run(q, layout, fetch.run)
                try:
                    for k in await self.read_run(
                        rec, run, fetch.buffer, fetch.source, fetch.prefetch
                    ):
                        fetch.errors[k] = KvfsError(
                            errno.EIO, f"checksum mismatch in unit {k} of block {rec.id}"
                        )
                        fetch.settled.set()
                except KvfsError as e:
                    for k in run:
                        fetch.errors[k] = e
                    fetch.settled.set()
                finally:
                    for k in run:
                        fetch.ready[k].set()
                done[j] = time.perf_counter() - t0

        while True:
            if len(fetch.queues) == 1:
                ((j, q),) = fetch.queues.items()
                if len(q) <= fetch.run:  # (one I/O at most, a small block: no nursery)
                    await worker(j, q)
                    if fetch.cancelled and not fetch.prefetch:
                        fetch.cancelled = False
                        continue
                    return units, t0, done
            async with trio.open_nursery() as nursery:
                for j, q in fetch.queues.items():
                    qd = self.local.queue_depth if local else self.pool.namespaces[j].queue_depth
                    for _ in range(min(len(q), qd, FETCH_WINDOW)):
                        nursery.start_soon(worker, j, q)
            if fetch.cancelled and not fetch.prefetch:
                fetch.cancelled = False  # a reader came for it after all: finish
                continue
            return units, t0, done
