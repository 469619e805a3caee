"""One namespace: a block device or a preallocated file, read and written with O_DIRECT.

Blocking calls (preadv, pwritev, fsync) run in worker threads (`kvfs.tasks.run_sync`), as
many at once as the namespace's I/O slots allow (its queue depth; the one shared fdatasync
besides); the trio thread never blocks on the device. Small blocks, which go through staging
memory, are read and written by Linux AIO from the trio thread instead where the namespace
allows it (`Namespace.aio`, kvfs/pool/linux_aio.py): a hand-off to a thread cost more CPU there
than the I/O. A failing device (EIO, a device that
went away, a short transfer) fails only the I/O that touched it, with EIO; the namespace is
reported as failed in its statistics until an I/O succeeds again. With I/O worker processes
(`[pool] io_workers`, kvfs/pool/io_workers.py) a fetch's reads go to them instead
(`read_into_file`): the units land in the block's own memory file, verified there.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import stat
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import trio

from kvfs import tasks
from kvfs.errors import DeviceError, KvfsError, StartupError
from kvfs.pool import linux_aio
from kvfs.pool.buffer import populate
from kvfs.pool.io_workers import IoWorkers, WorkerLost
from kvfs.pool.layout import PAGE
from kvfs.pool.namespace_aio import AioPaths
from kvfs.pool.read_health import ReadHealth
from kvfs.pool.requests import (
    PrioritySlots,
    WriteRequest,
    mismatched,
    transfer,
)
from kvfs.pool.requests import digests as unit_digests
from kvfs.pool.superblock import PROBE_BYTES, SB_SIZE, Superblock, SuperblockError, decode
from kvfs.tasks import run_all

log = logging.getLogger("kvfs.pool.namespace")

BLKGETSIZE64 = 0x80081272
RATE_WINDOW = 16 << 20  # bytes per throughput sample
GROUP_WRITE_BYTES = 1 << 20  # durable writes up to this size share a job and an fdatasync
GROUPS_IN_FLIGHT = 2  # groups a namespace runs at once (the next forms meanwhile)
BATCH_JOB_BYTES = 8 << 20  # a write-back batch's bytes per worker job on a namespace
RETRY_SECONDS = 2.0  # a failed namespace without errors for this long is tried again
DEADLINE_RATE = 64e6  # bytes per second a deadline allows beyond io_timeout
STABLE_TRIES = 4  # writes of memory that keeps changing before a copy is written
DAEMON_SHORTAGES = (errno.EMFILE, errno.ENFILE, errno.ENOMEM)


@dataclass
class NamespaceStats:
    reads: int = 0
    writes: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    errors: int = 0
    state: str = "ok"  # "ok" or "failed"
    last_error: str = ""
    inflight: int = 0
    busy_seconds: float = 0.0  # time with at least one I/O in flight
    rate_bps: float = 0.0  # recent bytes per busy second (0 until measured)
    aio_fallbacks: int = 0  # small-block I/Os AIO refused (EAGAIN...), done by a thread
    timeouts: int = 0  # jobs past their deadline (Namespace.bounded)
    read_state: str = "ok"  # "ok", or "failed": a read missed its deadline or failed
    # (kvfs/pool/read_health.py) and reads are refused at once until a probe answers in time
    read_timeouts: int = 0  # reads found past their deadline
    reads_refused: int = 0  # reads failed at once while failed for reads


def probe(path: Path) -> tuple[bool, bool, int]:
    """(exists, is_block_device, size in bytes) of a namespace path, without opening it for I/O."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False, False, 0
    if stat.S_ISBLK(st.st_mode):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:  # ENXIO: a device node with no device behind it
            raise StartupError(
                f"namespace {path}: cannot open the device: {e.strerror}: is it attached?", e.errno
            ) from None
        try:
            buf = fcntl.ioctl(fd, BLKGETSIZE64, b"\0" * 8)
        finally:
            os.close(fd)
        size = struct.unpack("<Q", buf)[0]
        if size == 0:
            raise StartupError(
                f"namespace {path}: the block device has no capacity (0 bytes): "
                f"is it attached? (a detached loop device or a disconnected "
                f"NVMe-oF namespace looks like this)",
                errno.ENXIO,
            )
        return True, True, size
    if stat.S_ISREG(st.st_mode):
        return True, False, st.st_size
    raise StartupError(f"namespace {path}: not a block device or regular file")


