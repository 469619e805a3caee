"""How a pool's Redis work spreads over several shards (`[cluster] shards`, docs/cluster.md
"More than one Redis"): the same stores with 1 and with 3 shards, side by side in one run.

Each round starts its shards (one redis-server each, appendfsync always, as in
bench/redis_scale.py), mounts --nodes real kvfs daemons over one pool of namespace files, makes
--dirs directories (a directory's files are in its own shard: its inode's hash), and has every
node store --files files of --file-size, spread over the directories, from --threads threads;
then waits until every node sees every file (the write-back published it and each follower
applied it). Measured between two snapshots of every shard's INFO: the commands each shard ran
(commandstats, scripts' inner commands included) and its main thread's CPU, less what the same
shards spent per second in an idle window just before (--idle: followers' blocking reads timing
out, lease renewals and their copies, the cleaner's lock) times the measured window's length.

Reported per shard count: each shard's share of the commands (and of the CPU), Redis commands and
Redis CPU per stored file in all shards together; and `cpu_ratio_3_vs_1`, the total Redis CPU per
stored file with 3 shards over 1 (issue 46: each shard's share within 0.28-0.39, the total within
1.15x). On a 2-core machine three Redis processes cannot show a throughput gain; the shares and the
CPU per file are what carry to a rack (docs/cluster.md turns them into nodes per shard).

With --follow master,replica instead: one master behind Sentinel (three sentinels, --replicas
replicas, each server at --appendfsync), the nodes' followers reading the change log from the
master in one round and from the replicas (`[cluster] follow_replicas`) in the other: the
master's Redis CPU and XREADs per stored file, the replicas' CPU, and
`master_cpu_replica_vs_master`.

  python bench/redis_shards.py [--nodes 4] [--files 400] [--dirs 48] [--shards 1,3] [--json]
  python bench/redis_shards.py --follow master,replica [--replicas 2] [--json]
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import dumps, parse, parser  # noqa: E402
from kvfs.units import parse_size  # noqa: E402
from testing.mount import MountedKvfs, wait_until, write_config  # noqa: E402
from testing.redis_sentinel import SentinelGroup, _ask  # noqa: E402
from testing.redis_server import RedisServer, parse_info  # noqa: E402

MiB = 1 << 20


def read_info(port: int) -> dict:
    """A server's INFO (cpu, stats, commandstats): its fields, and per command (calls, usec)."""
    return parse_info(_ask(port, "INFO", "cpu", "stats", "commandstats", timeout=30).decode())


def snapshot(ports: list[int]) -> list[dict]:
    out = []
    for port in ports:
        info = read_info(port)
        out.append(
            {
                "calls": sum(c for name, (c, _) in info["cmds"].items() if name != "info"),
                "cpu": float(info["used_cpu_sys_main_thread"])
                + float(info["used_cpu_user_main_thread"]),
                "cmds": info["cmds"],
                "reads": int(info["total_reads_processed"]),
            }
        )
    return out


