#!/usr/bin/env python3
"""Replay a prefix trace through kvfs's own placement code and report the prefix hit rate.

The trace is JSON lines in the format of ../shared/traces/conversation_trace.jsonl (the Mooncake
conversation trace): one request per line, `hash_ids` its prefix blocks (512 tokens each). For
each request the hit is the leading run of its blocks found in the tier; then every block of
the request is read (a hit) or stored (a miss), with its predecessor as parent, and the
request's last block is reported as the end of a chain walk. The tier is a `kvfs.policy.
TierIndex` (the DRAM tier's index) of `--capacity-blocks` blocks with the chosen policy.

    python bench/trace_replay.py --trace TRACE --capacity-blocks 6000 [--policy prefix] [--json]

`hit_rate` is for --policy; `lru_hit_rate` for LRU at the same capacity (the baseline), both
from this run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvfs.policy import POLICIES, TierIndex, make_policy  # noqa: E402


def load(path: str) -> list[list[int]]:
    with open(path) as f:
        return [json.loads(line)["hash_ids"] for line in f if line.strip()]


def replay(requests: list[list[int]], capacity: int, policy: str) -> dict:
    tier = TierIndex(capacity, make_policy(policy, capacity, typical_size=1))
    hits = total = 0
    t = time.perf_counter()
    for ids in requests:
        k = 0
        while k < len(ids) and ids[k] in tier:
            k += 1
        hits += k
        total += len(ids)
        parent = None
        for h in ids:
            if not tier.lookup(h, parent):
                if tier.make_room(1) is not None:
                    tier.add(h, 1, parent)
            parent = h
        if ids:
            tier.policy.end_chain(ids[-1])
    out = {"policy": policy, "capacity_blocks": capacity, "hit_rate": hits / total,
           "block_hit_rate": tier.hits / max(1, tier.hits + tier.misses),
           "requests": len(requests), "blocks": total, "seconds": time.perf_counter() - t}
    mode = getattr(tier.policy, "mode_name", None)
    if mode:
        out["final_mode"] = mode
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--capacity-blocks", type=int, required=True, nargs="+")
    ap.add_argument("--policy", default="prefix", choices=POLICIES)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    requests = load(args.trace)
    rows = []
    for cap in args.capacity_blocks:
        r = replay(requests, cap, args.policy)
        base = replay(requests, cap, "lru")
        r["lru_hit_rate"] = base["hit_rate"]
        r["vs_lru"] = r["hit_rate"] / base["hit_rate"] if base["hit_rate"] else float("inf")
        rows.append(r)
    if args.json:
        print(json.dumps(rows[0] if len(rows) == 1 else rows))
        return 0
    print(f"{args.trace}: {rows[0]['requests']} requests, {rows[0]['blocks']} block reads")
    print(f"{'capacity':>9}{'policy':>10}{'hit rate':>10}{'LRU':>9}{'vs LRU':>8}  mode")
    for r in rows:
        print(f"{r['capacity_blocks']:>9}{r['policy']:>10}{r['hit_rate']:>10.4f}{r['lru_hit_rate']:>9.4f}"
              f"{r['vs_lru']:>8.3f}  {r.get('final_mode', '')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
