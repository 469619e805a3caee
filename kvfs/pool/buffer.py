"""Block content in memory: one shared-memory file per block, which the kernel can read directly.

A `Buffer` is a file in shared memory (`MEMORY`: a memfd, or a file of the daemon's private
tmpfs with transparent huge pages, named so that it can be closed while unused) of the block's
size. The kernel serves reads and
writes of a passthrough-opened file straight from it (FUSE passthrough: the bytes never reach
the daemon), and the daemon reaches it through mappings of fixed-size chunks, made on demand:
O_DIRECT preads of a block's stripe units land in them and O_DIRECT writes leave from them.
A range never written is a hole: it reads as zeros and takes no memory.

Holes stay holes on the way to the pool too: `io_views` for a write hands out a shared chunk of
zeros where the memfd has a hole, instead of touching (and so allocating) those pages.

A block larger than a chunk (`chunk_size_for`) keeps one mapping of its whole file; a smaller
one is read with pread and mapped only for the length of an I/O.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import itertools
import logging
import mmap
import os
import tempfile
import threading
import weakref
from typing import Callable

from kvfs.pool.layout import PAGE

log = logging.getLogger("kvfs.pool.buffer")

MiB = 1 << 20
MS_NOSUID, MS_NODEV, MS_NOEXEC, MNT_DETACH = 2, 4, 8, 2

SEEK_DATA = getattr(os, "SEEK_DATA", 3)
SEEK_HOLE = getattr(os, "SEEK_HOLE", 4)
F_ADD_SEALS = getattr(fcntl, "F_ADD_SEALS", 1033)
F_SEAL_SHRINK = getattr(fcntl, "F_SEAL_SHRINK", 0x0002)
F_SEAL_GROW = getattr(fcntl, "F_SEAL_GROW", 0x0004)
F_SETLEASE = getattr(fcntl, "F_SETLEASE", 1024)

# A buffer dies wherever its last reference goes, or in the cyclic collector, which runs at
# any allocation of a container object, on whichever thread makes it: also inside a region
# that holds one of this module's locks (Spares._lock, MemorySource._lock). Its finalizer
# must not then wait for that lock: the holder is its own thread, and the lock is not
# reentrant (the daemon hung there). So the locks are `_Lock`s, which count on each thread
# the ones it holds; a buffer that dies while its thread holds one is queued (`_dead`) and
# released as soon as its thread leaves the last of them.
_holding = threading.local()
_dead: collections.deque[list] = collections.deque()


class _Lock:
    """A threading.Lock whose holder is known to be holding it (`_holding.n`)."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        # counted before the acquire and after the release: whatever runs between them
        # (a finalizer, by the collector) sees the count
        _holding.n = getattr(_holding, "n", 0) + 1
        self._lock.acquire()

    def __exit__(self, *exc) -> None:
        self._lock.release()
        _holding.n -= 1
        if _dead and not _holding.n:
            reap()  # what died meanwhile on this thread


MADV_POPULATE_WRITE = 23  # Linux >= 5.14

_libc = ctypes.CDLL(None, use_errno=True)
_populate = [True, False]  # [enabled, ever worked]


def populate(views) -> None:
    """Fault in the pages under `views` (writable), before an O_DIRECT read lands in them.
    An O_DIRECT read into pages not yet present faults them in from inside the read, at a
    fraction of the speed of one madvise(MADV_POPULATE_WRITE) over the range followed by the
    read (measured here: fresh 32 MiB blocks fetched ~2x faster). Where the kernel lacks
    MADV_POPULATE_WRITE (< 5.14) or the memory refuses it, the read faults them as before."""
    if not _populate[0]:
        return
    for v in views:
        if not len(v) or v.readonly:
            continue
        c = ctypes.c_char.from_buffer(v)
        addr = ctypes.addressof(c)
        del c
        start = addr & ~(PAGE - 1)
        if _libc.madvise(
            ctypes.c_void_p(start), ctypes.c_size_t(addr + len(v) - start), MADV_POPULATE_WRITE
        ):
            if ctypes.get_errno() == errno.EINVAL and not _populate[1]:
                _populate[0] = False  # the kernel does not know it: stop trying
            return
        _populate[1] = True


