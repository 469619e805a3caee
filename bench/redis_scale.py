#!/usr/bin/env python3
"""How far one Redis goes for a shared pool (docs/cluster.md): what each file operation costs
Redis in commands, round trips and CPU, and at what rate one Redis is saturated.

Method, in one run (everything is set up here and torn down at the end, also on error):

 1. Real kvfs daemons. --nodes daemons (4; at most 16) mount one shared pool (3 namespace files,
    sized so that the stores fit and a little more fills it) whose catalog is in one
    redis-server started here with the recommended persistence (appendonly yes, appendfsync
    always). Unless --no-proxy, each node reaches Redis through a counting TCP proxy (a port per
    node) that parses what each connection sends and counts its round trips (a request sent
    after the previous reply came back): so the commands a node sends are told apart from those
    Redis runs inside kvfs's Lua scripts, EVALSHA calls are named by script, and each node's
    follower connection (XREAD) is counted too. Phases, each between two snapshots of Redis's
    INFO (commandstats, cpu, stats), the proxy's counters and every node's statistics:
      store        every node stores --files new files of --file-size through its own mount
                   (--threads threads each, one shared directory, as LMCache's fs connector
                   does); then every node persists what it batches (the chain links its
                   writes taught it; kvfs does so every 5 s: here each phase ends with it, so
                   it pays for its own) and every follower catches up with the change log
      idle         --idle seconds of nothing: the background (each follower's XREAD BLOCK,
                   lease renewals, purges, the policy's floor, access-time flushes)
      lookup hit   every node stats the names the next node stored (known from the change log)
      lookup miss  every node stats as many names that nobody stored
      evict        storing goes on until the pool is full and the cluster evicts; then a
                   window of --evict-files more files per node (more, until the window itself
                   evicts: the fill may have cleaned ahead room for it) and the grace period for
                   their purges. Evicted files: the nodes' `cluster.evictions` (and their log lines
                   "pool full: evicting")
    Reported for each, per stored / looked-up / evicted file: Redis commands by name
    (commandstats counts those run inside Lua scripts as well), the EVALSHA calls by script and
    the commands run inside them (commandstats less what the clients sent), round trips (the
    nodes' own count `cluster.redis_calls`, which leaves out each follower's connection; and
    the proxy's count over all connections) and Redis CPU. The evict window is also given net
    of its stores (less the store phase's cost per file). The idle phase: per node per second.
 2. Redis CPU per 1,000 stored files: INFO cpu (used_cpu_sys + used_cpu_user, and the main
    thread's share alone) over the store phase, per file; 1 / that is the files/s at which one
    core would be fully used. A derivation: Redis executes commands on one thread, and with
    appendfsync always that thread also waits for each fsync of the AOF, which CPU time does
    not show.
 3. A load generator that replays the per-file command stream of N nodes against a fresh
    redis-server (same persistence; automatic AOF rewrites off, so no fork lands in a step):
    --gen-procs processes host N virtual nodes, each with a lease taken with kvfs's acquire
    script. A virtual node stores as a kvfs node of --durability does: with "fsync" (the
    write-back) D closed files are published by one EVALSHA publish with kvfs's own arguments
    (kvfs.catalog.redis.codec, kvfs.pool.layout; the name's ghost taken in it with evict =
    "prefix"), and the create's lookup of a new name is answered by the mirror; with "close"
    each file costs an HGET of its name (the create's lookup, a miss) and an EVALSHA publish
    of it alone (D files pipelined per round trip, which kvfs does not do: its shape is D = 1).
    Each new file carries the chain link from its writer's previous file in its record (`w`,
    as kvfs publishes it; the links script, every 5 s, then has nothing of the writers' to
    send). Every other virtual node follows the change log as kvfs's follower does (XREAD
    COUNT 512 BLOCK 1000; a publish's entry carries its records, so nothing of it is read
    back, nor of the links script's, which carries the chains it changed; what other entries
    name is read with HGETALL, as RedisMirror._refresh does); renewals, purges and the floor's
    GET run on kvfs's timers. Steps CxD: C connections per virtual node, D files per round
    trip. Each step: files/s, Redis's main-thread CPU share, the share of samples in which it
    waited on the disk (state D: the AOF fsync), the generator's CPU share, and what limited
    the rate.
    Repeated for each of --gen-nodes, and the last step with appendfsync everysec. If the
    generator is the limit, the rate is a lower bound. Then (unless --no-gen-replica), at the
    depths taken for 300 and 2,000 files/s, the same with every follower reading a replica of
    the master (`[cluster] follow_replicas`): the master's CPU per file then holds the
    writers, its replication stream and the background, measured at each node count.
 4. Capacity: a stored file costs Redis c(N) = a + b (N - 1) main-thread CPU-seconds with N
    nodes (the writer's part a; b for each node that follows the change), fitted to the
    generator's two node counts at their best step of kvfs's depth at that rate (`kvfs_depth`:
    1 with "close"; with "fsync" the write-back's batch, 16 files at 2,000 files/s and 2 at
    300 files/s); one Redis carries at --rate stored
    files/s per node the largest N with rate N c(N) + N idle <= 1 core (and <= --margin of it;
    idle: the background per node per second of phase 1); `<key>_followers_on_replicas`
    the same from the replica steps' cost per file (`_from`: "measured"; "fitted" where they
    did not run: the writers' part a alone). The same with the main thread's
    time waiting for fsync added to its CPU time (`model_with_fsync_waits`). Also the plain
    figure, (saturation files/s at --nodes) / rate.

Output: a table, or with --json the same figures as JSON (through bench.dumps).

    python bench/redis_scale.py [--nodes 4] [--files 500] [--gen-nodes 4,16] [--json]

Needs root, /dev/fuse and redis-server. On a 2-core machine the default run takes about
3 minutes.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import multiprocessing
import os
import resource
import selectors
import shutil
import socket
import stat as stat_mod
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import dumps, parser  # noqa: E402
from kvfs.catalog.records import BlobRec, Node, ghost_key  # noqa: E402
from kvfs.catalog.redis.bootstrap import EPOCH_SHIFT, SCHEMA_VERSION  # noqa: E402
from kvfs.catalog.redis.codec import (  # noqa: E402
    blob_fields,
    node_fields,
    parse_entry,
    publish_args,
    stream_id,
)
from kvfs.catalog.redis.flushes import PER_CALL as LINKS_PER_CALL  # noqa: E402
from kvfs.catalog.redis.scripts import SCRIPTS  # noqa: E402
from kvfs.config import DEFAULT_STRIPE_UNIT  # noqa: E402
from kvfs.pool.layout import DATA_START, Layout, stored_length, unit_count  # noqa: E402
from kvfs.redis.resp import RedisClient, RedisUnavailable, _encode  # noqa: E402
from kvfs.units import parse_size  # noqa: E402
from kvfs.write.writeback import GROUP_FILES  # noqa: E402
from testing.mount import MountedKvfs, wait_until, write_config  # noqa: E402
from testing.redis_sentinel import _ask  # noqa: E402
from testing.redis_server import RedisServer, parse_info, read_reply  # noqa: E402

MiB = 1 << 20
POOL = "scale"  # [cluster] name of the daemons' pool
GEN_POOL = "gen"  # the generator's
NAMESPACES = 3
STRIPE_UNIT = DEFAULT_STRIPE_UNIT  # the pool's (the configs here leave it alone)
# what this bench itself sends to Redis, never a node (commandstats: "xinfo|stream" and so on)
BENCH_COMMANDS = {"info", "xinfo", "config", "script"}
SHAS = {hashlib.sha1(text.encode()).hexdigest(): name for name, text in SCRIPTS.all().items()}


# ------------------------------------------------------------------------------------------------
# A blocking Redis connection for the bench's own INFO and XINFO calls (one read event each)


class Sync:
    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.file = self.sock.makefile("rb")
        self.calls = 0

    def call(self, *args):
        self.sock.sendall(_encode(args))
        self.calls += 1
        return read_reply(self.file)

    def info(self) -> dict:
        return parse_info(
            self.call("INFO", "cpu", "stats", "commandstats", "persistence", "memory").decode()
        )

    def entries_added(self, key: str) -> int:
        flat = self.call("XINFO", "STREAM", key)
        info = dict(zip(flat[::2], flat[1::2]))
        return int(info.get(b"entries-added", info.get(b"length", 0)))

    def close(self) -> None:
        self.sock.close()


# ------------------------------------------------------------------------------------------------
# The counting proxy (its own process): one listening port per node, commands and round trips
# counted per client connection


def _parse_commands(buf: bytearray) -> tuple[list[tuple[bytes, bytes]], int]:
    """Complete RESP commands at the start of `buf`: [(name, first argument)], bytes used."""
    out, pos, n = [], 0, len(buf)
    while pos < n:
        e = buf.find(b"\r\n", pos)
        if e < 0:
            break
        if buf[pos] != 42:  # an inline command (redis-cli style)
            words = bytes(buf[pos:e]).split()
            out.append((words[0] if words else b"", words[1] if len(words) > 1 else b""))
            pos = e + 2
            continue
        count, p, args, ok = int(buf[pos + 1 : e]), e + 2, [], True
        for _ in range(count):
            e = buf.find(b"\r\n", p)
            if e < 0:
                ok = False
                break
            ln = int(buf[p + 1 : e])
            if e + 2 + ln + 2 > n:
                ok = False
                break
            if len(args) < 2:
                args.append(bytes(buf[e + 2 : e + 2 + ln]))
            p = e + 2 + ln + 2
        if not ok:
            break
        args += [b""] * (2 - len(args))
        out.append((args[0], args[1]))
        pos = p
    return out, pos


def _command_key(name: bytes, arg: bytes) -> str:
    """How a command is counted: its name, EVALSHA and EVAL with the script's name."""
    name = name.upper()
    if name == b"EVALSHA":
        return "EVALSHA " + SHAS.get(arg.decode(errors="replace").lower(), "?")
    if name == b"EVAL":
        return "EVAL " + SHAS.get(hashlib.sha1(arg).hexdigest(), "?")
    return name.decode(errors="replace")


