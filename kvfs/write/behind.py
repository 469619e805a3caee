"""Write-behind: a block's stripe units written while its writer is still writing.

A sequential writer that has completely written a stripe unit and moved past it will not touch
it again (usually), so its unit can go to the namespaces while the writer goes on; close() then
only has the rest to write. `BlockWriter` is one block's set of such early writes.
"""

from __future__ import annotations

import time

import trio

from kvfs.errors import KvfsError
from kvfs.pool.buffer import Buffer
from kvfs.pool.layout import Layout, place_units, stored_length, unit_count
from kvfs.pool.pool import Pool
from kvfs.tasks import run_all


class BlockWriter:
    """Writes one block's stripe units as soon as they are final (write-behind), and the rest
    at commit, so a writer's transfer overlaps the namespaces' I/O.

    A session calls `write_early(k, ...)` for a unit its writer has completely written and moved
    past; the unit is placed (the same weighted rotation as `Pool.allocate`), allocated and
    written in the background. A later write into that unit marks it dirty (`touch`): it is
    written again at `finish`, which waits for early writes, writes whatever is missing or dirty,
    syncs the namespaces it touched and returns the block's layout. `abort` gives back every
    extent. Space taken early comes out of the session's reservation (kvfs/space/).
    """

    def __init__(self, pool: Pool):
        self.pool = pool
        self.weights = pool.placement_weights()
        self.start = pool.next_rotation()
        self.units: dict[int, tuple[int, int, int, int]] = {}  # k -> (ns, offset, stored, sum)
        self.inflight: dict[int, trio.Event] = {}
        self.dirty: set[int] = set()
        self.failed: set[int] = set()
        self.early_bytes = 0

    def _ns_for(self, k: int, nunits: int | None = None) -> int:
        return place_units(max(k + 1, nunits or 0), self.weights, self.start)[k]

    def started(self, k: int) -> bool:
        return k in self.units or k in self.inflight

    def touch(self, first: int, last: int) -> None:
        """Units first..last were written into again."""
        for k in range(first, last + 1):
            if k in self.units or k in self.inflight:
                self.dirty.add(k)

    def write_early(self, k: int, buf: Buffer, nursery: trio.Nursery) -> int:
        """Start writing full unit k in the background; returns the bytes it takes from the
        pool (to be moved out of the session's reservation), or 0 if it could not start."""
        pool = self.pool
        unit = pool.unit
        try:
            ns, off = pool.alloc_unit(self._ns_for(k), unit)
        except KvfsError:
            return 0
        done = trio.Event()
        self.inflight[k] = done
        self.early_bytes += unit

        late: list = []  # its I/O, if past its deadline (Pool.bounded)

        async def run() -> None:
            try:
                views = buf.io_views(k * unit, unit, pool.zero)
                pool.fence(off, unit)
                t = time.perf_counter()
                target = pool.namespaces[ns]
                digest = await pool.bounded(ns, lambda: target.write(views, off, unit), unit, late)
                self.units[k] = (ns, off, unit, digest)
                # adaptive placement learns from units written behind too (with write-behind
                # they are most of a block's units)
                pool.observe({ns: 1}, t, {ns: time.perf_counter() - t})
            except KvfsError:
                pool.free_after([(ns, off, unit)], late)  # (once a late write ended)
                self.early_bytes -= unit
                self.failed.add(k)
            finally:
                del self.inflight[k]
                done.set()

        nursery.start_soon(run)
        return unit

    async def _settle(self) -> None:
        for ev in list(self.inflight.values()):
            await ev.wait()

    async def finish(self, buf: Buffer, size: int) -> Layout:
        """Make the whole block durable and return its layout (EIO/ENOSPC: nothing kept)."""
        await self._settle()
        pool = self.pool
        if not self.units:
            return await pool.write_block(buf, size, deadline=True)
        unit = pool.unit
        n = unit_count(size, unit)
        placement = place_units(n, self.weights, self.start) if n else []
        ns_of, offsets, sums = [0] * n, [0] * n, [0] * n
        taken: list[tuple[int, int, int]] = []  # extents allocated in this call
        late: list = []  # I/Os past their deadline
        todo = []
        for k in list(self.units):
            ns, off, stored, digest = self.units[k]
            if k >= n or k in self.dirty or stored != stored_length(size, unit, k):
                del self.units[k]
                pool.free_extent(ns, off, stored)
        try:
            for k in range(n):
                if k in self.units:
                    ns_of[k], offsets[k], _, sums[k] = self.units[k]
                    continue
                stored = stored_length(size, unit, k)
                ns, off = pool.alloc_unit(placement[k], stored)
                taken.append((ns, off, stored))
                ns_of[k], offsets[k] = ns, off
                todo.append(k)

            def unit_writer(k: int):
                async def write() -> None:
                    start = k * unit
                    views = buf.io_views(start, stored_length(size, unit, k), pool.zero)
                    pool.fence(offsets[k], stored_length(size, unit, k))
                    target = pool.namespaces[ns_of[k]]
                    sums[k] = await pool.bounded(
                        ns_of[k],
                        lambda: target.write(views, offsets[k], min(unit, size - start)),
                        stored_length(size, unit, k),
                        late,
                    )

                return write

            await run_all(unit_writer(k) for k in todo)
            await run_all(
                (lambda j=j: pool.bounded(j, pool.namespaces[j].sync, 0, late))
                for j in sorted(set(ns_of))
            )
        except BaseException:
            pool.free_after(taken, late)  # (once the writes past their deadline ended)
            self._release_units()
            raise
        self.units.clear()
        return Layout(size, unit, tuple(ns_of), tuple(offsets), tuple(sums))

    def _release_units(self) -> None:
        for ns, off, stored, _ in self.units.values():
            self.pool.free_extent(ns, off, stored)
        self.units.clear()

    async def abort(self) -> None:
        """Give back everything written early (the block will not be committed)."""
        await self._settle()
        self._release_units()
