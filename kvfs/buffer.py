"""Page-aligned memory for block content: a list of equal, mmap-backed chunks.

Chunks are anonymous mmaps, so they are page aligned (O_DIRECT can read and write them) and
their memory goes back to the kernel as soon as the last reference is dropped. A chunk that
was never written is a hole (None) and reads as zeros. Reads that fall inside one chunk are
served as a memoryview slice, without a copy; a read that straddles chunks is joined.

The chunk size is a multiple of the pool's stripe unit (or a unit is a multiple of it), so the
unit views handed to the pool are lists of at most a few slices.
"""

from __future__ import annotations

import mmap

from kvfs.layout import PAGE

MiB = 1 << 20


def chunk_size_for(stripe_unit: int) -> int:
    """The buffer chunk size used with a pool of this stripe unit: max(unit, 1 MiB)."""
    return max(stripe_unit, MiB)


def _new_chunk(size: int) -> mmap.mmap:
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


class Buffer:
    """Growable block content. Not thread-safe: one writer at a time (the caller's lock)."""

    __slots__ = ("chunk", "chunks", "size")

    def __init__(self, chunk: int, size: int = 0, *, allocate: bool = False):
        if chunk % PAGE:
            raise ValueError("chunk size must be a multiple of 4 KiB")
        self.chunk = chunk
        self.size = 0
        self.chunks: list[mmap.mmap | None] = []
        self.resize(size)
        if allocate:
            for i in range(len(self.chunks)):
                self._alloc(i)

    @property
    def nbytes(self) -> int:
        """Memory the content occupies: the pages of allocated chunks up to the content's end
        (pages of a chunk past the end are never touched, so the kernel never backs them)."""
        end = (self.size + PAGE - 1) // PAGE * PAGE
        total = 0
        for i, c in enumerate(self.chunks):
            if c is not None:
                total += max(0, min(self.chunk, end - i * self.chunk))
        return total

    def _alloc(self, i: int) -> mmap.mmap:
        c = self.chunks[i] = _new_chunk(self.chunk)
        return c

    def resize(self, size: int) -> None:
        """Grow (the new bytes read as zeros) or shrink (bytes past the end are zeroed)."""
        n = (size + self.chunk - 1) // self.chunk
        if size < self.size:
            del self.chunks[n:]
            tail = size % self.chunk
            if tail and self.chunks and self.chunks[-1] is not None:
                c = self.chunks[-1]
                c[tail:] = bytes(self.chunk - tail)
        else:
            self.chunks.extend([None] * (n - len(self.chunks)))
        self.size = size

    def write(self, offset: int, data) -> None:
        data = memoryview(data).cast("B")
        end = offset + len(data)
        if end > self.size:
            self.resize(end)
        pos, src = offset, 0
        while src < len(data):
            i, at = divmod(pos, self.chunk)
            n = min(self.chunk - at, len(data) - src)
            c = self.chunks[i]
            if c is None:
                c = self._alloc(i)
            c[at:at + n] = data[src:src + n]
            pos += n
            src += n

    def view(self, offset: int, length: int):
        """Bytes [offset, offset+length) clipped to size: a memoryview when it lies in one chunk."""
        end = min(offset + length, self.size)
        if end <= offset:
            return b""
        i, at = divmod(offset, self.chunk)
        if (end - 1) // self.chunk == i:
            c = self.chunks[i]
            if c is None:
                return bytes(end - offset)
            return memoryview(c)[at:at + end - offset]
        parts = []
        pos = offset
        while pos < end:
            i, at = divmod(pos, self.chunk)
            n = min(self.chunk - at, end - pos)
            c = self.chunks[i]
            parts.append(bytes(n) if c is None else memoryview(c)[at:at + n])
            pos += n
        return b"".join(parts)

    def io_views(self, offset: int, length: int, zero_chunk: mmap.mmap | None = None) -> list[memoryview]:
        """Aligned writable slices covering [offset, offset+length) for O_DIRECT I/O.

        Holes are allocated (for reads into the buffer) unless `zero_chunk` is given, in which
        case they are served from it (for writes out of the buffer). Offsets and lengths must
        be 4 KiB multiples; the range may extend past `size` into the zeroed tail of the last
        chunk, never past the last chunk.
        """
        if offset % PAGE or length % PAGE:
            raise ValueError("I/O views must be 4 KiB aligned")
        out = []
        pos, end = offset, offset + length
        while pos < end:
            i, at = divmod(pos, self.chunk)
            n = min(self.chunk - at, end - pos)
            c = self.chunks[i]
            if c is None:
                if zero_chunk is not None:
                    out.append(memoryview(zero_chunk)[:n])
                    pos += n
                    continue
                c = self._alloc(i)
            out.append(memoryview(c)[at:at + n])
            pos += n
        return out

    def copy(self) -> "Buffer":
        """A private copy (copy-on-write when a committed version is modified)."""
        b = Buffer(self.chunk)
        b.size = self.size
        for c in self.chunks:
            if c is None:
                b.chunks.append(None)
            else:
                n = _new_chunk(self.chunk)
                n[:] = c
                b.chunks.append(n)
        return b


def zero_chunk(chunk: int) -> mmap.mmap:
    """A read-only chunk of zeros, used as the source when writing out holes."""
    return mmap.mmap(-1, chunk, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=mmap.PROT_READ)
