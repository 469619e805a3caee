"""Read loops for the benchmarks that count what they read.

A benchmark that stops at the first short read (`while os.readv(...) == size`) and divides the
block size by the time taken counts a short read as speed. These loops read to end of file,
count the bytes, and fail unless the whole file came back; `digest` checks the bytes too
(xxh3-64 of the whole file), for the one block per run that a benchmark verifies.
"""

from __future__ import annotations

import os
from pathlib import Path

import xxhash


class ShortRead(AssertionError):
    """A read returned fewer (or more) bytes than the file holds."""


def digest(data) -> int:
    return xxhash.xxh3_64_intdigest(data)


def read_full(
    path: Path | str, view: memoryview, expect: int, *, flags: int = 0, check: int | None = None
) -> int:
    """Read `path` from start to end with len(view)-byte requests into `view`; return the
    bytes read. Raises ShortRead unless exactly `expect` bytes came back, and (with `check`, an
    xxh3-64 digest) unless their digest matches."""
    h = xxhash.xxh3_64() if check is not None else None
    total = 0
    fd = os.open(path, os.O_RDONLY | flags)
    try:
        while True:
            n = os.readv(fd, [view])
            if n <= 0:
                break
            if h is not None:
                h.update(view[:n])
            total += n
    finally:
        os.close(fd)
    if total != expect:
        raise ShortRead(f"{path}: read {total} bytes, the file holds {expect}")
    if h is not None and h.intdigest() != check:
        raise ShortRead(f"{path}: the {total} bytes read differ from those written")
    return total
