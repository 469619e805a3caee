"""Whether a namespace answers reads in time: the reads in flight there, their deadline, and
the failed-for-reads state with its probe (issue 58).

A reader waits for the pool `[pool] read_timeout_ms` at most, plus its bytes at DEADLINE_RATE
(kvfs/tiers/store.py measures the wait). A reader that waited its deadline out asks each
namespace it waited for whether a read in flight there is past that read's own deadline
(`stalled`): a namespace that is, is failed for reads. From then on every read there is
refused at once (`Unreadable`: no new wait, the engine gets its miss within milliseconds),
until, once the stalled reads have ended, a probe of the first page answers within the
deadline; then it is read again, without a remount. A slow namespace that still answers (a
reader merely queued behind others) is not failed. Late reads are never taken back: they end
in the kernel or a worker, into memory their fetch keeps (kvfs/tiers/fetch.py).

Reads only: writes have their own deadline and failed state (Namespace.bounded). A namespace
that fills still reads, and one that stalls for reads is found by its readers.
"""

from __future__ import annotations

import logging
import mmap
import os
import time

import trio

from kvfs.errors import Unreadable

log = logging.getLogger("kvfs.pool.namespace")

PAGE = 4096
PROBE_SECONDS = 2.0  # between probes of a namespace failed for reads
CHECK_MAX = 8 << 20  # bytes a check of a direct reader's stalled read reads at most


class ReadHealth:
    """One namespace's reads in flight (start, bytes), its read deadline and whether it is
    failed for reads. Trio thread only."""

    def __init__(self, ns, timeout: float | None, rate: float):
        self.ns = ns  # the namespace (its index, path, descriptor and stats)
        self.timeout = timeout  # seconds; None: no deadline
        self.rate = rate  # bytes per second the deadline allows beyond `timeout`
        self.reads: dict[int, tuple[float, int]] = {}
        self._seq = 0
        self.failed_at = 0.0  # (monotonic) when it was failed for reads; 0: it is not

    def limit(self, nbytes: int) -> float | None:
        """How long a read of `nbytes` may take (None: no limit)."""
        if self.timeout is None:
            return None
        return self.timeout + nbytes / self.rate

    def begin(self, nbytes: int) -> int:
        """A read was issued; its key for `end`."""
        self._seq = key = self._seq + 1
        self.reads[key] = (time.monotonic(), nbytes)
        return key

    def end(self, key: int) -> None:
        del self.reads[key]

    def refused(self) -> Unreadable:
        """The error of a read refused while failed for reads (counted)."""
        ns = self.ns
        ns.stats.reads_refused += 1
        if ns.removed:
            return Unreadable(
                f"namespace {ns.index} ({ns.path}): removed from the pool",
                (ns.index,),
                waited=False,
            )
        return Unreadable(
            f"namespace {ns.index} ({ns.path}): failed for reads (no answer within "
            f"read_timeout_ms {time.monotonic() - self.failed_at:.1f} s ago); not waited for",
            (ns.index,),
            waited=False,
        )

    def stalled(self) -> bool:
        """Whether a read in flight is past its deadline (or reads are failed here already);
        the first time, fail reads here and start the probe."""
        if self.failed_at:
            return True
        if self.timeout is None:
            return False
        now = time.monotonic()
        late = [(t0, n) for t0, n in self.reads.values() if now - t0 > self.limit(n)]
        if not late:
            return False
        self.ns.stats.read_timeouts += len(late)
        t0, n = min(late)
        self.fail(f"a read of {n} bytes has had no answer for {now - t0:.1f} s (read_timeout_ms)")
        return True

    def fail(self, why: str) -> None:
        """Fail reads here (a read past its deadline, or one the device failed: a namespace
        that is gone fails every read, and refusing them saves each reader the round trip)
        until the probe answers in time."""
        if self.failed_at:
            return
        ns = self.ns
        ns.stats.read_state = "failed"
        self.failed_at = time.monotonic()
        log.error(
            "namespace %d (%s): %s; failing reads here at once until it answers again",
            ns.index,
            ns.path,
            why,
        )
        trio.lowlevel.spawn_system_task(self._probe)

    def suspect(self, offset: int, length: int, why: str) -> bool:
        """A direct reader (kvfs.client.direct, reading the namespace itself) had no answer
        for `length` bytes at `offset` within its deadline: read them here now, and fail
        reads here if they take longer than the deadline too (the reader's word alone fails
        nothing). False if the range is not one a check may read."""
        ns = self.ns
        if (
            offset % PAGE
            or length % PAGE
            or not 0 < length <= CHECK_MAX
            or offset < 0
            or offset + length > ns.size
        ):
            return False
        if not self.failed_at and self.timeout is not None:
            trio.lowlevel.spawn_system_task(self._check, offset, length, why)
        return True

    async def _check(self, offset: int, length: int, why: str) -> None:
        buf = mmap.mmap(-1, length)
        done = trio.Event()
        key = self.begin(length)

        async def read() -> None:
            try:
                await self._pread(buf, offset)
            except OSError as e:
                self.fail(f"{why}, and a check of it failed: {e.strerror or e}")
            finally:
                self.end(key)
                done.set()

        trio.lowlevel.spawn_system_task(read)
        limit = self.limit(length)
        with trio.move_on_after(limit):
            await done.wait()
        if not done.is_set():
            self.ns.stats.read_timeouts += 1
            self.fail(f"{why}, and a check of those {length} bytes had no answer in {limit:.1f} s")

    async def answers(self) -> bool:
        """Whether the namespace reads its first page within the deadline now (False while
        it is failed, for reads or writes, or has no descriptor)."""
        ns = self.ns
        if self.failed_at or ns.stats.state != "ok" or ns.fd < 0:
            return False
        page = mmap.mmap(-1, PAGE)
        with trio.move_on_after(self.limit(PAGE) or PROBE_SECONDS) as scope:
            try:
                await self._pread(page, 0)
            except OSError:
                return False
        return not scope.cancelled_caught

    async def _pread(self, buf: mmap.mmap, offset: int) -> None:
        """Read `buf` from `offset` in a thread of its own, outside the namespace's I/O slots
        (which stalled reads may hold). Abandoned if the daemon stops meanwhile: a hung
        device must not hold up its exit; the thread keeps the memory it reads into."""
        await trio.to_thread.run_sync(os.preadv, self.ns.fd, [buf], offset, abandon_on_cancel=True)

    async def _probe(self) -> None:
        """While failed for reads: every PROBE_SECONDS, once no read is in flight (the
        stalled ones ended), read the first page; one that answers within the deadline makes
        the namespace readable again. (The first page, not the place that failed: a bad
        sector must not keep the whole namespace from being read; a namespace that is gone
        fails there too.)"""
        ns = self.ns
        page = mmap.mmap(-1, PAGE)
        while True:
            await trio.sleep(PROBE_SECONDS)
            if ns.removed:
                return
            if self.reads or ns.fd < 0:
                continue
            t0 = time.monotonic()
            try:
                await self._pread(page, 0)
            except OSError:
                continue
            took = time.monotonic() - t0
            if self.timeout is None or took <= self.timeout:
                break
        log.warning(
            "namespace %d (%s): reads answer again (a probe took %.3f s); reading it again",
            ns.index,
            ns.path,
            took,
        )
        self.failed_at = 0.0
        ns.stats.read_state = "ok"
