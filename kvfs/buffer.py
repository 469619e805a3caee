"""Block content in memory: one memfd per block (shared memory the kernel can read directly).

A `Buffer` is a memfd (an anonymous tmpfs file) of the block's size. The kernel serves reads and
writes of a passthrough-opened file straight from it (FUSE passthrough: the bytes never reach
the daemon), and the daemon reaches it through mappings of fixed-size chunks, made on demand:
O_DIRECT preads of a block's stripe units land in them and O_DIRECT writes leave from them.
A range never written is a hole: it reads as zeros and takes no memory.

Holes stay holes on the way to the pool too: `io_views` for a write hands out a shared chunk of
zeros where the memfd has a hole, instead of touching (and so allocating) those pages.

The chunk size is a multiple of the pool's stripe unit (or a unit is a multiple of it), so the
unit views handed to the pool are lists of at most a few slices.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import weakref

from kvfs.layout import PAGE

MiB = 1 << 20

SEEK_DATA = getattr(os, "SEEK_DATA", 3)
SEEK_HOLE = getattr(os, "SEEK_HOLE", 4)
F_ADD_SEALS = getattr(fcntl, "F_ADD_SEALS", 1033)
F_SEAL_SHRINK = getattr(fcntl, "F_SEAL_SHRINK", 0x0002)
F_SEAL_GROW = getattr(fcntl, "F_SEAL_GROW", 0x0004)


def chunk_size_for(stripe_unit: int) -> int:
    """The buffer chunk size used with a pool of this stripe unit: max(unit, 1 MiB)."""
    return max(stripe_unit, MiB)


def _close_fd(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


class Buffer:
    """Growable block content in a memfd. Not thread-safe: one writer at a time (the caller's
    lock); worker threads only fill or drain the views they are given."""

    __slots__ = ("chunk", "fd", "size", "maps", "sealed", "__weakref__")

    def __init__(self, chunk: int, size: int = 0):
        if chunk % PAGE:
            raise ValueError("chunk size must be a multiple of 4 KiB")
        self.chunk = chunk
        self.fd = os.memfd_create("kvfs-block", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        weakref.finalize(self, _close_fd, self.fd)
        self.size = 0
        self.maps: list[mmap.mmap | None] = []
        self.sealed = False
        self.resize(size)

    @property
    def nbytes(self) -> int:
        """Memory the content occupies (its written pages; holes take none)."""
        return os.fstat(self.fd).st_blocks * 512

    @property
    def reserved_bytes(self) -> int:
        """Memory the content takes once every page is written."""
        return (self.size + PAGE - 1) // PAGE * PAGE

    def sync_size(self) -> int:
        """Re-read the size from the memfd (the kernel writes into it directly under FUSE
        passthrough) and return it."""
        size = os.fstat(self.fd).st_size
        if size != self.size:
            n = (size + self.chunk - 1) // self.chunk
            if n < len(self.maps):
                del self.maps[n:]
            else:
                self.maps.extend([None] * (n - len(self.maps)))
            self.size = size
        return size

    def signature(self) -> tuple[int, int, int]:
        """(size, mtime, ctime) of the memfd: changes whenever its content is written through
        a file descriptor."""
        st = os.fstat(self.fd)
        return st.st_size, st.st_mtime_ns, st.st_ctime_ns

    def _map(self, i: int, need: int) -> mmap.mmap:
        """A shared mapping of chunk i reaching at least `need` bytes into it (within the
        file). Kept for multi-chunk blocks; a block of one chunk (most small files) gets a
        mapping that lives only as long as the views taken from it, so a DRAM tier of many
        small blocks does not hold one mapping each (vm.max_map_count)."""
        m = self.maps[i]
        if m is None or len(m) < need:
            length = min(self.chunk, self.size - i * self.chunk)
            m = mmap.mmap(self.fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE,
                          offset=i * self.chunk)
            if len(self.maps) > 1:
                self.maps[i] = m
        return m

    def resize(self, size: int) -> None:
        """Grow (the new bytes read as zeros) or shrink (bytes past the end are gone)."""
        if self.sealed:
            raise OSError(errno.EPERM, "the block's content is sealed")
        n = (size + self.chunk - 1) // self.chunk
        if size < self.size:
            del self.maps[n:]
        else:
            self.maps.extend([None] * (n - len(self.maps)))
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
        """Bytes [offset, offset+length) clipped to size: a memoryview into the block when the
        range lies in one chunk of a multi-chunk block, else a copy."""
        end = min(offset + length, self.size)
        if end <= offset:
            return b""
        i, at = divmod(offset, self.chunk)
        if len(self.maps) > 1 and (end - 1) // self.chunk == i:
            return memoryview(self._map(i, at + end - offset))[at:at + end - offset]
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
                data = end                      # only a hole up to the end of the file
            data = min(data, end)
            if data > pos:
                out.append((pos, data, False))
            if data >= end:
                break
            hole = min(os.lseek(self.fd, data, SEEK_HOLE), end)
            out.append((data, hole, True))
            pos = hole
        return out

    def io_views(self, offset: int, length: int, zero_chunk: mmap.mmap | None = None) -> list[memoryview]:
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
        full = self.size // PAGE * PAGE          # end of the whole pages of content
        out: list[memoryview] = []
        if min(end, full) > offset:
            for lo, hi, is_data in self._data_runs(offset, min(end, full)):
                lo, hi = lo // PAGE * PAGE, -(-hi // PAGE) * PAGE
                out += self._views(lo, hi) if is_data else _zeros(zero_chunk, hi - lo)
        pos = max(offset, full)
        if full < self.size and offset <= full < end:        # the partial last page
            page = mmap.mmap(-1, PAGE)
            page[:self.size - full] = os.pread(self.fd, self.size - full, full)
            out.append(memoryview(page))
            pos = full + PAGE
        if end > pos:
            out += _zeros(zero_chunk, end - pos)                 # padding past the content
        return out

    def _views(self, lo: int, hi: int) -> list[memoryview]:
        out = []
        pos = lo
        while pos < hi:
            i, at = divmod(pos, self.chunk)
            n = min(self.chunk - at, hi - pos)
            out.append(memoryview(self._map(i, at + n))[at:at + n])
            pos += n
        return out

    def copy(self) -> "Buffer":
        """A private copy (copy-on-write when a committed version is modified)."""
        b = Buffer(self.chunk, self.size)
        for lo, hi, is_data in self._data_runs(0, self.size):
            if not is_data:
                continue
            pos = lo
            while pos < hi:
                n = os.copy_file_range(self.fd, b.fd, hi - pos, pos, pos)
                if n <= 0:
                    raise OSError(errno.EIO, "copy of a block's content ended early")
                pos += n
        return b

    def seal(self) -> None:
        """The content is final: its size can no longer change, so a reader's mmap of it can
        never see it shrink (a write seal would also need the daemon's own mappings gone)."""
        if not self.sealed:
            fcntl.fcntl(self.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW)
            self.sealed = True


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