def chunk_size_for(stripe_unit: int) -> int:
    """The buffer chunk size used with a pool of this stripe unit: max(unit, 1 MiB)."""
    return max(stripe_unit, MiB)


class MemorySource:
    """Where block memory comes from. By default a memfd per block. `use_private_tmpfs()`
    (the daemon, as root) mounts a tmpfs with `huge=within_size` and detaches it at once: it
    is then reachable only through the daemon's directory fd, and the kernel frees it when the
    daemon exits, however it exits. A block written or fetched whole gets 2 MiB pages there,
    which the kernel reads faster than 4 KiB ones.

    Files on the private tmpfs have names (a counter), so a block's file need not stay open:
    a buffer nobody uses can close its descriptor (`Buffer.park`) and reopen it by name when
    it is used again, and the number of blocks kept in memory is not bounded by the
    descriptors the daemon may open (RLIMIT_NOFILE). A memfd has no name: it stays open as
    long as its buffer lives. `open_files` counts the buffers' descriptors open now."""

    def __init__(self) -> None:
        self.dirfd: int | None = None
        self.kind = "memfd"
        self.open_files = 0
        self._names = itertools.count(1)
        self._lock = _Lock()  # buffers die (and close) on any thread

    @property
    def named(self) -> bool:
        """Files have names (and may be closed while unused and reopened)."""
        return self.dirfd is not None

    @property
    def huge(self) -> bool:
        """A file of 2 MiB or more gets huge pages (the private tmpfs with `huge=within_size`):
        mapping it for one I/O costs little (kvfs/pool/io_workers.py)."""
        return self.kind == "tmpfs, huge pages"

    def _count(self, n: int) -> None:
        with self._lock:
            self.open_files += n

    def new_file(self) -> tuple[int, bytes | None]:
        """A new empty file: (its descriptor, its name or None for a memfd)."""
        if self.dirfd is not None:
            name = b"b%x" % next(self._names)
            fd = os.open(
                name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=self.dirfd
            )
        else:
            name = None
            fd = os.memfd_create("kvfs-block", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        self._count(1)
        return fd, name

    def new_fd(self) -> int:
        """A new file's descriptor (a test helper: the name is dropped, the file stays)."""
        return self.new_file()[0]

    def reopen(self, name: bytes) -> int:
        fd = os.open(name, os.O_RDWR | os.O_CLOEXEC, dir_fd=self.dirfd)
        self._count(1)
        return fd

    def stat(self, name: bytes) -> os.stat_result:
        return os.stat(name, dir_fd=self.dirfd)

    def close(self, fd: int) -> None:
        self._count(-1)
        _close_fd(fd)

    def unlink(self, name: bytes | None) -> None:
        if name is not None and self.dirfd is not None:
            try:
                os.unlink(name, dir_fd=self.dirfd)
            except OSError:
                pass

    def use_private_tmpfs(self, size: int) -> str | None:
        """Switch to a private huge-page tmpfs of at most `size` bytes; None, or why not."""
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        where = tempfile.mkdtemp(prefix="kvfs-dram-")
        try:
            for opts in (f"huge=within_size,mode=0700,size={size}", f"mode=0700,size={size}"):
                if (
                    libc.mount(
                        b"kvfs-dram",
                        where.encode(),
                        b"tmpfs",
                        MS_NOSUID | MS_NODEV | MS_NOEXEC,
                        opts.encode(),
                    )
                    == 0
                ):
                    break
            else:
                return f"mounting a private tmpfs failed: {os.strerror(ctypes.get_errno())}"
            fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            libc.umount2(where.encode(), MNT_DETACH)
        finally:
            os.rmdir(where)
        self.dirfd = fd
        self.kind = "tmpfs, huge pages" if "huge" in opts else "tmpfs"
        return None


MEMORY = MemorySource()


def _close_fd(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _only_ours(fd: int) -> bool:
    """True if no other open file refers to the file behind `fd`: no reader or writer, and no
    mapping made through one (a FUSE passthrough open is such a file; a client's mmap of it
    holds one until unmapped). Asked of the kernel with a write lease, which it grants only
    then, and given back at once."""
    try:
        fcntl.fcntl(fd, F_SETLEASE, fcntl.F_WRLCK)
    except OSError:
        return False
    fcntl.fcntl(fd, F_SETLEASE, fcntl.F_UNLCK)
    return True


class Spares:
    """Memory of dead block buffers, kept to be filled again by the next fetch.

    A fetch into fresh shared memory pays for the kernel clearing every page first (profiled
    here under LMCache: as much CPU as the reader's own copy); a full DRAM tier evicts one block
    for each one it fetches, so the evicted block's pages can take the new content instead.
    A buffer joins the spares when its last reference dies, only where that is safe and cheap
    to prove: files of the private tmpfs (not memfds), that nothing else has open or mapped
    (`_only_ours`: a client's mmap of an old version keeps its bytes), and while `room()`
    (the DRAM tier's unused capacity) has space for them. A spare is kept by name, with no
    descriptor open. A fetch overwrites every page of the block it is given, so old bytes
    never show. Thread-safe: buffers may die anywhere."""

    def __init__(self, room: Callable[[], int], source: "MemorySource | None" = None):
        self.room = room
        self.source = source
        self.files: list[tuple[bytes, int, int]] = []  # (name, size, bytes of memory)
        self.bytes = 0
        self.reused = 0  # fetches that got a spare's memory
        self.kept = 0  # dead buffers kept
        self.closed = False
        self._lock = _Lock()

    def give(self, fd: int | None, name: bytes | None) -> None:
        """A buffer died: keep its file if it may be reused, else close and remove it (`fd`
        is None where the buffer's file was not open)."""
        src = self.source or MEMORY
        try:
            if not self.closed and name is not None and src.named:
                if fd is None:
                    fd = src.reopen(name)
                st = os.fstat(fd)
                nbytes = st.st_blocks * 512
                if nbytes and _only_ours(fd):
                    with self._lock:  # the room check too: buffers die on any thread
                        if nbytes + self.bytes <= self.room():
                            self.files.append((name, st.st_size, nbytes))
                            self.bytes += nbytes
                            self.kept += 1
                            name = None  # kept: not removed below
        except OSError:
            pass
        if fd is not None:
            src.close(fd)
        src.unlink(name)

    def take(self, size: int) -> tuple[int, bytes, int] | None:
        """A spare file for a buffer of `size` bytes (the last one kept of that size, if there
        is one: its pages are the likeliest to be in the CPU's caches): (descriptor, name, its
        size now), or None."""
        with self._lock:
            if not self.files:
                return None
            i = next(
                (i for i in range(len(self.files) - 1, -1, -1) if self.files[i][1] == size),
                len(self.files) - 1,
            )
            name, had, nbytes = self.files.pop(i)
            self.bytes -= nbytes
            self.reused += 1
        try:
            return (self.source or MEMORY).reopen(name), name, had
        except OSError:
            return None

    def trim(self, limit: int) -> None:
        """Remove spares until they hold at most `limit` bytes."""
        while self.bytes > max(0, limit):
            with self._lock:
                if not self.files:
                    return
                name, _, nbytes = self.files.pop()
                self.bytes -= nbytes
            (self.source or MEMORY).unlink(name)

    def close(self) -> None:
        self.closed = True
        self.trim(0)


def _release(box: list) -> None:
    """A buffer died (its finalizer): released now, or by a later `reap()` if this thread
    holds one of this module's locks."""
    _dead.append(box)
    reap()


def reap() -> None:
    """Release the buffers that died: each one's file goes to its spares, if it has any, else
    is closed (and its name removed). Nothing while this thread holds a lock of this module
    (see `_dead`)."""
    if getattr(_holding, "n", 0):
        return
    while True:
        try:
            fd, name, spares, source = _dead.popleft()
        except IndexError:
            return
        if spares is not None:
            spares.give(fd, name)
            continue
        if fd is not None:
            source.close(fd)
        source.unlink(name)


class Buffer:
    """Growable block content in a memfd. Not thread-safe: one writer at a time (the caller's
    lock); worker threads only fill or drain the views they are given."""

    __slots__ = ("chunk", "size", "_map", "sealed", "shared", "_box", "__weakref__")

    def __init__(self, chunk: int, size: int = 0, spares: Spares | None = None):
        """A buffer of `size` bytes. With `spares`, its memory may come from a dead buffer's
        (old bytes included: for a fetch, which overwrites every page) and goes back to them
        when it dies (see `recycle`)."""
        if chunk % PAGE:
            raise ValueError("chunk size must be a multiple of 4 KiB")
        self.chunk = chunk
        got = spares.take(size) if spares is not None else None
        if got is None:
            fd, name = MEMORY.new_file()
            had = 0
        else:
            fd, name, had = got
        self._box = [fd, name, spares, MEMORY]  # what _release needs, kept current
        weakref.finalize(self, _release, self._box)
        self.size = had
        self._map: mmap.mmap | None = None
        self.sealed = False
        # the kernel may write into it behind the daemon (a passthrough writer, or a shared
        # writable mapping that outlives its descriptor): a write to the pool from its live
        # memory checks that what it checksummed is what it wrote (kvfs/pool/namespace.py)
        self.shared = False
        if had != size:  # (a spare of the size wanted needs no truncate: a syscall a fetch)
            self.resize(size)

    @property
    def fd(self) -> int:
        """The file's descriptor (reopened by name if the buffer was parked)."""
        box = self._box
        fd = box[0]
        if fd is None:
            fd = box[0] = box[3].reopen(box[1])
        return fd

    @property
    def parked(self) -> bool:
        return self._box[0] is None

    def park(self) -> bool:
        """Close the file's descriptor while nothing uses the buffer (a named file only: it is
        reopened when used again); whether it was closed. The caller makes sure no I/O
        (worker thread) is using it."""
        box = self._box
        if box[0] is None or box[1] is None:
            return False
        fd, box[0] = box[0], None
        box[3].close(fd)
        return True

    def _stat(self) -> os.stat_result:
        box = self._box
        return os.fstat(box[0]) if box[0] is not None else box[3].stat(box[1])

    def recycle(self, spares: Spares) -> None:
        """When this buffer dies, offer its memory to `spares`."""
        self._box[2] = spares

    @property
    def nbytes(self) -> int:
        """Memory the content occupies (its written pages; holes take none)."""
        return self._stat().st_blocks * 512

    @property
    def reserved_bytes(self) -> int:
        """Memory the content takes once every page is written."""
        return (self.size + PAGE - 1) // PAGE * PAGE

    def sync_size(self) -> int:
        """Re-read the size from the file (the kernel writes into it directly under FUSE
        passthrough) and return it."""
        return self.refresh().st_size

    def refresh(self) -> os.stat_result:
        """The file's stat, with the size re-read from it (as `sync_size`)."""
        st = self._stat()
        if st.st_size < self.size:
            self._map = None
        self.size = st.st_size
        return st

    def signature(self) -> tuple[int, int, int]:
        """(size, mtime, ctime) of the file: changes whenever its content is written through
        a file descriptor."""
        st = self._stat()
        return st.st_size, st.st_mtime_ns, st.st_ctime_ns

    def mapping(self, end: int) -> mmap.mmap:
        """A shared mapping of the file from offset 0 reaching at least `end`. One mapping of
        the whole block (so the kernel can use huge pages for it), kept for blocks larger than
        a chunk; a small block gets a mapping that lives only as long as the views taken from
        it, so a DRAM tier of many small blocks holds no mapping each (vm.max_map_count)."""
        m = self._map
        if m is None or len(m) < end:
            m = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            if self.size > self.chunk:
                self._map = m
        return m

    def resize(self, size: int) -> None:
        """Grow (the new bytes read as zeros) or shrink (bytes past the end are gone)."""
        if self.sealed:
            raise OSError(errno.EPERM, "the block's content is sealed")
        if size < self.size:
            self._map = None
        os.ftruncate(self.fd, size)
        self.size = size

    def write(self, offset: int, data) -> None:
        end = offset + len(data)
        if end > self.size:
            self.resize(end)
        data = memoryview(data).cast("B")
        done = 0
        while done < len(data):
            done += os.pwrite(self.fd, data[done:], offset + done)

    def view(self, offset: int, length: int):
        """Bytes [offset, offset+length) clipped to size: a memoryview into the block when it
        is larger than a chunk, else a copy."""
        end = min(offset + length, self.size)
        if end <= offset:
            return b""
        if self.size > self.chunk:
            return memoryview(self.mapping(end))[offset:end]
        return os.pread(self.fd, end - offset, offset)

    def _data_runs(self, offset: int, end: int) -> list[tuple[int, int, bool]]:
        """[(start, end, is_data)] covering [offset, end), from SEEK_DATA/SEEK_HOLE."""
        out = []
        pos = offset
        while pos < end:
            try:
                data = os.lseek(self.fd, pos, SEEK_DATA)
            except OSError as e:
                if e.errno != errno.ENXIO:
                    raise
                data = end  # only a hole up to the end of the file
            data = min(data, end)
            if data > pos:
                out.append((pos, data, False))
            if data >= end:
                break
            hole = min(os.lseek(self.fd, data, SEEK_HOLE), end)
            out.append((data, hole, True))
            pos = hole
        return out

    def io_views(
        self, offset: int, length: int, zero_chunk: mmap.mmap | None = None
    ) -> list[memoryview]:
        """Aligned slices covering [offset, offset+length) for O_DIRECT I/O (4 KiB multiples).

        For reads into the buffer (`zero_chunk` None) the range must lie within the size (a
        buffer being filled is sized to whole pages until it is complete). For writes out of
        it, holes and the range past the size (the last unit's padding) come from
        `zero_chunk`, and the partial last page from a copy.
        """
        if offset % PAGE or length % PAGE:
            raise ValueError("I/O views must be 4 KiB aligned")
        end = offset + length
        if zero_chunk is None:
            if end > self.size:
                raise ValueError("I/O view past the end of the buffer")
            return self._views(offset, end)
        full = self.size // PAGE * PAGE  # end of the whole pages of content
        out: list[memoryview] = []
        if min(end, full) > offset:
            for lo, hi, is_data in self._data_runs(offset, min(end, full)):
                lo, hi = lo // PAGE * PAGE, -(-hi // PAGE) * PAGE
                out += self._views(lo, hi) if is_data else _zeros(zero_chunk, hi - lo)
        pos = max(offset, full)
        if full < self.size and offset <= full < end:  # the partial last page
            page = mmap.mmap(-1, PAGE)
            page[: self.size - full] = os.pread(self.fd, self.size - full, full)
            out.append(memoryview(page))
            pos = full + PAGE
        if end > pos:
            out += _zeros(zero_chunk, end - pos)  # padding past the content
        return out

    # A block no larger than a chunk is moved through the worker thread's staging memory
    # (`staging`): pread/pwrite of its file on one side, O_DIRECT on the other. That costs one
    # copy in the kernel, and saves mapping the file for each I/O (an mmap, the page faults or
    # an madvise to populate it, and an munmap whose TLB flush interrupts the other CPUs).

    def stage_out(self, spans: list[tuple[int, int, int]]) -> list[list[memoryview]]:
        """In a worker thread: the units (start, stored length, content length) copied into
        staging memory for an O_DIRECT write, each padded with zeros to its stored length."""
        total = sum(stored for _, stored, _ in spans)
        mem = staging(total)
        out, pos = [], 0
        for start, stored, length in spans:
            v = mem[pos : pos + stored]
            got = os.preadv(self.fd, [v[:length]], start) if length else 0
            if got < stored:
                v[got:] = bytes(stored - got)  # past the content (or a short file): zeros
            out.append([v])
            pos += stored
        return out

    def stage_in(self, spans: list[tuple[int, int, int]]) -> list[list[memoryview]]:
        """In a worker thread: staging memory for an O_DIRECT read of these units (start,
        stored length, content length); `unstage` then copies their content into the file."""
        mem = staging(sum(stored for _, stored, _ in spans))
        out, pos = [], 0
        for _, stored, _ in spans:
            out.append([mem[pos : pos + stored]])
            pos += stored
        return out

    def unstage(self, spans: list[tuple[int, int, int]], units: list[list[memoryview]]) -> None:
        """In a worker thread: the content of units read by `stage_in` into the file."""
        for (start, _, length), (v,) in zip(spans, units):
            done = 0
            while done < length:
                done += os.pwrite(self.fd, v[done:length], start + done)

    def _views(self, lo: int, hi: int) -> list[memoryview]:
        return [memoryview(self.mapping(hi))[lo:hi]]

    def copy(self) -> "Buffer":
        """A private copy (copy-on-write when a committed version is modified)."""
        b = Buffer(self.chunk, self.size)
        self._copy_into(b)
        return b

    def become(self, other: "Buffer") -> None:
        """Take `other`'s content in place: the same file, so whoever maps it or reads it by
        passthrough reads `other`'s bytes from now on (a failed session rolled back)."""
        self.resize(0)  # no page of the old content survives
        self.resize(other.size)
        other._copy_into(self)

    def _copy_into(self, b: "Buffer") -> None:
        for lo, hi, is_data in self._data_runs(0, self.size):
            if not is_data:
                continue
            pos = lo
            while pos < hi:
                n = os.copy_file_range(self.fd, b.fd, hi - pos, pos, pos)
                if n <= 0:
                    raise OSError(errno.EIO, "copy of a block's content ended early")
                pos += n

    def seal(self) -> None:
        """The content is final: where the memory supports seals (memfds), its size can no
        longer change, so a reader's mmap of it can never see it shrink."""
        if not self.sealed:
            self.sealed = True
            if self._box[1] is not None:
                return  # a file on the private tmpfs: it takes no seals
            try:
                fcntl.fcntl(self.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW)
            except OSError:
                pass  # files on a tmpfs take no seals


_staging = threading.local()


def staging(nbytes: int) -> memoryview:
    """This thread's aligned scratch memory of at least `nbytes` (for O_DIRECT I/O of small
    blocks, see `Buffer.stage_out` and `Buffer.stage_in`); kept for the thread's next I/O."""
    m = getattr(_staging, "m", None)
    if m is None or len(m) < nbytes:
        m = _staging.m = mmap.mmap(-1, max(nbytes, MiB))
    return memoryview(m)[:nbytes]


@contextlib.contextmanager
def use_staging(mem: mmap.mmap):
    """Within: `staging()` on this thread hands out `mem` (the trio thread's writes by AIO:
    each write in flight has its own memory, see kvfs/pool/linux_aio.py)."""
    old = getattr(_staging, "m", None)
    _staging.m = mem
    try:
        yield
    finally:
        _staging.m = old


def _zeros(zero_chunk: mmap.mmap, n: int) -> list[memoryview]:
    out = []
    while n > 0:
        k = min(n, len(zero_chunk))
        out.append(memoryview(zero_chunk)[:k])
        n -= k
    return out


def zero_chunk(chunk: int) -> mmap.mmap:
    """A read-only chunk of zeros, used as the source when writing out holes."""
    return mmap.mmap(-1, chunk, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=mmap.PROT_READ)
