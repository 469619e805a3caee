"""Free-space map of one namespace's data area, in 4 KiB aligned extents.

There is no allocator state on disk: at start-up the map is rebuilt from the extents of every
block the catalog holds (`ExtentAllocator.from_used`), so it can never disagree with the catalog.
Space that a crash left written but uncommitted is simply free again.
"""

from __future__ import annotations

import bisect
from typing import Iterable

from kvfs.pool.layout import PAGE


class ExtentAllocator:
    """First-fit allocator over [start, end) with coalescing frees.

    `unit` (the pool's stripe unit): besides `free_bytes`, the allocator keeps `unit_bytes`,
    the free bytes that lie in whole units (each free extent counts its length rounded down to
    a multiple of `unit`). Free pieces smaller than a unit, left between blocks of other sizes,
    cannot take a full stripe unit: a pool can have free bytes and no room for a big block."""

    def __init__(self, start: int, end: int, unit: int = PAGE):
        if start % PAGE or end % PAGE or end < start:
            raise ValueError(f"bad data area [{start}, {end})")
        if unit <= 0 or unit % PAGE:
            raise ValueError(f"bad unit {unit}")
        self.start, self.end, self.unit = start, end, unit
        self._starts: list[int] = []  # sorted starts of free extents
        self._length: dict[int, int] = {}  # start -> length
        self.free_bytes = 0
        self.unit_bytes = 0  # free bytes in whole units (see the class doc)
        if end > start:
            self._insert(start, end - start)

    @classmethod
    def from_used(
        cls, start: int, end: int, used: Iterable[tuple[int, int]], unit: int = PAGE
    ) -> "ExtentAllocator":
        """Build the map of [start, end) minus the (offset, length) extents in `used`.

        Raises ValueError if two used extents overlap or one lies outside the area: the catalog
        would then be corrupt, and serving it would hand the same bytes to two blocks.
        """
        a = cls(start, start, unit)
        a.end = end
        pos = start
        for off, length in sorted(used):
            if off < pos or off + length > end or off % PAGE or length % PAGE:
                raise ValueError(
                    f"used extent ({off}, {length}) overlaps another or lies outside "
                    f"[{start}, {end})"
                )
            if off > pos:
                a._insert(pos, off - pos)
            pos = off + length
        if end > pos:
            a._insert(pos, end - pos)
        return a

    @classmethod
    def from_sorted(cls, start: int, end: int, off, length, unit: int = PAGE) -> "ExtentAllocator":
        """`from_used` for used extents given as numpy arrays sorted by offset (millions of
        blocks: the gaps between them are found without a Python loop per extent)."""
        import numpy as np

        a = cls(start, start, unit)
        a.end = end
        ends = off + length
        bad = (off % PAGE != 0) | (length % PAGE != 0) | (off < start) | (ends > end)
        if len(off) > 1:
            bad[1:] |= off[1:] < ends[:-1]
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(
                f"used extent ({int(off[i])}, {int(length[i])}) overlaps another or "
                f"lies outside [{start}, {end})"
            )
        lo = np.concatenate(([start], ends)).astype(np.int64)
        hi = np.concatenate((off, [end])).astype(np.int64)
        gap = hi > lo
        starts = lo[gap].tolist()
        gaps = (hi - lo)[gap]
        lengths = gaps.tolist()
        a._starts = starts
        a._length = dict(zip(starts, lengths))
        a.free_bytes = sum(lengths)
        a.unit_bytes = int((gaps - gaps % unit).sum())
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
        self.unit_bytes += length - length % self.unit

    def _remove(self, start: int) -> int:
        i = bisect.bisect_left(self._starts, start)
        del self._starts[i]
        length = self._length.pop(start)
        self.free_bytes -= length
        self.unit_bytes -= length - length % self.unit
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

    # --- for a pool shared by several nodes (its regions: kvfs/cluster/space.py) ------------------
    def alloc_in(self, length: int, ranges: list[tuple[int, int]]) -> int | None:
        """Like `alloc`, but only inside the given sorted, disjoint [lo, hi) ranges."""
        if length <= 0 or length % PAGE:
            raise ValueError(f"allocation of {length} bytes is not a positive multiple of {PAGE}")
        for lo, hi in ranges:
            i = max(0, bisect.bisect_right(self._starts, lo) - 1)
            while i < len(self._starts) and self._starts[i] < hi:
                s = self._starts[i]
                have = self._length[s]
                a, b = max(s, lo), min(s + have, hi)
                if b - a >= length:
                    self.take(a, length)
                    return a
                i += 1
        return None

    def take(self, offset: int, length: int) -> None:
        """Mark [offset, offset+length) used; it must be free (else ValueError, nothing changes).
        Used for space another node allocated and published."""
        if length <= 0:
            return
        i = bisect.bisect_right(self._starts, offset) - 1
        if i < 0:
            raise ValueError(f"extent ({offset}, {length}) is not free")
        s = self._starts[i]
        have = self._length[s]
        if offset + length > s + have:
            raise ValueError(f"extent ({offset}, {length}) is not free")
        self._remove(s)
        if offset > s:
            self._insert(s, offset - s)
        if s + have > offset + length:
            self._insert(offset + length, s + have - offset - length)

    def take_free(self, offset: int, length: int) -> int:
        """Mark whatever part of [offset, offset+length) is free used; returns the bytes taken."""
        return sum(n for _, n in self.take_free_parts(offset, length))

    def take_free_parts(self, offset: int, length: int) -> list[tuple[int, int]]:
        """Mark whatever part of [offset, offset+length) is free used; returns the (offset,
        length) pieces taken."""
        end = offset + length
        parts = []
        i = max(0, bisect.bisect_right(self._starts, offset) - 1)
        while i < len(self._starts) and self._starts[i] < end:
            s = self._starts[i]
            a, b = max(s, offset), min(s + self._length[s], end)
            if b > a:
                parts.append((a, b - a))
            i += 1
        for a, n in parts:
            self.take(a, n)
        return parts

    def free_in(self, lo: int, hi: int) -> tuple[int, int]:
        """(free bytes, largest free extent) inside [lo, hi)."""
        total = largest = 0
        for n in self._pieces_in(lo, hi):
            total += n
            largest = max(largest, n)
        return total, largest

    def unit_bytes_in(self, lo: int, hi: int, grain: int | None = None) -> int:
        """`unit_bytes` of the free space inside [lo, hi) (each piece cut at lo and hi), in
        pieces of `grain` bytes (default: the unit)."""
        g = grain or self.unit
        return sum(n - n % g for n in self._pieces_in(lo, hi))

    def _pieces_in(self, lo: int, hi: int):
        """The lengths of the free extents' parts that lie inside [lo, hi)."""
        i = max(0, bisect.bisect_right(self._starts, lo) - 1)
        while i < len(self._starts) and self._starts[i] < hi:
            s = self._starts[i]
            n = min(s + self._length[s], hi) - max(s, lo)
            if n > 0:
                yield n
            i += 1
