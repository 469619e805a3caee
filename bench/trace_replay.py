#!/usr/bin/env python3
"""Replay a prefix trace through kvfs's own placement code and report the prefix hit rate.

The trace is JSON lines in the format of ../shared/traces/conversation_trace.jsonl (the Mooncake
conversation trace): one request per line, `hash_ids` its prefix blocks (512 tokens each). For
each request the hit is the leading run of its blocks found in the tier; then every block of
the request is read (a hit) or stored (a miss), with its predecessor as parent, and the
request's last block is reported as the end of a chain walk. The tier is a `kvfs.tiers.index.
TierIndex` (the DRAM tier's index) of `--capacity-blocks` blocks with the chosen policy.

    python bench/trace_replay.py --trace TRACE --capacity-blocks 6000 [--policy prefix] [--json]

`hit_rate` is for --policy; `lru_hit_rate` for LRU at the same capacity (the baseline), both
from this run; `bound_hit_rate` the offline bound at that capacity (`replay_bound`: furthest
next use, knowing the future) and `pct_of_bound` the policy's share of it; `us_per_access` the
policy's replay time per block access. `admission_oracle_pct_of_bound` ("oracle %") is LRU told,
by an oracle, whether each block will ever be used again (`replay_admission_oracle`): what
perfect prediction of reuse, without its time, reaches. A policy far below it can still learn;
a target above it needs knowing *when* blocks come back. `timed_oracle_pct_of_bound` ("timed
%") adds to that oracle a model of when: the trace's own reuse distances by class, evicting by
hit density (`replay_timed_oracle`), a yardstick no online policy reaches.

With --nodes N, the requests are also spread round-robin over N nodes, and the prefix hit rate
of N node-local pools of --capacity-blocks each is compared with one pool of N times that
shared by all of them (what kvfs's [cluster] mode gives). What is modelled is what runs,
whatever --policy says (that is the DRAM tier's policy): a node's own pool evicts by the score
policy (`pool.evict = "prefix"`, the default: kvfs.tiers.scoring.PrefixScore, kept in the catalog,
and for a shared pool in Redis); `--nodes-policy lru` gives the node-local pools LRU (the
shared pool keeps the policy). Each node's DRAM tier in front of the
pool is not modelled.

With --mounted N, the first N requests are also replayed end to end through a real kvfs mount
(root and /dev/fuse needed): every block is a small file (--block-size, default 64 KiB) in a
pool large enough for all of them, under a DRAM tier of --capacity-blocks blocks; a request
looks its blocks up in order (`user.kvfs.tier`), reads the ones that exist and writes the ones
that do not, as LMCache's fs connector does. Reported per tier (from kvfs's own statistics):
the DRAM prefix hit rate and block hit rate, for --policy and for LRU, readahead off. Then the
same requests again with the pool as the tier that evicts: a pool of --capacity-blocks blocks
with `pool.evict` = the policy (and LRU), its prefix hit rate (the leading blocks that exist
as files) beside the simulation's at the pool's capacity (`points_from_simulation`).

With --mounted-nodes N (N > 1) the pool replay is also run through N daemons sharing one pool
([cluster] mode: one namespace file, a real redis-server, grace_seconds 1), the requests
round-robin over their mounts, against the simulation of one pool of the shared pool's
capacity (`shared_pool`). It is slow: a writer that finds a full shared pool waits for the
grave (evicted space is reused only after the grace period, as other nodes may still read it),
so most stores here wait up to a second (150 requests: 15 minutes).

With --scale N (alone), the cost per access at a capacity of N blocks (a million: the issue's
bound is 10 us), where the production trace, 183k distinct blocks, would never evict: Zipf
chains over N chains of 16 blocks, 0.4 N requests, about 2.3 N distinct blocks. Keys
`us_per_access` (--policy), `pool_us_per_access` (the pool's policy, score) and
`lru_us_per_access`, with each one's hit rate.

    python bench/trace_replay.py --scale 1000000 [--policy prefix] [--json]
"""

