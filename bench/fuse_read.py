#!/usr/bin/env python3
"""Reads of 32 MiB KV blocks through a kvfs mount against the same bytes in tmpfs.

One run, side by side, block by block, so machine noise hits every case alike:

  tmpfs         the same bytes as plain files on a tmpfs with the same pages as kvfs's block
                memory (huge pages where the daemon's DRAM tier has them): the memory-speed
                reference
  dram          kvfs, blocks resident in its DRAM tier (kernel page cache dropped first)
  pool          kvfs, DRAM tier and page cache dropped: every byte comes from the pool
  pagecache     kvfs, a re-read that the kernel page cache serves (kept across opens); only
                without FUSE passthrough: with it the kernel reads the block's memory for
                every read, so a re-read is the `dram` path again and is not reported

Like with like: every path is timed per block (one block, one read of it, one sample), the
statistic is the median of the samples with their range, the order of the paths alternates
from round to round, and one thread reads with READ_SIZE requests on every path. The pool is
one namespace file on tmpfs, so `pool` measures kvfs's software path (stripe reads,
checksums, FUSE), not a disk. Every read must return the whole block (a short read fails the
run, it is not counted as speed), and one block per run is checked bit-exact through each path.

    python bench/fuse_read.py [--blocks 8] [--rounds 5] [--read-size 1MiB] [--json]
"""

from __future__ import annotations

import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import dumps, parser  # noqa: E402
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