def _proxy_main(ctl, nodes: int, redis_port: int) -> None:
    sel = selectors.DefaultSelector()
    ports = []
    for i in range(nodes):
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", 0))
        ls.listen(256)
        ls.setblocking(False)
        sel.register(ls, selectors.EVENT_READ, ("listen", i))
        ports.append(ls.getsockname()[1])
    ctl.send(ports)
    sel.register(ctl, selectors.EVENT_READ, ("ctl", None))
    conns: list[dict] = []

    def close(pair: dict) -> None:
        for s in (pair["client"], pair["server"]):
            try:
                sel.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()
        pair["rec"]["open"] = False

    while True:
        for key, _ in sel.select():
            kind, obj = key.data
            if kind == "listen":
                try:
                    c, _ = key.fileobj.accept()
                except BlockingIOError:
                    continue
                try:
                    r = socket.create_connection(("127.0.0.1", redis_port))
                except OSError:
                    c.close()
                    continue
                for s in (c, r):
                    s.settimeout(30)
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                rec = {"node": obj, "rt": 0, "cmds": collections.Counter(), "open": True}
                conns.append(rec)
                pair = {"client": c, "server": r, "rec": rec, "buf": bytearray(), "waiting": False}
                sel.register(c, selectors.EVENT_READ, ("client", pair))
                sel.register(r, selectors.EVENT_READ, ("server", pair))
            elif kind in ("client", "server"):
                pair = obj
                try:
                    data = key.fileobj.recv(1 << 17)
                except OSError:
                    data = b""
                if not data:
                    close(pair)
                    continue
                try:
                    if kind == "client":
                        pair["server"].sendall(data)
                        if not pair["waiting"]:
                            pair["rec"]["rt"] += 1
                            pair["waiting"] = True
                        pair["buf"] += data
                        cmds, used = _parse_commands(pair["buf"])
                        del pair["buf"][:used]
                        for name, arg in cmds:
                            pair["rec"]["cmds"][_command_key(name, arg)] += 1
                    else:
                        pair["waiting"] = False
                        pair["client"].sendall(data)
                except OSError:
                    close(pair)
            else:
                msg = ctl.recv()
                if msg == "stop":
                    return
                ctl.send(
                    [{"node": r["node"], "rt": r["rt"], "cmds": dict(r["cmds"])} for r in conns]
                )


class Proxy:
    def __init__(self, nodes: int, redis_port: int):
        ctx = multiprocessing.get_context("fork")
        self.ctl, child = ctx.Pipe()
        self.proc = ctx.Process(target=_proxy_main, args=(child, nodes, redis_port), daemon=True)
        self.proc.start()
        if not self.ctl.poll(20):
            raise RuntimeError("the counting proxy did not start")
        self.ports = self.ctl.recv()

    def snapshot(self) -> list[dict]:
        self.ctl.send("snap")
        return self.ctl.recv()

    def stop(self) -> None:
        if self.proc.is_alive():
            try:
                self.ctl.send("stop")
            except OSError:
                pass
            self.proc.join(5)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(5)


def proxy_totals(conns: list[dict], nodes: int) -> dict:
    """Per node and in all: round trips and commands of its link (every connection but the
    follower's) and of its follower (the connection that reads the log with XREAD)."""
    per = [
        {
            "link": {"rt": 0, "cmds": collections.Counter()},
            "follower": {"rt": 0, "cmds": collections.Counter()},
        }
        for _ in range(nodes)
    ]
    for c in conns:
        side = per[c["node"]]["follower" if c["cmds"].get("XREAD") else "link"]
        side["rt"] += c["rt"]
        side["cmds"].update(c["cmds"])
    return {"per_node": per}


# ------------------------------------------------------------------------------------------------
# Snapshots and their differences


class Probe:
    """Everything a phase is measured by: Redis's INFO, the proxy's counters, the nodes'
    statistics and their logs' eviction lines."""

    def __init__(self, sync: Sync, proxy: Proxy | None, mounts: list[MountedKvfs]):
        self.sync, self.proxy, self.mounts = sync, proxy, mounts

    def snap(self) -> dict:
        # The nodes' eviction counts, their log lines and the proxy's counters, read while no
        # eviction is under way: the daemon logs an eviction before it removes the file (so
        # that a crash leaves the line: bench/torture.py relies on it) and counts it after,
        # and the pool may be evicting in the background; read until they stand still 20 ms
        # with every logged eviction counted (an eviction's removal can outlast 20 ms: one
        # run in the mounted test saw 109 lines against 108).
        def read() -> tuple[list[dict], list[tuple[int, int]]]:
            nodes = []
            for m in self.mounts:
                c = m.stats()["cluster"]
                nodes.append(
                    {
                        "redis_calls": c["redis_calls"],
                        "follower_round_trips": c.get("follower_round_trips", 0),
                        "evictions": c["evictions"],
                        "events": c["events"],
                        "evict_lines": log_evictions(m.log),
                    }
                )
            return nodes, [(n["evictions"], n["evict_lines"]) for n in nodes]

        for _ in range(50):
            nodes, marks = read()
            proxy = self.proxy.snapshot() if self.proxy else None
            time.sleep(0.02)
            if read()[1] == marks and all(e == lines for e, lines in marks):
                break
        snap = {"t": time.monotonic(), "nodes": nodes, "proxy": proxy}
        snap["info"] = self.sync.info()  # last: its own call is counted in it
        snap["bench_calls"] = self.sync.calls
        return snap

    def diff(self, a: dict, b: dict) -> dict:
        ia, ib = a["info"], b["info"]
        cmds = {}
        usec = {}
        for name, (calls, us) in ib["cmds"].items():
            if name.split("|")[0] in BENCH_COMMANDS:
                continue
            c0, u0 = ia["cmds"].get(name, (0, 0.0))
            if calls - c0:
                cmds[name] = calls - c0
                usec[name] = round(us - u0, 1)

        def f(info, key):
            return float(info.get(key, 0.0))

        cpu = sum(f(ib, k) - f(ia, k) for k in ("used_cpu_sys", "used_cpu_user"))
        main = sum(
            f(ib, k) - f(ia, k) for k in ("used_cpu_sys_main_thread", "used_cpu_user_main_thread")
        )
        out = {
            "seconds": round(b["t"] - a["t"], 3),
            "commands": dict(sorted(cmds.items(), key=lambda kv: -kv[1])),
            "usec": usec,
            "cpu_s": round(cpu, 4),
            "cpu_main_s": round(main, 4),
            "read_events": int(ib["total_reads_processed"])
            - int(ia["total_reads_processed"])
            - (b["bench_calls"] - a["bench_calls"]),
            "redis_calls": sum(
                y["redis_calls"] - x["redis_calls"] for x, y in zip(a["nodes"], b["nodes"])
            ),
            "redis_calls_per_node": [
                y["redis_calls"] - x["redis_calls"] for x, y in zip(a["nodes"], b["nodes"])
            ],
            "follower_round_trips": sum(
                y["follower_round_trips"] - x["follower_round_trips"]
                for x, y in zip(a["nodes"], b["nodes"])
            ),
            "evictions": sum(
                y["evictions"] - x["evictions"] for x, y in zip(a["nodes"], b["nodes"])
            ),
            "evict_log_lines": sum(
                y["evict_lines"] - x["evict_lines"] for x, y in zip(a["nodes"], b["nodes"])
            ),
        }
        if a["proxy"] is not None:
            n = len(self.mounts)
            pa, pb = proxy_totals(a["proxy"], n), proxy_totals(b["proxy"], n)
            link_rt = follower_rt = 0
            direct: collections.Counter = collections.Counter()
            per_node = []
            for x, y in zip(pa["per_node"], pb["per_node"]):
                d = {}
                for side in ("link", "follower"):
                    c = y[side]["cmds"].copy()
                    c.subtract(x[side]["cmds"])
                    c = collections.Counter({k: v for k, v in c.items() if v})
                    d[side] = {"rt": y[side]["rt"] - x[side]["rt"], "cmds": dict(c)}
                    direct.update(c)
                link_rt += d["link"]["rt"]
                follower_rt += d["follower"]["rt"]
                per_node.append(d)
            by_script: collections.Counter = collections.Counter()
            for k, v in direct.items():
                if k.startswith(("EVALSHA ", "EVAL ")):
                    by_script[k.split(" ", 1)[1]] += v
            flat: collections.Counter = collections.Counter()
            for k, v in direct.items():
                flat[k.split(" ", 1)[0].lower()] += v
            inside = {k: v - flat.get(k, 0) for k, v in cmds.items() if v - flat.get(k, 0)}
            out["proxy"] = {
                "round_trips_link": link_rt,
                "round_trips_follower": follower_rt,
                "direct": dict(sorted(flat.items(), key=lambda kv: -kv[1])),
                "evalsha_by_script": dict(sorted(by_script.items(), key=lambda kv: -kv[1])),
                "follower_direct": dict(
                    sum(
                        (collections.Counter(p["follower"]["cmds"]) for p in per_node),
                        collections.Counter(),
                    )
                ),
                "in_scripts": dict(sorted(inside.items(), key=lambda kv: -kv[1])),
                "per_node": per_node,
            }
        return out


def log_evictions(path: Path) -> int:
    """Evictions a node's log names: those begun, less those it then did not make (another
    node removed or rewrote the file meanwhile)."""
    try:
        text = path.read_bytes()
    except OSError:
        return 0
    return text.count(b"pool full: evicting") - text.count(b"pool full: not evicting")


def per_op(d: dict, ops: int) -> dict:
    """A phase's figures per operation (file stored, looked up or evicted)."""
    if ops <= 0:
        return {}
    r = lambda x: round(x / ops, 3)  # noqa: E731
    total = sum(d["commands"].values())
    out = {
        "commands": r(total),
        "by_name": {k: r(v) for k, v in d["commands"].items()},
        "evalsha": r(d["commands"].get("evalsha", 0) + d["commands"].get("eval", 0)),
        "round_trips": r(d["redis_calls"]),
        # every node's followers too, from the nodes' own statistics (no proxy needed)
        "round_trips_with_followers": r(d["redis_calls"] + d["follower_round_trips"]),
        "redis_read_events": r(d["read_events"]),
        "redis_cpu_ms": round(1000 * d["cpu_s"] / ops, 4),
        "redis_cpu_main_ms": round(1000 * d["cpu_main_s"] / ops, 4),
    }
    p = d.get("proxy")
    if p is not None:
        out["direct_commands"] = r(sum(p["direct"].values()))
        out["in_scripts"] = r(sum(p["in_scripts"].values()))
        out["in_scripts_by_name"] = {k: r(v) for k, v in p["in_scripts"].items()}
        out["evalsha_by_script"] = {k: r(v) for k, v in p["evalsha_by_script"].items()}
        out["round_trips_link"] = r(p["round_trips_link"])
        out["round_trips_follower"] = r(p["round_trips_follower"])
        out["round_trips_all"] = r(p["round_trips_link"] + p["round_trips_follower"])
        out["follower_commands"] = r(sum(p["follower_direct"].values()))
    return out


# ------------------------------------------------------------------------------------------------
# Phase 1: real daemons


