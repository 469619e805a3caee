"""Linux native AIO (io_submit) for a namespace's small O_DIRECT I/O: no worker thread.

The namespaces (kvfs/pool/namespace.py) send their small staged reads (`preadv`), writes
(`pwritev`, merged where back to back) and the fdatasync after a group of writes (`fdatasync`,
IOCB_CMD_FDSYNC) through here when `[pool] io_engine = "auto"`.

Why: on the 2-vCPU development machine, an I/O handed to a worker thread cost more CPU in the
hand-offs than in the I/O. Per cold 256 KiB load the daemon made 16-23 voluntary context
switches (the worker's wake-up, and the GIL passed back and forth at each of its syscalls while
the trio thread wanted it too), and futex waits and wake-ups were about 40% of the daemon's CPU
in a `perf` profile (docs/performance.md, "Small blocks by Linux AIO"). With AIO the trio
thread submits the I/O itself (`io_submit` does not block for O_DIRECT on a block device: the
kernel queues the bio and returns), the completion is announced on an eventfd that trio's
epoll waits on, and one system task per trio run reaps every completion with `io_getevents`.
Nothing else runs Python meanwhile, so the GIL is never handed over.

Only I/O of memory the caller owns until it completes (staging memory, `Staging`), and only
with O_DIRECT: a buffered AIO blocks in io_submit. On a file (a namespace file on ext4 or
XFS) even an O_DIRECT I/O may block there, for the file system's locks or a journal handle,
so the namespaces ask for RWF_NOWAIT on files: the kernel fails such an I/O with EAGAIN, and
a worker thread does it instead.
Where the kernel refuses AIO (io_setup fails: a seccomp filter, aio-max-nr reached, another
architecture) `engine()` is None and the namespaces keep their worker threads.

The syscalls go through ctypes with the GIL held (`ctypes.PyDLL`): each takes microseconds, and
releasing the GIL around them is what this module is here to avoid.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import platform

import numpy as np
import outcome
import trio

from kvfs.pool.aio_abi import (  # noqa: F401 - the kernel's names, used below
    IOCB as _IOCB,
)
from kvfs.pool.aio_abi import (
    IOCB_CMD_FDSYNC,
    IOCB_CMD_PREADV,
    IOCB_CMD_PWRITEV,
    IOCB_FLAG_RESFD,
    RWF_NOWAIT,
)
from kvfs.pool.aio_abi import (
    NR as _NR,
)
from kvfs.pool.aio_abi import (
    Event as _Event,
)
from kvfs.pool.aio_abi import (
    Iovec as _Iovec,
)
from kvfs.pool.aio_abi import (
    Timespec as _Timespec,
)
from kvfs.pool.aio_abi import (
    syscall as _syscall,
)

log = logging.getLogger("kvfs.pool.linux_aio")


DEPTH = 1024  # I/Os in flight at once per engine (io_setup's nr_events); more
# are refused with EAGAIN, and the namespace uses a thread for them


def _iovecs(views: list[memoryview]):
    """A struct iovec array of the views (read-only ones too, such as the zero chunk)."""
    iov = (_Iovec * len(views))()
    for i, v in enumerate(views):
        if not len(v):
            continue
        if v.readonly:
            iov[i].iov_base = np.frombuffer(v, np.uint8).ctypes.data
        else:  # (the address without numpy's array: a tenth of the cost, per view of a file)
            iov[i].iov_base = ctypes.addressof(ctypes.c_char.from_buffer(v))
        iov[i].iov_len = len(v)
    return iov


_RUN = trio.lowlevel.RunVar("kvfs_linux_aio")
_disabled = os.environ.get("KVFS_AIO", "").lower() in ("0", "off", "false", "no")


class Engine:
    """One AIO context and its eventfd, reaped by a system task of the trio run."""

    def __init__(self):
        if _NR is None:
            raise OSError(errno.ENOSYS, f"no AIO syscall numbers for {platform.machine()}")
        ctx = ctypes.c_ulong(0)
        if _syscall(ctypes.c_long(_NR[0]), ctypes.c_long(DEPTH), ctypes.byref(ctx)) < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"io_setup: {os.strerror(e)}")
        self.ctx = ctx
        self.efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._events = (_Event * DEPTH)()
        self._zero = _Timespec(0, 0)
        self._waiting: dict[int, tuple[trio.lowlevel.Task, object]] = {}
        self._next = 1
        self.submitted = 0

    def close(self) -> None:
        """Destroy the context (the kernel waits for I/Os still in flight) and the eventfd."""
        if self.ctx is not None:
            _syscall(ctypes.c_long(_NR[1]), self.ctx)
            self.ctx = None
            os.close(self.efd)

    async def preadv(
        self, fd: int, views: list[memoryview], offset: int, nowait: bool = False
    ) -> int:
        """Read into `views` (writable, page-aligned memory the caller keeps until this
        returns) from `offset`; the bytes read, as preadv(2) returns them. With `nowait`
        (RWF_NOWAIT) a read the kernel would have to block for fails with BlockingIOError
        (EAGAIN) instead."""
        return await self._vectored(IOCB_CMD_PREADV, fd, views, offset, nowait)

    async def pwritev(
        self, fd: int, views: list[memoryview], offset: int, nowait: bool = False
    ) -> int:
        """Write `views` at `offset`; the bytes written (as `preadv`)."""
        return await self._vectored(IOCB_CMD_PWRITEV, fd, views, offset, nowait)

    async def _vectored(
        self, cmd: int, fd: int, views: list[memoryview], offset: int, nowait: bool
    ) -> int:
        iov = _iovecs(views)  # (kept alive by _submit until the kernel is done with it)
        flags = RWF_NOWAIT if nowait else 0
        return await self._submit(cmd, fd, ctypes.addressof(iov), len(views), offset, iov, flags)

    async def fdatasync(self, fd: int) -> None:
        """fdatasync(fd), carried out by the kernel's workqueue."""
        await self._submit(IOCB_CMD_FDSYNC, fd, 0, 0, 0)

    async def _submit(
        self,
        opcode: int,
        fd: int,
        address: int,
        nbytes: int,
        offset: int,
        keep=None,
        rw_flags: int = 0,
    ) -> int:
        key = self._next
        self._next += 1
        cb = _IOCB()
        cb.aio_data = key
        cb.aio_lio_opcode = opcode
        cb.aio_rw_flags = rw_flags
        cb.aio_fildes = fd
        cb.aio_buf = address
        cb.aio_nbytes = nbytes
        cb.aio_offset = offset
        cb.aio_flags = IOCB_FLAG_RESFD
        cb.aio_resfd = self.efd
        ptr = ctypes.pointer(cb)
        n = _syscall(ctypes.c_long(_NR[3]), self.ctx, ctypes.c_long(1), ctypes.byref(ptr))
        if n != 1:
            e = ctypes.get_errno() if n < 0 else errno.EAGAIN
            raise OSError(e, f"io_submit: {os.strerror(e)}")
        self.submitted += 1
        self._waiting[key] = (trio.lowlevel.current_task(), (cb, keep))
        return await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)

    async def reap(self) -> None:
        """The system task: wake every task whose I/O completed, as the eventfd says."""
        try:
            while True:
                await trio.lowlevel.wait_readable(self.efd)
                try:
                    os.eventfd_read(self.efd)
                except BlockingIOError:
                    continue
                self._collect()
        finally:
            self.close()

    def _collect(self) -> None:
        while self._waiting:
            n = _syscall(
                ctypes.c_long(_NR[2]),
                self.ctx,
                ctypes.c_long(0),
                ctypes.c_long(DEPTH),
                self._events,
                ctypes.byref(self._zero),
            )
            if n < 0:
                e = ctypes.get_errno()
                if e == errno.EINTR:
                    continue
                log.error("io_getevents: %s", os.strerror(e))
                return
            for i in range(n):
                ev = self._events[i]
                task, _cb = self._waiting.pop(ev.data)
                res = ev.res
                trio.lowlevel.reschedule(
                    task,
                    outcome.Value(res)
                    if res >= 0
                    else outcome.Error(OSError(-res, os.strerror(-res))),
                )
            if n < DEPTH:
                return