from __future__ import annotations

import collections
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import dumps, parser  # noqa: E402
from kvfs.tiers.index import TierIndex  # noqa: E402
from kvfs.tiers.policy import POLICIES, make_policy  # noqa: E402


def load(path: str) -> list[list[int]]:
    with open(path) as f:
        return [json.loads(line)["hash_ids"] for line in f if line.strip()]


def serve(tier: TierIndex, ids: list[int]) -> int:
    """One request against a tier: returns its prefix hit (the leading blocks found), then
    reads or stores each of its blocks."""
    k = 0
    while k < len(ids) and ids[k] in tier:
        k += 1
    parent = None
    for h in ids:
        if not tier.lookup(h, parent):
            tier.make_room(1)
            if tier.fits(1):
                tier.add(h, 1, parent)
        parent = h
    if ids:
        tier.policy.end_chain(ids[-1])
    return k


def replay(requests: list[list[int]], capacity: int, policy: str) -> dict:
    tier = TierIndex(capacity, make_policy(policy, capacity, typical_size=1))
    hits = total = 0
    t = time.perf_counter()
    for ids in requests:
        hits += serve(tier, ids)
        total += len(ids)
    out = {
        "policy": policy,
        "capacity_blocks": capacity,
        "hit_rate": hits / total,
        "block_hit_rate": tier.hits / max(1, tier.hits + tier.misses),
        "requests": len(requests),
        "blocks": total,
        "seconds": time.perf_counter() - t,
    }
    mode = getattr(tier.policy, "mode_name", None)
    if mode:
        out["final_mode"] = mode
    return out


NEVER = float("inf")  # the next use of a block that is not used again


def _replay_knowing_next_uses(requests: list[list[int]], kept, use) -> dict:
    """Replay with the future known, for the offline yardsticks: the same semantics as
    `serve` (a request's hit is the leading run of its blocks in `kept`, then every block of it
    is used), each use told to `use(block, position of its next use, or NEVER)`."""
    seq = [h for ids in requests for h in ids]
    nxt: list[float] = [NEVER] * len(seq)
    last: dict[int, int] = {}
    for i in range(len(seq) - 1, -1, -1):
        nxt[i] = last.get(seq[i], NEVER)
        last[seq[i]] = i
    hits = total = pos = 0
    for ids in requests:
        k = 0
        while k < len(ids) and ids[k] in kept:
            k += 1
        hits += k
        total += len(ids)
        for h in ids:
            use(h, nxt[pos])
            pos += 1
    return {"hit_rate": hits / max(1, total)}


def replay_bound(requests: list[list[int]], capacity: int) -> dict:
    """The offline bound at `capacity` blocks: knowing the future, keep the blocks used soonest
    (Belady's rule: when room is needed, drop the resident block whose next use is furthest
    away, and do not keep a block needed later than all of them, nor one never used again).
    Same semantics as `serve`: a request's hit is the leading run of its blocks found kept,
    then every block of it is used. No online policy can beat this on block hits; on prefix
    hits it is the yardstick the policy work is measured against (`pct_of_bound`)."""
    import heapq

    kept: dict[int, float] = {}  # block -> its next use
    heap: list[tuple[float, int]] = []  # (-next use, block), stale entries skipped

    def use(h: int, n: float) -> None:
        if h in kept:
            kept[h] = n
            heapq.heappush(heap, (-n, h))
            return
        if n == NEVER:
            return
        if len(kept) >= capacity:
            while kept.get(heap[0][1]) != -heap[0][0]:
                heapq.heappop(heap)
            if -heap[0][0] <= n:
                return  # every kept block is needed before this one
            del kept[heapq.heappop(heap)[1]]
        kept[h] = n
        heapq.heappush(heap, (-n, h))

    return {"capacity_blocks": capacity, **_replay_knowing_next_uses(requests, kept, use)}


