#!/usr/bin/env python3
"""Catalog scale: millions of small blocks through one mount, as a new user would use it.

In one run, with the pool (file namespaces) and the catalog on the local disk:

  create        N files of 4 KiB, 64 per directory, LMCache-style names, created, written and
                closed (durable when close returns) by --writers threads (`create_per_s`), the
                last tenth (at most 20,000) by one writer (`create_per_s_1writer`)
  memory        the daemon's resident memory empty, full, after a remount, and after a remount
                and a stat of every file (`rss_bytes_per_file`: that minus empty, per file)
  remount       unmount (`unmount_s`) and mount again (`warm_mount_s`: until the mount answers)
  stat          every file stat'ed after the kernel dropped its dentries (`stat_per_s`; each
                stat is a FUSE lookup answered by the catalog)
  verify        every file read back and compared (`bit_exact`, `read_per_s`)
  flat          a flat directory of --flat entries (default N; empty files, --writers
                threads), read whole with readdir (`flat_readdir_s`) and 10,000 random
                names looked up in it with a cold dentry cache (`flat_lookup_per_s`)
  --cluster     the same catalog in Redis (a real redis-server, AOF fsync always): Redis memory
                per block, a second node's start-up at N blocks (`cluster_new_node_ready_s`),
                and its catch-up after it was stopped (SIGSTOP) while the first node wrote
                `--outage` more files (`cluster_catchup_s`)
  --floor       the creates and the cold stats again on bench/floorfs.py (pyfuse3 with
                passthrough and nothing else; at most 15,000 files, a memfd each:
                `floor_create_per_s`, `floor_stat_per_s`, and kvfs over it:
                `create_vs_floor`, `stat_vs_floor`): the stack's share

    python bench/catalog_scale.py --files N [--writers 8] [--flat F] [--cluster] [--floor] [--json]

Everything (namespace files, state, mounts, Redis) is set up and torn down here.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import dumps, parse, parser  # noqa: E402
from testing.mount import MountedKvfs, process_memory, wait_until, write_config  # noqa: E402

PER_DIR = 64
FILE = 4096
GiB = 1 << 30


def name_of(i: int) -> tuple[str, str]:
    """(directory, file name) of file i: 64 files per directory, LMCache-style names."""
    h = (i * 0x9E3779B97F4A7C15) & ((1 << 64) - 1)
    return f"d{i // PER_DIR:06d}", f"meta-llama-Llama-3.1-8B@1@0@{h:016x}@bfloat16.pt"


def content(i: int) -> bytes:
    return i.to_bytes(8, "little") * (FILE // 8)


def drop_dentries() -> None:
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2")


def parallel(n: int, threads: int, fn) -> float:
    """Run fn(i) for i in range(n) on `threads` threads; return items per second."""
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for i in range(k, n, threads):
                fn(i)
        except BaseException as e:  # noqa: BLE001 - reported after the join
            errors.append(e)

    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    t = time.perf_counter()
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    dt = time.perf_counter() - t
    if errors:
        raise errors[0]
    return n / dt if dt > 0 else float("inf")


def create(root: Path, first: int, n: int, writers: int) -> float:
    def one(k: int) -> None:
        i = first + k
        d, name = name_of(i)
        fd = os.open(root / d / name, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        try:
            os.write(fd, content(i))
        finally:
            os.close(fd)  # durable when close returns

    return parallel(n, writers, one)


def make_dirs(root: Path, n: int) -> None:
    for d in range((n + PER_DIR - 1) // PER_DIR):
        os.mkdir(root / f"d{d:06d}")


def stat_all(root: Path, n: int) -> float:
    t = time.perf_counter()
    for i in range(n):
        d, name = name_of(i)
        st = os.stat(root / d / name)
        if st.st_size != FILE:
            raise RuntimeError(f"{d}/{name}: size {st.st_size}")
    return n / (time.perf_counter() - t)


def verify(root: Path, n: int, threads: int) -> tuple[bool, float, list[int]]:
    bad: list[int] = []

    def one(i: int) -> None:
        d, name = name_of(i)
        try:
            with open(root / d / name, "rb") as f:
                data = f.read()
        except OSError:
            data = b""
        if data != content(i):
            bad.append(i)

    rate = parallel(n, threads, one)
    return not bad, rate, bad[:10]


def flat_dir(root: Path, n: int, writers: int, lookups: int) -> dict:
    d = root / "flat"
    d.mkdir()

    def one(i: int) -> None:
        os.close(os.open(d / f"k{i:09d}.bin", os.O_CREAT | os.O_WRONLY, 0o644))

    create_rate = parallel(n, writers, one)
    drop_dentries()
    t = time.perf_counter()
    count = 0
    with os.scandir(d) as it:
        for _ in it:
            count += 1
    readdir_s = time.perf_counter() - t
    if count != n:
        raise RuntimeError(f"readdir of the flat directory listed {count} of {n} entries")
    drop_dentries()
    rng = random.Random(1)
    picks = [rng.randrange(n) for _ in range(lookups)]
    t = time.perf_counter()
    for i in picks:
        os.stat(d / f"k{i:09d}.bin")
    lookup_rate = lookups / (time.perf_counter() - t)
    misses = [f"missing{i}" for i in range(min(lookups, 2000))]
    t = time.perf_counter()
    for name in misses:
        if os.path.exists(d / name):
            raise RuntimeError("a missing name exists")
    miss_rate = len(misses) / (time.perf_counter() - t)
    return {
        "flat_entries": n,
        "flat_create_per_s": create_rate,
        "flat_readdir_s": readdir_s,
        "flat_readdir_entries_per_s": n / readdir_s,
        "flat_lookup_per_s": lookup_rate,
        "flat_miss_per_s": miss_rate,
    }


def config(
    tmp: Path, name: str, n: int, flat: int, extra: str = "", namespaces: list[dict] | None = None
) -> Path:
    # 2 namespace files: room for every block (4 KiB each) and a margin, nothing evicted
    size = max(GiB, ((n + 1000) * FILE * 13 // 10 // 2 + GiB - 1) // GiB * GiB)
    nss = namespaces or [
        {"path": str(tmp / f"{name}-ns{i}.img"), "size": f"{size // GiB}GiB"} for i in range(2)
    ]
    return write_config(tmp / f"{name}.toml", tmp / f"{name}-state", nss, dram="32MiB", extra=extra)


def single(tmp: Path, args) -> dict:
    n = args.files
    cfg = config(tmp, "single", n, args.flat)
    m = MountedKvfs(tmp / "mnt", cfg, tmp / "single.log")
    t = time.perf_counter()
    m.start(timeout=600)
    out: dict = {"cold_mount_s": time.perf_counter() - t}
    try:
        root = m.mountpoint
        time.sleep(1.0)
        out["rss_empty"] = process_memory(m.pid)
        t = time.perf_counter()
        make_dirs(root, n)
        out["mkdir_per_s"] = ((n + PER_DIR - 1) // PER_DIR) / (time.perf_counter() - t)
        n1 = min(max(n // 10, 1), 20_000)
        log(f"creating {n - n1} files with {args.writers} writers")
        out["create_per_s"] = create(root, 0, n - n1, args.writers)
        log(f"  {out['create_per_s']:.0f}/s; {n1} more with 1 writer")
        out["create_per_s_1writer"] = create(root, n - n1, n1, 1)
        log(f"  {out['create_per_s_1writer']:.0f}/s")
        out["rss_full"] = process_memory(m.pid)
        st = m.stats()
        out["catalog_full"] = st["catalog"]
        t = time.perf_counter()
        m.stop(timeout=600)
        out["unmount_s"] = time.perf_counter() - t
        t = time.perf_counter()
        m.start(timeout=600)
        out["warm_mount_s"] = time.perf_counter() - t
        os.stat(root)
        out["warm_mount_answer_s"] = time.perf_counter() - t
        log(f"remounted in {out['warm_mount_s']:.2f} s (unmount {out['unmount_s']:.2f} s)")
        time.sleep(1.0)
        out["rss_after_remount"] = process_memory(m.pid)
        drop_dentries()
        out["stat_per_s"] = stat_all(root, n)
        log(f"stat {out['stat_per_s']:.0f}/s")
        out["rss_after_stat"] = process_memory(m.pid)
        drop_dentries()
        out["stat_per_s_2nd"] = stat_all(root, n)
        ok, rate, bad = verify(root, n, args.writers)
        out.update(bit_exact=ok, read_per_s=rate, bad_examples=bad)
        log(f"verified: bit_exact={ok} ({rate:.0f} files/s)")
        out["rss_after_read"] = process_memory(m.pid)
        if args.flat:
            log(f"flat directory of {args.flat} entries")
            out.update(flat_dir(root, args.flat, args.writers, args.lookups))
            out["rss_after_flat"] = process_memory(m.pid)
        end = m.stats()
        out["stats_end"] = {k: end[k] for k in ("catalog", "files", "latency", "tiers")}
    finally:
        m.stop(timeout=600)
    empty = out["rss_empty"]["VmRSS"]
    out["rss_bytes_per_file"] = (out["rss_after_stat"]["VmRSS"] - empty) / n
    out["rss_bytes_per_file_remount_idle"] = (out["rss_after_remount"]["VmRSS"] - empty) / n
    out["rss_bytes_per_file_before_remount"] = (out["rss_full"]["VmRSS"] - empty) / n
    out["rss_bytes_per_file_after_read"] = (out["rss_after_read"]["VmRSS"] - empty) / n
    return out


def redis_memory(port: int) -> int:
    out = subprocess.run(
        ["redis-cli", "-p", str(port), "INFO", "memory"], check=True, capture_output=True, text=True
    ).stdout
    return int(next(ln for ln in out.splitlines() if ln.startswith("used_memory:")).split(":")[1])


def cluster(tmp: Path, args) -> dict:
    from testing.redis_server import RedisServer

    n = args.cluster_files or args.files
    redis = RedisServer(tmp / "redis").start()
    shared = tmp / "cluster-ns"
    shared.mkdir()
    size = max(GiB, ((n + args.outage + 1000) * FILE * 13 // 10 // 2 + GiB - 1) // GiB * GiB)
    nss = [{"path": str(shared / f"ns{i}.img"), "size": f"{size // GiB}GiB"} for i in range(2)]

    def node_cfg(k: int) -> Path:
        extra = f'[cluster]\nredis = "{redis.url}"\nnode_id = "node{k}"\n'
        return config(tmp, f"node{k}", n, 0, extra=extra, namespaces=nss)

    out: dict = {"cluster_files": n}
    a = MountedKvfs(tmp / "mnt-a", node_cfg(0), tmp / "node0.log")
    b = MountedKvfs(tmp / "mnt-b", node_cfg(1), tmp / "node1.log")
    try:
        a.start(timeout=600)
        time.sleep(1.0)
        mem0 = redis_memory(redis.port)
        rss_a0 = process_memory(a.pid)["VmRSS"]
        make_dirs(a.mountpoint, n + args.outage)
        log(f"cluster: creating {n} files with {args.writers} writers")
        out["cluster_create_per_s"] = create(a.mountpoint, 0, n, args.writers)
        log(f"  {out['cluster_create_per_s']:.0f}/s")
        out["redis_bytes_per_block"] = (redis_memory(redis.port) - mem0) / n
        out["cluster_node_rss_bytes_per_file"] = (process_memory(a.pid)["VmRSS"] - rss_a0) / n
        t = time.perf_counter()
        b.start(timeout=600)
        out["cluster_new_node_ready_s"] = time.perf_counter() - t
        log(f"  second node ready in {out['cluster_new_node_ready_s']:.2f} s")
        time.sleep(1.0)
        out["cluster_new_node_rss_bytes_per_file"] = process_memory(b.pid)["VmRSS"] / n
        # an outage: node B stopped while node A writes, then its mirror catches up
        os.kill(b.pid, signal.SIGSTOP)
        try:
            create(a.mountpoint, n, args.outage, args.writers)
        finally:
            os.kill(b.pid, signal.SIGCONT)
        want = a.stats()["files"]["nodes"]
        t = time.perf_counter()
        wait_until(
            lambda: b.stats()["files"]["nodes"] >= want, 600, "node B's catch-up", interval=0.05
        )
        out["cluster_catchup_s"] = time.perf_counter() - t
        out["cluster_outage_files"] = args.outage
        sample = random.Random(2).sample(range(n + args.outage), min(2000, n))
        bad = 0
        for i in sample:
            d, name = name_of(i)
            if (b.mountpoint / d / name).read_bytes() != content(i):
                bad += 1
        out["cluster_bit_exact_sample"] = bad == 0
    finally:
        b.stop(timeout=600)
        a.stop(timeout=600)
        redis.stop()
    return out


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


FLOOR_FILES = 15_000  # the floor keeps a memfd per file: below the descriptor limit (20,000 here)


def floor(tmp: Path, args) -> dict:
    """The same creates (--writers threads) and cold stats (one thread) on bench/floorfs.py,
    pyfuse3 with passthrough doing nothing else: what any file system on this stack reaches.
    At most FLOOR_FILES files (its names and attributes are dicts: their number hardly
    matters to it)."""
    from bench.floorfs import floor_mounted

    n = min(args.files, FLOOR_FILES)
    with floor_mounted(tmp, "floor") as fl:
        root = fl.root / "scale"
        root.mkdir()
        make_dirs(root, n)
        log(f"floor: creating {n} files with {args.writers} writers")
        out = {"floor_files": n, "floor_create_per_s": create(root, 0, n, args.writers)}
        drop_dentries()
        out["floor_stat_per_s"] = stat_all(root, n)
        log(
            f"floor: create {out['floor_create_per_s']:.0f}/s, stat {out['floor_stat_per_s']:.0f}/s"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument(
        "--flat",
        type=int,
        default=None,
        help="entries of the flat directory (default: --files; 0: skip)",
    )
    ap.add_argument("--lookups", type=int, default=10_000)
    ap.add_argument("--cluster", action="store_true", help="also the Redis catalog")
    ap.add_argument("--cluster-only", action="store_true")
    ap.add_argument(
        "--cluster-files",
        type=int,
        default=None,
        help="files for the cluster part (default: --files)",
    )
    ap.add_argument(
        "--outage",
        type=int,
        default=None,
        help="files written while the second node is stopped (default N/10)",
    )
    ap.add_argument(
        "--floor",
        action="store_true",
        help="also the creates and cold stats on bench/floorfs.py (the stack's floor)",
    )
    ap.add_argument("--dir", default="/var/tmp")
    args = parse(
        ap, argv, lambda a: "needs root (FUSE mounts, drop_caches)" if os.geteuid() != 0 else None
    )
    if args.flat is None:
        args.flat = args.files
    if args.outage is None:
        args.outage = max(1, (args.cluster_files or args.files) // 10)
    tmp = Path(tempfile.mkdtemp(prefix="kvfs-scale-", dir=args.dir))
    out: dict = {
        "files": args.files,
        "writers": args.writers,
        "file_bytes": FILE,
        "per_dir": PER_DIR,
        "load_before": os.getloadavg()[0],
    }
    try:
        if not args.cluster_only:
            out.update(single(tmp, args))
            if args.floor:
                out.update(floor(tmp, args))
                out["create_vs_floor"] = out["create_per_s"] / out["floor_create_per_s"]
                out["stat_vs_floor"] = out["stat_per_s"] / out["floor_stat_per_s"]
        if args.cluster or args.cluster_only:
            out.update(cluster(tmp, args))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out["load_after"] = os.getloadavg()[0]
    out = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items()}
    if args.json:
        print(dumps(out))
        return 0
    rows = [
        ("create_per_s", f"{args.writers} writers"),
        ("create_per_s_1writer", "1 writer"),
        ("rss_bytes_per_file", "daemon RSS per file, remount + stat of all"),
        ("warm_mount_s", "warm mount"),
        ("unmount_s", "unmount"),
        ("stat_per_s", "stat, cold dentries"),
        ("read_per_s", "read + compare"),
        ("floor_create_per_s", "the floor: create"),
        ("create_vs_floor", "kvfs / floor"),
        ("floor_stat_per_s", "the floor: stat, cold dentries"),
        ("stat_vs_floor", "kvfs / floor"),
        ("bit_exact", "every file bit-exact after the remount"),
        ("flat_readdir_s", "readdir of the flat directory"),
        ("flat_lookup_per_s", "random lookups in it"),
        ("redis_bytes_per_block", "Redis memory per block"),
        ("cluster_new_node_ready_s", "new node ready"),
        ("cluster_catchup_s", "mirror catch-up after an outage"),
    ]
    print(f"catalog scale: {args.files} files of {FILE} bytes, {PER_DIR} per directory")
    for key, what in rows:
        if key in out:
            print(f"  {what:<45} {key:<28} {out[key]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
