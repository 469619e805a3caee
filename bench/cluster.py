#!/usr/bin/env python3
"""Cluster catalog: what Redis costs next to SQLite, and what a cross-node read costs.

In one run, with a real redis-server (AOF, fsync always) on 127.0.0.1:

  catalog ops   one kvfs mount with the SQLite catalog, then one with the Redis catalog, each
                over 4 unthrottled namespace files, state and Redis data on the same disk:
                  publish       create a 4 KiB file, write, close (durable and visible: both
                                nodes commit at close, durability "close"), N times,
                                from 1 thread and from 4 threads
                  lookup hit    stat N existing names after the kernel dropped its dentries
                                (every stat is a FUSE lookup answered by the catalog)
                  lookup miss   stat N names that do not exist (LMCache's fs connector does this
                                for every chunk it has not stored; the Redis catalog asks Redis)
                                (lookups: the best of 5 rounds)
  cross-node    two kvfs nodes sharing 4 loop-device namespaces throttled (cgroup blkio or
                io.max) to --bps each, both daemons in the one cgroup that throttles them;
                node A writes 32 MiB blocks; then the blocks are read cold (DRAM and page cache
                dropped, prefetch off) by node A (same-node) and by node B (cross-node), in both
                orders

    python bench/cluster.py [--ops 400] [--blocks 6] [--bps 100e6] [--json]

Everything (Redis, tmpfs, loop devices, cgroups, mounts) is set up and torn down here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import dumps, parse, parser  # noqa: E402
from bench.stripe import BLOCK, drop_page_cache, read_cold, write_blocks  # noqa: E402
from testing.emulate import Emulation  # noqa: E402
from testing.mount import MountedKvfs, wait_until, write_config  # noqa: E402
from testing.redis_server import RedisServer  # noqa: E402

MiB = 1 << 20
ROUNDS = 5


def cluster_table(redis: RedisServer, node: str, name: str) -> str:
    lines = ["[cluster]", f'redis = "{redis.url}"', f'node_id = "{node}"', f'name = "{name}"']
    return "\n".join(lines) + "\n"


def drop_dentries() -> None:
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2")


def publish(paths: list[Path], threads: int) -> float:
    data = os.urandom(4096)

    def work(part: list[Path]) -> None:
        for p in part:
            fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)

    parts = [paths[i::threads] for i in range(threads)]
    ts = [threading.Thread(target=work, args=(part,)) for part in parts]
    t = time.perf_counter()
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    return len(paths) / (time.perf_counter() - t)


def stat_all(paths: list[Path], expect: bool) -> float:
    t = time.perf_counter()
    for p in paths:
        if p.exists() != expect:
            raise RuntimeError(f"{p}: expected {'present' if expect else 'absent'}")
    return len(paths) / (time.perf_counter() - t)


def redis_memory(redis: RedisServer) -> int:
    out = subprocess.run(
        ["redis-cli", "-p", str(redis.port), "INFO", "memory"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return int(next(ln for ln in out.splitlines() if ln.startswith("used_memory:")).split(":")[1])


def run_ops(tmp: Path, kind: str, redis: RedisServer, n: int) -> dict:
    shared = tmp / f"{kind}-ns"
    shared.mkdir()
    nss = [{"path": str(shared / f"ns{i}.img"), "size": "256MiB"} for i in range(4)]
    extra = cluster_table(redis, "ops", "ops") if kind == "redis" else ""
    # like with like: both commit at close (durability "close"; the default, "fsync", leaves
    # the commit to the write-back, which bench/cluster_visibility.py and redis_scale.py
    # measure for a shared pool)
    cfg = write_config(
        tmp / f"{kind}.toml",
        tmp / f"{kind}-state",
        nss,
        dram="256MiB",
        extra=extra,
        mount='durability = "close"',
    )
    with MountedKvfs(tmp / f"{kind}-mnt", cfg, tmp / f"{kind}.log") as m:
        d = m.mountpoint / "d"
        d.mkdir()
        mem = redis_memory(redis)
        one = publish([d / f"a{i}" for i in range(n)], 1)
        per_file = (redis_memory(redis) - mem) / n
        four = publish([d / f"b{i}" for i in range(n)], 4)
        hit = miss = 0.0
        for r in range(ROUNDS):  # the best of a few rounds: lookups are quick
            drop_dentries()
            hit = max(hit, stat_all([d / f"a{i}" for i in range(n)], True))
            miss = max(miss, stat_all([d / f"missing{r}-{i}" for i in range(n)], False))
        st = m.stats()
    return {
        "publish_per_s": one,
        "publish_4threads_per_s": four,
        "lookup_hit_per_s": hit,
        "lookup_miss_per_s": miss,
        "catalog_kind": st["catalog"].get("kind"),
        **({"redis_bytes_per_file": round(per_file)} if kind == "redis" else {}),
    }


def run_cross(emu: Emulation, tmp: Path, redis: RedisServer, bps: float, nblocks: int) -> dict:
    per_ns = (2 * nblocks * BLOCK) // 4 + 256 * MiB
    devs = [emu.loop(f"x-ns{i}", per_ns) for i in range(4)]
    nss = [{"path": d.path} for d in devs]
    group = emu.cgroup("kvfs-cluster")
    for d in devs:
        group.limit(d, read_bps=bps, write_bps=bps)
    nodes = []
    try:
        for i in range(2):
            cfg = write_config(
                tmp / f"x{i}.toml",
                tmp / f"x{i}-state",
                nss,
                dram="512MiB",
                extra=cluster_table(redis, f"x{i}", "cross") + "[prefetch]\nenabled = false\n",
            )
            if i == 0:  # block devices are formatted explicitly, once, for the whole cluster
                r = subprocess.run(
                    [sys.executable, "-m", "kvfs", "format", "--config", str(cfg)],
                    capture_output=True,
                    text=True,
                )
                if r.returncode != 0:
                    raise RuntimeError(f"kvfs format failed: {r.stderr.strip()}")
            m = MountedKvfs(tmp / f"x{i}-mnt", cfg, tmp / f"x{i}.log").start()
            nodes.append(m)
            group.add(m.pid)
        a, b = nodes
        blocks = [os.urandom(BLOCK) for _ in range(nblocks)]
        times = {"same": 0.0, "cross": 0.0}
        # two sets of blocks, read in opposite orders, so neither side is always first
        for rnd, order in enumerate((("same", "cross"), ("cross", "same"))):
            paths = [f"r{rnd}-block{i}.pt" for i in range(nblocks)]
            write_blocks([a.mountpoint / p for p in paths], blocks)
            # (fsync'd, so published: B has them once its follower applied the change log)
            wait_until(lambda: all((b.mountpoint / p).exists() for p in paths), 20, "B to see them")
            for side in order:
                for m in nodes:
                    m.control("drop_dram")
                drop_page_cache()
                m = a if side == "same" else b
                times[side] += read_cold([m.mountpoint / p for p in paths])
            got = (b.mountpoint / paths[0]).read_bytes()
            if got != blocks[0]:
                raise RuntimeError("cross-node read differs from what node A wrote")
        st_b = b.stats()
    finally:
        for m in nodes:
            m.stop()
        group.remove()
    total = 2 * nblocks * BLOCK
    return {
        "same_node_read_gbps": total / times["same"] / 1e9,
        "cross_node_read_gbps": total / times["cross"] / 1e9,
        "node_b_pool_bytes_in": st_b["tiers"]["pool"]["bytes_in"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--ops", type=int, default=400, help="files published / names looked up")
    ap.add_argument("--blocks", type=int, default=6, help="32 MiB blocks per cross-node round")
    ap.add_argument("--bps", type=float, default=100e6, help="bytes/s per namespace")
    args = parse(ap, argv)
    with tempfile.TemporaryDirectory(prefix="kvfs-cluster-", dir="/var/tmp") as tmp:
        tmp = Path(tmp)
        redis = RedisServer(tmp / "redis").start()
        try:
            ops = {kind: run_ops(tmp, kind, redis, args.ops) for kind in ("sqlite", "redis")}
            size = f"{(2 * args.blocks * BLOCK) // MiB + 1536}m"
            with Emulation(size) as emu:
                cross = run_cross(emu, tmp, redis, args.bps, args.blocks)
        finally:
            redis.stop()
    r = lambda x: round(x, 3)  # noqa: E731
    out = {
        "ops": args.ops,
        "blocks": args.blocks,
        "block_bytes": BLOCK,
        "bps_per_namespace": args.bps,
        "catalog": {
            k: {kk: (r(vv) if isinstance(vv, float) else vv) for kk, vv in v.items()}
            for k, v in ops.items()
        },
        "cross_node": {k: (r(v) if isinstance(v, float) else v) for k, v in cross.items()},
    }
    for key in ("publish_per_s", "publish_4threads_per_s", "lookup_hit_per_s", "lookup_miss_per_s"):
        out[f"redis_vs_sqlite_{key[: -len('_per_s')]}"] = r(ops["redis"][key] / ops["sqlite"][key])
    out["cross_vs_same_node_read"] = r(cross["cross_node_read_gbps"] / cross["same_node_read_gbps"])
    if args.json:
        print(dumps(out))
        return 0
    print(f"catalog operations through one mount ({args.ops} each; 4 KiB files)")
    print(
        f"{'catalog':<10}{'publish/s':>11}{'publish/s x4':>14}{'lookup hit/s':>14}"
        f"{'lookup miss/s':>15}"
    )
    for k, v in ops.items():
        print(
            f"{k:<10}{v['publish_per_s']:>11.0f}{v['publish_4threads_per_s']:>14.0f}"
            f"{v['lookup_hit_per_s']:>14.0f}{v['lookup_miss_per_s']:>15.0f}"
        )
    print(
        f"Redis memory per published file (4 KiB, one stripe unit): "
        f"{ops['redis']['redis_bytes_per_file']} bytes"
    )
    print(
        f"\ncold reads of {2 * args.blocks} x 32 MiB blocks written by node A; 4 namespaces "
        f"throttled to {args.bps / 1e6:.0f} MB/s each"
    )
    print(f"same-node  {cross['same_node_read_gbps']:.3f} GB/s")
    print(f"cross-node {cross['cross_node_read_gbps']:.3f} GB/s")
    for k, v in out.items():
        if k.startswith("redis_vs_") or k.startswith("cross_vs_"):
            print(f"{k} = {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
