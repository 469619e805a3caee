#!/usr/bin/env python3
"""Reads of 32 MiB KV blocks through a kvfs mount against the same bytes in tmpfs.

One run, side by side, block by block, so machine noise hits every case alike:

  tmpfs         the same bytes as plain files on tmpfs (the memory-speed reference)
  dram          kvfs, blocks resident in its DRAM tier (kernel page cache dropped first)
  pool          kvfs, DRAM tier and page cache dropped: every byte comes from the pool
  pagecache     kvfs, a re-read that the kernel page cache serves (kept across opens)

The pool is one namespace file on the same tmpfs, so `pool` measures kvfs's software path
(stripe reads, checksums, FUSE), not a disk. Reads use one thread and READ_SIZE requests;
every read must return the whole block (a short read fails the run, it is not counted as
speed), and one block per run is checked bit-exact through each path.

    python bench/fuse_read.py [--blocks 8] [--rounds 5] [--read-size 1MiB] [--json]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.reads import digest, read_full  # noqa: E402
from kvfs.units import parse_size  # noqa: E402
from testing.emulate import Emulation  # noqa: E402
from testing.mount import MountedKvfs, write_config  # noqa: E402

MiB = 1 << 20
BLOCK = 32 * MiB


def read_all(paths: list[Path], read_size: int, buf: mmap.mmap, check: int | None = None) -> float:
    """Read every file start to end with `read_size` requests; return seconds. Every file must
    give back all BLOCK bytes (a short read fails the run); `check`: their xxh3-64 digest."""
    view = memoryview(buf)[:read_size]
    t = time.perf_counter()
    for p in paths:
        read_full(p, view, BLOCK, check=check)
    return time.perf_counter() - t


def drop_page_cache(paths: list[Path]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--read-size", default="1MiB")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    read_size = parse_size(args.read_size)
    total = args.blocks * BLOCK
    results: dict[str, list[float]] = {"tmpfs": [], "dram": [], "pool": [], "pagecache": []}

    with Emulation(f"{(2 * total + 512 * MiB) // MiB}m") as emu, \
            tempfile.TemporaryDirectory(prefix="kvfs-bench-") as tmp:
        tmp = Path(tmp)
        cfg = write_config(tmp / "kvfs.toml", tmp / "state",
                           [{"path": str(emu.root / "ns0.img"), "size": f"{total // MiB + 256}MiB"}],
                           dram=f"{total // MiB + 128}MiB")
        with MountedKvfs(tmp / "mnt", cfg, tmp / "kvfs.log") as m:
            ref, kv = [], []
            for i in range(args.blocks):
                data = os.urandom(BLOCK)
                if i == 0:
                    check = digest(data)
                (emu.root / f"block{i}.pt").write_bytes(data)
                ref.append(emu.root / f"block{i}.pt")
                (m.mountpoint / f"block{i}.pt").write_bytes(data)
                kv.append(m.mountpoint / f"block{i}.pt")
            buf = mmap.mmap(-1, read_size)
            read_all(ref, read_size, buf)           # warm-up
            for _ in range(args.rounds):
                # block by block, tmpfs and kvfs side by side: noise hits both alike
                for r, k in zip(ref, kv):
                    results["tmpfs"].append(read_all([r], read_size, buf))
                    drop_page_cache([k])
                    results["dram"].append(read_all([k], read_size, buf))
                    results["pagecache"].append(read_all([k], read_size, buf))
                m.control("drop_dram")
                drop_page_cache(kv)
                t = read_all(kv, read_size, buf)
                results["pool"] += [t / len(kv)] * len(kv)
            # One block per run, through every path measured, must come back bit-exact
            # (untimed): a fast path that returns the wrong bytes fails the run.
            read_all(ref[:1], read_size, buf, check)
            m.control("drop_dram")
            drop_page_cache(kv[:1])
            read_all(kv[:1], read_size, buf, check)       # pool
            drop_page_cache(kv[:1])
            read_all(kv[:1], read_size, buf, check)       # dram
            read_all(kv[:1], read_size, buf, check)       # page cache
            stats = m.stats()

    gbps = {k: BLOCK / statistics.median(v) / 1e9 for k, v in results.items()}
    out = {
        "block_bytes": BLOCK, "blocks": args.blocks, "rounds": args.rounds, "read_size": read_size,
        "gbps": {k: round(v, 3) for k, v in gbps.items()},
        "dram_vs_tmpfs": round(gbps["dram"] / gbps["tmpfs"], 3),
        "pool_vs_tmpfs": round(gbps["pool"] / gbps["tmpfs"], 3),
        "pagecache_vs_tmpfs": round(gbps["pagecache"] / gbps["tmpfs"], 3),
        "dram_request_hits": stats["store"]["dram_request_hits"], "fetches": stats["store"]["fetches"],
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(f"32 MiB blocks x {args.blocks}, {args.rounds} rounds, {read_size // 1024} KiB reads, "
              f"one reader (median per block; ratio to tmpfs)")
        print(f"{'path':<12}{'GB/s':>8}{'vs tmpfs':>10}")
        for k in ("tmpfs", "dram", "pool", "pagecache"):
            print(f"{k:<12}{gbps[k]:>8.2f}{gbps[k] / gbps['tmpfs']:>10.2f}")
        print(f"dram_vs_tmpfs={out['dram_vs_tmpfs']}  pool_vs_tmpfs={out['pool_vs_tmpfs']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