def run_round(tmp: Path, shards: int, args, say, follow: str | None = None) -> dict:
    """One round: `shards` Redis servers; or, with `follow` ("master" or "replica"), one
    master behind Sentinel with --replicas replicas, the followers reading from `follow`."""
    group = None
    replica_ports: list[int] = []
    if follow is None:
        servers = [
            RedisServer(tmp / f"redis{k}", args=["--appendfsync", args.appendfsync]).start()
            for k in range(shards)
        ]
    else:
        group = SentinelGroup(tmp / "redis", replicas=args.replicas).start()
        servers = [group.master]
        replica_ports = [s.port for s in group.servers if s is not group.master]
        for s in group.servers:
            _ask(s.port, "CONFIG", "SET", "appendonly", "yes")
            _ask(s.port, "CONFIG", "SET", "appendfsync", args.appendfsync)
    mounts: list[MountedKvfs] = []
    ports = [s.port for s in servers]
    try:
        shared = tmp / "shared"
        shared.mkdir()
        nss = [{"path": str(shared / f"ns{i}.img"), "size": args.ns_size} for i in range(2)]
        more = ", ".join(f'"{s.url}"' for s in servers[1:])
        if group is None:
            where = f'redis = "{servers[0].url}"\n' + (f"shards = [{more}]\n" if more else "")
        else:
            where = (
                "sentinels = [" + ", ".join(f'"{a}"' for a in group.sentinel_addresses) + "]\n"
                f'master_name = "{group.name}"\n'
                f"follow_replicas = {'true' if follow == 'replica' else 'false'}\n"
            )
        for i in range(args.nodes):
            cfg = write_config(
                tmp / f"node{i}.toml",
                tmp / f"state{i}",
                nss,
                dram=args.dram,
                extra=(
                    "[cluster]\n"
                    + where
                    + f'node_id = "node{i}"\nname = "shards"\nregions = {4 * args.nodes}\n'
                ),
                mount=f'durability = "{args.durability}"'
                + (f"\nwriteback_ms = {args.writeback_ms}" if args.writeback_ms else ""),
            )
            m = MountedKvfs(tmp / f"mnt{i}", cfg, tmp / f"node{i}.log")
            m.start(timeout=120)
            mounts.append(m)
        dirs = [f"d{k}" for k in range(args.dirs)]
        for d in dirs:
            (mounts[0].mountpoint / d).mkdir()
        for m in mounts:
            wait_until(lambda m=m: (m.mountpoint / dirs[-1]).is_dir(), 30, "the directories")
        data = os.urandom(args.file_size)
        # the background first (followers' idle XREADs, lease renewals and their copies, the
        # cleaner's lock): Redis CPU per second with nothing stored, taken out of the stores'
        time.sleep(1.0)
        i0, ir0 = snapshot(ports), snapshot(replica_ports)
        t = time.monotonic()
        time.sleep(args.idle)
        i1, ir1 = snapshot(ports), snapshot(replica_ports)
        idle_s = time.monotonic() - t
        bg_cpu = [(b["cpu"] - a["cpu"]) / idle_s for a, b in zip(i0, i1)]
        bg_calls = [(b["calls"] - a["calls"]) / idle_s for a, b in zip(i0, i1)]
        bg_replica_cpu = sum(b["cpu"] - a["cpu"] for a, b in zip(ir0, ir1)) / idle_s
        names = [
            [f"{dirs[(i * args.files + k) % len(dirs)]}/n{i}-{k}" for k in range(args.files)]
            for i in range(len(mounts))
        ]
        s0, r0 = snapshot(ports), snapshot(replica_ports)
        t = time.monotonic()
        import threading

        step = args.threads / args.rate if args.rate else 0.0  # (seconds per file, a thread)

        def store(m: MountedKvfs, part: list[str]) -> None:
            due = time.monotonic()
            for nm in part:
                if step:
                    time.sleep(max(0.0, due - time.monotonic()))
                    due += step
                with open(m.mountpoint / nm, "wb") as f:
                    f.write(data)

        threads = [
            threading.Thread(target=store, args=(m, names[i][j :: args.threads]))
            for i, m in enumerate(mounts)
            for j in range(args.threads)
        ]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        store_s = time.monotonic() - t
        last = [names[i][-1] for i in range(len(mounts))]
        for m in mounts:
            wait_until(
                lambda m=m: all((m.mountpoint / nm).exists() for nm in last),
                60,
                "every node seeing every file",
            )
        time.sleep(1.0)  # the followers' last batches, the links' flush
        s1, r1 = snapshot(ports), snapshot(replica_ports)
        window = time.monotonic() - t
        files = args.nodes * args.files
        calls = [b["calls"] - a["calls"] - c * window for a, b, c in zip(s0, s1, bg_calls)]
        cpu = [b["cpu"] - a["cpu"] - c * window for a, b, c in zip(s0, s1, bg_cpu)]
        usec: dict[str, float] = {}  # per command, all shards (EVALSHA's includes its own)
        ncalls: dict[str, int] = {}
        for a, b in zip(s0, s1):
            for name, (c, us) in b["cmds"].items():
                c0, us0 = a["cmds"].get(name, (0, 0.0))
                if us > us0:
                    usec[name] = usec.get(name, 0.0) + us - us0
                if c > c0 and name not in ("info",):
                    ncalls[name] = ncalls.get(name, 0) + c - c0
        say(
            f"{shards} shard(s){f', followers on the {follow}' if follow else ''}: {files} "
            f"files in {store_s:.1f} s; commands per shard {calls}"
        )
        extra: dict = {}
        if group is not None:
            replica_cpu = sum(b["cpu"] - a["cpu"] for a, b in zip(r0, r1))
            extra = {
                "follow": follow,
                "replicas": len(replica_ports),
                # (`ncalls` counts the one server in `ports`: the master)
                "master_xread_per_stored_file": round(ncalls.get("xread", 0) / files, 3),
                "replicas_cpu_ms_per_stored_file": round(
                    (replica_cpu - bg_replica_cpu * window) * 1000 / files, 4
                ),
                "follower_nodes": [m.stats()["cluster"]["following"] for m in mounts],
            }
        return {
            **extra,
            "shards": shards,
            "files": files,
            "store_seconds": round(store_s, 3),
            "window_seconds": round(window, 3),
            "background_cpu_ms_per_s": [round(c * 1000, 3) for c in bg_cpu],
            "background_commands_per_s": [round(c, 1) for c in bg_calls],
            "files_per_s": round(files / store_s, 1),
            "commands_per_shard": [round(c) for c in calls],
            "command_share": [round(c / max(1, sum(calls)), 3) for c in calls],
            "cpu_ms_per_shard": [round(c * 1000, 1) for c in cpu],
            "cpu_share": [round(c / max(1e-9, sum(cpu)), 3) for c in cpu],
            "redis_commands_per_stored_file": round(sum(calls) / files, 2),
            "redis_cpu_ms_per_stored_file": round(sum(cpu) * 1000 / files, 4),
            "read_events_per_stored_file": round(
                sum(b["reads"] - a["reads"] for a, b in zip(s0, s1)) / files, 3
            ),
            "calls_per_stored_file_by_command": {
                k: round(v / files, 3) for k, v in sorted(ncalls.items(), key=lambda kv: -kv[1])
            },
            "usec_per_stored_file_by_command": {
                k: round(v / files, 2) for k, v in sorted(usec.items(), key=lambda kv: -kv[1])
            },
        }
    finally:
        for m in mounts:
            try:
                m.stop()
            except Exception as e:  # noqa: BLE001 - unmount the others all the same
                print(f"redis_shards: stopping {m.mountpoint}: {e}", file=sys.stderr)
                m.kill()
        if group is not None:
            group.stop()
        else:
            for s in servers:
                s.stop()


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2, help="writer threads per node")
    ap.add_argument("--files", type=int, default=1000, help="files each node stores")
    ap.add_argument("--file-size", type=parse_size, default="64KiB")
    ap.add_argument("--dirs", type=int, default=240, help="directories the files go in")
    ap.add_argument("--idle", type=float, default=3.0, help="seconds of the background window")
    ap.add_argument("--shards", default="1,3", help="the shard counts to compare")
    ap.add_argument("--ns-size", default="256MiB", help="each of the 2 namespace files")
    ap.add_argument(
        "--dram",
        default="64MiB",
        help="each node's DRAM tier (a quarter of it is the write-back's dirty limit, which "
        "ends a group of batches early)",
    )
    ap.add_argument("--durability", default="fsync", choices=("fsync", "close"))
    ap.add_argument(
        "--rate", type=float, default=0.0, help="files/s each node stores (0: as fast as it can)"
    )
    ap.add_argument(
        "--writeback-ms",
        type=int,
        default=0,
        help="[mount] writeback_ms (0: the default, 100): with --rate, the files per publish "
        "(300 files/s and 7 ms: about 2, as LMCache's 32 MiB chunks at 300/s give)",
    )
    ap.add_argument(
        "--follow",
        default="",
        help="instead of --shards: one master behind Sentinel with --replicas replicas, one "
        "round per follower source named here (master,replica: [cluster] follow_replicas)",
    )
    ap.add_argument("--replicas", type=int, default=2, help="with --follow")
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run every round this many times, interleaved; the ratios are the medians",
    )
    ap.add_argument(
        "--appendfsync",
        default="always",
        choices=("always", "everysec"),
        help="each shard's AOF policy (kvfs's deployment guide: always)",
    )
    args = parse(ap, argv, needs=lambda a: None if os.geteuid() == 0 else "needs root (FUSE)")

    def say(msg: str) -> None:
        print(f"[redis_shards] {msg}", file=sys.stderr, flush=True)

    plan = (
        [(1, f) for f in args.follow.split(",")]
        if args.follow
        else [(int(x), None) for x in args.shards.split(",")]
    )
    rounds = run_rounds(plan, args, say)
    out = {
        "nodes": args.nodes,
        "threads": args.threads,
        "files_per_node": args.files,
        "file_size": args.file_size,
        "dirs": args.dirs,
        "durability": args.durability,
        "appendfsync": args.appendfsync,
        "rate": args.rate,
        "writeback_ms": args.writeback_ms or 100,
        **compare(rounds),
    }
    if args.follow:
        out["replicas"] = args.replicas
    if args.json:
        print(dumps(out))
    else:
        print(f"{'shards':>6}{'files/s':>10}{'cmds/file':>11}{'cpu ms/file':>13}  command shares")
        for r in rounds:
            print(
                f"{r['shards']:>6}{r['files_per_s']:>10}{r['redis_commands_per_stored_file']:>11}"
                f"{r['redis_cpu_ms_per_stored_file']:>13}  {r['command_share']}"
            )
        for r in rounds:
            if "follow" in r:
                print(
                    f"followers on the {r['follow']}: master XREADs per stored file "
                    f"{r['master_xread_per_stored_file']}, replicas' CPU per stored file "
                    f"{r['replicas_cpu_ms_per_stored_file']} ms"
                )
        if "master_cpu_replica_vs_master" in out:
            print(
                "the master's Redis CPU per stored file, followers on replicas over on the "
                f"master: {out['master_cpu_replica_vs_master']}x"
            )
        if "cpu_ratio_3_vs_1" in out:
            print(f"Redis CPU per stored file, 3 shards over 1: {out['cpu_ratio_3_vs_1']}x")
    return 0