def replay_admission_oracle(requests: list[list[int]], capacity: int) -> dict:
    """What knowing *whether* a block is used again is worth, without knowing *when*: LRU
    that keeps a block only if it will be used again (an oracle no online policy has). Same
    semantics as `serve`. Between the policy and the bound: the part of the bound an online
    policy could reach by predicting reuse perfectly and keeping the rest in recency order;
    the rest of the bound is knowing when."""
    import collections

    lru: collections.OrderedDict[int, None] = collections.OrderedDict()

    def use(h: int, n: float) -> None:
        if h in lru:
            lru.move_to_end(h)
        elif n != NEVER:
            lru[h] = None
            if len(lru) > capacity:
                lru.popitem(last=False)

    return {"capacity_blocks": capacity, **_replay_knowing_next_uses(requests, lru, use)}


def _age_bucket(age: float) -> int:
    """Reuse distances and ages in log-spaced buckets, four per octave (bucket b starts at
    _EDGES[b] accesses)."""
    return 0 if age < 4 else min(_NB - 1, max(0, int(4 * math.log2(age)) - 7))


_NB = 64
_EDGES = [0.0] + [2 ** ((b + 7) / 4) for b in range(1, _NB + 1)]


def replay_timed_oracle(requests: list[list[int]], capacity: int) -> dict:
    """A stronger yardstick between the admission oracle and the bound: told by an oracle
    whether each block is used again (it keeps only those, and drops a block at its last
    use), and knowing the whole trace's reuse distances by class (how many times the block
    was used, whether it ended its request), it evicts by hit density as LHD does
    (Beckmann et al., NSDI '18): the resident block whose expected hits per unit of
    space-time from its age on, over the best horizon, is lowest, or the block just used if
    that one is worth less (exactly, not among a sample: with 64 random candidates it reached
    0.59x of this at 2,000 blocks). What knowing *whether* and a good model of *when* reach
    together. Same semantics as `serve`."""
    import bisect

    seq = [h for ids in requests for h in ids]
    last_of_request = set()
    pos = 0
    for ids in requests:
        pos += len(ids)
        last_of_request.add(pos - 1)

    def classes():
        """(position, block, its class) of every access, in order."""
        uses: dict[int, int] = {}
        for i, h in enumerate(seq):
            u = uses.get(h, 0) + 1
            uses[h] = u
            yield i, h, (min(u, 6), i in last_of_request)

    # the reuse-distance histogram of each class, over the reuses (the oracle drops the rest)
    seen: dict[int, int] = {}
    cls_at: dict[int, tuple] = {}
    hist: dict[tuple, list[float]] = {}
    for i, h, c in classes():
        if h in seen:
            hist.setdefault(cls_at[h], [0.0] * _NB)[_age_bucket(i - seen[h])] += 1
        hist.setdefault(c, [0.0] * _NB)  # a class no block of comes back: none
        seen[h], cls_at[h] = i, c
    # every (density, class, age bucket), lowest first: the victim is the first one that
    # holds a resident block
    order = []
    for c, hh in hist.items():
        for a in range(_NB):
            left = sum(hh[a:])
            best = hits = spent = 0.0
            for t in range(a, _NB):  # keep it to the end of bucket t at most
                hits += hh[t]
                spent += hh[t] * ((_EDGES[t] + _EDGES[t + 1]) / 2 - _EDGES[a])
                cost = spent + (left - hits) * (_EDGES[t + 1] - _EDGES[a])
                if cost > 0:
                    best = max(best, hits / cost)
            order.append((best, c, a))
    order.sort(key=lambda x: x[0])
    young = {c: d for d, c, a in order if a == 0}  # a block's density as it is used
    kept: dict[int, tuple[int, tuple]] = {}  # block -> (last use, class)
    times: dict[tuple, list[int]] = {}  # per class: last uses, ascending (some stale)
    blocks: dict[tuple, list[int]] = {}  # the block of each of them
    live: collections.Counter = collections.Counter()
    clock = iter(classes())

    def victim(now: int) -> tuple[float, int]:
        for d, c, a in order:
            tl = times.get(c)
            if not tl:
                continue
            lo = 0 if a == _NB - 1 else bisect.bisect_right(tl, now - _EDGES[a + 1])
            hi = bisect.bisect_right(tl, now - _EDGES[a])
            for j in range(lo, hi):
                h = blocks[c][j]
                if kept.get(h) == (tl[j], c):
                    return d, h
        raise AssertionError("no resident block")

    def drop(h: int) -> None:
        live[kept.pop(h)[1]] -= 1

    def use(h: int, n: float) -> None:
        i, _, c = next(clock)
        if h in kept:
            drop(h)
        if n == NEVER:
            return
        if len(kept) >= capacity:
            d, k = victim(i)
            if d >= young[c]:
                return  # the block itself is worth least: not kept
            drop(k)
        kept[h] = (i, c)
        live[c] += 1
        tl, bl = times.setdefault(c, []), blocks.setdefault(c, [])
        tl.append(i)
        bl.append(h)
        if len(tl) > 2 * live[c] + 64:  # drop the stale entries
            pairs = [(t, k) for t, k in zip(tl, bl) if kept.get(k) == (t, c)]
            times[c], blocks[c] = [t for t, _ in pairs], [k for _, k in pairs]

    return {"capacity_blocks": capacity, **_replay_knowing_next_uses(requests, kept, use)}