_available: bool | None = None


def available() -> bool:
    """Whether this process can use Linux AIO (probed once: io_setup and io_destroy)."""
    global _available
    if _available is None:
        try:
            Engine().close()
            _available = not _disabled
        except OSError:
            _available = False
    return _available


def engine() -> Engine | None:
    """This trio run's AIO engine (made on first use), or None where AIO is unavailable (or
    turned off with KVFS_AIO=off): then I/O goes to worker threads."""
    try:
        eng = _RUN.get()
    except LookupError:
        eng = None
        if not _disabled:
            try:
                eng = Engine()
            except OSError as e:
                log.info(
                    "Linux AIO unavailable (%s): small blocks' I/O uses worker threads", e.strerror
                )
            else:
                trio.lowlevel.spawn_system_task(eng.reap, name="kvfs.pool.linux_aio.reap")
        _RUN.set(eng)
    return eng


class Staging:
    """Page-aligned scratch memory for reads in flight on the trio thread, reused: one
    anonymous mapping per size (rounded up to 64 KiB), a few kept per size."""

    KEEP = 16

    def __init__(self):
        self._free: dict[int, list[mmap.mmap]] = {}

    def take(self, nbytes: int) -> mmap.mmap:
        size = max(65536, (nbytes + 65535) & ~65535)
        free = self._free.get(size)
        return free.pop() if free else mmap.mmap(-1, size)

    def give(self, mem: mmap.mmap) -> None:
        free = self._free.setdefault(len(mem), [])
        if len(free) < self.KEEP:
            free.append(mem)  # (else unmapped once no view of it is left)


STAGING = Staging()
