"""Striping arithmetic: where each stripe unit of a block lives. Pure functions, no I/O.

A block (the content of one file version) of `size` bytes is cut into stripe units of `unit`
bytes; the last unit may be shorter. Each unit lives contiguously on one namespace at a 4 KiB
aligned offset, and is stored rounded up to 4 KiB (zero padded) so that every I/O is O_DIRECT
friendly. Units are spread RAID-0 style: unit k of a block goes to the namespace chosen by a
smooth weighted round robin that starts at a per-block rotation, so with equal weights unit k
lands on namespace (start + k) mod N, and small blocks spread across namespaces too.

A `Layout` records, per unit, the namespace, the byte offset in it and a checksum (xxh3-64 of
the unit's content bytes, padding excluded). It is immutable: a rewrite makes a new layout.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Iterable, Sequence

PAGE = 4096
DATA_START = 1 << 20  # bytes [0, DATA_START) of every namespace hold its superblock


def align_up(n: int, a: int = PAGE) -> int:
    return (n + a - 1) // a * a


def unit_count(size: int, unit: int) -> int:
    """Number of stripe units in a block of `size` bytes (0 for an empty block)."""
    return (size + unit - 1) // unit


def unit_length(size: int, unit: int, k: int) -> int:
    """Content bytes in unit k."""
    return max(0, min(unit, size - k * unit))


def stored_length(size: int, unit: int, k: int) -> int:
    """Bytes unit k occupies on its namespace (content rounded up to 4 KiB)."""
    return align_up(unit_length(size, unit, k))


def units_covering(offset: int, length: int, size: int, unit: int) -> range:
    """Indexes of the units holding bytes [offset, offset+length) of a block, clipped to size."""
    end = min(offset + length, size)
    if end <= offset:
        return range(0)
    return range(offset // unit, (end - 1) // unit + 1)


def place_units(
    nunits: int,
    weights: Sequence[float],
    start: int,
    room: Sequence[int] | None = None,
    unit_bytes: Sequence[int] | None = None,
    credit: list[float] | None = None,
) -> list[int]:
    """Choose a namespace for each of `nunits` units.

    Smooth weighted round robin: every namespace earns its weight at each step and the richest
    is chosen; ties go to the namespace that comes first in rotation order from `start`. With
    equal weights this is plain rotation from `start`. A namespace with weight 0, or whose
    `room` (free bytes) cannot take the unit's `unit_bytes[k]`, is skipped for that unit.

    Without `credit` each call starts from nothing, so the result depends only on the
    arguments (the write-behind writer asks again for the same block). With `credit` (one
    number per namespace, updated in place) the round robin goes on across calls: blocks of
    fewer units than namespaces are spread by weight too, where a fresh start would give
    every one-unit block to the heaviest namespace whatever `start` says.

    Raises ValueError if some unit fits nowhere.
    """
    n = len(weights)
    if n == 0:
        raise ValueError("no namespaces")
    left = list(room) if room is not None else None
    current = credit if credit is not None else [0.0] * n
    order = [(start + i) % n for i in range(n)]
    rank = {ns: i for i, ns in enumerate(order)}
    out = []
    for k in range(nunits):
        need = unit_bytes[k] if unit_bytes is not None else 0
        eligible = [i for i in range(n) if weights[i] > 0 and (left is None or left[i] >= need)]
        if not eligible:
            raise ValueError(f"unit {k} ({need} bytes) fits on no namespace")
        total = sum(weights[i] for i in eligible)
        for i in eligible:
            current[i] += weights[i]
        best = max(eligible, key=lambda i: (current[i], -rank[i]))
        current[best] -= total
        if left is not None:
            left[best] -= need
        out.append(best)
    return out


@dataclass(frozen=True)
class Extent:
    ns: int
    offset: int
    length: int

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True)
class Layout:
    size: int
    unit: int
    ns: tuple[int, ...]
    offsets: tuple[int, ...]
    sums: tuple[int, ...]

    def __post_init__(self) -> None:
        n = unit_count(self.size, self.unit)
        if not (len(self.ns) == len(self.offsets) == len(self.sums) == n):
            raise ValueError(
                f"layout of {self.size} bytes needs {n} units, got "
                f"{len(self.ns)}/{len(self.offsets)}/{len(self.sums)}"
            )

    @property
    def nunits(self) -> int:
        return len(self.ns)

    def unit_span(self, k: int) -> tuple[int, int]:
        """(start byte in the block, content length) of unit k."""
        return k * self.unit, unit_length(self.size, self.unit, k)

    def stored(self, k: int) -> int:
        return stored_length(self.size, self.unit, k)

    def unit_extents(self) -> Iterable[Extent]:
        for k in range(self.nunits):
            yield Extent(self.ns[k], self.offsets[k], self.stored(k))

    def extents(self) -> list[Extent]:
        """The namespace space this block occupies, coalesced, sorted by (namespace, offset)."""
        out: list[Extent] = []
        for e in sorted(self.unit_extents(), key=lambda e: (e.ns, e.offset)):
            if out and out[-1].ns == e.ns and out[-1].end == e.offset:
                out[-1] = Extent(e.ns, out[-1].offset, out[-1].length + e.length)
            else:
                out.append(e)
        return out

    def stored_bytes(self) -> int:
        return sum(self.stored(k) for k in range(self.nunits))

    # --- persistence -------------------------------------------------------------------------
    def pack(self) -> tuple[bytes, bytes, bytes]:
        return (
            array("H", self.ns).tobytes(),
            array("Q", self.offsets).tobytes(),
            array("Q", self.sums).tobytes(),
        )

    @classmethod
    def unpack(cls, size: int, unit: int, ns: bytes, offsets: bytes, sums: bytes) -> "Layout":
        a_ns, a_off, a_sum = array("H"), array("Q"), array("Q")
        a_ns.frombytes(ns)
        a_off.frombytes(offsets)
        a_sum.frombytes(sums)
        return cls(size, unit, tuple(a_ns), tuple(a_off), tuple(a_sum))

    def describe(self) -> dict:
        """A JSON-friendly description (what `user.kvfs.layout` shows)."""
        return {
            "size": self.size,
            "stripe_unit": self.unit,
            "units": self.nunits,
            "namespaces": sorted(set(self.ns)),
            "extents": [[e.ns, e.offset, e.length] for e in self.extents()],
            "unit_map": [[self.ns[k], self.offsets[k]] for k in range(self.nunits)],
        }
