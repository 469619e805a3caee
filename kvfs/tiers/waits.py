"""A reader's wait for a fetch, bounded by `[pool] read_timeout_ms` (issue 58).

A reader of a block that is not resident waits for the units it reads (a read through the
daemon) or for the whole fetch (a passthrough open), at most the pool's read deadline
(`Pool.read_limit`: read_timeout_ms plus the block's bytes at 64 MB/s). Past it the reader
gets `Unreadable` (EIO; an open turns it into ENOENT, kvfs/fs/files.py), and each namespace it
waited for is asked whether a read there is past its own deadline: such a namespace is failed
for reads (kvfs/pool/read_health.py), and from then on a reader that would wait for a unit
there fails at once instead, including one that would join a fetch still waiting there. The
fetch itself goes on in its own task with its own buffer (kvfs/tiers/fetch.py): late I/O lands
in memory that no other block was given, and the block may still become resident once it ends.
"""

from __future__ import annotations

import trio

from kvfs.catalog.records import BlobRec
from kvfs.errors import DeviceError, KvfsError, Unreadable
from kvfs.pool.pool import Pool
from kvfs.tiers.fetch import Fetch

FOREVER = 1e9  # seconds: the wait of a pool with no read deadline


class ReadWaits:
    """Bounded waits for fetches, counted in the store's statistics (`read_timeouts`)."""

    def __init__(self, pool: Pool, stats):
        self.pool = pool
        self.stats = stats

    async def units(self, rec: BlobRec, fetch: Fetch, ks) -> None:
        """Wait for units `ks` of `fetch` (issued first: `Fetch.expedite`), within the
        deadline counted from the first one not yet read; raise the error of a unit that
        failed."""
        deadline = None
        for k in ks:
            if not fetch.ready[k].is_set():
                if deadline is None:
                    self.refuse_stalled(rec, fetch, ks)
                    limit = self.pool.read_limit(rec.size)
                    deadline = trio.current_time() + (FOREVER if limit is None else limit)
                fetch.expedite(rec.layout, k)
                with trio.move_on_at(deadline):
                    await fetch.ready[k].wait()
                if not fetch.ready[k].is_set():
                    raise self.late(rec, fetch, ks, limit)
            err = fetch.errors.get(k)
            if err is not None:
                raise again(err)

    async def whole(self, rec: BlobRec, fetch: Fetch) -> None:
        """Wait for the whole fetch to end, within the deadline; raise the error of a unit
        that failed (as soon as one has: the rest would not make the block whole)."""
        if not fetch.settled.is_set():
            every = range(len(fetch.ready))
            self.refuse_stalled(rec, fetch, every)
            limit = self.pool.read_limit(rec.size)
            with trio.move_on_after(FOREVER if limit is None else limit):
                await fetch.settled.wait()
            if not fetch.settled.is_set():
                raise self.late(rec, fetch, every, limit)
        for err in fetch.errors.values():
            raise again(err)

    def refuse_stalled(self, rec: BlobRec, fetch: Fetch | None, ks) -> None:
        """Unreadable at once if a unit in `ks` not yet read (by `fetch`, if any) lies on a
        namespace failed for reads."""
        if fetch is not None and fetch.source != "pool":
            return
        ns = rec.layout.ns
        hit = self.pool.failed_among(
            ns[k] for k in ks if fetch is None or not fetch.ready[k].is_set()
        )
        if hit:
            raise Unreadable(
                f"block {rec.id}: namespace(s) {', '.join(map(str, hit))} failed for reads "
                f"(read_timeout_ms); not waited for",
                tuple(hit),
                waited=False,
            )

    def late(self, rec: BlobRec, fetch: Fetch, ks, limit: float) -> Unreadable:
        """A reader waited its deadline out: the namespaces of the units still missing are
        asked whether a read there is past its own deadline (then failed for reads), and the
        reader gets Unreadable."""
        missing = [k for k in ks if not fetch.ready[k].is_set()]
        where = {rec.layout.ns[k] for k in missing} if fetch.source == "pool" else set()
        failed = self.pool.stalled(where)
        self.stats.read_timeouts += 1
        return Unreadable(
            f"block {rec.id}: {len(missing)} unit(s) not read within {limit:.1f} s "
            f"(read_timeout_ms) from the {fetch.source} tier"
            + (f"; namespace(s) {', '.join(map(str, failed))} failed for reads" if failed else ""),
            failed or tuple(sorted(where)),
            waited=True,
        )


def again(err: KvfsError) -> KvfsError:
    """A fetch's error raised for one more reader (a new exception: the fetch keeps its own),
    of the same kind."""
    if isinstance(err, Unreadable):
        return Unreadable(str(err), err.namespaces, err.waited)
    if isinstance(err, DeviceError):
        return DeviceError(str(err), err.namespace)
    return KvfsError(err.errno, str(err))