# what kvfs's pools evict by: a node's own (pool.evict = "prefix", the default) and a shared one
POOL_SIMULATION = {"prefix": "score", "lru": "lru"}
NODE_POOL = SHARED_POOL = "score"


def replay_nodes(
    requests: list[list[int]], capacity: int, policy: str, nodes: int, shared: str | None = None
) -> dict:
    """Requests spread round-robin over `nodes` inference nodes (a load balancer that does not
    route by prefix): each node with its own pool of `capacity` blocks evicting by `policy`,
    against one pool of `nodes * capacity` blocks shared by all (kvfs [cluster]) evicting by
    `shared` (default: the same). Prefix hit rates of both."""
    shared = shared or policy
    local = [
        TierIndex(capacity, make_policy(policy, capacity, typical_size=1)) for _ in range(nodes)
    ]
    pooled = TierIndex(nodes * capacity, make_policy(shared, nodes * capacity, typical_size=1))
    hl = hp = total = 0
    for i, ids in enumerate(requests):
        hl += serve(local[i % nodes], ids)
        hp += serve(pooled, ids)
        total += len(ids)
    return {
        "nodes": nodes,
        "capacity_blocks_per_node": capacity,
        "pool_eviction": policy,
        "shared_pool_eviction": shared,
        "node_local_hit_rate": hl / total,
        "pooled_hit_rate": hp / total,
        "pooled_vs_node_local": hp / hl if hl else float("inf"),
    }


