#!/usr/bin/env python3
"""The least CPU a store and a cold load can cost the daemon in I/O alone: a block moved
between its memory (a memfd) and one of the loop devices kvfs's benches use, each way it can
be moved, the calling thread's CPU per block (user and kernel, getrusage RUSAGE_THREAD).

What kvfs does per block beyond this is its own work (the requests' handling, the catalog, the
placement); docs/performance.md sets it beside the floor's whole cost per file
(bench/block_sizes.py --floor), which moves nothing to a device.

Ways, per block size (synchronous O_DIRECT calls; kvfs submits the same I/O by Linux AIO or a
worker thread, whose kernel work is the same):

  store_staged        the block's file copied into aligned staging memory (preadv), written
                      from there (kvfs's way for blocks up to a chunk, Buffer.stage_out)
  store_mapped        written straight from a mapping of the file made for the write (mmap,
                      the write, munmap: kvfs's way for larger blocks)
  store_kept_mapping  written from a mapping made once (what a write costs when no mapping
                      has to be made: the least)
  store_staged_xxh3   store_staged with the checksum kvfs takes (xxh3-64 of the staging
                      memory the copy just filled: kvfs's small-block write)
  store_mapped_xxh3   store_mapped with the checksum taken from the mapping before the write
                      and again after it (what kvfs must do when writing from memory a
                      passthrough writer may still change: Namespace._write_sync's verify)
  load_staged_fresh   read into staging memory, copied into a new file (pwrite: the kernel
                      clears each new page first; kvfs's way for blocks up to a chunk)
  load_staged_reused  the same into a file whose pages exist (a spare, Spares)
  load_mapped_fresh   read straight into a mapping of a new file (its pages faulted in one by
                      one by the read)
  load_mapped_reused  read straight into a mapping, made for the read, of a file whose pages
                      exist (a spare), populated first (MADV_POPULATE_WRITE) and unmapped after:
                      an I/O worker's way (kvfs/pool/io_worker.py), one copy
  load_kept_mapping   read into a mapping made once of a file whose pages exist (the least)

Every number is a median over --rounds rounds of --blocks blocks each, the ways interleaved.
Each way moves the same block memory again and again, so it is in the CPU's caches: a floor.
In the daemon a stored block's pages were written by the client just before, on either CPU.

    python bench/io_floor.py [--sizes 256K,1M,4M] [--blocks 1000] [--rounds 3] [--json]
"""

from __future__ import annotations

import mmap
import os
import resource
import statistics
import sys
from pathlib import Path

import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import dumps, parse, parser  # noqa: E402
from testing.emulate import Emulation, available  # noqa: E402

MiB = 1 << 20
MADV_POPULATE_WRITE = 23  # (Linux >= 5.14; the mmap module lacks the name)
SIZES = {"256K": 256 << 10, "1M": MiB, "4M": 4 * MiB}
WAYS = (
    "store_staged",
    "store_mapped",
    "store_kept_mapping",
    "store_staged_xxh3",
    "store_mapped_xxh3",
    "load_staged_fresh",
    "load_staged_reused",
    "load_mapped_fresh",
    "load_mapped_reused",
    "load_kept_mapping",
)


def thread_cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_THREAD)
    return r.ru_utime, r.ru_stime