def run_rounds(plan: list[tuple[int, str | None]], args, say) -> list[dict]:
    """Each round of `plan` ((shard count, follower source or None)), `args.repeats` times,
    interleaved, each in a temporary directory of its own; each round says its `repeat`."""
    rounds = []
    for repeat in range(args.repeats):
        for count, follow in plan:
            tmp = Path(tempfile.mkdtemp(prefix=f"kvfs-shards{count}-"))
            try:
                rounds.append({**run_round(tmp, count, args, say, follow), "repeat": repeat})
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return rounds


def compare(rounds: list[dict]) -> dict:
    """The rounds, and 3 shards against 1 where both ran; with repeats (each round's
    `repeat`), each ratio is the median of the repeats' (`<ratio>_range`: theirs)."""
    repeats = sorted({r.get("repeat", 0) for r in rounds})
    if len(repeats) > 1:
        each = [compare([r for r in rounds if r.get("repeat", 0) == k]) for k in repeats]
        out: dict = {"rounds": rounds, "repeats": len(repeats)}
        for key in each[0]:
            if key == "rounds":
                continue
            values = [e[key] for e in each if key in e]
            if key == "share_range_3":
                out[key] = [min(v[0] for v in values), max(v[1] for v in values)]
            else:
                out[key] = round(statistics.median(values), 3)
                out[f"{key}_range"] = [min(values), max(values)]
        return out
    out = {"rounds": rounds}
    one = next((r for r in rounds if r["shards"] == 1), None)
    three = next((r for r in rounds if r["shards"] == 3), None)
    if one and three:
        out["cpu_ratio_3_vs_1"] = round(
            three["redis_cpu_ms_per_stored_file"] / one["redis_cpu_ms_per_stored_file"], 3
        )
        out["commands_ratio_3_vs_1"] = round(
            three["redis_commands_per_stored_file"] / one["redis_commands_per_stored_file"], 3
        )
        out["share_range_3"] = [min(three["command_share"]), max(three["command_share"])]
    on_master = next((r for r in rounds if r.get("follow") == "master"), None)
    on_replica = next((r for r in rounds if r.get("follow") == "replica"), None)
    if on_master and on_replica:
        out["master_cpu_replica_vs_master"] = round(
            on_replica["redis_cpu_ms_per_stored_file"] / on_master["redis_cpu_ms_per_stored_file"],
            3,
        )
    return out


if __name__ == "__main__":
    sys.exit(main())