def replay_mounted(requests: list[list[int]], capacity: int, policy: str, block: int) -> dict:
    """Replay requests through a real mount; returns per-tier hit rates."""
    import os
    import tempfile

    from testing.mount import MountedKvfs, write_config

    uniq = len({h for r in requests for h in r})
    with tempfile.TemporaryDirectory(prefix="kvfs-replay-") as tmp:
        tmp = Path(tmp)
        pool_bytes = (uniq * block * 2) // (1 << 20) + 64
        cfg = write_config(
            tmp / "kvfs.toml",
            tmp / "state",
            [{"path": str(tmp / "ns0.img"), "size": f"{pool_bytes}MiB"}],
            dram=str(capacity * block),
            extra="[prefetch]\nenabled = false\n",
            pool=f'stripe_unit = "{min(block, 1 << 20)}"',
        )
        cfg.write_text(cfg.read_text().replace("[dram]\n", f'[dram]\npolicy = "{policy}"\n'))
        payload = os.urandom(block)
        prefix_hits = blocks = 0
        t = time.perf_counter()
        with MountedKvfs(tmp / "mnt", cfg, tmp / "kvfs.log") as m:
            d = m.mountpoint
            for ids in requests:
                running = True
                for h in ids:
                    p = d / f"{h}.kv"
                    blocks += 1
                    try:
                        tier = os.getxattr(p, "user.kvfs.tier")
                    except FileNotFoundError:
                        tier = None
                    if tier is None:
                        running = False
                        p.write_bytes(payload)
                        continue
                    if running and tier == b"dram":
                        prefix_hits += 1
                    else:
                        running = False
                    with open(p, "rb") as f:
                        f.read()
            st = m.stats()
        dram = st["tiers"]["dram"]
        return {
            "policy": policy,
            "requests": len(requests),
            "blocks": blocks,
            "dram_prefix_hit_rate": prefix_hits / blocks,
            "dram_block_hit_rate": dram["hits"] / max(1, dram["hits"] + dram["misses"]),
            "pool_block_hits": st["tiers"]["pool"]["hits"],
            "dram_hits": dram["hits"],
            "dram_misses": dram["misses"],
            "dram_evictions": dram["evictions"],
            "policy_mode": dram["policy_mode"],
            "seconds": time.perf_counter() - t,
        }


def replay_mounted_pool(
    requests: list[list[int]], capacity: int, policy: str, block: int, nodes: int = 1
) -> dict:
    """Replay requests through a real mount whose pool is the tier that evicts: a pool of
    about `capacity` blocks (each a file of `block` bytes, one stripe unit) with `pool.evict =
    policy`, a DRAM tier of a few blocks. A request's hit is the leading run of its blocks that
    exist as files (the pool kept them); then it reads those and writes the others, as
    LMCache's fs connector does. With `nodes` > 1 the pool is shared ([cluster] mode: that many
    daemons over the same namespace file and a real redis-server, the cluster-wide order in
    Redis) and the requests go round-robin to the nodes' mounts. Returns the prefix hit rate
    and the pool's capacity in blocks (what the simulation is run at to compare)."""
    import os
    import tempfile

    from kvfs.pool.layout import DATA_START
    from testing.mount import MountedKvfs, write_config
    from testing.redis_server import RedisServer

    with tempfile.TemporaryDirectory(prefix="kvfs-replay-") as tmp:
        tmp = Path(tmp)
        ns_bytes = DATA_START + capacity * block
        redis = RedisServer(tmp / "redis").start() if nodes > 1 else None
        mounts: list[MountedKvfs] = []
        try:
            for i in range(nodes):
                extra = "[prefetch]\nenabled = false\n"
                if redis is not None:  # evicted space is reused after a second, not 30
                    extra += (
                        f'[cluster]\nredis = "{redis.url}"\nnode_id = "node{i}"\n'
                        f"grace_seconds = 1.0\nregions = 16\n"
                    )
                cfg = write_config(
                    tmp / f"kvfs{i}.toml",
                    tmp / f"state{i}",
                    [{"path": str(tmp / "ns0.img"), "size": ns_bytes}],
                    dram=str(8 * block),
                    extra=extra,
                    pool=f'stripe_unit = "{block}"\nevict = "{policy}"',
                )
                mounts.append(MountedKvfs(tmp / f"mnt{i}", cfg, tmp / f"kvfs{i}.log").start())
            payload = os.urandom(block)
            hits = blocks = 0
            t = time.perf_counter()
            pool_blocks = mounts[0].stats()["tiers"]["pool"]["capacity"] // block
            for r, ids in enumerate(requests):
                d = mounts[r % nodes].mountpoint
                k = 0
                while k < len(ids) and os.path.exists(d / f"{ids[k]}.kv"):
                    k += 1
                hits += k
                blocks += len(ids)
                for h in ids:
                    p = d / f"{h}.kv"
                    try:
                        with open(p, "rb") as f:
                            f.read()
                    except FileNotFoundError:
                        p.write_bytes(payload)
            stats = [m.stats() for m in mounts]
        finally:
            for m in mounts:
                m.stop()
            if redis is not None:
                redis.stop()
        return {
            "policy": policy,
            "nodes": nodes,
            "requests": len(requests),
            "blocks": blocks,
            "pool_capacity_blocks": pool_blocks,
            "pool_prefix_hit_rate": hits / blocks,
            "pool_evictions": sum(st["files"]["pool_evictions"] for st in stats),
            "evict_mode": stats[0]["tiers"]["pool"].get("evict_mode", policy),
            "seconds": time.perf_counter() - t,
        }