def new_file(size: int) -> int:
    fd = os.memfd_create("kvfs-io-floor", os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    return fd


class Ways:
    """The ways of one block size over one device (`dev`: an O_DIRECT descriptor), each
    `run(way, n)` moving n blocks at n consecutive places of the device."""

    def __init__(self, dev: int, size: int, span: int):
        self.dev, self.size, self.span = dev, size, span
        self.staging = mmap.mmap(-1, size)
        self.src = new_file(size)  # a stored block: its pages written, as a writer leaves them
        os.pwrite(self.src, os.urandom(size), 0)
        self.src_map = mmap.mmap(self.src, size)
        self.dst = new_file(size)  # a spare: its pages exist
        os.pwrite(self.dst, bytes(size), 0)
        self.dst_map = mmap.mmap(self.dst, size)

    def close(self) -> None:
        for m in (self.staging, self.src_map, self.dst_map):
            m.close()
        os.close(self.src)
        os.close(self.dst)

    def place(self, i: int) -> int:
        return i * self.size % (self.span - self.size)

    def run(self, way: str, n: int) -> tuple[float, float]:
        """(user, kernel) µs per block."""
        step = getattr(self, way)
        u0, s0 = thread_cpu()
        for i in range(n):
            step(self.place(i))
        u1, s1 = thread_cpu()
        return (u1 - u0) / n * 1e6, (s1 - s0) / n * 1e6

    def store_staged(self, at: int) -> None:
        v = memoryview(self.staging)
        os.preadv(self.src, [v], 0)
        os.pwritev(self.dev, [v], at)

    def store_mapped(self, at: int) -> None:
        m = mmap.mmap(self.src, self.size)
        with memoryview(m) as v:
            os.pwritev(self.dev, [v], at)
        m.close()

    def store_kept_mapping(self, at: int) -> None:
        os.pwritev(self.dev, [memoryview(self.src_map)], at)

    def store_staged_xxh3(self, at: int) -> None:
        v = memoryview(self.staging)
        os.preadv(self.src, [v], 0)
        xxhash.xxh3_64_intdigest(v)
        os.pwritev(self.dev, [v], at)

    def store_mapped_xxh3(self, at: int) -> None:
        m = mmap.mmap(self.src, self.size)
        with memoryview(m) as v:
            before = xxhash.xxh3_64_intdigest(v)
            os.pwritev(self.dev, [v], at)
            if xxhash.xxh3_64_intdigest(v) != before:
                raise RuntimeError("the block changed while it was written")
        m.close()

    def load_staged_fresh(self, at: int) -> None:
        v = memoryview(self.staging)
        os.preadv(self.dev, [v], at)
        fd = new_file(self.size)
        os.pwrite(fd, v, 0)
        os.close(fd)

    def load_staged_reused(self, at: int) -> None:
        v = memoryview(self.staging)
        os.preadv(self.dev, [v], at)
        os.pwrite(self.dst, v, 0)

    def load_mapped_fresh(self, at: int) -> None:
        fd = new_file(self.size)
        m = mmap.mmap(fd, self.size)
        with memoryview(m) as v:
            os.preadv(self.dev, [v], at)
        m.close()
        os.close(fd)

    def load_mapped_reused(self, at: int) -> None:
        m = mmap.mmap(self.dst, self.size)
        m.madvise(MADV_POPULATE_WRITE)
        with memoryview(m) as v:
            os.preadv(self.dev, [v], at)
        m.close()

    def load_kept_mapping(self, at: int) -> None:
        os.preadv(self.dev, [memoryview(self.dst_map)], at)


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--blocks", type=int, default=1000, help="blocks per way and round")
    ap.add_argument("--rounds", type=int, default=3)
    args = parse(ap, argv, needs=lambda a: available(throttle=False))
    sizes = args.sizes.split(",")
    for s in sizes:
        if s not in SIZES:
            ap.error(f"--sizes: {s!r} is not one of {', '.join(SIZES)}")
    span = max(SIZES[s] for s in sizes) * args.blocks + MiB
    got: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with Emulation(f"{span // MiB + 256}m") as emu:
        loop = emu.loop("io-floor", span)
        dev = os.open(loop.path, os.O_RDWR | os.O_DIRECT)
        try:
            for s in sizes:
                ways = Ways(dev, SIZES[s], span)
                try:
                    for way in WAYS:  # once each first: the device's pages exist afterwards
                        ways.run(way, min(args.blocks, 50))
                    for _ in range(args.rounds):
                        for way in WAYS:
                            got.setdefault((s, way), []).append(ways.run(way, args.blocks))
                finally:
                    ways.close()
        finally:
            os.close(dev)
    out: dict = {"blocks": args.blocks, "rounds": args.rounds, "memory": "memfd"}
    for (s, way), runs in got.items():
        out[f"{s}_{way}_us"] = round(statistics.median(u + k for u, k in runs), 1)
        out[f"{s}_{way}_kernel_us"] = round(statistics.median(k for _, k in runs), 1)
    if args.json:
        print(dumps(out))
        return 0
    print(f"CPU per block, µs (user + kernel; kernel), median of {args.rounds} rounds")
    print(f"{'way':20s}" + "".join(f"{s:>16s}" for s in sizes))
    for way in WAYS:
        cells = "".join(
            f"{out[f'{s}_{way}_us']:>8.1f} ({out[f'{s}_{way}_kernel_us']:>5.1f})" for s in sizes
        )
        print(f"{way:20s}{cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