class Namespace(AioPaths):
    """An open namespace. Create with `Namespace.open`; I/O methods must run inside trio."""

    def __init__(
        self,
        index: int,
        path: Path,
        fd: int,
        size: int,
        is_block: bool,
        direct: bool,
        queue_depth: int,
        weight: float,
        io_engine: str = "auto",
        io_timeout: float | None = None,
        read_timeout: float | None = None,
    ):
        self.index = index
        self.path = path
        self.fd = fd
        self.size = size
        self.is_block = is_block
        self.direct = direct
        self.queue_depth = queue_depth
        self.weight = weight
        # small staged reads and writes by Linux AIO from the trio thread (kvfs/pool/linux_aio.py):
        # O_DIRECT only (a buffered AIO blocks in io_submit); on a file with RWF_NOWAIT: an I/O
        # its file system would block for goes to a worker thread (`aio_fallbacks`)
        self.aio = direct and io_engine == "auto"
        self.nowait = not is_block
        self.stats = NamespaceStats()
        self._failed_at = 0.0  # (monotonic) the last error that marked it failed
        self._failed_writing = False  # ... and whether a write failed since it was ok
        self.io_timeout = io_timeout  # seconds (`bounded`); None: no deadline
        self.late = 0  # jobs past their deadline, still in flight
        # reads in flight, their deadline, failed for reads (kvfs/pool/read_health.py)
        self.health = ReadHealth(self, read_timeout, DEADLINE_RATE)
        self.slots = PrioritySlots(queue_depth)
        # shared fdatasyncs (see `sync`): numbers of the last sync started and completed
        self._sync_started = 0
        self._sync_done = 0
        self._syncing = False
        self._sync_round: trio.Event | None = None
        self.syncs = 0
        # small durable writes grouped into one job and one sync (see `_write_grouped`)
        self._group: list[WriteRequest] = []
        self._groups_running = 0
        self._busy_mark = 0.0
        self._window_bytes = 0
        self._window_busy = 0.0

    def __repr__(self) -> str:
        return f"<Namespace {self.index} {self.path}>"

    @property
    def removed(self) -> bool:
        """Removed from the pool (`kvfs pool remove`): a number with no space, no reads and
        no writes (kvfs/pool/members.py)."""
        return self.stats.state == "removed"

    def retire(self) -> None:
        """Remove it from the pool: no new units (placement), every read refused at once
        (`ReadHealth.refused`). The descriptor stays open until the pool closes: I/O that was
        in flight ends on it, never on a descriptor reused meanwhile."""
        self.stats.state = self.stats.read_state = "removed"
        self.health.failed_at = self.health.failed_at or time.monotonic()

    @classmethod
    def open(
        cls,
        index: int,
        path: Path,
        *,
        queue_depth: int = 8,
        weight: float = 1.0,
        create_size: int | None = None,
        io_engine: str = "auto",
        io_timeout: float | None = None,
        read_timeout: float | None = None,
    ) -> "Namespace":
        """Open (and with `create_size`, first create and preallocate) a namespace.

        Raises StartupError with a one-line message on any problem.
        """
        exists, is_block, size = probe(path)
        if not exists:
            if create_size is None:
                raise StartupError(f"namespace {path}: does not exist", errno.ENOENT)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    os.posix_fallocate(fd, 0, create_size)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as e:
                try:
                    os.unlink(path)
                except OSError:
                    pass
                raise StartupError(
                    f"namespace {path}: cannot create a {create_size}-byte file: {e.strerror}",
                    e.errno,
                ) from None
            size = create_size
        flags = os.O_RDWR | getattr(os, "O_CLOEXEC", 0)
        direct = True
        try:
            fd = os.open(path, flags | os.O_DIRECT)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise StartupError(
                    f"namespace {path}: cannot open: {e.strerror}", e.errno
                ) from None
            # The filesystem under a file namespace does not do O_DIRECT (tmpfs on old kernels):
            # fall back to buffered I/O; fsync at commit still makes writes durable.
            fd = os.open(path, flags)
            direct = False
            log.warning("namespace %s: O_DIRECT is not supported here; using buffered I/O", path)
        size -= size % PAGE
        return cls(
            index,
            path,
            fd,
            size,
            is_block,
            direct,
            queue_depth,
            weight,
            io_engine,
            io_timeout,
            read_timeout,
        )

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # --- superblock (synchronous: used at start-up and by `kvfs format`) -----------------------
    def read_head(self) -> bytes:
        import mmap

        n = (PROBE_BYTES + PAGE - 1) // PAGE * PAGE
        buf = mmap.mmap(-1, n)
        try:
            got = os.preadv(self.fd, [buf], 0)
        except OSError as e:
            raise StartupError(
                f"namespace {self.path}: cannot read: {e.strerror}", e.errno
            ) from None
        return bytes(buf[:got])

    def read_superblock(self) -> Superblock | None:
        try:
            return decode(self.read_head()[:SB_SIZE])
        except SuperblockError as e:
            raise StartupError(f"namespace {self.path}: {e}") from None

    def write_superblock(self, sb: Superblock) -> None:
        import mmap

        buf = mmap.mmap(-1, SB_SIZE)
        buf[:] = sb.encode()
        try:
            transfer(os.pwritev, self.fd, [memoryview(buf)], 0)
            os.fsync(self.fd)
        except OSError as e:
            raise StartupError(
                f"namespace {self.path}: cannot write the superblock: {e.strerror}", e.errno
            ) from None

    # --- data I/O (async) --------------------------------------------------------------------
    def _failed(self, what: str, e: OSError, writing: bool = True) -> KvfsError:
        """The error of an I/O the device failed (`DeviceError`, the namespace marked failed),
        or of one the daemon could not make (DAEMON_SHORTAGES: the errno itself)."""
        msg = f"namespace {self.index} ({self.path}): {what}: {e.strerror or e}"
        if e.errno in DAEMON_SHORTAGES:
            # the daemon ran short (descriptors, memory) making the I/O: no sign the device
            # failed, so it is not marked failed; the request fails with the errno itself
            log.error(msg)
            return KvfsError(e.errno, msg)
        self.stats.errors += 1
        if self.stats.state == "ok":
            log.error("%s; marking the namespace failed", msg)
        if not self.removed:
            self.stats.state = "failed"
        self.stats.last_error = msg
        self._failed_at = time.monotonic()
        self._failed_writing = self._failed_writing or writing
        return DeviceError(msg, self.index)  # a device's failure: the block may go elsewhere

    def on_probation(self) -> bool:
        """A failed namespace with no error for RETRY_SECONDS and no job still in flight past
        its deadline: placement tries it again (a write that fails there is placed
        elsewhere: kvfs/write/writeback.py), so a device that healed is used again without a
        remount."""
        return (
            self.stats.state == "failed"
            and not self.late
            and time.monotonic() - self._failed_at >= RETRY_SECONDS
        )

    async def bounded(self, job, nbytes: int):
        """Run `job()` (this namespace's I/O of `nbytes`) and return its result, within the
        deadline: `io_timeout` plus the bytes at DEADLINE_RATE. Past it, the namespace is
        failed (for new placement) and EIO raised at once, while the job goes on in a system
        task: it owns its memory and the extents it writes until it ends, and the EIO's
        `pending` (a trio.Event) says when (the caller frees those extents then). The I/O
        itself cannot be taken back: O_DIRECT, in the kernel or a worker thread."""
        if self.io_timeout is None:
            return await job()
        done, box = trio.Event(), {}

        async def run() -> None:
            try:
                box["result"] = await job()
            except Exception as e:  # noqa: BLE001 - handed to the caller, or logged if late
                box["error"] = e
            finally:
                done.set()

        trio.lowlevel.spawn_system_task(run)
        limit = self.io_timeout + nbytes / DEADLINE_RATE
        with trio.move_on_after(limit):
            await done.wait()
        if done.is_set():
            if "error" in box:
                raise box["error"]
            return box.get("result")
        self.late += 1
        self.stats.timeouts += 1

        async def settle() -> None:
            await done.wait()
            self.late -= 1
            if "error" in box:
                log.warning(
                    "namespace %d (%s): an I/O past its deadline ended: %s",
                    self.index,
                    self.path,
                    box["error"],
                )

        trio.lowlevel.spawn_system_task(settle)
        err = self._failed(
            f"no answer within {limit:.1f} s (io_timeout_ms)",
            OSError(errno.ETIMEDOUT, os.strerror(errno.ETIMEDOUT)),
        )
        err.pending = done  # (a DeviceError: ETIMEDOUT is no daemon shortage)
        raise err

    def _ok(self, writing: bool = True) -> None:
        """An I/O succeeded. A failed namespace is ok again once it has had no error for
        RETRY_SECONDS, and a write failure ends only with a write that succeeds (a device
        that fills still reads: its reads would make it flip between ok and failed, and
        placement send writes to it, at every read)."""
        if (
            self.stats.state != "failed"
            or (self._failed_writing and not writing)
            or time.monotonic() - self._failed_at < RETRY_SECONDS
        ):
            return
        log.warning("namespace %d (%s): I/O succeeds again; marking it ok", self.index, self.path)
        self.stats.state = "ok"
        self._failed_writing = False

    async def read(
        self,
        views: Sequence[memoryview],
        offset: int,
        check: tuple[int, int] | None = None,
        prefetch: bool = False,
    ) -> None:
        """Fill `views` from `offset`. With `check=(length, digest)`, verify the xxh3-64 of the
        first `length` bytes (off the trio thread) and raise EIO on a mismatch. A `prefetch`
        read yields to demand reads for an I/O slot."""
        bad = await self.read_units([list(views)], offset, [check], prefetch)
        if bad:
            raise KvfsError(errno.EIO, self._mismatch(offset, sum(len(v) for v in views)))

    async def read_units(
        self,
        units,
        offset: int,
        checks: list[tuple[int, int] | None],
        prefetch: bool = False,
        *,
        sizes: list[int] | None = None,
        after=None,
    ) -> list[int]:
        """Fill several units that lie back to back from `offset` with one preadv, and verify
        each unit's checksum (`checks[i]` = (length, digest) or None). Returns the indices of
        the units whose checksum did not match (each logged); raises EIO if the read failed.
        `units` is a list of each unit's views, or a function that makes them (called in the
        worker thread; `sizes`, each unit's length, is then given); `after(units)`, if given,
        runs in the worker thread once they are read."""
        if callable(units):
            flat = None
        else:
            flat = [v for u in units for v in u]
            sizes = [sum(len(v) for v in u) for u in units]
        nbytes = sum(sizes)
        # staged reads by AIO from the trio thread (kvfs/pool/linux_aio.py); a large block's units
        # go on to worker threads: its checksums, a millisecond per MiB or so, would hold up
        # every request on the trio thread, and threads verify in parallel
        eng = linux_aio.engine() if flat is None and self.aio else None

        async def read() -> list[int]:
            if eng is not None:
                try:
                    return await self._read_aio(eng, units, nbytes, offset, checks, after)
                except OSError as e:
                    if not self._falls_back(e):
                        raise
            return await tasks.run_sync(self._read_sync, units, flat, offset, checks, after)

        return await self._read(offset, sizes, prefetch, read)

    async def read_into_file(
        self,
        workers: "IoWorkers",
        fd: int,
        length: int,
        spans: list[tuple[int, int, int]],
        offset: int,
        checks: list[tuple[int, int] | None],
        prefetch: bool = False,
    ) -> list[int] | None:
        """`read_units` by an I/O worker process (kvfs/pool/io_workers.py): the units that lie
        back to back from `offset` land in the file `fd` (`length` bytes) at `spans` ((start,
        stored length, content length) each), read and verified there, padding zeroed. The
        indices of the units that failed their checksums; None if the worker died first
        (nothing was read: read them with `read_units`). Raises EIO if the read failed."""
        try:
            return await self._read(
                offset,
                [stored for _, stored, _ in spans],
                prefetch,
                lambda: workers.read(self.index, offset, fd, length, spans, checks),
            )
        except WorkerLost:
            return None

    async def _read(self, offset: int, sizes: list[int], prefetch: bool, io) -> list[int]:
        """Run one read, `await io()` (the indices of its units that failed their checksums),
        in an I/O slot, counted; an OSError of the device marks the namespace failed and is
        raised as EIO (a `WorkerLost` is raised as it is: nothing was read). While the
        namespace is failed for reads (kvfs/pool/read_health.py) it raises `Unreadable` at
        once, before and after waiting for a slot (readers queued behind a stalled read go at
        once too)."""
        health = self.health
        if health.failed_at:
            raise health.refused()
        nbytes = sum(sizes)
        async with self.slots.take(prefetch):
            if health.failed_at:
                raise health.refused()
            self._begin()
            key = health.begin(nbytes)
            try:
                bad = await io()
            except WorkerLost:
                raise
            except OSError as e:
                err = self._failed(f"read of {nbytes} bytes at {offset}", e, writing=False)
                if isinstance(err, DeviceError):
                    health.fail(f"a read failed: {e.strerror or e}")
                raise err from None
            finally:
                health.end(key)
                self._end(nbytes)
        return self._read_done(offset, sizes, bad)

    def _read_done(self, offset: int, sizes: list[int], bad: list[int]) -> list[int]:
        """Count a read that ended, and log the units that failed their checksums."""
        self.stats.reads += 1
        self.stats.bytes_read += sum(sizes)
        if not bad:  # bytes that fail their checksums are no sign the device is back
            self._ok(writing=False)
        for i in bad:
            self.stats.errors += 1
            log.error(self._mismatch(offset + sum(sizes[:i]), sizes[i]))
        return bad

    def _mismatch(self, offset: int, nbytes: int) -> str:
        return (
            f"namespace {self.index} ({self.path}): checksum mismatch in {nbytes} bytes at "
            f"offset {offset}"
        )

    async def write(self, views: Sequence[memoryview], offset: int, digest_len: int = -1) -> int:
        """Write `views` at `offset`; return the xxh3-64 of the first `digest_len` bytes (computed
        off the trio thread), or 0 when digest_len is negative."""
        return (await self.write_units([list(views)], offset, [digest_len]))[0]

    async def write_units(
        self,
        units,
        offset: int,
        digest_lens: list[int],
        sync: bool = False,
        nbytes: int | None = None,
        verify: bool = False,
    ) -> list[int]:
        """Write several units back to back from `offset` with one pwritev; return each unit's
        xxh3-64 over its first `digest_lens[i]` bytes (0 where that is negative). With `sync`
        the write is durable on return: the worker thread that wrote also fdatasyncs when no
        sync is running (one hop for a small block), else the write joins the next shared
        sync (`sync()`). `units` is a list of each unit's views, or a function that makes
        them (called in the worker thread; `nbytes`, their total length, is then given).
        `verify`: the views are memory the kernel may write meanwhile (see `_write_sync`)."""
        if callable(units):
            flat = None
        else:
            flat = [v for u in units for v in u]
            nbytes = sum(len(v) for v in flat)
        if offset < 0 or offset + nbytes > self.size:
            raise KvfsError(errno.EIO, f"namespace {self.index}: write at {offset} beyond its end")
        if sync and nbytes <= GROUP_WRITE_BYTES:
            return await self._write_grouped(
                WriteRequest(units, flat, offset, digest_lens, nbytes, verify)
            )
        lead = sync and not self._syncing
        if lead:  # this job's fdatasync is the round others wait for
            number = self._begin_sync()
        try:
            async with self.slots.take():
                self._begin()
                try:
                    digests = await tasks.run_sync(
                        self._write_sync, units, flat, offset, digest_lens, lead, verify
                    )
                except OSError as e:
                    raise self._failed(f"write of {nbytes} bytes at {offset}", e) from None
                finally:
                    self._end(nbytes)
        finally:
            if lead:
                self._end_sync(number, ok=sys.exc_info()[0] is None)
        if sync and not lead:
            await self.sync()
        self.stats.writes += 1
        self.stats.bytes_written += nbytes
        self._ok()
        return digests

    async def _write_grouped(self, req: "WriteRequest") -> list[int]:
        """A small write that must be durable on return, grouped with the others queued on
        this namespace: one worker job writes every queued request (a pwritev each) and then
        fdatasyncs once, so a burst of small commits costs one thread hop and one sync per
        namespace instead of one or two per block. While a group runs, new requests queue;
        the first of them leads the next group once it is done."""
        self._group.append(req)
        if self._groups_running >= GROUPS_IN_FLIGHT:
            with trio.CancelScope(shield=True):  # a lost leader would stall the queue
                await req.done.wait()
            if req.batch is None:
                return req.result()
            batch = req.batch  # handed the queue by a group that ended
        else:
            self._groups_running += 1
            batch, self._group = self._group, []
        try:
            with trio.CancelScope(shield=True):
                await self._run_group(batch)
        finally:
            for r in batch:
                r.finished()
            if self._group:  # the queue becomes the next group, which the
                nxt = self._group[0]  # first request waiting leads (this group's slot)
                nxt.batch, self._group = self._group, []
                nxt.done.set()
            else:
                self._groups_running -= 1
        return req.result()

    async def write_batch(self, reqs: list["WriteRequest"]) -> None:
        """Write a batch of requests (the write-back flusher's runs on this namespace) in as
        few worker jobs as BATCH_JOB_BYTES allows (one for a batch of small blocks), each a
        pwritev per request with its checksums computed on the way, then make them durable
        with one fdatasync. Each request ends with its digests or its own error
        (`WriteRequest.result`); a failed fdatasync fails them all."""
        jobs: list[list[WriteRequest]] = [[]]
        size = 0
        for r in reqs:
            if jobs[-1] and size + r.nbytes > BATCH_JOB_BYTES:
                jobs.append([])
                size = 0
            jobs[-1].append(r)
            size += r.nbytes
        if len(jobs) == 1:
            await self._run_group(jobs[0])
            return
        await run_all((lambda j=j: self._run_group(j, sync=False)) for j in jobs)
        written = [r for r in reqs if r.error is None]
        if written:
            try:
                await self.sync()
            except KvfsError as e:
                for r in written:
                    r.error = e

    async def _run_group(self, batch: list["WriteRequest"], sync: bool = True) -> None:
        """One group's job: its writes, then (with `sync`) its own fdatasync (groups in
        flight at once each sync after their own writes).
        Every error of every step (a write, a short write, io_submit, a completion, the
        fdatasync; anything else raised on the way) ends as a request's own `KvfsError`:
        nothing raised here reaches the caller's nursery."""
        nbytes = sum(r.nbytes for r in batch)
        # staged writes by AIO from the trio thread (kvfs/pool/linux_aio.py)
        eng = linux_aio.engine() if self.aio and all(r.flat is None for r in batch) else None
        sync_error: BaseException | None = None
        async with self.slots.take():
            self._begin()
            try:
                if eng is not None:
                    sync_error = await self._write_group_aio(eng, batch, sync)
                else:
                    sync_error = await tasks.run_sync(self._write_group_sync, batch, sync)
            except (OSError, KvfsError) as e:
                sync_error = e  # (a step outside any one request: all of them fail)
                for r in batch:
                    r.error = r.error or e
            except Exception as e:  # noqa: BLE001 - a bug must not take the mount down
                log.exception("namespace %s: a group of %d writes failed", self.path, len(batch))
                sync_error = OSError(errno.EIO, f"{type(e).__name__}: {e}")
                for r in batch:
                    r.error = r.error or sync_error
            finally:
                self._end(nbytes)
        # each request's own error first (also when the fdatasync failed: a request whose
        # write failed must not keep a raw OSError, which nothing above catches)
        for r in batch:
            if isinstance(r.error, OSError):
                r.error = self._failed(f"write of {r.nbytes} bytes at {r.offset}", r.error)
        written = [r for r in batch if r.error is None]
        if sync_error is not None:
            err = (
                sync_error
                if isinstance(sync_error, KvfsError)
                else self._failed("fdatasync", sync_error)
            )
            for r in written:
                r.digests = None
                r.error = err
            return
        if written and sync:
            self.syncs += 1
        for r in written:
            self.stats.writes += 1
            self.stats.bytes_written += r.nbytes
        if written:
            self._ok()

    def _write_group_sync(self, batch: list["WriteRequest"], then_sync: bool) -> OSError | None:
        """In a worker thread: each request's checksums and pwritev (an error fails that
        request only), then one fdatasync if any was written; returns its error, or None."""
        any_written = False
        for r in batch:
            try:
                r.digests = self._write_sync(
                    r.units, r.flat, r.offset, r.digest_lens, verify=r.verify
                )
                any_written = True
            except OSError as e:
                r.error = e
        if then_sync and any_written:
            try:
                os.fdatasync(self.fd)
            except OSError as e:
                return e
        return None

    def _read_sync(self, units, flat, offset: int, checks, after=None) -> list[int]:
        """In a worker thread: one preadv (looping over short transfers), then the checksums;
        the indices of the units that failed theirs."""
        if callable(units):  # (the caller's memory, already present: staging)
            units = units()
            flat = [v for u in units for v in u]
        else:
            populate(flat)
        transfer(os.preadv, self.fd, flat, offset)
        bad = mismatched(units, checks)
        if after is not None:
            after(units)
        return bad

    def _write_sync(
        self, units, flat, offset: int, digest_lens, then_sync: bool = False, verify: bool = False
    ) -> list[int]:
        """In a worker thread: the checksums, then one pwritev (and an fdatasync). Staged
        units (`units` a function) are a private copy. With `verify`, `flat` is memory the
        kernel may write into meanwhile (`Buffer.shared`): the checksums are taken again
        after the write, and the write repeated until both agree, so the checksums recorded
        are those of the bytes written (a concurrent writer made them differ: after the
        block was evicted, the whole file read EIO). Memory still changing after
        STABLE_TRIES writes is copied, and the copy checksummed and written."""
        if callable(units):
            units = units()
            flat = [v for u in units for v in u]
        digests = unit_digests(units, digest_lens)
        for _ in range(STABLE_TRIES):
            transfer(os.pwritev, self.fd, flat, offset)
            if not verify:
                break
            again = unit_digests(units, digest_lens)
            if again == digests:
                break
            digests = again
        else:
            log.warning(
                "namespace %d: the block at %d changed while it was written, %d "
                "times: writing a copy",
                self.index,
                offset,
                STABLE_TRIES,
            )
            copy = mmap.mmap(-1, sum(len(v) for v in flat))
            pos, frozen = 0, []
            for u in units:
                views = []
                for v in u:
                    copy[pos : pos + len(v)] = v
                    views.append(memoryview(copy)[pos : pos + len(v)])
                    pos += len(v)
                frozen.append(views)
            digests = unit_digests(frozen, digest_lens)
            transfer(os.pwritev, self.fd, [v for u in frozen for v in u], offset)
        if then_sync:
            os.fdatasync(self.fd)
        return digests

    def _begin_sync(self) -> int:
        self._syncing = True
        self._sync_started += 1
        self._sync_round = trio.Event()
        return self._sync_started

    def _end_sync(self, number: int, ok: bool) -> None:
        self._syncing = False
        if ok:
            self._sync_done = max(self._sync_done, number)
            self.syncs += 1
        self._sync_round.set()

    async def sync(self) -> None:
        """Make completed writes durable (fdatasync: for a file, for a block device's cache).

        Shared by concurrent committers: this returns once an fdatasync that started after the
        call has completed; while one runs, callers wait for it to end and the first of them
        starts the next, which covers them all (one sync for a burst of commits)."""
        need = self._sync_started + 1  # the first sync that starts from now on
        while self._sync_done < need:
            if self._syncing:
                await self._sync_round.wait()
                continue
            number = self._begin_sync()
            ok = False
            try:
                await tasks.run_sync(os.fdatasync, self.fd)
                ok = True
            except OSError as e:
                raise self._failed("fdatasync", e) from None
            finally:
                self._end_sync(number, ok)

    # --- throughput, for placement ---------------------------------------------------------------
    def _begin(self) -> None:
        if self.stats.inflight == 0:
            self._busy_mark = time.perf_counter()
        self.stats.inflight += 1

    def _end(self, nbytes: int) -> None:
        now = time.perf_counter()
        self.stats.busy_seconds += now - self._busy_mark
        self._window_busy += now - self._busy_mark
        self._busy_mark = now
        self.stats.inflight -= 1
        self._window_bytes += nbytes
        if self._window_bytes >= RATE_WINDOW and self._window_busy > 0:
            rate = self._window_bytes / self._window_busy
            old = self.stats.rate_bps
            self.stats.rate_bps = rate if old == 0 else 0.5 * old + 0.5 * rate
            self._window_bytes = 0
            self._window_busy = 0.0
