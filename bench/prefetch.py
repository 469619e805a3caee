#!/usr/bin/env python3
"""Readahead along prefix chains: chain walks and random reads, with readahead on and off.

Four emulated namespaces (loop devices throttled to --bps each, as in bench/stripe.py) hold
--chains chains of 16 blocks, each chain written in prefix order by one writer (so kvfs learns
it), and as many unrelated blocks (each written by its own process, so no chain links them). For each setting (readahead on, off) a fresh kvfs is mounted
on the same devices and, with the DRAM tier and page cache cold:

  chain walk   one reader walks every chain block by block, pausing after each block for about
               the time one cold block read takes (the compute of a decode step; measured
               back to back, since a throttled device that idled serves its next I/O in a burst)
  random       the same reader reads the unrelated blocks in a random order with the same pause

`chain_speedup` = walk time off / on (target >= 1.6); `random_slowdown` = random time on / off
(target <= 1.05).

    python bench/prefetch.py [--chains 4] [--block 8MiB] [--bps 100e6] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import mmap
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.reads import digest, read_full  # noqa: E402
from kvfs.units import parse_size  # noqa: E402
from testing.emulate import Emulation, available  # noqa: E402
from testing.mount import MountedKvfs, write_config  # noqa: E402

MiB = 1 << 20
CHAIN = 16


def read_block(path: Path, buf: mmap.mmap, size: int, check: int | None = None) -> float:
    """Read a whole block (a short read fails the run); seconds. `check`: its xxh3-64."""
    t = time.perf_counter()
    read_full(path, memoryview(buf), size, check=check)
    return time.perf_counter() - t


def walk(paths: list[Path], pause: float, buf: mmap.mmap, size: int) -> float:
    t = time.perf_counter()
    for p in paths:
        read_block(p, buf, size)
        time.sleep(pause)               # the reader computes on the block
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chains", type=int, default=2)
    ap.add_argument("--block", default="32MiB")
    ap.add_argument("--bps", type=float, default=20e6)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    why = available()
    if why:
        print(f"bench/prefetch.py: {why}", file=sys.stderr)
        return 2
    block = parse_size(args.block)
    nblocks = 2 * args.chains * CHAIN
    out: dict = {"block_bytes": block, "chains": args.chains, "chain_length": CHAIN,
                 "bps_per_namespace": args.bps}
    with Emulation(f"{(nblocks * block * 2) // MiB + 1024}m") as emu, \
            tempfile.TemporaryDirectory(prefix="kvfs-prefetch-") as tmp:
        tmp = Path(tmp)
        devs = [emu.loop(f"p{i}", (nblocks * block) // 4 + 256 * MiB) for i in range(4)]
        group = emu.cgroup("kvfs-prefetch")
        for d in devs:
            group.limit(d, read_bps=args.bps, write_bps=args.bps)
        buf = mmap.mmap(-1, MiB)
        times: dict[str, dict] = {}
        checks: dict[str, tuple[str, int]] = {}      # one block of each kind: its xxh3-64
        for setting in ("off", "on"):
            cfg = write_config(tmp / f"{setting}.toml", tmp / "state",
                               [{"path": d.path} for d in devs], dram=f"{nblocks * block // MiB}MiB",
                               extra=f"[prefetch]\nenabled = {'true' if setting == 'on' else 'false'}\n")
            if setting == "off":
                from kvfs.cli import main as kvfs_main
                with contextlib.redirect_stdout(io.StringIO()):
                    assert kvfs_main(["format", "--config", str(cfg)]) == 0
            with MountedKvfs(tmp / "mnt", cfg, tmp / f"{setting}.log") as m:
                chains = [[m.mountpoint / f"c{c}" / f"b{i:02d}.pt" for i in range(CHAIN)]
                          for c in range(args.chains)]
                singles = [m.mountpoint / "single" / f"s{i:03d}.pt"
                           for i in range(args.chains * CHAIN)]
                if setting == "off":          # the same files serve both settings
                    for chain in chains:
                        chain[0].parent.mkdir()
                        for p in chain:
                            data = os.urandom(block)
                            checks.setdefault("chain", (p.name, digest(data)))
                            p.write_bytes(data)
                    singles[0].parent.mkdir()
                    for p in singles:         # each by its own process: no chain among them
                        data = os.urandom(block)
                        checks.setdefault("single", (p.name, digest(data)))
                        subprocess.run(["dd", f"of={p}", "bs=1M", "iflag=fullblock",
                                        "status=none"], input=data, check=True)
                    m.control("flush")
                group.add(m.pid)                  # throttled from here on
                m.drop_caches()
                if setting == "off":          # how long a cold block read takes, back to back
                    t = [read_block(p, buf, block) for p in singles[:5]]
                    out["cold_block_read_s"] = statistics.median(t[1:])
                    m.drop_caches()
                pause = out["cold_block_read_s"]
                walk_s = sum(walk(chain, pause, buf, block) for chain in chains)
                m.drop_caches()
                order = singles[:]
                random.Random(setting).shuffle(order)   # an order the other run did not teach
                random_s = walk(order, pause, buf, block)
                st = m.stats()
                # one block of each kind per run, read cold, must come back bit-exact (untimed)
                m.drop_caches()
                read_block(chains[0][0], buf, block, checks["chain"][1])
                read_block(singles[0], buf, block, checks["single"][1])
                times[setting] = {"walk_s": round(walk_s, 3), "random_s": round(random_s, 3),
                                  "prefetch": {k: st["prefetch"][k] for k in (
                                      "issued", "used", "wasted", "cancelled", "skipped",
                                      "predicted_hits", "predicted_misses")}}
        group.remove()
    out["runs"] = times
    out["chain_speedup"] = round(times["off"]["walk_s"] / times["on"]["walk_s"], 3)
    out["random_slowdown"] = round(times["on"]["random_s"] / times["off"]["random_s"], 3)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{args.chains} chains x {CHAIN} blocks of {block // MiB} MiB; 4 namespaces at "
          f"{args.bps / 1e6:.0f} MB/s; pause per block {out['cold_block_read_s'] * 1000:.0f} ms "
          f"(one cold block read)")
    print(f"{'readahead':<10}{'chain walk s':>14}{'random s':>10}  prefetch issued/used/wasted")
    for k in ("off", "on"):
        t = times[k]
        p = t["prefetch"]
        print(f"{k:<10}{t['walk_s']:>14.3f}{t['random_s']:>10.3f}  {p['issued']}/{p['used']}/{p['wasted']}")
    print(f"chain_speedup = {out['chain_speedup']}  random_slowdown = {out['random_slowdown']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
