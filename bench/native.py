"""The compiled per-file path's pieces against their Python source, in-process, side by side
(issue 45; kvfs/native.py): each case runs the same calls a stored and a loaded 256 KiB block
make of a module, in a fresh interpreter with the compiled build and in one with
KVFS_PURE_PYTHON=1, alternating, `--rounds` times; medians of the µs per call, and their ratio
(compiled over source: below 1 is a gain).

    python bench/native.py [--rounds 5] [--json]

Cases:
  dram_policy   the DRAM tier's index and its default policy ("prefix", kvfs/tiers/policy.py)
                as the block store drives it: a block added (room made first), then read twice
  pool_score    the pool's score (kvfs/tiers/scoring.py PrefixScore) observing a store and a
                read of each block, sampled as in a pool of 5,000 blocks of 256 KiB
  layout        placing and describing a 256 KiB block's stripe units (kvfs/pool/layout.py)
  latency       one request's latency record (kvfs/fs/latency.py)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path
from time import perf_counter

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import dumps, parse, parser  # noqa: E402

KiB = 1024
BLOCK = 256 * KiB
N = 20_000  # blocks per case


def case_dram_policy() -> float:
    from kvfs.tiers.index import TierIndex
    from kvfs.tiers.policy import make_policy

    cap = 2000 * BLOCK
    tier = TierIndex(cap, make_policy("prefix", cap, BLOCK))
    t = perf_counter()
    for i in range(N):
        key = (i % 16, i)
        tier.make_room(BLOCK)
        tier.add(key, BLOCK, None)
        tier.lookup(key)
        tier.lookup((i % 16, i - 700))
    return (perf_counter() - t) / N


def case_pool_score() -> float:
    from kvfs.tiers.scoring import PrefixScore

    rule = PrefixScore(5000 * BLOCK, BLOCK)
    t = perf_counter()
    for i in range(N):
        key = (i % 16, f"block-{i:06d}.kv")
        rule.observe(key, BLOCK)
        rule.priority(1)
        rule.observe((i % 16, f"block-{i - 1500:06d}.kv"), BLOCK)
        rule.priority(2)
    return (perf_counter() - t) / N


def case_layout() -> float:
    from kvfs.pool import layout

    weights = [1.0, 1.0, 1.0, 1.0]
    credit = [0.0] * 4
    t = perf_counter()
    for i in range(N):
        nu = layout.unit_count(BLOCK, 1 << 20)
        layout.place_units(nu, weights, i % 4, None, [BLOCK], credit)
        for k in layout.units_covering(0, BLOCK, BLOCK, 1 << 20):
            layout.stored_length(BLOCK, 1 << 20, k)
            layout.unit_length(BLOCK, 1 << 20, k)
    return (perf_counter() - t) / N


def case_latency() -> float:
    from kvfs.fs.latency import Latency

    lat = Latency()
    t = perf_counter()
    for i in range(N):
        lat.record("lookup", 1e-5 * (i % 7))
    return (perf_counter() - t) / N


CASES = {
    "dram_policy": case_dram_policy,
    "pool_score": case_pool_score,
    "layout": case_layout,
    "latency": case_latency,
}


def child(name: str) -> None:
    """In the fresh interpreter: one case, after a warm-up run; prints µs per block and how
    the case's modules were loaded."""
    from kvfs import native

    CASES[name]()
    us = CASES[name]() * 1e6
    print(us, native.status()["mode"])  # (read by run(), not a result)


def run(name: str, pure: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "KVFS_PURE_PYTHON"}
    if pure:
        env["KVFS_PURE_PYTHON"] = "1"
    out = subprocess.run(
        [sys.executable, __file__, "--child", name],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    us, mode = out.stdout.split()
    return {"us": float(us), "mode": mode}


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = parse(ap, argv, needs=lambda a: None)
    if args.child:
        child(args.child)
        return 0
    out: dict = {"rounds": args.rounds, "cases": {}}
    for name in args.cases.split(","):
        got: dict[bool, list[float]] = {False: [], True: []}
        modes = {}
        for r in range(args.rounds):
            for pure in (r % 2 == 1, r % 2 == 0):  # alternate which goes first
                res = run(name, pure)
                got[pure].append(res["us"])
                modes[pure] = res["mode"]
        c, p = statistics.median(got[False]), statistics.median(got[True])
        out["cases"][name] = {
            "compiled_us": round(c, 3),
            "source_us": round(p, 3),
            "compiled_vs_source": round(c / p, 3),
            "compiled_range_us": [round(min(got[False]), 3), round(max(got[False]), 3)],
            "source_range_us": [round(min(got[True]), 3), round(max(got[True]), 3)],
            "modes": {"compiled": modes[False], "source": modes[True]},
        }
    if args.json:
        print(dumps(out))
        return 0
    print(f"µs per block, medians of {args.rounds} rounds (fresh interpreters, alternating)")
    print(f"{'case':<14}{'compiled':>10}{'source':>10}{'ratio':>8}  build")
    for name, c in out["cases"].items():
        print(
            f"{name:<14}{c['compiled_us']:>10.2f}{c['source_us']:>10.2f}"
            f"{c['compiled_vs_source']:>8.3f}  {c['modes']['compiled']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
