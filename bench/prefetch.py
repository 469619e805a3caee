#!/usr/bin/env python3
"""Readahead along prefix chains: chain walks and random reads, with readahead on and off.

Four emulated namespaces (loop devices throttled to --bps each, as in bench/stripe.py) hold
--chains chains of 16 blocks, each chain written in prefix order by one writer (so kvfs learns
it), and as many unrelated blocks (each written by its own process, so no chain links them).
Each round mounts a fresh kvfs on the same devices for each setting (readahead off and on, the
order alternating from round to round) and, with the DRAM tier and page cache cold:

  chain walk   one reader walks every chain block by block, pausing after each block for about
               the time one cold block read takes (the compute of a decode step; measured
               back to back, since a throttled device that idled serves its next I/O in a burst)
  random       the same reader reads the unrelated blocks in a random order with the same pause

`chain_speedup` = walk time off / on (target >= 1.6); `random_slowdown` = random time on / off
(target <= 1.05): each the median of the rounds' pairs, with their range. The pause bounds
what readahead can win: a walk whose every read is hidden behind the pause takes half the time
of one that waits for each read (so the speedup is at most 2 with the default pause).

    python bench/prefetch.py [--chains 4] [--block 8MiB] [--bps 100e6] [--rounds 3]
                             [--pause S] [--json]
"""

from __future__ import annotations

import contextlib
import io
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

