"""Free-space map of one namespace's data area, in 4 KiB aligned extents.

There is no allocator state on disk: at start-up the map is rebuilt from the extents of every
block the catalog holds (`ExtentAllocator.from_used`), so it can never disagree with the catalog.
Space that a crash left written but uncommitted is simply free again.
"""

from __future__ import annotations

import bisect
from typing import Iterable

from kvfs.layout import PAGE


class ExtentAllocator:
    """First-fit allocator over [start, end) with coalescing frees."""

    def __init__(self, start: int, end: int):
        if start % PAGE or end % PAGE or end < start:
            raise ValueError(f"bad data area [{start}, {end})")
        self.start, self.end = start, end
        self._starts: list[int] = []        # sorted starts of free extents
        self._length: dict[int, int] = {}   # start -> length
        self.free_bytes = 0
        if end > start:
            self._insert(start, end - start)

    @classmethod
    def from_used(cls, start: int, end: int, used: Iterable[tuple[int, int]]) -> "ExtentAllocator":
        """Build the map of [start, end) minus the (offset, length) extents in `used`.

        Raises ValueError if two used extents overlap or one lies outside the area: the catalog
        would then be corrupt, and serving it would hand the same bytes to two blocks.
        """
        a = cls(start, start)
        a.end = end
        pos = start
        for off, length in sorted(used):
            if off < pos or off + length > end or off % PAGE or length % PAGE:
                raise ValueError(f"used extent ({off}, {length}) overlaps another or lies outside "
                                 f"[{start}, {end})")
            if off > pos:
                a._insert(pos, off - pos)
            pos = off + length
        if end > pos:
            a._insert(pos, end - pos)
        return a

    @property
    def capacity(self) -> int:
        return self.end - self.start

    def extents(self) -> list[tuple[int, int]]:
        return [(s, self._length[s]) for s in self._starts]

    def largest(self) -> int:
        return max(self._length.values(), default=0)

    def _insert(self, start: int, length: int) -> None:
        bisect.insort(self._starts, start)
        self._length[start] = length
        self.free_bytes += length

    def _remove(self, start: int) -> int:
        i = bisect.bisect_left(self._starts, start)
        del self._starts[i]
        length = self._length.pop(start)
        self.free_bytes -= length
        return length

    def alloc(self, length: int) -> int | None:
        """Return the offset of a free contiguous extent of `length` bytes, or None."""
        if length <= 0 or length % PAGE:
            raise ValueError(f"allocation of {length} bytes is not a positive multiple of {PAGE}")
        for s in self._starts:
            have = self._length[s]
            if have >= length:
                self._remove(s)
                if have > length:
                    self._insert(s + length, have - length)
                return s
        return None

    def free(self, offset: int, length: int) -> None:
        """Return an extent; it must not overlap free space (a double free raises ValueError)."""
        if length <= 0:
            return
        if offset < self.start or offset + length > self.end or offset % PAGE or length % PAGE:
            raise ValueError(f"free of ({offset}, {length}) outside [{self.start}, {self.end})")
        i = bisect.bisect_right(self._starts, offset)
        if i > 0:
            p = self._starts[i - 1]
            if p + self._length[p] > offset:
                raise ValueError(f"double free of ({offset}, {length})")
        if i < len(self._starts) and self._starts[i] < offset + length:
            raise ValueError(f"double free of ({offset}, {length})")
        # coalesce with the neighbours
        if i < len(self._starts) and self._starts[i] == offset + length:
            length += self._remove(self._starts[i])
        if i > 0:
            p = self._starts[i - 1]
            if p + self._length[p] == offset:
                plen = self._remove(p)
                offset, length = p, plen + length
        self._insert(offset, length)
