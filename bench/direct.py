#!/usr/bin/env python3
"""Direct reads: kvfs.direct against reads through the FUSE mount and against raw preads.

Four emulated namespaces (loop devices over a private tmpfs, throttled to --bps each with cgroup
v1 blkio, as in bench/stripe.py) hold --blocks blocks of 32 MiB. In one run, block by block and
cold every time (kvfs's DRAM tier and the page cache dropped; the direct and raw paths read
with O_DIRECT), the same reader process reads each block:

  fuse     through the mount, 1 MiB reads
  direct   with kvfs.direct into a host buffer (layout and lease through the mount, then every
           stripe unit in parallel from the namespaces)
  raw      the same extents with parallel O_DIRECT preads and no kvfs at all (the physical
           reference: what the devices give)

`direct_vs_raw` (target >= 0.9) and `direct_vs_fuse` (target >= 1.5) are throughput ratios.

    python bench/direct.py [--blocks 8] [--bps 1e9] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import io
import json
import mmap
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.emulate import Emulation, available  # noqa: E402
from kvfs import direct  # noqa: E402
from kvfs.testing import MountedKvfs, write_config  # noqa: E402

MiB = 1 << 20
BLOCK = 32 * MiB


def read_fuse(path: Path, buf: mmap.mmap) -> None:
    view = memoryview(buf)[:MiB]
    fd = os.open(path, os.O_RDONLY)
    try:
        while os.readv(fd, [view]) == MiB:
            pass
    finally:
        os.close(fd)


def read_raw(lay: direct.BlockLayout, fds: dict, pool: concurrent.futures.Executor,
             buf: mmap.mmap) -> None:
    def unit(k: int) -> None:
        n = lay.unit_length(k)
        view = memoryview(buf)[k * lay.unit:k * lay.unit + (n + 4095) // 4096 * 4096]
        got = os.preadv(fds[lay.ns_paths[lay.ns[k]]], [view], lay.offsets[k])
        assert got >= n
    list(pool.map(unit, range(len(lay.ns))))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bps", type=float, default=1e9)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    why = available()
    if why:
        print(f"bench/direct.py: {why}", file=sys.stderr)
        return 2
    times: dict[str, list[float]] = {"fuse": [], "direct": [], "raw": []}
    with Emulation(f"{(args.blocks * BLOCK * 2) // MiB + 1024}m") as emu, \
            tempfile.TemporaryDirectory(prefix="kvfs-direct-") as tmp:
        tmp = Path(tmp)
        devs = [emu.loop(f"d{i}", (args.blocks * BLOCK) // 4 + 256 * MiB) for i in range(4)]
        cfg = write_config(tmp / "k.toml", tmp / "state", [{"path": d.path} for d in devs],
                           dram=f"{args.blocks * BLOCK // MiB + 64}MiB",
                           extra="[prefetch]\nenabled = false\n")
        from kvfs.cli import main as kvfs_main
        with contextlib.redirect_stdout(io.StringIO()):
            assert kvfs_main(["format", "--config", str(cfg)]) == 0
        group = emu.cgroup("kvfs-direct")
        for d in devs:
            group.limit(d, read_bps=args.bps, write_bps=args.bps)
        with MountedKvfs(tmp / "mnt", cfg, tmp / "kvfs.log") as m:
            paths = [m.mountpoint / f"block{i}.pt" for i in range(args.blocks)]
            blocks = [os.urandom(BLOCK) for _ in paths]
            for p, data in zip(paths, blocks):
                p.write_bytes(data)
            group.add(m.pid)
            group.add(os.getpid())           # direct and raw reads are this process's I/O
            buf = mmap.mmap(-1, BLOCK + MiB)
            fds = {d.path: os.open(d.path, os.O_RDONLY | os.O_DIRECT) for d in devs}
            pool = concurrent.futures.ThreadPoolExecutor(args.threads)
            with direct.Direct(str(m.mountpoint), threads=args.threads) as dr:
                layouts = [dr.layout(str(p)) for p in paths]
                for p, data in zip(paths[:2], blocks):          # correctness, once
                    dr.read_into(str(p), buf)
                    assert buf[:BLOCK] == data
                for _ in range(args.rounds):
                    for p, lay in zip(paths, layouts):
                        m.drop_caches()
                        t = time.perf_counter()
                        read_fuse(p, buf)
                        times["fuse"].append(time.perf_counter() - t)
                        t = time.perf_counter()
                        dr.read_into(str(p), buf)
                        times["direct"].append(time.perf_counter() - t)
                        t = time.perf_counter()
                        read_raw(lay, fds, pool, buf)
                        times["raw"].append(time.perf_counter() - t)
            pool.shutdown()
            for fd in fds.values():
                os.close(fd)
            st = m.stats()
        from bench.emulate import BLKIO
        (BLKIO / "cgroup.procs").write_text(f"{os.getpid()}\n")
        group.remove()
    gbps = {k: BLOCK / statistics.median(v) / 1e9 for k, v in times.items()}
    out = {"block_bytes": BLOCK, "blocks": args.blocks, "rounds": args.rounds,
           "bps_per_namespace": args.bps, "threads": args.threads,
           "gbps": {k: round(v, 3) for k, v in gbps.items()},
           "direct_vs_raw": round(gbps["direct"] / gbps["raw"], 3),
           "direct_vs_fuse": round(gbps["direct"] / gbps["fuse"], 3),
           "direct_reads_counted": st["files"]["direct_reads"]}
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"cold reads of 32 MiB blocks x {args.blocks} x {args.rounds} rounds; 4 namespaces at "
          f"{args.bps / 1e6:.0f} MB/s; median per block")
    print(f"{'path':<8}{'GB/s':>8}")
    for k in ("fuse", "direct", "raw"):
        print(f"{k:<8}{gbps[k]:>8.3f}")
    print(f"direct_vs_raw = {out['direct_vs_raw']}  direct_vs_fuse = {out['direct_vs_fuse']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
