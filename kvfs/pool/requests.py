"""What a namespace's I/O is made of (kvfs/pool/namespace.py runs it): vectored transfers that
finish short calls and split at IOV_MAX, the I/O slots that put demand before prefetch, the
write requests a group or a write-back batch is made of and how staged ones merge, and the
stripe units' checksums (xxh3-64)."""

from __future__ import annotations

import collections
import contextlib
import errno
import os
from typing import Callable, Sequence

import trio
import xxhash

from kvfs.errors import KvfsError

IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024  # views per call
MERGE_BYTES = 1 << 20  # staged writes back to back on a device go as one AIO write of
MERGE_VIEWS = 256  # at most this many bytes, and views (the kernel takes 1,024)


def transfer(op: Callable, fd: int, views: Sequence[memoryview], offset: int) -> None:
    """Move all of `views` at `offset`, looping over short transfers; raise OSError at EOF.
    At most IOV_MAX views go in one call (a sparse file's block has a view per data or hole
    run: 2,048 for 16 MiB written 4 KiB in every 8 KiB; more fail with EINVAL)."""
    total = sum(len(v) for v in views)
    done = 0
    views = list(views)
    while done < total:
        n = op(fd, views[:IOV_MAX], offset + done)
        if n <= 0:
            raise OSError(errno.EIO, f"short transfer ({done} of {total} bytes): device ended")
        done += n
        advance(views, n)


async def transfer_aio(
    op: Callable, fd: int, views: Sequence[memoryview], offset: int, nowait: bool = False
) -> None:
    """`transfer` by Linux AIO (`op`: the engine's preadv or pwritev)."""
    total = sum(len(v) for v in views)
    done = 0
    views = list(views)
    while done < total:
        n = await op(fd, views[:IOV_MAX], offset + done, nowait)
        if n <= 0:
            raise OSError(errno.EIO, f"short transfer ({done} of {total} bytes): device ended")
        done += n
        advance(views, n)


def advance(views: list[memoryview], n: int) -> None:
    """Drop what was transferred (n bytes) from the front of the view list."""
    while n and views:
        if n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        else:
            views[0] = views[0][n:]
            n = 0


class PrioritySlots:
    """A namespace's I/O slots (its queue depth), handed out demand first.

    A prefetch waits while any demand I/O waits, and prefetches together hold at most a quarter
    of the slots (at least one), so a reader's I/O shares the device with few prefetch I/Os.
    """

    def __init__(self, n: int):
        self.n = n
        self.free = n
        self.prefetch_held = 0
        self.prefetch_max = max(1, n // 4)
        self.waiting: tuple[collections.deque, collections.deque] = (
            collections.deque(),
            collections.deque(),
        )

    def _grant(self) -> None:
        while self.free > 0:
            if self.waiting[0]:
                ev = self.waiting[0].popleft()
            elif self.waiting[1] and self.prefetch_held < self.prefetch_max:
                ev = self.waiting[1].popleft()
                self.prefetch_held += 1
            else:
                return
            self.free -= 1
            ev.set()

    @contextlib.asynccontextmanager
    async def take(self, prefetch: bool = False):
        pri = 1 if prefetch else 0
        if (
            self.free > 0
            and not self.waiting[0]
            and not (prefetch and (self.waiting[1] or self.prefetch_held >= self.prefetch_max))
        ):
            self.free -= 1
            if prefetch:
                self.prefetch_held += 1
        else:
            ev = trio.Event()
            self.waiting[pri].append(ev)
            try:
                await ev.wait()
            except BaseException:
                if ev.is_set():  # granted while being cancelled: give it back
                    self._release(prefetch)
                else:
                    self.waiting[pri].remove(ev)
                raise
        try:
            yield
        finally:
            self._release(prefetch)

    def _release(self, prefetch: bool) -> None:
        self.free += 1
        if prefetch:
            self.prefetch_held -= 1
        self._grant()


class WriteRequest:
    """One write of a group: a small durable write waiting in a namespace's group
    (`Namespace._write_grouped`), or a run of a write-back batch (`Namespace.write_batch`).
    `units`: each unit's views (`flat`: all of them in order), or a function called in the
    worker thread that makes them (`flat` None)."""

    __slots__ = (
        "units",
        "flat",
        "offset",
        "digest_lens",
        "nbytes",
        "verify",
        "done",
        "batch",
        "digests",
        "error",
    )

    def __init__(self, units, flat, offset: int, digest_lens, nbytes: int, verify: bool = False):
        self.units, self.flat, self.offset = units, flat, offset
        self.digest_lens, self.nbytes = digest_lens, nbytes
        self.verify = verify  # live memory the kernel may write (Namespace._write_sync)
        self.done = trio.Event()
        self.batch: list | None = None  # set when woken to run this group, not with a result
        self.digests: list[int] | None = None
        self.error: BaseException | None = None

    def finished(self) -> None:
        """Its group is done: let go of the block memory it wrote and of the group's list
        (the request that led it held the list it is in: a reference cycle that kept the
        views, so the blocks' mappings and files, until the cyclic collector ran), and wake
        its waiter."""
        self.units = self.flat = self.batch = None
        self.done.set()

    def result(self) -> list[int]:
        """Its digests, or its error as a KvfsError (EIO for anything else)."""
        if isinstance(self.error, KvfsError):
            raise self.error
        if self.error is not None:
            raise KvfsError(
                (isinstance(self.error, OSError) and self.error.errno) or errno.EIO,
                f"write of {self.nbytes} bytes at {self.offset}: {self.error}",
            )
        if self.digests is None:  # its group ended without reaching it (cancelled)
            raise KvfsError(errno.EIO, "write was not carried out")
        return self.digests


def mismatched(units, checks) -> list[int]:
    """The indices of the units whose xxh3-64 is not their check's (length, digest)."""
    return [
        i
        for i, (u, c) in enumerate(zip(units, checks))
        if c is not None and digest(u, c[0]) != c[1]
    ]


def merged(batch: list["WriteRequest"]) -> list[list["WriteRequest"]]:
    """Staged write requests in runs one write can move (back to back on the device, in
    offset order; at most MERGE_BYTES and MERGE_VIEWS), in order."""
    runs: list[list[WriteRequest]] = []
    end = nbytes = views = 0
    for r in sorted(batch, key=lambda r: r.offset):
        n = len(r.digest_lens)
        if (
            runs
            and r.offset == end
            and nbytes + r.nbytes <= MERGE_BYTES
            and views + n <= MERGE_VIEWS
        ):
            runs[-1].append(r)
            nbytes += r.nbytes
            views += n
        else:
            runs.append([r])
            nbytes, views = r.nbytes, n
        end = r.offset + r.nbytes
    return runs


def digests(units, lengths) -> list[int]:
    """Each unit's xxh3-64 of its first `lengths[i]` bytes (0 where that is negative)."""
    return [digest(u, n) if n >= 0 else 0 for u, n in zip(units, lengths)]


def digest(views: Sequence[memoryview], length: int) -> int:
    h = xxhash.xxh3_64()
    left = length
    for v in views:
        if left <= 0:
            break
        h.update(v[:left])
        left -= len(v)
    return h.intdigest()