class ReferenceTmpfs:
    """A tmpfs for the reference files, with huge pages when `huge` (as the daemon's DRAM tier
    mounts its block memory, kvfs/pool/buffer.py); `pages` says what it got."""

    def __init__(self, size: int, huge: bool):
        self.root = Path(tempfile.mkdtemp(prefix="kvfs-ref-"))
        self.pages = "4 KiB"
        if huge:
            r = subprocess.run(
                [
                    "mount",
                    "-t",
                    "tmpfs",
                    "-o",
                    f"huge=within_size,size={size}",
                    "kvfs-ref",
                    str(self.root),
                ],
                capture_output=True,
                check=False,
            )
            if r.returncode == 0:
                self.pages = "huge"
                return
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "kvfs-ref", str(self.root)], check=True
        )

    def __enter__(self) -> ReferenceTmpfs:
        return self

    def __exit__(self, *exc) -> None:
        subprocess.run(["umount", "-l", str(self.root)], capture_output=True, check=False)
        os.rmdir(self.root)


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--read-size", default="1MiB")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    read_size = parse_size(args.read_size)
    total = args.blocks * BLOCK
    results: dict[str, list[float]] = {"tmpfs": [], "dram": [], "pool": [], "pagecache": []}

    with (
        Emulation(f"{(total + 512 * MiB) // MiB}m") as emu,
        tempfile.TemporaryDirectory(prefix="kvfs-bench-") as tmp,
    ):
        tmp = Path(tmp)
        cfg = write_config(
            tmp / "kvfs.toml",
            tmp / "state",
            [{"path": str(emu.root / "ns0.img"), "size": f"{total // MiB + 256}MiB"}],
            dram=f"{total // MiB + 128}MiB",
        )
        with MountedKvfs(tmp / "mnt", cfg, tmp / "kvfs.log") as m:
            path = m.stats()["data_path"]
            passthrough = bool(path["passthrough"])
            if passthrough:
                del results["pagecache"]
            with ReferenceTmpfs(total + 64 * MiB, "huge" in path.get("memory", "")) as refdir:
                ref, kv = [], []
                for i in range(args.blocks):
                    data = os.urandom(BLOCK)
                    if i == 0:
                        check = digest(data)
                    (refdir.root / f"block{i}.pt").write_bytes(data)
                    ref.append(refdir.root / f"block{i}.pt")
                    (m.mountpoint / f"block{i}.pt").write_bytes(data)
                    kv.append(m.mountpoint / f"block{i}.pt")
                buf = mmap.mmap(-1, read_size)
                read_all(ref, read_size, buf)  # warm-up
                for rnd in range(args.rounds):
                    # block by block, tmpfs and kvfs side by side, the order alternating
                    for r, k in zip(ref, kv):
                        for path_name in ("tmpfs", "dram") if rnd % 2 == 0 else ("dram", "tmpfs"):
                            if path_name == "tmpfs":
                                results["tmpfs"].append(read_all([r], read_size, buf))
                                continue
                            read_all([k], read_size, buf)  # resident (the pool rows
                            drop_page_cache([k])  # of the round before dropped it)
                            results["dram"].append(read_all([k], read_size, buf))
                            if not passthrough:
                                results["pagecache"].append(read_all([k], read_size, buf))
                    for k in kv if rnd % 2 == 0 else kv[::-1]:  # cold, one block at a time
                        m.control("drop_dram")  # (also what a read prefetched)
                        drop_page_cache([k])
                        results["pool"].append(read_all([k], read_size, buf))
                # One block per run, through every path measured, must come back bit-exact
                # (untimed): a fast path that returns the wrong bytes fails the run.
                read_all(ref[:1], read_size, buf, check)
                m.control("drop_dram")
                drop_page_cache(kv[:1])
                read_all(kv[:1], read_size, buf, check)  # pool
                drop_page_cache(kv[:1])
                read_all(kv[:1], read_size, buf, check)  # dram
                read_all(kv[:1], read_size, buf, check)  # page cache, or dram again
                stats = m.stats()
                ref_pages = refdir.pages

    gbps = {k: BLOCK / statistics.median(v) / 1e9 for k, v in results.items()}
    spread = {
        k: [round(BLOCK / max(v) / 1e9, 3), round(BLOCK / min(v) / 1e9, 3)]
        for k, v in results.items()
    }
    out = {
        "block_bytes": BLOCK,
        "blocks": args.blocks,
        "rounds": args.rounds,
        "read_size": read_size,
        "samples_per_path": len(results["tmpfs"]),
        "passthrough": passthrough,
        "kvfs_memory": path.get("memory"),
        "reference_pages": ref_pages,
        "gbps": {k: round(v, 3) for k, v in gbps.items()},
        "gbps_range": spread,
        "dram_vs_tmpfs": round(gbps["dram"] / gbps["tmpfs"], 3),
        "pool_vs_tmpfs": round(gbps["pool"] / gbps["tmpfs"], 3),
        "pagecache_vs_tmpfs": (
            round(gbps["pagecache"] / gbps["tmpfs"], 3) if "pagecache" in gbps else None
        ),
        "dram_request_hits": stats["store"]["dram_request_hits"],
        # cold reads: one per block and round on the pool path, one per round's first resident
        # read of a block the pool path dropped, and the checks
        "fetches": stats["store"]["fetches"],
    }
    if args.json:
        print(dumps(out))
    else:
        print(
            f"32 MiB blocks x {args.blocks}, {args.rounds} rounds, {read_size // 1024} KiB reads, "
            f"one reader on every path, order alternated; median per block [slowest, fastest]; "
            f"reference tmpfs with {ref_pages} pages, kvfs memory: {path.get('memory')}"
        )
        print(f"{'path':<12}{'GB/s':>8}{'range':>16}{'vs tmpfs':>10}")
        for k in results:
            lo, hi = spread[k]
            print(
                f"{k:<12}{gbps[k]:>8.2f}{f'[{lo:.2f}, {hi:.2f}]':>16}"
                f"{gbps[k] / gbps['tmpfs']:>10.2f}"
            )
        if passthrough:
            print("pagecache: not reported (with passthrough a re-read is the dram path)")
        print(f"dram_vs_tmpfs={out['dram_vs_tmpfs']}  pool_vs_tmpfs={out['pool_vs_tmpfs']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
