"""A namespace's Linux AIO paths (kvfs/pool/linux_aio.py): small blocks, staged, read and
written from the trio thread rather than handed to a worker thread, and a write-back group's
staged writes merged when they are back to back on the device; an AIO the file system would
block for goes to a worker thread instead. A part of `Namespace` (kvfs/pool/namespace.py),
whose descriptor, statistics and thread paths (`_write_sync`) it uses."""

from __future__ import annotations

import errno
import logging

from kvfs import tasks
from kvfs.pool import linux_aio
from kvfs.pool.buffer import use_staging
from kvfs.pool.requests import MERGE_BYTES, WriteRequest, merged, mismatched, transfer_aio
from kvfs.pool.requests import digests as unit_digests

log = logging.getLogger("kvfs.pool.namespace")


class AioPaths:
    async def _write_group_aio(
        self, eng: "linux_aio.Engine", batch: list["WriteRequest"], then_sync: bool
    ) -> OSError | None:
        """`_write_group_sync` on the trio thread, for staged requests: their content copied
        into staging memory with their checksums and written by AIO, requests back to back on
        the device as one write (`merged`: a write-back batch's small blocks are allocated
        one after the other, and each io_submit costs the trio thread about 20 us), one run
        after the other as the worker thread would; then one fdatasync by AIO if any was
        written. A merged write that fails is tried again request by request, so that each
        request gets its own error."""
        any_written = False
        for run in merged(batch):
            if len(run) > 1:
                e = await self._write_run_aio(eng, run)
                if e is None:
                    any_written = True
                    continue
                log.debug(
                    "%s: a merged write of %d requests failed (%s): one by one",
                    self.path,
                    len(run),
                    e,
                )
            for r in run:
                if await self._write_one_aio(eng, r):
                    any_written = True
        if then_sync and any_written:
            try:
                await eng.fdatasync(self.fd)
            except OSError as e:
                return e
        return None

    async def _write_one_aio(self, eng: "linux_aio.Engine", r: "WriteRequest") -> bool:
        """One request by AIO, or by a worker thread where AIO falls back (`_falls_back`);
        whether it was written (else its error is set)."""
        e = await self._write_run_aio(eng, [r])
        if e is None:
            return True
        try:
            if not self._falls_back(e):
                raise e
            r.digests = await tasks.run_sync(
                self._write_sync, r.units, None, r.offset, r.digest_lens
            )
            return True
        except OSError as e2:
            r.digests = None
            r.error = e2
            return False

    async def _write_run_aio(
        self, eng: "linux_aio.Engine", run: list["WriteRequest"]
    ) -> OSError | None:
        """Requests back to back on the device staged into one memory, with their checksums,
        and written by one AIO write (`transfer_aio`: short writes continue); the error that
        stopped it, if any (their digests are unset then)."""
        # (one size for every run: its memory is reused, never faulted in afresh)
        mem = linux_aio.STAGING.take(max(MERGE_BYTES, sum(r.nbytes for r in run)))
        view = memoryview(mem)
        flat: list[memoryview] = []
        try:
            pos = 0
            for r in run:
                with use_staging(view[pos : pos + r.nbytes]):
                    units = r.units()
                r.digests = unit_digests(units, r.digest_lens)
                flat += [v for u in units for v in u]
                del units
                pos += r.nbytes
            await transfer_aio(eng.pwritev, self.fd, flat, run[0].offset, self.nowait)
            return None
        except OSError as e:
            for r in run:
                r.digests = None
            return e
        finally:
            del flat, view
            linux_aio.STAGING.give(mem)

    def _falls_back(self, e: OSError) -> bool:
        """Whether an AIO that failed with `e` goes to a worker thread: EAGAIN (a file system
        would have blocked for it, RWF_NOWAIT; or the AIO context is full), or a file system
        that does not take RWF_NOWAIT at all (then no more AIO on this namespace)."""
        if e.errno == errno.EOPNOTSUPP and self.nowait:
            log.warning(
                "namespace %s: its file system does not take RWF_NOWAIT; small blocks "
                "go to worker threads",
                self.path,
            )
            self.aio = False
        elif e.errno != errno.EAGAIN:
            return False
        self.stats.aio_fallbacks += 1
        return True

    async def _read_aio(
        self, eng: "linux_aio.Engine", make_units, nbytes: int, offset: int, checks, after
    ) -> list[int]:
        """`_read_sync` of staged units on the trio thread: `make_units()` makes their views
        in staging memory of this read's own, AIO fills them, their checksums are verified,
        then `after(units)` copies their content where it goes."""
        mem = linux_aio.STAGING.take(nbytes)
        try:
            with use_staging(mem):
                units = make_units()
            await transfer_aio(
                eng.preadv, self.fd, [v for u in units for v in u], offset, self.nowait
            )
            bad = mismatched(units, checks)
            if after is not None:
                after(units)
            return bad
        finally:
            linux_aio.STAGING.give(mem)
