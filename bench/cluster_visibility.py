#!/usr/bin/env python3
"""How long a file closed on one node of a shared pool takes to be visible on another: the
close-to-visible bound of docs/cluster.md, for each `[mount] durability`.

Method, in one run (set up here, torn down at the end, also on error): a redis-server (AOF,
appendfsync always, as docs/cluster.md recommends) and two real kvfs daemons mounting one
pool of 3 namespace files, once per mode (--modes, default "fsync,close"). A writer thread on
node A stores --files new files of --file-size, one every --interval ms (a steady store rate,
as an engine offloading KV chunks), each timed from the return of its close(); a reader
thread on node B stats every name not yet seen, round after round (each stat goes through
B's mount: the kernel never caches a miss in a shared pool), and records when the file
first shows with its full size. Reported per mode: the close-to-visible latency p50, p99 and
max (ms), the close() latency p50 and p99 (what the writer waited), and the files never
seen within --timeout seconds (0 expected).

With "close", close() returns once the file is published: B sees it as soon as its
follower applied the change-log entry, or at once (a miss is asked of Redis). With
"fsync" close() returns at once and the write-back publishes the file within
`[mount] writeback_ms` (100 ms by default; a batch starts early when 64 files or 64 MiB
wait); B then sees it once its follower applied the entry (a miss is answered by B's mirror).

    python bench/cluster_visibility.py [--files 300] [--interval 5] [--modes fsync,close] [--json]

Needs root, /dev/fuse and redis-server; about 30 s.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import dumps, parser  # noqa: E402
from kvfs.units import parse_size  # noqa: E402
from testing.mount import MountedKvfs, wait_until, write_config  # noqa: E402
from testing.redis_server import RedisServer  # noqa: E402

MiB = 1 << 20


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 2)


def run_mode(tmp: Path, redis: RedisServer, mode: str, args) -> dict:
    shared = tmp / mode
    shared.mkdir()
    nss = [{"path": str(shared / f"ns{i}.img"), "size": args.ns_size} for i in range(3)]
    mounts = []
    try:
        for i in range(2):
            cfg = write_config(
                shared / f"node{i}.toml",
                shared / f"state{i}",
                nss,
                dram="64MiB",
                extra=(
                    f'[cluster]\nredis = "{redis.url}"\nnode_id = "{mode}{i}"\n'
                    f'name = "vis-{mode}"\n'
                ),
                mount=f'durability = "{mode}"',
            )
            m = MountedKvfs(shared / f"mnt{i}", cfg, shared / f"node{i}.log")
            m.start(timeout=120)
            mounts.append(m)
        a, b = mounts
        (a.mountpoint / "d").mkdir()
        wait_until(lambda: (b.mountpoint / "d").is_dir(), 20, "the directory on B")
        data = os.urandom(args.file_size)
        names = [f"f{k}" for k in range(args.files)]
        closed: dict[str, float] = {}
        seen: dict[str, float] = {}
        close_ms: list[float] = []
        lock = threading.Lock()
        done = threading.Event()

        def writer() -> None:
            step = args.interval / 1000
            t_next = time.monotonic()
            for name in names:
                time.sleep(max(0.0, t_next - time.monotonic()))
                t_next += step
                with open(a.mountpoint / "d" / name, "wb") as f:
                    f.write(data)
                    t0 = time.monotonic()
                t = time.monotonic()
                close_ms.append((t - t0) * 1000)
                with lock:
                    closed[name] = t
            done.set()

        def reader() -> None:
            deadline = None
            while True:
                with lock:
                    todo = [n for n in closed if n not in seen]
                if not todo:
                    if done.is_set():
                        return
                    time.sleep(0.0005)
                    continue
                if done.is_set() and deadline is None:
                    deadline = time.monotonic() + args.timeout
                for name in todo:
                    try:
                        if os.stat(b.mountpoint / "d" / name).st_size == len(data):
                            seen[name] = time.monotonic()
                    except FileNotFoundError:
                        pass
                if deadline is not None and time.monotonic() > deadline:
                    return

        threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        lat = [(seen[n] - closed[n]) * 1000 for n in names if n in seen]
        return {
            "files": len(names),
            "never_seen": len(names) - len(lat),
            "close_to_visible_ms": {
                "p50": pct(lat, 0.5),
                "p99": pct(lat, 0.99),
                "max": round(max(lat), 2) if lat else None,
            },
            "close_ms": {"p50": pct(close_ms, 0.5), "p99": pct(close_ms, 0.99)},
            "writer": {"writeback": a.stats().get("writeback", {}).get("close_to_durable_ms")},
        }
    finally:
        for m in mounts:
            m.stop()


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--files", type=int, default=300)
    ap.add_argument("--file-size", type=parse_size, default="256KiB")
    ap.add_argument("--interval", type=float, default=5.0, help="ms between two stores")
    ap.add_argument("--modes", default="fsync,close")
    ap.add_argument("--ns-size", default="256MiB")
    ap.add_argument("--timeout", type=float, default=10.0, help="s a file may take to show")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if shutil.which("redis-server") is None:
        print("bench/cluster_visibility.py: needs redis-server", file=sys.stderr)
        return 2
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        print("bench/cluster_visibility.py: needs root and /dev/fuse", file=sys.stderr)
        return 2
    out: dict = {"files": args.files, "file_size": args.file_size, "interval_ms": args.interval}
    with tempfile.TemporaryDirectory(prefix="kvfs-visibility-", dir="/var/tmp") as tmp:
        tmp = Path(tmp)
        redis = RedisServer(tmp / "redis").start()
        try:
            out["modes"] = {m: run_mode(tmp, redis, m, args) for m in args.modes.split(",")}
        finally:
            redis.stop()
    if args.json:
        print(dumps(out))
    else:
        print(f"{'mode':<8} {'visible p50':>12} {'p99':>8} {'max':>8} {'close p50':>10} never")
        for m, r in out["modes"].items():
            v, c = r["close_to_visible_ms"], r["close_ms"]
            print(
                f"{m:<8} {v['p50']!s:>12} {v['p99']!s:>8} {v['max']!s:>8} "
                f"{c['p50']!s:>10} {r['never_seen']}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
