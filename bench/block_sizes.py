#!/usr/bin/env python3
"""Block sizes: KV blocks one file each, stored, stat'ed and loaded through plain POSIX calls, on
kvfs over 4 loop namespaces against what a user would build instead, side by side: ext4 on a
RAID-0 of 4 such devices (`raid0`; testing/emulate.py's ext4_on_raid0: dm-stripe where the
kernel has device-mapper, else a stand-in, ext4 on one device at 4x the per-device limit, as
the JSON's "raid0" says), and ext4 on one loop device (what a node without striping gets).

This is what vLLM's fs tier, SGLang's HiCacheFile and NIXL's POSIX backend do: a file per block.
For each block size (about --total-mib MiB of blocks, at most --max-files files) and each device
speed (unthrottled, and --bps bytes/s per device, read and write, by a cgroup throttle):

  store   --threads threads each open(O_CREAT|O_TRUNC|O_WRONLY), write the whole block, close.
          On kvfs (durability "fsync", the default) the block is in DRAM when close returns
          and durable within writeback_ms, as on ext4 it is in the page cache
          (KVFS_TEST_DURABILITY=close: durable when close returns).
          Throttled, each ext4 (and RAID-0) writer also fsyncs each file before closing it
          (durable at close, as on kvfs): the page cache's writeback is not throttled by a
          cgroup v1 limit (the flusher threads are outside the cgroup), so without it ext4's
          store would never meet the device's limit; unthrottled it does not.
  stat    every name stat'ed (--threads threads) after the kernel dropped its dentries and
          inodes (and, on kvfs, kvfs's DRAM tier)
  load    every file opened, read whole and compared with what was stored (--threads
          threads), cold: page cache (and kvfs's DRAM tier) dropped first

Both file systems run on loop devices over files on one tmpfs, with the same page size and the
same statistic (files per second of the whole phase, wall clock); in each round the order of the
two alternates, and the ratios (kvfs files/s over ext4 files/s) are medians over --rounds
rounds. For kvfs the table also gives the daemon's CPU time per file and the FUSE requests per
file of each phase (from its statistics), the per-file budget of docs/architecture.md.

    python bench/block_sizes.py [--sizes 256K,1M,4M,32M] [--rounds 1] [--bps 1e9]
                                [--speeds fast,throttled] [--floor] [--json]

With --floor the same phases also run (unthrottled) on bench/floorfs.py, pyfuse3 with
passthrough that keeps files in memory and does nothing else: the floor of kvfs's stack. Keys
`<size>_<op>_floor_vs_ext4` and `<size>_<op>_vs_floor` (kvfs over the floor) split the gap to
ext4 into the stack's part and kvfs's own (docs/architecture.md, "The floor of the stack").

Keys of --json: `<size>_<op>_vs_ext4` and `<size>_<op>_vs_raid0` (unthrottled) and
`gbps<N>_<size>_<op>_vs_ext4` / `_vs_raid0` (throttled), with `<op>` store, stat or load;
`<size>_store_vs_ext4_fsync` against ext4 whose writers fsync before closing (durable at close,
as kvfs's are; unthrottled: an extra ext4 pass, the "(fsync)" column);
`<size>_<op>_ceiling_per_s`: 1 s over the trio thread's CPU per file (median, unthrottled),
files/s one mount cannot pass whatever the cores; `rows` has every measurement (`<op>_trio_us`:
the trio thread's share of `<op>_daemon_us`).

Every kvfs row has `<op>_busy`: each namespace's busy share of the phase (its io_ticks in
/sys/block over the phase's time). The daemon's CPU counts its I/O worker processes too.

With --inproc a second kvfs mount (`kvfs_inproc`, every speed) runs beside the first with
`[pool] io_workers = 0`: fetches on the daemon's own threads, as before the I/O worker
processes (kvfs/pool/io_workers.py). `<size>_<op>_vs_inproc` is the first's files/s over its
twin's, `<size>_<op>_{cpu,trio}_vs_inproc` the daemon CPU and the trio thread's per file.

With --split K a further kvfs set-up (`kvfs_split`, unthrottled) is K mounts side by side, each a
daemon over 4/K of the namespaces, the blocks dealt among them in turn: what K request threads
would give over the same devices on this machine (an upper bound for one daemon answering on K
threads: the mounts share nothing). Its CPU figures are the K daemons' summed, and
`<size>_<op>_split_vs_kvfs` is its files/s over the one mount's.

Every row has `<op>_machine_busy`: the share of all the machine's CPUs busy during the phase
(/proc/stat), whoever used them (clients, loop devices, daemons).

Every row also has `<op>_daemon_user_us`, the user part of `<op>_daemon_us`. (`--pure`, the
compiled build against its Python source, went with the compiled build: performance.md.)

With --events a second kvfs mount (`kvfs_events`, unthrottled) runs beside the first with KV
events on ([events], kvfs/events; a naming rule that makes every block file a block) and a
subscriber in this process: `<size>_store_events_cpu_vs_off` is its daemon CPU per stored file
over the first's (medians of the rounds; side by side, so as noisy as two mounts are),
`<size>_store_events_cpu_share` the share of the events mount's daemon CPU per stored file
spent announcing, measured inside it (the trio thread's time in the catalog's notes and the
publisher, and ZMQ's threads; issue 47 asks <= 0.03), and
`<size>_events_latency_p50_ms` / `_p99_ms` the time from a batch's commit (its `ts`) to its
arrival at the subscriber, over the rounds' stores and the unlinks after them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import threading
from pathlib import Path

import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import dumps, parse, parser  # noqa: E402
from bench.catalog_scale import parallel as per_second
from bench.floorfs import floor_mounted
from kvfs.events.subscriber import Subscriber
from testing.emulate import (
    Emulation,
    available,
    drop_kernel_caches,
    ext4_on_loop,
    ext4_on_raid0,
    kvfs_on_loops,
    throttled,
    warm_memory,
)
from testing.mount import cpu_seconds

MiB = 1 << 20
SIZES = {"256K": 256 << 10, "1M": MiB, "4M": 4 * MiB, "32M": 32 * MiB}
# KV events for the --events mount: every block file (Blocks.name) is a block, its number the
# hash (kvfs/events/naming.py)
EVENTS_PATTERN = r"d[0-9]{2}/block-(?P<hash>[0-9]{6})\.kv"


class EventLatency:
    """A subscriber thread: each batch's delay from its commit (`ts`) to its arrival."""

    def __init__(self, endpoint: str):
        self.sub = Subscriber(endpoint)
        self.delays: list[float] = []
        self.events = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import time

        while not self._stop.is_set():
            got = self.sub.receive(0.2)
            if got is not None:
                self.delays.append(time.time() - got[2].ts)
                self.events += len(got[2].events)

    def take(self) -> dict:
        """What arrived since the last call: batches, events, delay p50/p99/max (ms)."""
        d, self.delays = sorted(self.delays), []
        n, self.events = self.events, 0
        if not d:
            return {"event_batches": 0, "events": n}
        return {
            "event_batches": len(d),
            "events": n,
            "event_delay_ms": [
                round(d[len(d) // 2] * 1e3, 2),
                round(d[int(0.99 * (len(d) - 1))] * 1e3, 2),
                round(d[-1] * 1e3, 2),
            ],
            "gaps": self.sub.gaps,
        }

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sub.close()


def parallel(n: int, threads: int, fn) -> float:
    """Run fn(i) for i in range(n) on `threads` threads; return the wall-clock seconds."""
    return n / per_second(n, threads, fn)


class Blocks:
    """The blocks of one size: distinct contents (each 8-byte word of block i is the base's
    word xor i) and their xxh3-64 digests, made before anything is timed (a load compares the
    digest of what it read: comparing a memoryview with bytes in Python costs more than the
    read itself)."""

    def __init__(self, size: int, n: int):
        import numpy as np

        base = np.random.default_rng(size).integers(0, 1 << 63, size // 8, dtype=np.uint64)
        self.size, self.n = size, n
        self.data = [(base ^ np.uint64(i)).tobytes() for i in range(n)]
        self.digests = [xxhash.xxh3_64_intdigest(d) for d in self.data]

    @staticmethod
    def name(i: int) -> str:
        return f"d{i % 16:02d}/block-{i:06d}.kv"


def where(roots: list[Path], i: int, blocks: Blocks) -> Path:
    """Block i's path: the blocks are dealt among the roots in turn (one root: all there)."""
    return roots[i % len(roots)] / blocks.name(i)


def store(roots: list[Path], blocks: Blocks, threads: int, fsync: bool = False) -> float:
    for root in roots:
        for d in range(16):
            (root / f"d{d:02d}").mkdir(parents=True, exist_ok=True)

    def one(i: int) -> None:
        fd = os.open(where(roots, i, blocks), os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
        try:
            view = memoryview(blocks.data[i])
            while view:
                view = view[os.write(fd, view) :]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    return parallel(blocks.n, threads, one)


def stat_all(roots: list[Path], blocks: Blocks, threads: int) -> float:
    def one(i: int) -> None:
        st = os.stat(where(roots, i, blocks))
        if st.st_size != blocks.size:
            raise RuntimeError(f"{blocks.name(i)}: size {st.st_size}, stored {blocks.size}")

    return parallel(blocks.n, threads, one)


def load(roots: list[Path], blocks: Blocks, threads: int) -> float:
    local = threading.local()

    def one(i: int) -> None:
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = bytearray(blocks.size + 4096)
        view = memoryview(buf)
        fd = os.open(where(roots, i, blocks), os.O_RDONLY)
        try:
            got = 0
            while True:
                k = os.readv(fd, [view[got:]])
                if k == 0:
                    break
                got += k
        finally:
            os.close(fd)
        if got != blocks.size or xxhash.xxh3_64_intdigest(view[:got]) != blocks.digests[i]:
            raise RuntimeError(
                f"{blocks.name(i)}: read {got} bytes, not the {blocks.size} "
                f"stored (or different bytes)"
            )

    return parallel(blocks.n, threads, one)


def zmq_threads_cpu(pid: int) -> float:
    """CPU seconds of a process's ZMQ threads (libzmq names them ZMQbg/...)."""
    total = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                comm, rest = f.read().split("(", 1)[1].rsplit(")", 1)
        except OSError:
            continue
        if comm.startswith("ZMQbg"):
            fields = rest.split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def machine_busy_ticks() -> tuple[int, int]:
    """(busy, all) clock ticks of every CPU so far (/proc/stat's first line; idle and iowait
    are not busy)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


class Split:
    """K kvfs mounts side by side (`parts`, KvfsSetups), the blocks dealt among them: what K
    request threads would give, sharing nothing."""

    def __init__(self, parts: list):
        self.parts = parts
        self.mounts = [p.kvfs for p in parts]
        self.roots = [p.root for p in parts]
        self.devices = [d for p in parts for d in p.devices]

    def sync(self) -> None:
        """Nothing to do: as for one mount."""

    def drop(self) -> None:
        for m in self.mounts:
            m.control("drop_dram")
        drop_kernel_caches()


@contextlib.contextmanager
def split_mounts(make, k: int):
    """K mounts made by make(name, count) (count: its namespaces, 4/K), as one Split."""
    stack = contextlib.ExitStack()
    with stack:
        yield Split([stack.enter_context(make(f"split{j}", 4 // k)) for j in range(k)])


def daemon_counters(m) -> dict:
    """Requests per operation, (with --handlers) the trio thread's CPU seconds in all and
    in each handler, and (KV events on) the CPU seconds spent announcing: the trio thread's
    (the publisher's statistics) and ZMQ's own threads'."""
    st = m.stats()
    lat = st.get("latency", {})
    out = {
        "requests": {op: v["count"] for op, v in lat.items()},
        "handler_cpu": {op: v["cpu_us"] / 1e6 for op, v in lat.items() if "cpu_us" in v},
        "trio_cpu": st.get("trio_thread_cpu_s", 0.0),
    }
    if "events" in st:
        out["events_cpu"] = st["events"]["cpu_s"] + zmq_threads_cpu(m.pid)
    return out


def summed(counters) -> dict:
    """Several daemons' counters (daemon_counters) added up."""
    out: dict = {"requests": {}, "handler_cpu": {}, "trio_cpu": 0.0}
    for c in counters:
        for key in ("requests", "handler_cpu"):
            for op, v in c[key].items():
                out[key][op] = out[key].get(op, 0) + v
        out["trio_cpu"] += c["trio_cpu"]
        if "events_cpu" in c:
            out["events_cpu"] = out.get("events_cpu", 0.0) + c["events_cpu"]
    return out


def run_fs(fs: str, setup, blocks: Blocks, threads: int, sync_store: bool) -> dict:
    """Store, stat and load the blocks on one file system; files/s, and the daemon's cost."""
    # where the blocks go, and the kvfs daemons whose cost is counted (ext4 and the floor have
    # none; a split set-up has K, summed)
    if isinstance(setup, Split):
        roots, mounts = setup.roots, setup.mounts
    else:
        roots, mounts = [setup.root], [setup.kvfs] if setup.kvfs is not None else []
    roots = [r / "blocks" for r in roots]
    # how to read the requests by kind (the floor does not count the reads of its statistics;
    # kvfs counts them as a getxattr)
    if mounts:
        pids, counters = [x.pid for x in mounts], lambda: summed(daemon_counters(x) for x in mounts)
    elif fs == "floor":
        pids = [setup.pid]
        counters = lambda: {"requests": setup.requests(), "handler_cpu": {}}  # noqa: E731
    else:
        pids, counters = [], None

    def cpu(user_only: bool = False) -> float:
        return sum(cpu_seconds(p, user_only=user_only) for p in pids)

    out: dict = {}

    devices = getattr(setup, "devices", [])

    def phase(name: str, fn) -> None:
        if pids:
            cpu0, c0 = cpu(), counters()
            user0 = cpu(user_only=True)
        ticks0 = [d.io_ticks() for d in devices]
        busy0 = machine_busy_ticks()
        dt = fn()
        busy1 = machine_busy_ticks()
        out[f"{name}_per_s"] = blocks.n / dt
        out[f"{name}_machine_busy"] = round((busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]), 3)
        if devices:  # each namespace's busy share of the phase (its io_ticks over the time)
            out[f"{name}_busy"] = [
                round(min(1.0, (d.io_ticks() - t) / 1e3 / dt), 3) for d, t in zip(devices, ticks0)
            ]
        if not pids:
            return
        out[f"{name}_daemon_us"] = (cpu() - cpu0) / blocks.n * 1e6
        out[f"{name}_daemon_user_us"] = (cpu(user_only=True) - user0) / blocks.n * 1e6
        c1 = counters()
        req0, req1 = c0["requests"], c1["requests"]
        per = {
            op: round((req1.get(op, 0) - req0.get(op, 0)) / blocks.n, 2)
            for op in req1
            if req1.get(op, 0) != req0.get(op, 0)
        }
        if c1["handler_cpu"]:
            h0, h1 = c0["handler_cpu"], c1["handler_cpu"]
            handlers = {
                op: round((h1[op] - h0.get(op, 0.0)) / blocks.n * 1e6, 1)
                for op in h1
                if h1[op] != h0.get(op, 0.0)
            }
            out[f"{name}_handler_us"] = handlers
        if mounts:  # the trio thread's own share: 1 s over it is the mount's ceiling
            out[f"{name}_trio_us"] = round((c1["trio_cpu"] - c0["trio_cpu"]) / blocks.n * 1e6, 1)
        if "events_cpu" in c1:  # what announcing cost (after the phase: its unlinks too)
            out[f"{name}_events_us"] = round(
                (c1["events_cpu"] - c0["events_cpu"]) / blocks.n * 1e6, 2
            )
        if mounts and "getxattr" in per:  # less this bench's own statistics read
            per["getxattr"] = round(per["getxattr"] - len(mounts) / blocks.n, 2)
            if not per["getxattr"]:
                del per["getxattr"]
        out[f"{name}_requests"] = per

    if fs == "ext4" and not sync_store:
        # for context: ext4 durable at close too (each writer fsyncs before closing)
        durable = setup.root / "durable"
        out["store_fsync_per_s"] = blocks.n / store([durable], blocks, threads, fsync=True)
        shutil.rmtree(durable)
        setup.sync()
    phase("store", lambda: store(roots, blocks, threads, fsync=sync_store))
    setup.drop()
    phase("stat", lambda: stat_all(roots, blocks, threads))
    setup.drop()
    phase("load", lambda: load(roots, blocks, threads))
    for root in roots:
        shutil.rmtree(root)
    setup.sync()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--total-mib", type=int, default=768, help="MiB of blocks per size")
    ap.add_argument("--max-files", type=int, default=3000)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--bps", type=float, default=1e9, help="bytes/s per device, throttled")
    ap.add_argument("--speeds", default="fast,throttled")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument(
        "--handlers",
        action="store_true",
        help="also the trio thread's CPU per file and per handler (the daemon runs "
        "with KVFS_HANDLER_CPU=1, which costs a little)",
    )
    ap.add_argument(
        "--events",
        action="store_true",
        help="also kvfs with KV events on and a subscriber (unthrottled only)",
    )
    ap.add_argument(
        "--inproc",
        action="store_true",
        help="also kvfs with [pool] io_workers = 0 (fetches on the daemon's own threads, as "
        "before the I/O worker processes), at every speed",
    )
    ap.add_argument(
        "--split",
        type=int,
        default=0,
        choices=(0, 2, 4),
        help="also K kvfs mounts side by side, each over 4/K of the namespaces, the blocks "
        "dealt among them (unthrottled only): what K request threads would give",
    )
    ap.add_argument(
        "--floor",
        action="store_true",
        help="also the floor of the stack (bench/floorfs.py: pyfuse3 with "
        "passthrough, files in memory, nothing else), unthrottled only",
    )
    args = parse(ap, argv, lambda a: available(throttle="throttled" in a.speeds.split(",")))
    if args.handlers:
        os.environ["KVFS_HANDLER_CPU"] = "1"  # read by the daemon (kvfs/fs/operations.py)
    sizes = [s for s in args.sizes.split(",") if s]
    for s in sizes:
        if s not in SIZES:
            ap.error(f"--sizes: {s!r} is not one of {', '.join(SIZES)}")
    data = args.total_mib * MiB
    rows: list[dict] = []
    warm_memory(4 * data / (1 << 30) + 1)  # first touches of guest memory are slow
    with tempfile.TemporaryDirectory(prefix="kvfs-sizes-") as tmp:
        tmp = Path(tmp)
        for speed in args.speeds.split(","):
            bps = args.bps if speed == "throttled" else None
            label = f"{bps / 1e9:g} GB/s" if bps else "unthrottled"
            with Emulation(f"{4 * data // MiB + 3072}m") as emu:

                def kvfs_mount(name: str, wanted: bool = True, count: int = 4, **kw):
                    """kvfs over `count` of the 4 loop namespaces at this speed (the extra
                    mounts only unthrottled), or nothing."""
                    if not wanted:
                        return contextlib.nullcontext()
                    return kvfs_on_loops(
                        emu,
                        tmp,
                        f"{name}-{speed}",
                        count,
                        (data + 512 * MiB) * count // 4,
                        bps,
                        dram=f"{(data * count // 4) // MiB + 256}MiB",
                        **kw,
                    )

                events = (
                    f'[events]\nenabled = true\nendpoint = "ipc://{tmp}/events"\n'
                    f"pattern = '{EVENTS_PATTERN}'\n"
                )
                with (
                    ext4_on_loop(emu, tmp, f"ext4-{speed}", data + 512 * MiB, bps) as ext4,
                    ext4_on_raid0(emu, tmp, f"raid0-{speed}", 4, data + 512 * MiB, bps) as raid0,
                    kvfs_mount("kvfs") as kv,
                    (
                        floor_mounted(tmp, f"floor-{speed}")
                        if args.floor and bps is None
                        else contextlib.nullcontext()
                    ) as floor,
                    kvfs_mount("kvfs-events", args.events and bps is None, extra=events) as kve,
                    kvfs_mount("kvfs-inproc", args.inproc, pool="io_workers = 0") as kvi,
                    (
                        split_mounts(lambda name, count: kvfs_mount(name, count=count), args.split)
                        if args.split and bps is None
                        else contextlib.nullcontext()
                    ) as kvs,
                ):
                    names = {
                        id(ext4): "ext4",
                        id(raid0): "raid0",
                        id(kv): "kvfs",
                        id(floor): "floor",
                        id(kve): "kvfs_events",
                        id(kvi): "kvfs_inproc",
                        id(kvs): "kvfs_split",
                    }
                    latency = EventLatency(f"ipc://{tmp}/events") if kve is not None else None
                    raid0_kind = raid0.raid0
                    for size_name in sizes:
                        size = SIZES[size_name]
                        blocks = Blocks(size, min(args.max_files, max(1, data // size)))
                        for r in range(args.rounds):
                            order = [ext4, raid0, kv] + [
                                x for x in (floor, kve, kvi, kvs) if x is not None
                            ]
                            if r % 2:
                                order.reverse()
                            for setup in order:
                                fs = names[id(setup)]
                                # ext4's I/O is this process's: it joins that set-up's
                                # throttle group for the run (a process is in one group at a
                                # time, and each ext4 set-up has its own)
                                with (
                                    throttled(setup, os.getpid())
                                    if fs in ("ext4", "raid0")
                                    else contextlib.nullcontext()
                                ):
                                    res = run_fs(
                                        fs,
                                        setup,
                                        blocks,
                                        args.threads,
                                        sync_store=fs in ("ext4", "raid0") and bps is not None,
                                    )
                                if fs == "kvfs_events":
                                    res.update(latency.take())
                                rows.append(
                                    {
                                        "fs": fs,
                                        "speed": label,
                                        "size": size_name,
                                        "files": blocks.n,
                                        "round": r,
                                        **res,
                                    }
                                )
                        del blocks
                    if latency is not None:
                        latency.close()
    out: dict = {
        "threads": args.threads,
        "rounds": args.rounds,
        "bps_per_device": args.bps,
        "raid0": raid0_kind,
        "rows": rows,
    }
    for speed in args.speeds.split(","):
        label = f"{args.bps / 1e9:g} GB/s" if speed == "throttled" else "unthrottled"
        prefix = "" if speed == "fast" else f"gbps{args.bps / 1e9:g}_"
        for size_name in sizes:
            for op in ("store", "stat", "load"):
                trio = [
                    x[f"{op}_trio_us"]
                    for x in rows
                    if x["fs"] == "kvfs" and x["speed"] == label and x["size"] == size_name
                ]
                if speed == "fast" and trio and statistics.median(trio) > 0:
                    # one thread serves every request: files/s no mount can pass, whatever the
                    # cores (1 s over the trio thread's CPU per file)
                    out[f"{size_name}_{op}_ceiling_per_s"] = round(1e6 / statistics.median(trio))
                ratios = []
                for r in range(args.rounds):
                    k = next(
                        x
                        for x in rows
                        if x["fs"] == "kvfs"
                        and x["speed"] == label
                        and x["size"] == size_name
                        and x["round"] == r
                    )
                    e = next(
                        x
                        for x in rows
                        if x["fs"] == "ext4"
                        and x["speed"] == label
                        and x["size"] == size_name
                        and x["round"] == r
                    )
                    ratios.append(k[f"{op}_per_s"] / e[f"{op}_per_s"])
                out[f"{prefix}{size_name}_{op}_vs_ext4"] = round(statistics.median(ratios), 3)
                out[f"{prefix}{size_name}_{op}_vs_raid0"] = round(
                    statistics.median(
                        k[f"{op}_per_s"] / e[f"{op}_per_s"]
                        for k, e in zip(
                            *(
                                [
                                    x
                                    for x in rows
                                    if x["fs"] == fs
                                    and x["speed"] == label
                                    and x["size"] == size_name
                                ]
                                for fs in ("kvfs", "raid0")
                            )
                        )
                    ),
                    3,
                )
                floors = [
                    (k, f, e)
                    for k, f, e in zip(
                        *(
                            [
                                x
                                for x in rows
                                if x["fs"] == fs and x["speed"] == label and x["size"] == size_name
                            ]
                            for fs in ("kvfs", "floor", "ext4")
                        )
                    )
                ]
                if floors:  # where kvfs stands between the stack's floor and ext4
                    out[f"{prefix}{size_name}_{op}_floor_vs_ext4"] = round(
                        statistics.median(
                            f[f"{op}_per_s"] / e[f"{op}_per_s"] for _, f, e in floors
                        ),
                        3,
                    )
                    out[f"{prefix}{size_name}_{op}_vs_floor"] = round(
                        statistics.median(
                            k[f"{op}_per_s"] / f[f"{op}_per_s"] for k, f, _ in floors
                        ),
                        3,
                    )
            durable = [
                k["store_per_s"] / e["store_fsync_per_s"]
                for k, e in zip(
                    (
                        x
                        for x in rows
                        if x["fs"] == "kvfs" and x["speed"] == label and x["size"] == size_name
                    ),
                    (
                        x
                        for x in rows
                        if x["fs"] == "ext4" and x["speed"] == label and x["size"] == size_name
                    ),
                )
                if "store_fsync_per_s" in e
            ]
            if durable:
                out[f"{prefix}{size_name}_store_vs_ext4_fsync"] = round(
                    statistics.median(durable), 3
                )
            pairs = list(
                zip(
                    *(
                        [
                            x
                            for x in rows
                            if x["fs"] == fs and x["speed"] == label and x["size"] == size_name
                        ]
                        for fs in ("kvfs_events", "kvfs")
                    )
                )
            )
            if pairs:  # the publisher's cost, and its delivery
                out[f"{size_name}_store_events_cpu_share"] = round(
                    statistics.median(
                        e["store_events_us"] / e["store_daemon_us"] for e, _ in pairs
                    ),
                    4,
                )
                out[f"{size_name}_store_events_cpu_vs_off"] = round(
                    statistics.median(
                        e["store_daemon_us"] / k["store_daemon_us"] for e, k in pairs
                    ),
                    3,
                )
                delays = [e["event_delay_ms"] for e, _ in pairs if "event_delay_ms" in e]
                if delays:
                    out[f"{size_name}_events_latency_p50_ms"] = statistics.median(
                        d[0] for d in delays
                    )
                    out[f"{size_name}_events_latency_p99_ms"] = max(d[1] for d in delays)
                out[f"{size_name}_events_per_file"] = round(
                    statistics.median(e["events"] / e["files"] for e, _ in pairs), 2
                )
    for speed in args.speeds.split(","):
        label = f"{args.bps / 1e9:g} GB/s" if speed == "throttled" else "unthrottled"
        prefix = "" if speed == "fast" else f"gbps{args.bps / 1e9:g}_"
        for size_name in sizes:
            pairs = list(
                zip(
                    *(
                        [
                            x
                            for x in rows
                            if x["fs"] == fs and x["size"] == size_name and x["speed"] == label
                        ]
                        for fs in ("kvfs", "kvfs_inproc")
                    )
                )
            )
            split = list(
                zip(
                    *(
                        [
                            x
                            for x in rows
                            if x["fs"] == fs and x["size"] == size_name and x["speed"] == label
                        ]
                        for fs in ("kvfs_split", "kvfs", "ext4")
                    )
                )
            )
            for op in ("store", "stat", "load") if split else ():
                # K request threads (K mounts) against one, and against ext4
                out[f"{prefix}{size_name}_{op}_split_vs_kvfs"] = round(
                    statistics.median(s[f"{op}_per_s"] / k[f"{op}_per_s"] for s, k, _ in split), 3
                )
                out[f"{prefix}{size_name}_{op}_split_vs_ext4"] = round(
                    statistics.median(s[f"{op}_per_s"] / e[f"{op}_per_s"] for s, _, e in split), 3
                )
            for op in ("store", "load") if pairs else ():
                # fetches by the I/O worker processes against the daemon's own threads
                out[f"{prefix}{size_name}_{op}_vs_inproc"] = round(
                    statistics.median(k[f"{op}_per_s"] / i[f"{op}_per_s"] for k, i in pairs), 3
                )
                for key, what in (("cpu", "daemon_us"), ("trio", "trio_us")):
                    ratios = [
                        k[f"{op}_{what}"] / i[f"{op}_{what}"] for k, i in pairs if i[f"{op}_{what}"]
                    ]
                    if ratios:
                        out[f"{prefix}{size_name}_{op}_{key}_vs_inproc"] = round(
                            statistics.median(ratios), 3
                        )
    if args.json:
        print(dumps(out))
        return 0
    print(
        f"{args.threads} threads; kvfs on 4 loop namespaces, ext4 on 1 loop device, raid0: "
        f"{raid0_kind} (loops over tmpfs); files/s of each phase; kvfs's daemon CPU and FUSE "
        f"requests per file"
    )
    print(
        f"{'speed':<12}{'size':<6}{'files':>6}  {'fs':<11}{'store/s':>9}{'(fsync)':>9}"
        f"{'stat/s':>9}{'load/s':>9}{'cpu us store/stat/load':>24}{'CPUs busy':>16}"
    )
    for x in rows:
        cpu = (
            "/".join(f"{x[f'{op}_daemon_us']:.0f}" for op in ("store", "stat", "load"))
            if x["fs"] not in ("ext4", "raid0")
            else ""
        )
        durable = f"{x['store_fsync_per_s']:>9.0f}" if "store_fsync_per_s" in x else f"{'':>9}"
        busy = "/".join(f"{x[op + '_machine_busy']:.2f}" for op in ("store", "stat", "load"))
        print(
            f"{x['speed']:<12}{x['size']:<6}{x['files']:>6}  {x['fs']:<11}"
            f"{x['store_per_s']:>9.0f}{durable}{x['stat_per_s']:>9.0f}{x['load_per_s']:>9.0f}"
            f"{cpu:>24}{busy:>16}"
        )
    print("\nrequests per file (store | stat | load):")
    for x in rows:
        if x["fs"] not in ("ext4", "raid0"):
            print(
                f"  {x['fs']:<11}{x['speed']:<12}{x['size']:<6}"
                + " | ".join(
                    " ".join(f"{op}={n:g}" for op, n in sorted(x[f"{ph}_requests"].items()))
                    for ph in ("store", "stat", "load")
                )
            )
    if args.handlers:
        print(
            "\nkvfs's trio thread, CPU us per file (store | stat | load): all, and in each "
            "handler (the rest is the request loop and background tasks)"
        )
        for x in rows:
            if x["fs"] == "kvfs":
                print(
                    f"  {x['speed']:<12}{x['size']:<6}"
                    + " | ".join(
                        f"{x[f'{ph}_trio_us']:.0f}: "
                        + " ".join(
                            f"{op}={v:g}"
                            for op, v in sorted(
                                x[f"{ph}_handler_us"].items(), key=lambda kv: -kv[1]
                            )
                        )
                        for ph in ("store", "stat", "load")
                    )
                )
    print(
        "\nkvfs / ext4 and kvfs / raid0 (files/s ratio, median of rounds; with --floor also "
        "the floor / ext4 and kvfs / the floor):"
    )
    for k, v in out.items():
        if "_vs_" in k:
            print(f"  {k:<28}{v:>7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