def mounted_pool_against_simulation(
    requests: list[list[int]], capacity: int, policy: str, block: int, nodes: int = 1
) -> dict:
    """`replay_mounted_pool`, with the simulation of the same requests at the pool's capacity
    in blocks beside it (`simulated_hit_rate`, `points_from_simulation`)."""
    x = replay_mounted_pool(requests, capacity, policy, block, nodes)
    x["simulated_hit_rate"] = replay(requests, x["pool_capacity_blocks"], POOL_SIMULATION[policy])[
        "hit_rate"
    ]
    x["points_from_simulation"] = 100 * (x["pool_prefix_hit_rate"] - x["simulated_hit_rate"])
    return x


def scale(capacity: int, policy: str, as_json: bool) -> int:
    """The replay's cost per access at a capacity of `capacity` blocks, where the production
    trace (183k distinct blocks) never evicts: Zipf chains (bench/synthetic_traces.py) over
    `capacity` chains of 16 blocks, 0.4 x `capacity` requests, about 2.3 x `capacity` distinct
    blocks, so the tier evicts throughout. For --policy, for the pool's policy (score) and for
    LRU."""
    from bench.synthetic_traces import zipf_chains

    requests = zipf_chains(n_requests=int(0.4 * capacity), n_chains=capacity, depth=16, s=0.7)
    out = {
        "scale_blocks": capacity,
        "requests": len(requests),
        "blocks": sum(len(r) for r in requests),
        "distinct_blocks": len({h for r in requests for h in r}),
    }
    runs: dict[str, dict] = {}  # each policy replayed once (--policy may be a baseline)
    for name, key in ((policy, ""), (POOL_SIMULATION["prefix"], "pool_"), ("lru", "lru_")):
        if name not in runs:
            runs[name] = replay(requests, capacity, name)
        r = runs[name]
        out[f"{key}policy"] = name
        out[f"{key}hit_rate"] = r["hit_rate"]
        out[f"{key}us_per_access"] = 1e6 * r["seconds"] / max(1, r["blocks"])
    if as_json:
        print(dumps(out))
        return 0
    print(
        f"zipf chains: {out['requests']} requests, {out['blocks']} block accesses, "
        f"{out['distinct_blocks']} distinct blocks, capacity {capacity} blocks"
    )
    print(f"{'policy':>10}{'hit rate':>10}{'us/access':>11}")
    for key in ("", "pool_", "lru_"):
        if not key or out[f"{key}policy"] != policy:
            print(
                f"{out[key + 'policy']:>10}{out[key + 'hit_rate']:>10.4f}"
                f"{out[key + 'us_per_access']:>11.2f}"
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--trace")
    ap.add_argument("--capacity-blocks", type=int, nargs="+")
    ap.add_argument("--policy", default="prefix", choices=POLICIES)
    ap.add_argument(
        "--mounted",
        type=int,
        metavar="N",
        help="also replay the first N requests through a real mount",
    )
    ap.add_argument(
        "--mounted-nodes",
        type=int,
        default=1,
        metavar="N",
        help="with --mounted, also replay through N nodes sharing one pool "
        "([cluster] mode, a real redis-server): slow, see above",
    )
    ap.add_argument("--block-size", type=int, default=64 * 1024)
    ap.add_argument(
        "--nodes",
        type=int,
        metavar="N",
        help="also compare N node-local caches with one pool shared by N nodes",
    )
    ap.add_argument(
        "--nodes-policy",
        default=NODE_POOL,
        choices=POLICIES,
        help=f"what the node-local pools evict by with --nodes (default "
        f"{NODE_POOL}, as kvfs's; the shared pool: {SHARED_POOL})",
    )
    ap.add_argument(
        "--scale",
        type=int,
        metavar="N",
        help="instead: the cost per access at a capacity of N blocks, on a "
        "synthetic trace that evicts (see below)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.scale:
        return scale(args.scale, args.policy, args.json)
    if not args.trace or not args.capacity_blocks:
        ap.error("--trace and --capacity-blocks are needed (or --scale N)")
    requests = load(args.trace)
    rows = []
    for cap in args.capacity_blocks:
        r = replay(requests, cap, args.policy)
        base = replay(requests, cap, "lru")
        r["lru_hit_rate"] = base["hit_rate"]
        r["vs_lru"] = r["hit_rate"] / base["hit_rate"] if base["hit_rate"] else float("inf")
        bound = replay_bound(requests, cap)["hit_rate"]
        r["bound_hit_rate"] = bound
        r["pct_of_bound"] = 100 * r["hit_rate"] / bound if bound else float("nan")
        r["lru_pct_of_bound"] = 100 * base["hit_rate"] / bound if bound else float("nan")
        oracle = replay_admission_oracle(requests, cap)["hit_rate"]
        r["admission_oracle_hit_rate"] = oracle
        r["admission_oracle_pct_of_bound"] = 100 * oracle / bound if bound else float("nan")
        timed = replay_timed_oracle(requests, cap)["hit_rate"]
        r["timed_oracle_hit_rate"] = timed
        r["timed_oracle_pct_of_bound"] = 100 * timed / bound if bound else float("nan")
        r["us_per_access"] = 1e6 * r["seconds"] / max(1, r["blocks"])
        rows.append(r)
    mounted = None
    if args.mounted:
        cap = args.capacity_blocks[0]
        sub = requests[: args.mounted]
        ours = replay_mounted(sub, cap, args.policy, args.block_size)
        base = replay_mounted(sub, cap, "lru", args.block_size)
        mounted = {
            "capacity_blocks": cap,
            args.policy: ours,
            "lru": base,
            "dram_prefix_vs_lru": ours["dram_prefix_hit_rate"]
            / max(base["dram_prefix_hit_rate"], 1e-9),
        }
        # the pool as the tier that evicts (pool.evict = the policy), against the simulation
        # of the same requests at the pool's capacity in blocks (a pool's "prefix" is the
        # score policy, kvfs.tiers.scoring.PrefixScore, kept in the catalog)
        pool = {
            name: mounted_pool_against_simulation(sub, cap, name, args.block_size)
            for name in ("prefix", "lru")
        }
        pool["pool_vs_lru"] = pool["prefix"]["pool_prefix_hit_rate"] / max(
            pool["lru"]["pool_prefix_hit_rate"], 1e-9
        )
        mounted["pool"] = pool
        if args.mounted_nodes > 1:
            # one pool shared by that many nodes ([cluster], Redis), the requests round-robin:
            # the cluster-wide order against the simulation of one pool of its capacity
            mounted["shared_pool"] = mounted_pool_against_simulation(
                sub, cap, "prefix", args.block_size, args.mounted_nodes
            )
        for r in rows:
            r["mounted"] = mounted
    if args.nodes:
        for r in rows:
            r["pooling"] = replay_nodes(
                requests, r["capacity_blocks"], args.nodes_policy, args.nodes, SHARED_POOL
            )
    if args.json:
        print(dumps(rows[0] if len(rows) == 1 else {"rows": rows}))
        return 0
    print(f"{args.trace}: {rows[0]['requests']} requests, {rows[0]['blocks']} block reads")
    print(
        f"{'capacity':>9}{'policy':>10}{'hit rate':>10}{'LRU':>9}{'bound':>9}{'vs LRU':>8}"
        f"{'% bound':>9}{'LRU %':>7}{'oracle %':>9}{'timed %':>8}{'us/access':>11}  mode"
    )
    for r in rows:
        print(
            f"{r['capacity_blocks']:>9}{r['policy']:>10}{r['hit_rate']:>10.4f}{r['lru_hit_rate']:>9.4f}"
            f"{r['bound_hit_rate']:>9.4f}{r['vs_lru']:>8.3f}{r['pct_of_bound']:>9.1f}"
            f"{r['lru_pct_of_bound']:>7.1f}{r['admission_oracle_pct_of_bound']:>9.1f}"
            f"{r['timed_oracle_pct_of_bound']:>8.1f}"
            f"{r['us_per_access']:>11.2f}  {r.get('final_mode', '')}"
        )
    if args.nodes:
        print(
            f"\n{args.nodes} nodes, requests round-robin; node-local pools evict by "
            f"{args.nodes_policy}, the shared pool by {SHARED_POOL} (cluster-wide)"
        )
        print(f"{'per node':>9}{'node-local':>12}{'pooled':>9}{'pooled/local':>14}")
        for r in rows:
            x = r["pooling"]
            print(
                f"{r['capacity_blocks']:>9}{x['node_local_hit_rate']:>12.4f}"
                f"{x['pooled_hit_rate']:>9.4f}{x['pooled_vs_node_local']:>14.3f}"
            )
    if mounted:
        print(
            f"\nmounted replay of {args.mounted} requests, {args.block_size // 1024} KiB blocks, "
            f"DRAM tier of {mounted['capacity_blocks']} blocks over the pool:"
        )
        print(
            f"{'policy':>10}{'DRAM prefix':>13}{'DRAM block':>12}{'DRAM hits':>11}"
            f"{'pool hits':>11}{'evictions':>11}"
        )
        for name in (args.policy, "lru"):
            x = mounted[name]
            print(
                f"{name:>10}{x['dram_prefix_hit_rate']:>13.4f}{x['dram_block_hit_rate']:>12.4f}"
                f"{x['dram_hits']:>11}{x['pool_block_hits']:>11}{x['dram_evictions']:>11}"
            )
        print(f"dram prefix hit rate vs LRU: {mounted['dram_prefix_vs_lru']:.3f}")
        pool = mounted["pool"]
        print(
            f"\nmounted replay, the pool as the tier that evicts (pool.evict = policy), "
            f"{pool['lru']['pool_capacity_blocks']} blocks:"
        )
        print(
            f"{'policy':>10}{'pool prefix':>13}{'simulated':>11}{'points off':>12}{'evictions':>11}"
        )
        for name in ("prefix", "lru"):
            x = pool[name]
            print(
                f"{name:>10}{x['pool_prefix_hit_rate']:>13.4f}{x['simulated_hit_rate']:>11.4f}"
                f"{x['points_from_simulation']:>12.2f}{x['pool_evictions']:>11}"
            )
        print(f"pool prefix hit rate vs LRU: {pool['pool_vs_lru']:.3f}")
        x = mounted.get("shared_pool")
        if x:
            print(
                f"\none pool of {x['pool_capacity_blocks']} blocks shared by {x['nodes']} "
                f"nodes (cluster), requests round-robin: prefix hit rate "
                f"{x['pool_prefix_hit_rate']:.4f}, simulated {x['simulated_hit_rate']:.4f} "
                f"({x['points_from_simulation']:+.2f} points), {x['pool_evictions']} "
                f"evictions, {x['seconds']:.0f} s"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