from bench import dumps, parse, parser  # noqa: E402
from bench.reads import digest, read_full  # noqa: E402
from kvfs.units import parse_size  # noqa: E402
from testing.emulate import Emulation  # noqa: E402
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
        time.sleep(pause)  # the reader computes on the block
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--chains", type=int, default=2)
    ap.add_argument("--block", default="32MiB")
    ap.add_argument("--bps", type=float, default=20e6)
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="runs of each setting, the order alternating (off-on, on-off, ...)",
    )
    ap.add_argument(
        "--pause",
        type=float,
        default=None,
        help="seconds the reader computes per block (default: one cold block read)",
    )
    args = parse(ap, argv)
    block = parse_size(args.block)
    nblocks = 2 * args.chains * CHAIN
    out: dict = {
        "block_bytes": block,
        "chains": args.chains,
        "chain_length": CHAIN,
        "bps_per_namespace": args.bps,
        "rounds": args.rounds,
    }
    with (
        Emulation(f"{(nblocks * block * 2) // MiB + 1024}m") as emu,
        tempfile.TemporaryDirectory(prefix="kvfs-prefetch-") as tmp,
    ):
        tmp = Path(tmp)
        devs = [emu.loop(f"p{i}", (nblocks * block) // 4 + 256 * MiB) for i in range(4)]
        group = emu.cgroup("kvfs-prefetch")
        for d in devs:
            group.limit(d, read_bps=args.bps, write_bps=args.bps)
        buf = mmap.mmap(-1, MiB)
        runs: dict[str, list[dict]] = {"off": [], "on": []}
        checks: dict[str, tuple[str, int]] = {}  # one block of each kind: its xxh3-64

        def config(setting: str) -> Path:
            return write_config(
                tmp / f"{setting}.toml",
                tmp / "state",
                [{"path": d.path} for d in devs],
                dram=f"{nblocks * block // MiB}MiB",
                extra=f"[prefetch]\nenabled = {'true' if setting == 'on' else 'false'}\n",
            )

        def names(m: MountedKvfs) -> tuple[list[list[Path]], list[Path]]:
            chains = [
                [m.mountpoint / f"c{c}" / f"b{i:02d}.pt" for i in range(CHAIN)]
                for c in range(args.chains)
            ]
            return chains, [
                m.mountpoint / "single" / f"s{i:03d}.pt" for i in range(args.chains * CHAIN)
            ]

        from kvfs.cli import main as kvfs_main

        with contextlib.redirect_stdout(io.StringIO()):
            assert kvfs_main(["format", "--config", str(config("off"))]) == 0
        # the same files serve every run: written once, each chain in prefix order by one
        # writer, each single by its own process (no chain among them)
        with MountedKvfs(tmp / "mnt", config("off"), tmp / "write.log") as m:
            chains, singles = names(m)
            for chain in chains:
                chain[0].parent.mkdir()
                for p in chain:
                    data = os.urandom(block)
                    checks.setdefault("chain", (p.name, digest(data)))
                    p.write_bytes(data)
            singles[0].parent.mkdir()
            for p in singles:
                data = os.urandom(block)
                checks.setdefault("single", (p.name, digest(data)))
                subprocess.run(
                    ["dd", f"of={p}", "bs=1M", "iflag=fullblock", "status=none"],
                    input=data,
                    check=True,
                )
            m.control("flush")
            group.add(m.pid)
            m.drop_caches()  # how long a cold block read takes, back to back
            t = [read_block(p, buf, block) for p in singles[:5]]
            out["cold_block_read_s"] = statistics.median(t[1:])
        pause = out["cold_block_read_s"] if args.pause is None else args.pause
        out["pause_s"] = pause
        for r in range(args.rounds):
            for setting in ("off", "on") if r % 2 == 0 else ("on", "off"):
                with MountedKvfs(tmp / "mnt", config(setting), tmp / f"{setting}{r}.log") as m:
                    chains, singles = names(m)
                    group.add(m.pid)  # throttled
                    m.drop_caches()
                    walk_s = sum(walk(chain, pause, buf, block) for chain in chains)
                    m.drop_caches()
                    order = singles[:]
                    random.Random(f"{setting}{r}").shuffle(order)  # an order no run taught
                    random_s = walk(order, pause, buf, block)
                    st = m.stats()
                    # one block of each kind per run, read cold, must come back bit-exact
                    m.drop_caches()
                    read_block(chains[0][0], buf, block, checks["chain"][1])
                    read_block(singles[0], buf, block, checks["single"][1])
                    runs[setting].append(
                        {
                            "walk_s": round(walk_s, 3),
                            "random_s": round(random_s, 3),
                            "prefetch": {
                                k: st["prefetch"][k]
                                for k in (
                                    "issued",
                                    "used",
                                    "wasted",
                                    "cancelled",
                                    "skipped",
                                    "predicted_hits",
                                    "predicted_misses",
                                )
                            },
                        }
                    )
        group.remove()
    out["runs"] = runs
    # ratios of each round's pair (run side by side), then their median and range
    speedups = [o["walk_s"] / n["walk_s"] for o, n in zip(runs["off"], runs["on"])]
    slowdowns = [n["random_s"] / o["random_s"] for o, n in zip(runs["off"], runs["on"])]
    out["chain_speedup"] = round(statistics.median(speedups), 3)
    out["chain_speedup_range"] = [round(min(speedups), 3), round(max(speedups), 3)]
    out["random_slowdown"] = round(statistics.median(slowdowns), 3)
    out["random_slowdown_range"] = [round(min(slowdowns), 3), round(max(slowdowns), 3)]
    if args.json:
        print(dumps(out))
        return 0
    print(
        f"{args.chains} chains x {CHAIN} blocks of {block // MiB} MiB; 4 namespaces at "
        f"{args.bps / 1e6:.0f} MB/s; pause per block {pause * 1000:.0f} ms (one cold block "
        f"read: {out['cold_block_read_s'] * 1000:.0f} ms); {args.rounds} rounds, order "
        f"alternating; ratios: median of the rounds' pairs [range]"
    )
    print(
        f"{'readahead':<10}{'round':>6}{'chain walk s':>14}{'random s':>10}  "
        "prefetch issued/used/wasted"
    )
    for r in range(args.rounds):
        for k in ("off", "on"):
            t = runs[k][r]
            p = t["prefetch"]
            print(
                f"{k:<10}{r:>6}{t['walk_s']:>14.3f}{t['random_s']:>10.3f}  "
                f"{p['issued']}/{p['used']}/{p['wasted']}"
            )
    print(
        f"chain_speedup = {out['chain_speedup']} {out['chain_speedup_range']}  "
        f"random_slowdown = {out['random_slowdown']} {out['random_slowdown_range']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