def node_config(tmp: Path, i: int, url: str, nss: list[dict], args) -> Path:
    extra = (
        f'[cluster]\nredis = "{url}"\nnode_id = "node{i}"\nname = "{POOL}"\n'
        f"grace_seconds = {args.grace}\nlease_seconds = {args.lease}\n"
        f"regions = {args.regions}\n"
    )
    return write_config(
        tmp / f"node{i}.toml",
        tmp / f"state{i}",
        nss,
        dram=args.dram,
        extra=extra,
        pool=f'evict = "{args.evict}"',
        mount=f'durability = "{args.durability}"',
    )


def write_file(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def run_threads(jobs: list[list], fn) -> tuple[int, int]:
    """Run fn(item) for every item of every job, one thread per job: (done, failed)."""
    done, failed = [0], [0]
    lock = threading.Lock()

    def work(items):
        ok = bad = 0
        for it in items:
            try:
                fn(it)
                ok += 1
            except OSError:
                bad += 1
        with lock:
            done[0] += ok
            failed[0] += bad

    ts = [threading.Thread(target=work, args=(job,)) for job in jobs if job]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return done[0], failed[0]


def store_jobs(mounts, names_per_node: list[list[str]], threads: int) -> list[list]:
    jobs = []
    for m, names in zip(mounts, names_per_node):
        paths = [m.mountpoint / "d" / n for n in names]
        jobs += [paths[k::threads] for k in range(threads)]
    return jobs


def settle(
    sync: Sync, mounts, base: dict, key: str, extra: float = 0.3, timeout: float = 60.0
) -> None:
    """Persist what every node batches (access times, the chain links its writes taught it:
    kvfs does it every 5 s, kvfs.service.CLUSTER_FLUSH_SECONDS; here at the end of a phase, so
    that each phase pays for its own), then wait until every node's follower has applied
    every change-log entry added so far."""
    for m in mounts:
        m.control("flush")
    target = sync.entries_added(key) - base["added"]

    def caught_up() -> bool:
        return all(
            m.stats()["cluster"]["events"] - e0 >= target for m, e0 in zip(mounts, base["events"])
        )

    wait_until(caught_up, timeout, "the followers to catch up", interval=0.05)
    time.sleep(extra)


def log_base(sync: Sync, mounts, key: str) -> dict:
    return {
        "added": sync.entries_added(key),
        "events": [m.stats()["cluster"]["events"] for m in mounts],
    }


def run_daemons(tmp: Path, args, say) -> dict:
    n = args.nodes
    fsize = args.file_size
    stored = stored_length(fsize, STRIPE_UNIT, 0) * unit_count(fsize, STRIPE_UNIT)
    if args.ns_size:
        ns_size = args.ns_size
    else:  # the stores fill about 2/3 of the pool
        need = n * args.files * stored * 3 // 2
        ns_size = max(32 * MiB, -(-need // NAMESPACES // MiB) * MiB + 2 * MiB)
    shared = tmp / "shared"
    shared.mkdir()
    nss = [
        {"path": str(shared / f"ns{i}.img"), "size": f"{ns_size // MiB}MiB"}
        for i in range(NAMESPACES)
    ]
    redis = RedisServer(tmp / "redis").start()
    proxy = None
    mounts: list[MountedKvfs] = []
    sync = None
    try:
        sync = Sync(redis.port)
        if not args.no_proxy:
            proxy = Proxy(n, redis.port)
        for i in range(n):
            port = proxy.ports[i] if proxy else redis.port
            cfg = node_config(tmp, i, f"redis://127.0.0.1:{port}/0", nss, args)
            m = MountedKvfs(tmp / f"mnt{i}", cfg, tmp / f"node{i}.log")
            mounts.append(m)
            m.start(timeout=120)
        say(f"{n} nodes mounted; pool {NAMESPACES} x {ns_size // MiB} MiB")
        (mounts[0].mountpoint / "d").mkdir()
        for m in mounts:
            wait_until(lambda m=m: (m.mountpoint / "d").is_dir(), 20, "the directory everywhere")
        probe = Probe(sync, proxy, mounts)
        key = f"kvfs:{{{POOL}}}:log"
        data = os.urandom(fsize)
        phases = {}

        # (a) stores
        names = [[f"n{i}-{k}" for k in range(args.files)] for i in range(n)]
        base = log_base(sync, mounts, key)
        s0 = probe.snap()
        t = time.monotonic()
        done, failed = run_threads(
            store_jobs(mounts, names, args.threads), lambda p: write_file(p, data)
        )
        store_s = time.monotonic() - t
        settle(sync, mounts, base, key)
        d = probe.diff(s0, probe.snap())
        d.update(
            ops=done,
            failed=failed,
            files_per_s=round(done / store_s, 1),
            store_seconds=round(store_s, 3),
        )
        phases["store"] = d
        say(f"store: {done} files in {store_s:.1f} s ({failed} failed)")

        # idle
        s0 = probe.snap()
        time.sleep(args.idle)
        d = probe.diff(s0, probe.snap())
        d["ops"] = 0
        phases["idle"] = d
        say(f"idle: {args.idle} s")

        # (b) lookups: hits (another node's names) and misses
        look = min(args.lookups, args.files)
        for kind in ("hit", "miss"):
            if kind == "hit":
                jobs = [
                    [m.mountpoint / "d" / nm for nm in names[(i + 1) % n][:look]]
                    for i, m in enumerate(mounts)
                ]
            else:
                jobs = [
                    [m.mountpoint / "d" / f"x{i}-{k}" for k in range(look)]
                    for i, m in enumerate(mounts)
                ]
            wrong = [0]

            def check(p, expect=(kind == "hit")):
                if p.exists() != expect:
                    wrong[0] += 1

            base = log_base(sync, mounts, key)
            s0 = probe.snap()
            t = time.monotonic()
            done, _ = run_threads(jobs, check)
            secs = time.monotonic() - t
            settle(sync, mounts, base, key)
            d = probe.diff(s0, probe.snap())
            d.update(ops=done, wrong=wrong[0], lookups_per_s=round(done / secs, 1))
            phases[f"lookup_{kind}"] = d
            say(f"lookup {kind}: {done} stats, {wrong[0]} unexpected")

        # (c) evictions: fill the pool, then a measured window
        counter = [0]

        def batch(per_node: int) -> tuple[int, int]:
            nm = [[f"e{i}-{counter[0] + k}" for k in range(per_node)] for i in range(n)]
            counter[0] += per_node
            return run_threads(store_jobs(mounts, nm, args.threads), lambda p: write_file(p, data))

        def evicted() -> int:
            return sum(m.stats()["cluster"]["evictions"] for m in mounts)

        cap_files = NAMESPACES * (ns_size - DATA_START) // stored
        fill = 0
        step = max(8, args.threads * 4)
        base = log_base(sync, mounts, key)
        t = time.monotonic()
        while evicted() == 0:
            if fill > 2 * cap_files:
                raise RuntimeError(
                    f"no eviction after storing {fill} more files per node "
                    f"(a pool of about {cap_files} files)"
                )
            batch(step)
            fill += step
        fill_s = time.monotonic() - t
        settle(sync, mounts, base, key)  # the fill's links flushed before the window
        say(f"evict: {fill} files per node filled the pool ({fill_s:.1f} s)")
        base = log_base(sync, mounts, key)
        s0 = probe.snap()
        ev0 = evicted()
        t = time.monotonic()
        done, failed = batch(args.evict_files)
        more = 0
        # the fill's eviction may have cleaned ahead enough room for the whole window (the
        # pool's free_target): store on until the window itself has evicted
        while evicted() == ev0 and more < cap_files:
            d2, f2 = batch(step)
            done, failed, more = done + d2, failed + f2, more + step
        store_s = time.monotonic() - t
        time.sleep(args.grace * 1.5 + 0.5)  # the evicted blocks' purges
        settle(sync, mounts, base, key)
        d = probe.diff(s0, probe.snap())
        d.update(
            ops=d["evictions"],
            stored=done,
            failed=failed,
            store_seconds=round(store_s, 3),
            fill_files_per_node=fill,
        )
        phases["evict"] = d
        say(f"evict: {done} stored ({failed} failed), {d['evictions']} evicted in the window")
        stats = [m.stats()["cluster"] for m in mounts]
    finally:
        for m in mounts:
            try:
                m.stop()
            except Exception as e:  # noqa: BLE001 - unmount the others all the same
                print(f"redis_scale: stopping {m.mountpoint}: {e}", file=sys.stderr)
                m.kill()
        if proxy is not None:
            proxy.stop()
        if sync is not None:
            sync.close()
        redis.stop()
    return {
        "nodes": n,
        "ns_size": ns_size,
        "pool_files": cap_files,
        "phases": phases,
        "node_stats_end": [
            {
                k: s.get(k)
                for k in (
                    "redis_calls",
                    "redis_call_ms",
                    "events",
                    "refreshes",
                    "evictions",
                    "room_waits",
                    "room_wait_seconds",
                    "leases_lost",
                )
            }
            for s in stats
        ],
    }


def summarize_daemons(res: dict, args) -> dict:
    ph = res["phases"]
    n = res["nodes"]
    idle = ph["idle"]
    secs = max(idle["seconds"], 1e-9)
    bg = {
        "commands_per_node_s": round(sum(idle["commands"].values()) / n / secs, 2),
        "by_name_per_node_s": {k: round(v / n / secs, 3) for k, v in idle["commands"].items()},
        "round_trips_per_node_s": round(idle["redis_calls"] / n / secs, 3),
        "redis_cpu_ms_per_node_s": round(1000 * idle["cpu_main_s"] / n / secs, 4),
    }
    if "proxy" in idle:
        p = idle["proxy"]
        bg["round_trips_all_per_node_s"] = round(
            (p["round_trips_link"] + p["round_trips_follower"]) / n / secs, 3
        )
        bg["evalsha_by_script_per_node_s"] = {
            k: round(v / n / secs, 3) for k, v in p["evalsha_by_script"].items()
        }
        bg["follower_per_node_s"] = {
            k: round(v / n / secs, 3) for k, v in p["follower_direct"].items()
        }
    out = {"background": bg}
    for name in ("store", "lookup_hit", "lookup_miss", "evict"):
        d = ph[name]
        o = per_op(d, d["ops"])
        # the background's share of the phase (the idle rate over the phase's length)
        o["background_commands"] = round(
            bg["commands_per_node_s"] * n * d["seconds"] / max(1, d["ops"]), 3
        )
        out[name] = o
    # the eviction's own cost: the window less what its stores cost in the store phase
    ev, st = ph["evict"], ph["store"]
    if ev["ops"] > 0 and st["ops"] > 0:
        k = ev["stored"] / st["ops"]
        own = {
            c: ev["commands"].get(c, 0) - k * st["commands"].get(c, 0)
            for c in set(ev["commands"]) | set(st["commands"])
        }
        own = {
            c: round(v / ev["ops"], 3)
            for c, v in sorted(own.items(), key=lambda kv: -kv[1])
            if abs(v / ev["ops"]) >= 0.005
        }
        o = {
            "commands": round(sum(own.values()), 3),
            "by_name": own,
            "round_trips": round((ev["redis_calls"] - k * st["redis_calls"]) / ev["ops"], 3),
            "redis_cpu_main_ms": round(
                1000 * (ev["cpu_main_s"] - k * st["cpu_main_s"]) / ev["ops"], 4
            ),
            "stores_per_eviction": round(ev["stored"] / ev["ops"], 3),
        }
        if "proxy" in ev and "proxy" in st:
            pe, ps = ev["proxy"], st["proxy"]
            o["evalsha_by_script"] = {
                s: round(
                    (pe["evalsha_by_script"].get(s, 0) - k * ps["evalsha_by_script"].get(s, 0))
                    / ev["ops"],
                    3,
                )
                for s in set(pe["evalsha_by_script"]) | set(ps["evalsha_by_script"])
            }
            o["round_trips_follower"] = round(
                (pe["round_trips_follower"] - k * ps["round_trips_follower"]) / ev["ops"], 3
            )
            o["follower_by_name"] = {
                c: round(
                    (pe["follower_direct"].get(c, 0) - k * ps["follower_direct"].get(c, 0))
                    / ev["ops"],
                    3,
                )
                for c in set(pe["follower_direct"]) | set(ps["follower_direct"])
            }
        out["evict_own"] = o
    st = ph["store"]
    files = max(1, st["ops"])
    cpu_k = 1000 * st["cpu_s"] / files
    main_k = 1000 * st["cpu_main_s"] / files
    out["cpu"] = {
        "cpu_s_per_1000_files": round(cpu_k, 4),
        "cpu_main_s_per_1000_files": round(main_k, 4),
        "redis_cpu_share_during_stores": round(st["cpu_s"] / max(st["seconds"], 1e-9), 3),
        # derivation: one core (1.0 CPU-s/s) is what Redis's command thread can use
        "saturation_files_per_s": round(1000 / main_k) if main_k else None,
        "saturation_files_per_s_process_cpu": round(1000 / cpu_k) if cpu_k else None,
        "nodes_at_rate": round(1000 / main_k / args.rate, 2) if main_k else None,
        "nodes_at_rate_margin": round(args.margin * 1000 / main_k / args.rate, 2)
        if main_k
        else None,
    }
    return out


# ------------------------------------------------------------------------------------------------
# Phase 3: the load generator (worker processes: `--gen-worker SPEC`)


class _Incomplete(Exception):
    pass


def _parse(buf: bytearray, pos: int):
    """One RESP value at buf[pos:]: (value, next position); _Incomplete if not all there."""
    e = buf.find(b"\r\n", pos)
    if e < 0:
        raise _Incomplete
    t = buf[pos]
    if t == 36:  # $
        n = int(buf[pos + 1 : e])
        if n < 0:
            return None, e + 2
        end = e + 2 + n
        if end + 2 > len(buf):
            raise _Incomplete
        return bytes(buf[e + 2 : end]), end + 2
    if t == 42:  # *
        n = int(buf[pos + 1 : e])
        pos = e + 2
        if n < 0:
            return None, pos
        out = []
        for _ in range(n):
            v, pos = _parse(buf, pos)
            out.append(v)
        return out, pos
    if t == 45:  # -
        raise RuntimeError(buf[pos + 1 : e].decode(errors="replace"))
    if t == 58:  # :
        return int(buf[pos + 1 : e]), e + 2
    return bytes(buf[pos + 1 : e]), e + 2


def _skip(buf: bytearray, pos: int, todo: int) -> tuple[int, int]:
    """Skip `todo` RESP values from buf[pos:] without building them: (position, values still to
    skip), the position at the start of the first value not complete in `buf`."""
    n = len(buf)
    while todo:
        e = buf.find(b"\r\n", pos)
        if e < 0:
            break
        t = buf[pos]
        if t == 36:
            ln = int(buf[pos + 1 : e])
            end = e + 2 + ln + 2 if ln >= 0 else e + 2
            if end > n:
                break
            pos = end
        elif t == 42:
            k = int(buf[pos + 1 : e])
            pos = e + 2
            if k > 0:
                todo += k
        elif t == 45:
            raise RuntimeError(buf[pos + 1 : e].decode(errors="replace"))
        else:
            pos = e + 2
        todo -= 1
    return pos, todo


class RawConn:
    """A follower's connection: big replies skipped or parsed without kvfs's general reader
    (the generator must cost less per file than Redis does)."""

    def __init__(self, stream):
        self.stream = stream
        self.buf = bytearray()

    @classmethod
    async def connect(cls, port: int) -> "RawConn":
        import trio

        c = cls(await trio.open_tcp_stream("127.0.0.1", port))
        await c.send([("SELECT", 0)])
        await c.skip(1)
        return c

    async def send(self, cmds) -> None:
        await self.stream.send_all(b"".join(_encode(c) for c in cmds))

    async def _fill(self) -> None:
        data = await self.stream.receive_some(1 << 17)
        if not data:
            raise RedisUnavailable("connection closed")
        self.buf += data

    async def read(self):
        while True:
            try:
                value, pos = _parse(self.buf, 0)
            except _Incomplete:
                await self._fill()
                continue
            del self.buf[:pos]
            return value

    async def skip(self, n: int) -> None:
        while True:
            pos, n = _skip(self.buf, 0, n)
            del self.buf[:pos]
            if not n:
                return
            await self._fill()


class VNode:
    """One virtual node of the generator: a writer's per-file calls, a follower, the timers."""

    def __init__(self, v: int, spec: dict):
        self.v = v
        self.spec = spec
        self.P = f"kvfs:{{{spec['name']}}}:"
        self.url = f"redis://127.0.0.1:{spec['port']}/0"
        self.sha = spec["shas"]
        self.files = self.late = self.counter = 0
        self.rt = collections.Counter()
        self.cmds = collections.Counter()
        self.entries = self.batches = self.rereads = 0
        self.target = None
        self.caught_up = None
        # this node's own changes of the shared directory (each mknode): in flight, and a
        # sequence number of the last to finish (kvfs: RedisMirror._changing)
        self.in_flight = self.seq = 0
        self.prev: int | None = None  # the last file this node created
        self.links: list = []  # chain links learned, not yet flushed

    async def setup(self) -> None:
        import trio

        self.caught_up = trio.Event()
        sp = self.spec
        self.bg = await RedisClient.connect(self.url)
        self.epoch = await self.bg.call("INCR", self.P + "epoch")
        self.token = f"gen{self.v}/{self.epoch}/{uuid.uuid4().hex[:8]}"
        cands = [self.v + k * sp["all"] for k in range(64)]
        got, tail = await self.bg.eval(
            SCRIPTS.acquire, [self.P], [self.token, sp["lease_ms"], *cands]
        )
        if not got:
            raise RuntimeError("the generator found no free region")
        self.region = int(got)
        self.tail = tail
        self.writers = [await RedisClient.connect(self.url) for _ in range(sp["conns"])]
        # (followers on a replica: `--gen-replica`, [cluster] follow_replicas)
        self.follower = await RawConn.connect(sp.get("follow_port") or sp["port"])
        self.dkey = self.P + f"d:{sp['dir']}"

    def new_file(self) -> tuple[bytes, int, list]:
        sp = self.spec
        self.counter += 1
        ino = (self.epoch << EPOCH_SHIFT) | self.counter
        name = f"g{self.epoch}-{self.counter}".encode()
        now = time.time_ns()
        size, unit = sp["file_size"], STRIPE_UNIT
        nu = unit_count(size, unit)
        base = DATA_START + self.region * sp["region_size"]
        off = base + (self.counter * stored_length(size, unit, 0)) % sp["region_size"]
        lay = Layout(
            size,
            unit,
            tuple(k % NAMESPACES for k in range(nu)),
            tuple(off + k * unit for k in range(nu)),
            tuple(hash((ino, k)) & ((1 << 64) - 1) for k in range(nu)),
        )
        rec = BlobRec(ino, lay, now)  # the generator's block ids are its inodes
        # kvfs.tiers.readahead: a writer's files form a chain; each new file's link from its
        # predecessor goes in its own record (`w`, RedisMirror._write_link), not in a links call
        wpred, self.prev = self.prev, ino
        node = Node(
            ino,
            sp["dir"],
            name,
            stat_mod.S_IFREG | 0o644,
            0,
            0,
            now,
            now,
            now,
            cookie=ino,
            blob=rec,
        )
        if sp["evict"] == "prefix":
            node.prio, node.uses = 0.5 + (self.counter % 1000) * 1e-6, 1
        blob = blob_fields(rec, ino)
        fields = node_fields(node) + ([b"w", wpred] if wpred is not None else [])
        ghost = ghost_key(sp["dir"], name) if sp["evict"] == "prefix" else ""
        args = publish_args(
            *(ino, sp["dir"], name, b"new", str(self.region), ino, ghost, node.prio),
            blob,
            fields,
        )
        return name, args

    def publish(self, files: list) -> tuple:
        """EVALSHA publish of `files` (publish.lua: kvfs.catalog.redis.catalog.commit_batch)."""
        head = (self.epoch, self.token, self.spec["grace_ms"], time.time_ns(), len(files))
        return ("EVALSHA", self.sha["publish"], 1, self.P, *head, *(a for f in files for a in f[1]))

    async def write(self, c: RedisClient, end: float) -> None:
        """kvfs's stores. Durability "fsync": the write-back publishes D closed files in one
        script call, and the create's lookup of a new name is answered by the mirror. "close":
        each close asks Redis about its new name (the create's lookup, a miss) and publishes
        its file alone, D files pipelined per round trip (which kvfs does not do: D = 1)."""
        import trio

        depth = self.spec["depth"]
        close = self.spec["durability"] == "close"
        while trio.current_time() < end:
            files = [self.new_file() for _ in range(depth)]
            if close:  # the create's lookup of a new name: a miss, asked of Redis
                await c.pipeline([("HGET", self.dkey, f[0]) for f in files])
            self.in_flight += depth
            try:
                if close:
                    await c.pipeline([self.publish([f]) for f in files])
                else:
                    await c.pipeline([self.publish(files)])
            finally:
                self.in_flight -= depth
                self.seq += depth
            rts = 2 if close else 1
            self.rt["writer"] += rts
            self.cmds["writer"] += rts * depth if close else 1
            if trio.current_time() <= end:
                self.files += depth
            else:
                self.late += depth

    async def _read_states(self, inos: list[bytes]) -> None:
        """kvfs's RedisMirror._read_states: the inodes' hashes, then their new blocks'."""
        f = self.follower
        await f.send([("HGETALL", self.P + "n:" + i.decode()) for i in inos])
        await f.skip(len(inos))
        self.rt["follower"] += 1
        self.cmds["follower"] += len(inos)
        blobs = [i for i in inos if int(i) != self.spec["dir"]]
        if blobs:
            await f.send([("HGETALL", self.P + "b:" + i.decode()) for i in blobs])
            await f.skip(len(blobs))
            self.rt["follower"] += 1
            self.cmds["follower"] += len(blobs)

    async def follow(self) -> None:
        """kvfs's follower (RedisMirror._follow_loop, _apply_entries, _refresh)."""
        import trio

        key = self.P + "log"
        last = self.tail
        origin = str(self.epoch).encode()
        d = str(self.spec["dir"]).encode()
        f = self.follower
        while True:
            await f.send([("XREAD", "COUNT", 512, "BLOCK", 1000, "STREAMS", key, last)])
            reply = await f.read()
            self.rt["follower"] += 1
            self.cmds["follower"] += 1
            if reply:
                entries = reply[0][1]
                self.batches += 1
                inos: dict[bytes, None] = {}
                for sid, flat in entries:
                    self.entries += 1
                    # (a publish's entry carries its records: nothing of it is read back)
                    fields, _ = parse_entry(flat)
                    if fields.get(b"o") != origin:
                        for i in (fields.get(b"i") or b"").split():
                            inos[i] = None
                    last = sid
                if inos:
                    # RedisMirror._refresh: read again what this node changed while the read
                    # was in flight (the shared directory: every mknode here changes it), and
                    # only that, at most 10 times
                    todo = list(inos)
                    for k in range(10):
                        mark = self.seq
                        await self._read_states(todo)
                        if d not in todo or not (self.in_flight or self.seq > mark):
                            break
                        todo = [d]
                        self.rereads += 1
                        with trio.move_on_after(1.0):
                            while self.in_flight:
                                await trio.sleep(0.01)
            if self.target is not None and stream_id(last) >= self.target:
                self.caught_up.set()

    async def flush_links(self) -> None:
        """kvfs.service's flush (every 5 s): the chain links learned, PER_CALL a links script
        call (kvfs.catalog.redis.flushes)."""
        args, self.links = self.links, []
        for i in range(0, len(args), 4 * LINKS_PER_CALL):
            await self.bg.eval(
                SCRIPTS.links, [self.P], [self.epoch, "1", *args[i : i + 4 * LINKS_PER_CALL]]
            )
            self.rt["background"] += 1
            self.cmds["background"] += 1

    async def background(self) -> None:
        """The timers of a node's space layer: renewals (lease/4), purges (grace/4, at least
        0.2 s) and, evicting by the policy, the floor's GET (each second)."""
        import trio

        sp = self.spec
        lease_s, grace_s = sp["lease_ms"] / 1000, sp["grace_ms"] / 1000
        timers = {"renew": lease_s / 4, "purge": max(0.2, grace_s / 4), "flush": 5.0}
        if sp["evict"] == "prefix":
            timers["floor"] = 1.0
        due = {k: trio.current_time() + v for k, v in timers.items()}
        while True:
            k = min(due, key=due.get)
            await trio.sleep_until(due[k])
            due[k] += timers[k]
            if k == "renew":
                await self.bg.eval(
                    SCRIPTS.renew, [self.P], [self.token, sp["lease_ms"], self.region]
                )
            elif k == "purge":
                await self.bg.eval(SCRIPTS.purge, [self.P], [self.epoch, 256])
            elif k == "flush":
                await self.flush_links()
                continue
            else:
                await self.bg.call("GET", self.P + "floor")
            self.rt["background"] += 1
            self.cmds["background"] += 1

    async def run(self, end: float) -> None:
        import trio

        async with trio.open_nursery() as outer:
            outer.start_soon(self.follow)
            outer.start_soon(self.background)
            async with trio.open_nursery() as w:
                for c in self.writers:
                    w.start_soon(self.write, c, end)
            await self.flush_links()  # as the daemons' phases end with a flush
            await trio.sleep(0.3)  # the other processes' last files
            last = await self.bg.call("XREVRANGE", self.P + "log", "+", "-", "COUNT", 1)
            self.target = stream_id(last[0][0]) if last else (0, 0)
            with trio.move_on_after(30):
                await self.caught_up.wait()
            outer.cancel_scope.cancel()
        try:
            await self.bg.eval(SCRIPTS.release, [self.P], [self.token, self.region])
        except Exception:  # noqa: BLE001 - it expires anyway
            pass


def gen_worker(spec: dict) -> int:
    import trio

    async def main() -> dict:
        vns = [VNode(v, spec) for v in spec["vnodes"]]
        for vn in vns:
            await vn.setup()
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = trio.current_time()
        end = t0 + spec["seconds"]
        at_end = []

        async def window_end():
            await trio.sleep_until(end)
            at_end.append(resource.getrusage(resource.RUSAGE_SELF))

        async with trio.open_nursery() as n:
            n.start_soon(window_end)
            for vn in vns:
                n.start_soon(vn.run, end)
        ru1 = resource.getrusage(resource.RUSAGE_SELF)

        def used(a, b):
            return (b.ru_utime - a.ru_utime) + (b.ru_stime - a.ru_stime)

        rt, cmds = collections.Counter(), collections.Counter()
        for vn in vns:
            rt.update(vn.rt)
            cmds.update(vn.cmds)
        return {
            "files": sum(v.files for v in vns),
            "late": sum(v.late for v in vns),
            "round_trips": dict(rt),
            "commands": dict(cmds),
            "entries": sum(v.entries for v in vns),
            "batches": sum(v.batches for v in vns),
            "rereads": sum(v.rereads for v in vns),
            "caught_up": all(v.caught_up.is_set() for v in vns),
            "cpu_s": used(ru0, ru1),
            "cpu_window_s": used(ru0, at_end[0]),
            "wall_s": trio.current_time() - t0,
        }

    out = trio.run(main)
    print(dumps(out), flush=True)  # to the coordinator (its provenance is harmless)
    return 0


def machine_cpu() -> tuple[int, int]:
    """(idle, total) jiffies of all CPUs so far, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[3] + v[4], sum(v[:8])


class StateSampler(threading.Thread):
    """Samples the state of Redis's main thread: R (on or waiting for a CPU), D (waiting on the
    disk: the AOF's fsync), S (idle in its event loop)."""

    def __init__(self, pid: int, hz: float = 500.0):
        super().__init__(daemon=True)
        self.path = f"/proc/{pid}/task/{pid}/stat"
        self.period = 1.0 / hz
        self.counts: collections.Counter = collections.Counter()
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                with open(self.path, "rb") as f:
                    self.counts[f.read().rsplit(b")", 1)[1].split()[0].decode()] += 1
            except OSError:
                return
            time.sleep(self.period)

    def stop(self) -> dict:
        self.stopped.set()
        self.join()
        total = max(1, sum(self.counts.values()))
        return {k: round(v / total, 4) for k, v in self.counts.items()}


async def _gen_setup(port: int, grace_ms: int) -> int:
    """An empty catalog (as `kvfs format` makes it) and one directory: its inode."""
    c = await RedisClient.connect(f"redis://127.0.0.1:{port}/0")
    P = f"kvfs:{{{GEN_POOL}}}:"
    now = time.time_ns()
    root = [
        b"p",
        1,
        b"n",
        b"",
        b"c",
        0,
        b"m",
        stat_mod.S_IFDIR | 0o755,
        b"u",
        0,
        b"g",
        0,
        b"a",
        now,
        b"t",
        now,
        b"k",
        now,
        b"d",
        1,
    ]
    await c.eval(SCRIPTS.init, [P], [uuid.uuid4().hex, SCHEMA_VERSION, *root])
    epoch = await c.call("INCR", P + "epoch")
    ino = (epoch << EPOCH_SHIFT) | 1
    d = Node(ino, 1, b"d", stat_mod.S_IFDIR | 0o755, 0, 0, now, now, now, cookie=ino, children={})
    await c.eval(
        SCRIPTS.mknode,
        [P],
        [epoch, ino, 1, b"d", "excl", grace_ms, now, *node_fields(d)],
    )
    for text in SCRIPTS.all().values():
        await c.call("SCRIPT", "LOAD", text)
    await c.aclose()
    return ino


def gen_step(
    redis: RedisServer, sync: Sync, base_spec: dict, nodes: int, conns: int, depth: int, procs: int
) -> dict:
    procs = max(1, min(procs, nodes))
    workers = []
    try:
        for p in range(procs):
            spec = dict(
                base_spec, vnodes=list(range(p, nodes, procs)), all=nodes, conns=conns, depth=depth
            )
            workers.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--gen-worker", json.dumps(spec)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        for w in workers:
            line = w.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"a generator worker failed to start ({line!r})")
        s0 = sync.info()
        calls0 = sync.calls
        sampler = StateSampler(redis.proc.pid)
        cpu0 = machine_cpu()
        t0 = time.monotonic()
        sampler.start()
        for w in workers:
            w.stdin.write("go\n")
            w.stdin.flush()
        # the writers' window: shares of CPU and of the disk are taken over it; the costs per
        # file over it and the followers' catching up after it
        time.sleep(max(0.0, t0 + base_spec["seconds"] - time.monotonic()))
        mid = sync.info()
        wall = time.monotonic() - t0
        states = sampler.stop()
        cpu1 = machine_cpu()
        outs = []
        for w in workers:
            out, _ = w.communicate(timeout=base_spec["seconds"] + 120)
            if w.returncode != 0:
                raise RuntimeError(f"a generator worker failed (status {w.returncode})")
            outs.append(json.loads(out.strip().splitlines()[-1]))
        s1 = sync.info()
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()

    def f(info, k):
        return float(info.get(k, 0.0))

    main_keys = ("used_cpu_sys_main_thread", "used_cpu_user_main_thread")
    main = sum(f(s1, k) - f(s0, k) for k in main_keys)
    cpu = sum(f(s1, k) - f(s0, k) for k in ("used_cpu_sys", "used_cpu_user"))
    main_window = sum(f(mid, k) - f(s0, k) for k in main_keys)
    cpu_window = sum(f(mid, k) - f(s0, k) for k in ("used_cpu_sys", "used_cpu_user"))
    idle = (cpu1[0] - cpu0[0]) / max(1, cpu1[1] - cpu0[1])
    cmds = {}
    for name, (calls, _) in s1["cmds"].items():
        c = calls - s0["cmds"].get(name, (0, 0.0))[0]
        if c and name.split("|")[0] not in BENCH_COMMANDS:
            cmds[name] = c
    files = sum(o["files"] for o in outs)
    # costs are per file Redis stored: those done in the window and those still in flight at
    # its end (which Redis ran too); the rate counts the window's
    total = files + sum(o["late"] for o in outs)
    secs = base_spec["seconds"]
    rt, gcmds = collections.Counter(), collections.Counter()
    for o in outs:
        rt.update(o["round_trips"])
        gcmds.update(o["commands"])
    gen_cpu = sum(o["cpu_window_s"] for o in outs)
    ncpu = os.cpu_count() or 1
    main_share = main_window / wall
    disk = states.get("D", 0.0)
    busy = main_share + disk
    gen_share = gen_cpu / wall
    if busy >= 0.85:
        limit = "redis"
    elif gen_share >= 0.85 * max(0.5, ncpu - cpu_window / wall):
        limit = "generator"
    elif idle < 0.1:
        limit = "machine CPU (generator and other processes)"
    else:
        limit = "neither (more concurrency needed)"
    fl = max(1, total)
    return {
        "nodes": nodes,
        "conns_per_node": conns,
        "depth": depth,
        "procs": procs,
        "files": files,
        "files_total": total,
        "files_per_s": round(files / secs, 1),
        "seconds": secs,
        "window_s": round(wall, 3),
        "redis_cpu_main_share": round(main_share, 3),
        "redis_cpu_share": round(cpu_window / wall, 3),
        "machine_idle_share": round(idle, 3),
        "redis_disk_wait_share": round(disk, 3),
        "redis_busy_share": round(busy, 3),
        "redis_thread_states": states,
        "generator_cpu_share": round(gen_share, 3),
        "limit": limit,
        "cpu_main_s_per_1000_files": round(1000 * main / fl, 4),
        "cpu_s_per_1000_files": round(1000 * cpu / fl, 4),
        "busy_s_per_1000_files": round(1000 * (main_window + disk * wall) / max(1, files), 4),
        # what Redis holds more per stored file: its records and its share of the change
        # log's entries (the log is capped at LOG_MAXLEN entries, which these steps never reach)
        "redis_memory_bytes_per_file": round(
            (int(s1.get("used_memory", 0)) - int(s0.get("used_memory", 0))) / fl
        ),
        "commands_per_file": round(sum(cmds.values()) / fl, 3),
        "commands_per_file_by_name": {
            k: round(v / fl, 3) for k, v in sorted(cmds.items(), key=lambda kv: -kv[1])
        },
        "round_trips_per_file": {k: round(v / fl, 3) for k, v in rt.items()},
        "sent_per_file": {k: round(v / fl, 3) for k, v in gcmds.items()},
        "follower_entries_per_file": round(sum(o["entries"] for o in outs) / fl, 3),
        "follower_batches": sum(o["batches"] for o in outs),
        "follower_rereads": sum(o["rereads"] for o in outs),
        "followers_caught_up": all(o["caught_up"] for o in outs),
        "redis_read_events_per_file": round(
            (
                int(s1["total_reads_processed"])
                - int(s0["total_reads_processed"])
                - (sync.calls - calls0)
            )
            / fl,
            3,
        ),
    }


def run_generator(tmp: Path, args, say) -> dict:
    steps = [tuple(int(x) for x in s.lower().split("x")) for s in args.gen_steps.split(",")]
    counts = [int(x) for x in args.gen_nodes.split(",")]
    region_size = 64 * MiB
    out = {"steps": steps, "node_counts": counts, "runs": []}
    modes = [("always", steps)]
    if not args.no_everysec:
        modes.append(("everysec", steps[-1:]))
    for mode, msteps in modes:
        extra = ["--auto-aof-rewrite-percentage", "0"]
        if mode != "always":
            extra += ["--appendfsync", mode]
        if args.gen_prefill:
            extra += ["--enable-debug-command", "yes"]
        redis = RedisServer(tmp / f"gen-redis-{mode}", args=extra).start()
        sync = replica = None
        try:
            sync = Sync(redis.port)
            if args.gen_prefill:
                sync.call("DEBUG", "POPULATE", args.gen_prefill, "kvfs:prefill:", 100)
            got = sync.call("CONFIG", "GET", "appendfsync")
            if got[1].decode() != mode:
                raise RuntimeError(f"redis-server runs with appendfsync {got[1]!r}, not {mode}")
            import trio

            dir_ino = trio.run(_gen_setup, redis.port, int(args.grace * 1000))
            base = {
                "port": redis.port,
                "name": GEN_POOL,
                "dir": dir_ino,
                "shas": {k: hashlib.sha1(v.encode()).hexdigest() for k, v in SCRIPTS.all().items()},
                "file_size": args.file_size,
                "region_size": region_size,
                "lease_ms": int(args.lease * 1000),
                "grace_ms": int(args.grace * 1000),
                "evict": args.evict,
                "durability": args.durability,
                "seconds": args.gen_seconds,
            }
            plans = [(None, nodes, step) for nodes in counts for step in msteps]
            if args.gen_replica and mode == "always":
                # the followers on a replica of the master ([cluster] follow_replicas): the
                # master's CPU per file is then the writers', its replication stream and the
                # background, measured, not fitted; at the depths the model takes for 300 and
                # 2,000 files/s (kvfs_depth), the step with the most connections
                replica = RedisServer(
                    tmp / "gen-redis-replica", args=["--replicaof", "127.0.0.1", str(redis.port)]
                ).start()
                wait_until(
                    lambda: b"master_link_status:up" in _ask(replica.port, "INFO", "replication"),
                    30,
                    "the replica in sync",
                )
                depths = {kvfs_depth(args, 300), kvfs_depth(args, 2000)}
                for d in sorted(depths):
                    at = [st for st in msteps if st[1] == d]
                    if at:
                        plans += [(replica.port, nodes, max(at)) for nodes in counts]
            for follow_port, nodes, (conns, depth) in plans:
                spec = dict(base, follow_port=follow_port)
                r = gen_step(redis, sync, spec, nodes, conns, depth, args.gen_procs)
                r["appendfsync"] = mode
                r["followers"] = "replica" if follow_port else "master"
                out["runs"].append(r)
                say(
                    f"generator ({mode}) {nodes} nodes {conns}x{depth}"
                    f"{', followers on a replica' if follow_port else ''}: "
                    f"{r['files_per_s']:.0f} files/s, Redis main thread "
                    f"{r['redis_cpu_main_share']:.0%} CPU + {r['redis_disk_wait_share']:.0%} "
                    f"disk, generator {r['generator_cpu_share']:.0%}: limit {r['limit']}"
                )
        finally:
            if sync is not None:
                sync.close()
            if replica is not None:
                replica.stop()
            redis.stop()
    return out


# ------------------------------------------------------------------------------------------------
# Phase 4: capacity


def kvfs_depth(args, rate: float) -> int:
    """Files per publish of a kvfs node storing `rate` files/s: with durability "close" one
    (each close publishes its file); with "fsync" its write-back's publish, which takes what
    was closed within `writeback_ms` up to BATCH_FILES files and BATCH_BYTES bytes a batch,
    and in a shared pool batches started early by their bytes together, up to GROUP_FILES
    (kvfs/write/writeback.py): at 300 files/s, LMCache's 32 MiB chunks, 2 files a batch (the
    bytes cap) and 27 a publish: the group goes when its oldest file has waited
    `writeback_ms` (100 ms) since its close, and holds the batches written by then, those
    closed in the first 91 ms (a batch's 64 MiB take 9 ms on a 7 GB/s drive); the default
    steps measure that depth (16 was taken before); at 2,000 files/s, 200 closed
    within 100 ms, a batch starts at BATCH_FILES (64) files or, of 2 MiB blocks, at 32, and
    the group publishes GROUP_FILES (64) at a time. `--depth-at-300 2` gives the figure
    before the grouping (c740a0e)."""
    if args.durability == "close":
        return 1
    return {300: args.depth_at_300}.get(int(rate), GROUP_FILES)


def nodes_carried(rate: float, a: float, b: float, bg: float, budget: float = 1.0) -> int:
    """The most nodes storing `rate` files/s each that one Redis core carries within
    `budget`: a stored file costs a + b (N - 1) seconds of its CPU with N nodes, and each
    node `bg` seconds per second in the background."""
    n = 0
    while n < 100_000 and rate * (n + 1) * (a + b * n) + (n + 1) * bg <= budget:
        n += 1
    return n


def capacity(gen: dict | None, daemons: dict | None, args) -> dict:
    rate, margin = args.rate, args.margin
    bg = 0.0
    if daemons is not None:
        bg = daemons["background"]["redis_cpu_ms_per_node_s"] / 1000
    out: dict = {
        "rate_files_per_s_per_node": rate,
        "margin": margin,
        "background_cpu_s_per_node_s": round(bg, 6),
    }

    if daemons is not None and daemons["cpu"]["saturation_files_per_s"]:
        cpu = daemons["cpu"]
        out["plain_from_daemons"] = {
            "nodes": args.nodes,
            "saturation_files_per_s": cpu["saturation_files_per_s"],
            "nodes_at_rate": cpu["nodes_at_rate"],
            "nodes_at_margin": cpu["nodes_at_rate_margin"],
        }
    if gen is not None:

        def best_at(depth: int) -> dict:
            """node count -> the fastest step with `depth` files per round trip."""
            best = {}
            for r in gen["runs"]:
                if r["appendfsync"] != "always" or r["depth"] != depth or not r["files"]:
                    continue
                if r.get("followers", "master") != "master":
                    continue
                if r["nodes"] not in best or r["files_per_s"] > best[r["nodes"]]["files_per_s"]:
                    best[r["nodes"]] = r
            return best

        depth = kvfs_depth(args, rate)
        out["depth_at_rate"] = depth
        best = best_at(depth)
        top = {}
        for r in gen["runs"]:
            if (
                r["appendfsync"] == "always"
                and r.get("followers", "master") == "master"
                and r["files"]
                and (r["nodes"] not in top or r["files_per_s"] > top[r["nodes"]]["files_per_s"])
            ):
                top[r["nodes"]] = r
        out["generator_points"] = [
            {
                "nodes": n,
                "conns_per_node": r["conns_per_node"],
                "depth": r["depth"],
                "files_per_s": r["files_per_s"],
                "limit": r["limit"],
                "cpu_main_s_per_1000_files": r["cpu_main_s_per_1000_files"],
                "busy_s_per_1000_files": r["busy_s_per_1000_files"],
                "derived_saturation_files_per_s": round(1000 / r["cpu_main_s_per_1000_files"])
                if r["cpu_main_s_per_1000_files"]
                else None,
                "redis_busy_share": r["redis_busy_share"],
                "commands_per_file": r["commands_per_file"],
                "follower_reads_per_batch": round(
                    1 + r["follower_rereads"] / max(1, r["follower_batches"]), 2
                ),
            }
            for n, r in sorted(best.items())
        ]
        out["generator_fastest"] = [
            {
                "nodes": n,
                "conns_per_node": r["conns_per_node"],
                "depth": r["depth"],
                "files_per_s": r["files_per_s"],
                "limit": r["limit"],
                "redis_busy_share": r["redis_busy_share"],
                "measured_saturation": r["limit"] == "redis",
            }
            for n, r in sorted(top.items())
        ]
        out["model_by_depth"] = {}
        for d in sorted({r["depth"] for r in gen["runs"]}):
            pts = sorted(best_at(d).items())
            if len(pts) >= 2:
                (n1, r1), (n2, r2) = pts[0], pts[-1]
                c1, c2 = (
                    r1["cpu_main_s_per_1000_files"] / 1000,
                    r2["cpu_main_s_per_1000_files"] / 1000,
                )
                b = max(0.0, (c2 - c1) / (n2 - n1))
                out["model_by_depth"][d] = {
                    "writer_ms_per_file": round(1000 * max(0.0, c1 - b * (n1 - 1)), 4),
                    "follower_ms_per_file_per_node": round(1000 * b, 4),
                    "fitted_on_nodes": [n1, n2],
                }
        # the followers on a replica (`--gen-replica`): the master's cost per file measured at
        # each node count, fitted as above (its slope the part that still grows with the
        # nodes: none is expected)
        out["replica_followers_by_depth"] = {}
        for d in sorted({r["depth"] for r in gen["runs"] if r.get("followers") == "replica"}):
            pts = sorted(
                (r["nodes"], r["cpu_main_s_per_1000_files"] / 1000)
                for r in gen["runs"]
                if r.get("followers") == "replica" and r["depth"] == d and r["files"]
            )
            if len(pts) >= 2:
                (n1, c1), (n2, c2) = pts[0], pts[-1]
                b = max(0.0, (c2 - c1) / (n2 - n1))
                out["replica_followers_by_depth"][d] = {
                    "master_ms_per_file": [round(1000 * c, 4) for _, c in pts],
                    "writer_ms_per_file": round(1000 * max(0.0, c1 - b * (n1 - 1)), 4),
                    "growth_ms_per_file_per_node": round(1000 * b, 4),
                    "measured_on_nodes": [n for n, _ in pts],
                }
        pts = sorted(best.items())
        if len(pts) >= 2:
            (n1, r1), (n2, r2) = pts[0], pts[-1]
            for name, key in (
                ("model", "cpu_main_s_per_1000_files"),
                ("model_with_fsync_waits", "busy_s_per_1000_files"),
            ):
                c1, c2 = r1[key] / 1000, r2[key] / 1000
                b = max(0.0, (c2 - c1) / (n2 - n1))
                a = max(0.0, c1 - b * (n1 - 1))
                out[name] = {
                    "depth": depth,
                    "writer_ms_per_file": round(1000 * a, 4),
                    "follower_ms_per_file_per_node": round(1000 * b, 4),
                    "fitted_on_nodes": [n1, n2],
                    "nodes_carried": nodes_carried(rate, a, b, bg),
                    "nodes_carried_at_margin": nodes_carried(rate, a, b, bg, margin),
                }
            m = out["model"]
            out["below_64_nodes"] = m["nodes_carried"] < 64
            out["statement"] = (
                f"One Redis carries about {m['nodes_carried']} nodes storing {rate:g} files/s "
                f"each ({m['nodes_carried_at_margin']} at {margin:.0%} of its core)"
                + (": below 64 nodes." if m["nodes_carried"] < 64 else ".")
            )
        if args.nodes in best:
            r = best[args.nodes]
            sat = 1000 / r["cpu_main_s_per_1000_files"] if r["cpu_main_s_per_1000_files"] else 0
            out["plain_from_generator"] = {
                "nodes": args.nodes,
                "derived_saturation_files_per_s": round(sat),
                "nodes_at_rate": round(sat / rate, 2),
                "nodes_at_margin": round(margin * sat / rate, 2),
            }
    if "statement" not in out:  # no model (one node count): the plain figure
        plain = out.get("plain_from_generator") or out.get("plain_from_daemons")
        if plain is not None:
            out["below_64_nodes"] = plain["nodes_at_rate"] < 64
            out["statement"] = (
                f"One Redis carries about {plain['nodes_at_rate']:g} nodes storing {rate:g} "
                f"files/s each ({plain['nodes_at_margin']:g} at {margin:.0%} of its core; the "
                f"cost of following grows with the nodes, so fewer)"
                + (": below 64 nodes." if plain["nodes_at_rate"] < 64 else ".")
            )
    return out


def headline(daemons: dict | None, cap: dict, args) -> dict:
    """The figures to hold against the targets (issue 46), at the top of the JSON: per stored
    file, every node's work counted (commands Redis ran, round trips of the writing node and
    of every follower, Redis's main-thread CPU), and the nodes one Redis carries at 2,000 and
    at 300 stored files/s per node (LMCache's 32 MiB chunks on one 7 GB/s drive), from the
    generator's fitted model (else the daemons' single point)."""
    out: dict = {}
    if daemons is not None:
        st = daemons["store"]
        out["redis_commands_per_stored_file"] = st.get("commands")
        out["round_trips_per_stored_file"] = st.get("round_trips_with_followers")
        out["redis_cpu_ms_per_stored_file"] = st.get("redis_cpu_main_ms")
    bg = cap.get("background_cpu_s_per_node_s", 0.0)
    for rate in (2000, 300):
        key = f"nodes_per_redis_at_{rate}_files_s"
        model = cap.get("model_by_depth", {}).get(kvfs_depth(args, rate))
        if model is not None:
            a = model["writer_ms_per_file"] / 1000
            b = model["follower_ms_per_file_per_node"] / 1000
            out[key] = nodes_carried(rate, a, b, bg)
            # ([cluster] follow_replicas) the followers' reads on replicas: the master pays
            # the writers' part alone (and the background): measured with the followers on a
            # replica where the generator ran so (its replication stream included), else the
            # writers' part of the fit above
            rep = cap.get("replica_followers_by_depth", {}).get(kvfs_depth(args, rate))
            if rep is not None:
                ra = rep["writer_ms_per_file"] / 1000
                rb = rep["growth_ms_per_file_per_node"] / 1000
                out[f"{key}_followers_on_replicas"] = nodes_carried(rate, ra, rb, bg)
                out[f"{key}_followers_on_replicas_from"] = "measured"
            else:
                out[f"{key}_followers_on_replicas"] = nodes_carried(rate, a, 0.0, bg)
                out[f"{key}_followers_on_replicas_from"] = "fitted"
        elif daemons is not None and daemons["cpu"]["saturation_files_per_s"]:
            out[key] = round(daemons["cpu"]["saturation_files_per_s"] / rate, 2)
    return out


# ------------------------------------------------------------------------------------------------
# Report


def table(out: dict) -> None:
    d = out.get("daemons")
    if d is not None:
        s = d["summary"]
        print(
            f"Redis traffic per file operation: {d['nodes']} kvfs nodes, one redis-server "
            f"(appendfsync always), {out['file_size'] // 1024} KiB files, "
            f'evict = "{out["evict"]}"'
        )
        print(
            f"{'operation':<13}{'ops':>6}{'cmds':>8}{'EVALSHA':>9}{'in Lua':>8}{'direct':>8}"
            f"{'follower':>9}{'rt node':>8}{'rt all':>8}{'CPU ms':>8}"
        )
        for name, label in (
            ("store", "store"),
            ("lookup_hit", "lookup hit"),
            ("lookup_miss", "lookup miss"),
            ("evict", "evict (all)"),
        ):
            o = s[name]
            ops = d["phases"][name]["ops"]
            print(
                f"{label:<13}{ops:>6}{o.get('commands', 0):>8.2f}{o.get('evalsha', 0):>9.2f}"
                f"{o.get('in_scripts', float('nan')):>8.2f}"
                f"{o.get('direct_commands', float('nan')):>8.2f}"
                f"{o.get('follower_commands', float('nan')):>9.2f}"
                f"{o.get('round_trips', 0):>8.2f}{o.get('round_trips_all', float('nan')):>8.2f}"
                f"{o.get('redis_cpu_main_ms', 0):>8.3f}"
            )
        if "evict_own" in s:
            o = s["evict_own"]
            print(
                f"{'evict (own)':<13}{'':>6}{o['commands']:>8.2f}{'':>9}{'':>8}{'':>8}{'':>9}"
                f"{o['round_trips']:>8.2f}{'':>8}{o['redis_cpu_main_ms']:>8.3f}"
            )
        print(
            "  cmds: Redis commands (commandstats, Lua's inside included); direct: sent by the "
            "nodes; follower: of those, by the followers; rt node: the nodes' redis_calls "
            "(no follower); rt all: the proxy's count; CPU: Redis main thread"
        )
        for name in ("store", "lookup_miss", "evict"):
            o = s[name]
            top = ", ".join(f"{k} {v:g}" for k, v in list(o["by_name"].items())[:10])
            print(f"  {name} by name: {top}")
            if "evalsha_by_script" in o:
                print(
                    f"  {name} scripts: "
                    + ", ".join(f"{k} {v:g}" for k, v in o["evalsha_by_script"].items())
                )
        if "evict_own" in s:
            top = ", ".join(f"{k} {v:g}" for k, v in list(s["evict_own"]["by_name"].items())[:10])
            print(f"  evict (own) by name: {top}")
        bg = s["background"]
        print(
            f"background, per node per second (idle): {bg['commands_per_node_s']:g} commands, "
            f"{bg['round_trips_per_node_s']:g} round trips (node), "
            f"{bg.get('round_trips_all_per_node_s', float('nan')):g} (all), "
            f"{bg['redis_cpu_ms_per_node_s']:g} ms Redis CPU"
        )
        if "evalsha_by_script_per_node_s" in bg:
            print(
                "  scripts: "
                + ", ".join(f"{k} {v:g}" for k, v in bg["evalsha_by_script_per_node_s"].items())
                + "; follower: "
                + ", ".join(f"{k} {v:g}" for k, v in bg["follower_per_node_s"].items())
            )
        c = s["cpu"]
        print(
            f"Redis CPU per 1,000 stored files: {c['cpu_s_per_1000_files']:.3f} CPU-s "
            f"(main thread {c['cpu_main_s_per_1000_files']:.3f}); one core saturates at "
            f"{c['saturation_files_per_s']} files/s (derived from CPU: Redis runs commands on "
            f"one thread; fsync waits not included)"
        )
    g = out.get("generator")
    if g is not None:
        print("\nload generator (per-file command stream of N nodes, replayed)")
        print(
            f"{'fsync':<9}{'nodes':>6}{'CxD':>7}{'files/s':>9}{'CPU':>6}{'disk':>6}{'gen':>6}"
            f"{'ms/file':>9}{'cmds/f':>8}  limit"
        )
        for r in g["runs"]:
            cxd = f"{r['conns_per_node']}x{r['depth']}"
            print(
                f"{r['appendfsync']:<9}{r['nodes']:>6}{cxd:>7}"
                f"{r['files_per_s']:>9.0f}{r['redis_cpu_main_share']:>6.0%}"
                f"{r['redis_disk_wait_share']:>6.0%}{r['generator_cpu_share']:>6.0%}"
                f"{r['cpu_main_s_per_1000_files']:>9.4f}{r['commands_per_file']:>8.2f}  "
                f"{r['limit']}"
            )
        print(
            "  CPU: Redis main thread's share of a core; disk: share of samples it waited on "
            "the disk (fsync); gen: the generator's CPU (cores); ms/file: Redis main-thread "
            "CPU per file"
        )
    c = out["capacity"]
    print(f"\ncapacity at {c['rate_files_per_s_per_node']:g} stored files/s per node")
    for k in ("plain_from_daemons", "plain_from_generator"):
        if k in c:
            p = c[k]
            sat = p.get("saturation_files_per_s", p.get("derived_saturation_files_per_s"))
            print(
                f"  {k}: saturation {sat} files/s at {p['nodes']} nodes -> {p['nodes_at_rate']} "
                f"nodes ({p['nodes_at_margin']} at {c['margin']:.0%})"
            )
    for k, what in (("model", "CPU"), ("model_with_fsync_waits", "CPU + fsync waits")):
        if k in c:
            m = c[k]
            print(
                f"  {k} ({what}): {m['writer_ms_per_file']} ms + "
                f"{m['follower_ms_per_file_per_node']} ms per following node, per file -> "
                f"{m['nodes_carried']} nodes ({m['nodes_carried_at_margin']} at "
                f"{c['margin']:.0%})"
            )
    if "statement" in c:
        print(f"  {c['statement']}")
    sh = out.get("shards")
    if sh:
        print("More than one Redis (bench/redis_shards.py's rounds, the same nodes):")
        for r in sh["rounds"]:
            print(
                f"  {r['shards']} shard(s): {r['redis_cpu_ms_per_stored_file']} ms of Redis CPU "
                f"per stored file, commands per shard {r['command_share']}"
            )
        if "cpu_ratio_3_vs_1" in sh:
            print(f"  3 shards over 1: {sh['cpu_ratio_3_vs_1']}x the Redis CPU per stored file")


def run_shards(args, say) -> dict:
    """The same nodes' stores with the catalog over 1 and over 3 Redis shards, side by side
    (bench/redis_shards.py's rounds: the files in 240 directories, a directory's files in its
    shard): each shard's share of the commands, Redis CPU per stored file in all of them;
    the nodes' `writeback_ms` is --shards-writeback-ms (publishes of a rack's size) and
    their DRAM tier 1 GiB."""
    from bench import redis_shards

    sargs = argparse.Namespace(
        nodes=args.nodes,
        threads=args.threads,
        files=args.shards_files,
        file_size=args.file_size,
        dirs=240,
        idle=3.0,
        ns_size="256MiB",
        # (the embedded default's DRAM tier: its dirty limit, a quarter, holds a group of
        # batches of 64 files per shard)
        dram="1GiB",
        durability=args.durability,
        appendfsync="always",
        rate=0.0,
        writeback_ms=args.shards_writeback_ms,
        repeats=args.shards_repeats,
    )
    plan = [(int(x), None) for x in args.shards.split(",")]
    return redis_shards.compare(redis_shards.run_rounds(plan, sargs, say))


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--gen-worker"]:
        return gen_worker(json.loads(argv[1]))
    ap = parser(__doc__)
    ap.add_argument("--nodes", type=int, default=4, help="kvfs daemons (2-16)")
    ap.add_argument("--threads", type=int, default=2, help="writer threads per node")
    ap.add_argument("--files", type=int, default=500, help="files each node stores")
    ap.add_argument("--file-size", type=parse_size, default="64KiB")
    ap.add_argument("--lookups", type=int, default=250, help="stats per node, hits and misses each")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of the idle phase")
    ap.add_argument(
        "--evict-files", type=int, default=250, help="files per node stored in the eviction window"
    )
    ap.add_argument(
        "--ns-size",
        type=parse_size,
        default=0,
        help="size of each of the 3 namespace files (default: the stores fill 2/3)",
    )
    ap.add_argument("--regions", type=int, default=16)
    ap.add_argument("--grace", type=float, default=1.0, help="[cluster] grace_seconds")
    ap.add_argument("--lease", type=float, default=2.0, help="[cluster] lease_seconds")
    ap.add_argument("--evict", default="prefix", choices=("prefix", "lru"), help="[pool] evict")
    ap.add_argument(
        "--durability",
        default="fsync",
        choices=("fsync", "close"),
        help="[mount] durability of the nodes (and the generator's shape)",
    )
    ap.add_argument("--dram", default="64MiB", help="each node's DRAM tier")
    ap.add_argument(
        "--no-proxy",
        action="store_true",
        help="nodes talk to Redis directly (no split of direct/in-script commands)",
    )
    ap.add_argument(
        "--gen-nodes",
        default=None,
        help="virtual node counts of the generator (default: --nodes,16)",
    )
    ap.add_argument("--gen-procs", type=int, default=2, help="generator processes")
    ap.add_argument(
        "--gen-prefill",
        type=int,
        default=0,
        help="string keys put in the generator's Redis before its steps (DEBUG POPULATE): the "
        "keyspace of a pool that holds files already",
    )
    ap.add_argument(
        "--no-gen-replica",
        dest="gen_replica",
        action="store_false",
        help="skip the generator's steps with the followers on a replica (the master's cost "
        "per file under [cluster] follow_replicas, measured)",
    )
    ap.add_argument(
        "--gen-steps",
        default=None,
        help="CxD: connections per virtual node x files per round trip (default: "
        '"1x1,4x1,16x1,16x16" with close, "1x2,4x2,1x16,4x16,4x27,4x64" with fsync)',
    )
    ap.add_argument("--gen-seconds", type=float, default=3.0, help="seconds per generator step")
    ap.add_argument("--no-everysec", action="store_true", help="skip the appendfsync everysec run")
    ap.add_argument("--no-daemons", action="store_true", help="the generator only")
    ap.add_argument("--no-generator", action="store_true", help="the daemons only")
    ap.add_argument("--rate", type=float, default=2000.0, help="stored files/s per node")
    ap.add_argument("--margin", type=float, default=0.7, help="share of Redis's core to plan for")
    ap.add_argument(
        "--depth-at-300",
        type=int,
        default=27,
        help="files per publish taken for a node storing 300 files/s (LMCache's 32 MiB chunks: "
        "the write-back's group, kvfs_depth: 27; 2 before c740a0e; 16 taken before 2026-12-05)",
    )
    ap.add_argument(
        "--shards",
        default="1,3",
        help="also store with the catalog over these shard counts ('' to skip; "
        "bench/redis_shards.py)",
    )
    ap.add_argument(
        "--shards-writeback-ms",
        type=int,
        default=400,
        help="[mount] writeback_ms of the shard comparison's nodes: the files a node closes "
        "within it are what a node storing 2,000 files/s closes within the default 100 ms "
        "(here 4 nodes on 2 cores store about 600 files/s each), so each publish, and each "
        "shard's part of it, has the size it has in a rack at the target rate (0: the "
        "default, this machine's rate)",
    )
    ap.add_argument(
        "--shards-files",
        type=int,
        default=1500,
        help="files each node stores in the shard comparison (at 500, a node's last group, "
        "published at the end of its stores, is a third of its publishes)",
    )
    ap.add_argument(
        "--shards-repeats",
        type=int,
        default=3,
        help="times the shard comparison runs (interleaved; its ratios are the medians)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if not 1 <= args.nodes <= 16:
        ap.error("--nodes must be 1-16")
    if args.gen_steps is None:
        args.gen_steps = (
            "1x1,4x1,16x1,16x16" if args.durability == "close" else "1x2,4x2,1x16,4x16,4x27,4x64"
        )
    if args.gen_nodes is None:
        args.gen_nodes = f"{args.nodes},16" if args.nodes < 16 else "8,16"
    if shutil.which("redis-server") is None:
        print("bench/redis_scale.py: needs redis-server", file=sys.stderr)
        return 2
    if not args.no_daemons and (os.geteuid() != 0 or not os.path.exists("/dev/fuse")):
        print("bench/redis_scale.py: needs root and /dev/fuse (or --no-daemons)", file=sys.stderr)
        return 2

    def say(msg: str) -> None:
        print(f"[redis_scale] {msg}", file=sys.stderr, flush=True)

    out: dict = {
        "nodes": args.nodes,
        "threads": args.threads,
        "files_per_node": args.files,
        "file_size": args.file_size,
        "evict": args.evict,
        "durability": args.durability,
        "grace_seconds": args.grace,
        "lease_seconds": args.lease,
        "regions": args.regions,
        "cpus": os.cpu_count(),
        "proxy": not args.no_proxy,
        "redis_version": subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True
        ).stdout.strip(),
    }
    with tempfile.TemporaryDirectory(prefix="kvfs-redis-scale-", dir="/var/tmp") as tmp:
        tmp = Path(tmp)
        daemons = None
        if not args.no_daemons:
            res = run_daemons(tmp, args, say)
            res["summary"] = summarize_daemons(res, args)
            out["daemons"] = res
            daemons = res["summary"]
        gen = None
        if not args.no_generator:
            gen = run_generator(tmp, args, say)
            out["generator"] = gen
        if args.shards and not args.no_daemons:
            out["shards"] = {
                **run_shards(args, say),
                "writeback_ms": args.shards_writeback_ms,
                "dram": "1GiB",
                "files_per_node": args.shards_files,
            }
    out["capacity"] = capacity(gen, daemons, args)
    out.update(headline(daemons, out["capacity"], args))
    if "shards" in out:
        out.update(
            {
                k: out["shards"][k]
                for k in ("cpu_ratio_3_vs_1", "share_range_3")
                if k in out["shards"]
            }
        )
    if args.json:
        print(dumps(out))
    else:
        table(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
