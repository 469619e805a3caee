#!/usr/bin/env python3
"""Direct reads: kvfs.client.direct against reads through the FUSE mount and against raw preads.

Four emulated namespaces (loop devices over a private tmpfs, throttled to --bps each with a
cgroup limit, as in bench/stripe.py) hold --blocks blocks of 32 MiB. The kvfs daemon and this
process (which issues the direct and raw reads itself) are both in the throttled cgroup. Each
round, every path reads all the blocks back to back, cold (kvfs's DRAM tier and the page cache
dropped; the direct and raw paths read with O_DIRECT), the paths taking turns in a rotating
order (round r starts with path r mod 5):

  fuse        through the mount, --threads threads each reading its share of the block
              with 1 MiB preads (the same parallelism as the direct and raw paths)
  fuse_1      through the mount, one reader, 1 MiB reads (what most engines do)
  direct      with kvfs.client.direct into a host buffer (layout and lease through the mount,
              then every stripe unit in parallel from the namespaces), every unit's checksum
              verified (the default)
  raw         the same extents with parallel O_DIRECT preads and no kvfs at all (the physical
              reference: what the devices give)
  unverified  kvfs.client.direct with verify=False (the opt-out): `verify_cost` is its speed over
              `direct`'s

Why a batch of blocks, not one block, per timed sample: blk-throttle grants a device that idled
a burst of about --bps x 0.1 s (its time slice, rounded up), so a single 32 MiB block (8 MiB
per namespace) read after a pause is not throttled at all; a batch moves many slices' worth.
`vs_limit` is each path's throughput against the 4 x --bps the throttles allow: a raw path well
above 1 means the reads escaped the throttle, and the run fails.

Every read must return the whole block (a short read fails the run); one block per run is
checked bit-exact through each path. `direct_vs_raw` (target >= 0.9) and `direct_vs_fuse`
(target >= 1.5; both with --threads readers) are throughput ratios; `direct_vs_fuse_1` is
against one reader through the mount.

The batched path (`batched`, before the throttle): what the daemon spends per block when
kvfs.client.direct stores and loads in batches (issue 57: <= 40 us per block in batches of
32). Each round stores --batched-blocks blocks of --batched-bytes with write_many, --batch
per call (replacing the last round's), then loads them cold with read_many, --batch per
call; per block, the daemon's CPU (`daemon_us`: all its threads and processes, from their
/proc schedstat, the store's write-back flush included) and its request thread's (`trio_us`,
likewise), medians of the rounds with their range; and what each batch asked the daemon
(`requests_per_batch`, on its direct socket) and FUSE requests in all (`fuse_requests`: none,
once the client has found the socket; the store's fsync of the root left out).

    python bench/direct.py [--blocks 24] [--bps 2e8] [--rounds 3] [--batch 32] [--json]
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import io
import mmap
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import dumps, parse, parser  # noqa: E402
from bench.reads import ShortRead, digest, read_full  # noqa: E402
from kvfs.client import direct  # noqa: E402
from testing.emulate import Emulation  # noqa: E402
from testing.mount import MountedKvfs, live_cpu_seconds, write_config  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
BLOCK = 32 * MiB


def read_fuse(path: Path, buf: mmap.mmap, check: int | None = None) -> None:
    read_full(path, memoryview(buf)[:MiB], BLOCK, check=check)


def read_fuse_parallel(path: Path, pool: concurrent.futures.Executor, buf: mmap.mmap) -> None:
    """The block read by the pool's threads, each 1 MiB piece with its own pread."""
    fd = os.open(path, os.O_RDONLY)
    try:

        def piece(off: int) -> None:
            n = min(MiB, BLOCK - off)
            got = os.preadv(fd, [memoryview(buf)[off : off + n]], off)
            if got != n:
                raise ShortRead(f"read of {path} at {off}: {got} of {n} bytes")

        list(pool.map(piece, range(0, BLOCK, MiB)))
    finally:
        os.close(fd)


def read_raw(
    lay: direct.BlockLayout, fds: dict, pool: concurrent.futures.Executor, buf: mmap.mmap
) -> None:
    def unit(k: int) -> None:
        n = lay.unit_length(k)
        view = memoryview(buf)[k * lay.unit : k * lay.unit + (n + 4095) // 4096 * 4096]
        got = os.preadv(fds[lay.ns_paths[lay.ns[k]]], [view], lay.offsets[k])
        if got < n:
            raise ShortRead(f"raw read of unit {k}: {got} of {n} bytes")

    list(pool.map(unit, range(len(lay.ns))))


def read_direct(dr: direct.Direct, path: Path, buf: mmap.mmap, verify: bool = True) -> None:
    got = dr.read_into(str(path), buf, verify)
    if got != BLOCK:
        raise ShortRead(f"kvfs.client.direct read {got} bytes of {path}, which holds {BLOCK}")


SYNC_OPS = ("opendir", "fsyncdir", "releasedir")  # an fsync of the mount's root (m.sync)


def fuse_requests(m: MountedKvfs) -> collections.Counter:
    """FUSE requests the daemon answered so far, by operation."""
    return collections.Counter({op: v["count"] for op, v in m.stats()["latency"].items()})


def request_thread_seconds(pid: int) -> float:
    """The CPU time of the daemon's request thread (trio's: its main thread), to the
    nanosecond."""
    with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def batched_round(m: MountedKvfs, dr: direct.Direct, paths: list[str], size: int, batch: int):
    """One round of the batched path: store then load every path, `batch` per call; per
    phase, (daemon us per block, request thread us per block, direct requests, FUSE
    requests). The CPU is read from /proc right before and after the phase (a store's
    includes the fsync of the root that makes its renames durable); the statistics are
    looked at outside that."""
    data = [os.urandom(size) for _ in range(batch)]
    bufs = [mmap.mmap(-1, size) for _ in range(batch)]
    out = {}
    for phase in ("store", "load"):
        if phase == "load":
            m.drop_caches()
        before = fuse_requests(m)
        asking = fuse_requests(m) - before  # what a look at the statistics costs
        direct0 = m.stats()["direct"]["requests"]
        fuse0 = fuse_requests(m)
        cpu0, trio0 = live_cpu_seconds(m.pid), request_thread_seconds(m.pid)
        for at in range(0, len(paths), batch):
            part = paths[at : at + batch]
            if phase == "store":
                dr.write_many(part, data[: len(part)])
            elif dr.read_many(part, bufs[: len(part)]) != [size] * len(part):
                raise ShortRead(f"a batched load of {len(part)} blocks came back short")
        if phase == "store":
            m.sync()  # (the store's renames are durable with the write-back's next round)
        cpu, trio = live_cpu_seconds(m.pid) - cpu0, request_thread_seconds(m.pid) - trio0
        fuse = fuse_requests(m) - fuse0 - asking
        direct1 = m.stats()["direct"]["requests"]
        requests = {k: n - direct0.get(k, 0) for k, n in direct1.items() if n != direct0.get(k, 0)}
        out[phase] = (
            cpu / len(paths) * 1e6,
            trio / len(paths) * 1e6,
            requests,
            sum(n for op, n in fuse.items() if op not in SYNC_OPS),
        )
    if digest(memoryview(bufs[0])) != digest(data[0]):
        raise ShortRead("the batched path loaded wrong bytes")
    return out


def batched(m: MountedKvfs, dr: direct.Direct, args) -> dict:
    """The batched path over --rounds rounds (see the module doc)."""
    d = m.mountpoint / "batched"
    d.mkdir()
    dr.write(str(d / "first"), b"1")  # (the client finds the daemon's socket: a getxattr)
    paths = [str(d / f"b{i}.bin") for i in range(args.batched_blocks)]
    rounds = [
        batched_round(m, dr, paths, args.batched_bytes, args.batch) for _ in range(args.rounds)
    ]
    calls = -(-len(paths) // args.batch)
    out = {"batch": args.batch, "blocks": len(paths), "block_bytes": args.batched_bytes}
    for phase in ("store", "load"):
        for j, name in ((0, "daemon_us"), (1, "trio_us")):
            v = [r[phase][j] for r in rounds]
            out[f"{phase}_{name}"] = round(statistics.median(v), 1)
            out[f"{phase}_{name}_range"] = [round(min(v), 1), round(max(v), 1)]
        out[f"{phase}_requests_per_batch"] = {
            k: round(n / calls, 2) for k, n in rounds[-1][phase][2].items()
        }
        out[f"{phase}_fuse_requests"] = max(r[phase][3] for r in rounds)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--blocks", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bps", type=float, default=2e8)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--batch", type=int, default=32, help="blocks per call, batched path")
    ap.add_argument("--batched-blocks", type=int, default=1024)
    ap.add_argument("--batched-bytes", type=int, default=256 * KiB)
    args = parse(ap, argv)
    # direct: kvfs.client.direct as shipped (every unit's checksum verified); unverified: the same
    # with verify=False (the opt-out), for the cost of verifying
    paths_order = ("fuse", "direct", "raw", "unverified", "fuse_1")
    times: dict[str, list[float]] = {k: [] for k in paths_order}
    batched_bytes = args.batched_blocks * -(-args.batched_bytes // 4096) * 4096
    with (
        Emulation(f"{(args.blocks * BLOCK * 2 + 3 * batched_bytes) // MiB + 1024}m") as emu,
        tempfile.TemporaryDirectory(prefix="kvfs-direct-") as tmp,
    ):
        tmp = Path(tmp)
        devs = [
            emu.loop(f"d{i}", (args.blocks * BLOCK + 2 * batched_bytes) // 4 + 256 * MiB)
            for i in range(4)
        ]
        cfg = write_config(
            tmp / "k.toml",
            tmp / "state",
            [{"path": d.path} for d in devs],
            dram=f"{args.blocks * BLOCK // MiB + 64}MiB",
            extra="[prefetch]\nenabled = false\n",
        )
        from kvfs.cli import main as kvfs_main

        with contextlib.redirect_stdout(io.StringIO()):
            assert kvfs_main(["format", "--config", str(cfg)]) == 0
        group = emu.cgroup("kvfs-direct")
        for d in devs:
            group.limit(d, read_bps=args.bps, write_bps=args.bps)
        with MountedKvfs(tmp / "mnt", cfg, tmp / "kvfs.log") as m:
            paths = [m.mountpoint / f"block{i}.pt" for i in range(args.blocks)]
            first = None
            for p in paths:
                data = os.urandom(BLOCK)
                first = first or data
                p.write_bytes(data)
            check = digest(first)
            with direct.Direct(str(m.mountpoint), threads=args.threads) as dr:
                batch_out = batched(m, dr, args)
            group.add(m.pid)
            group.add(os.getpid())  # direct and raw reads are this process's I/O
            assert group.contains(m.pid) and group.contains(os.getpid()), (
                "the readers must be in the throttled cgroup"
            )
            buf = mmap.mmap(-1, BLOCK + MiB)
            fds = {d.path: os.open(d.path, os.O_RDONLY | os.O_DIRECT) for d in devs}
            pool = concurrent.futures.ThreadPoolExecutor(args.threads)
            with direct.Direct(str(m.mountpoint), threads=args.threads) as dr:
                layouts = [dr.layout(str(p)) for p in paths]
                # one block per run through each path, bit-exact (untimed)
                m.drop_caches()
                read_fuse(paths[0], buf, check)
                m.drop_caches()
                buf[:BLOCK] = bytes(BLOCK)
                read_fuse_parallel(paths[0], pool, buf)
                assert digest(memoryview(buf)[:BLOCK]) == check, "parallel reads: wrong bytes"
                read_direct(dr, paths[0], buf)
                assert digest(memoryview(buf)[:BLOCK]) == check, "kvfs.client.direct: wrong bytes"
                buf[:BLOCK] = bytes(BLOCK)
                read_raw(layouts[0], fds, pool, buf)
                assert digest(memoryview(buf)[:BLOCK]) == check, "raw: wrong bytes"
                batch = {
                    "fuse": lambda: [read_fuse_parallel(p, pool, buf) for p in paths],
                    "fuse_1": lambda: [read_fuse(p, buf) for p in paths],
                    "direct": lambda: [read_direct(dr, p, buf) for p in paths],
                    "raw": lambda: [read_raw(lay, fds, pool, buf) for lay in layouts],
                    "unverified": lambda: [read_direct(dr, p, buf, False) for p in paths],
                }
                for r in range(args.rounds):
                    n = len(paths_order)
                    for k in paths_order[r % n :] + paths_order[: r % n]:
                        m.drop_caches()
                        t = time.perf_counter()
                        batch[k]()
                        times[k].append(time.perf_counter() - t)
            pool.shutdown()
            for fd in fds.values():
                os.close(fd)
            st = m.stats()
        group.release(os.getpid())
        group.remove()
    total = args.blocks * BLOCK
    gbps = {k: total / statistics.median(v) / 1e9 for k, v in times.items()}
    limit = 4 * args.bps / 1e9
    out = {
        "block_bytes": BLOCK,
        "blocks": args.blocks,
        "rounds": args.rounds,
        "bps_per_namespace": args.bps,
        "threads": args.threads,
        "gbps": {k: round(v, 3) for k, v in gbps.items()},
        "vs_limit": {k: round(v / limit, 3) for k, v in gbps.items()},
        "direct_vs_raw": round(gbps["direct"] / gbps["raw"], 3),
        "direct_vs_fuse": round(gbps["direct"] / gbps["fuse"], 3),
        "direct_vs_fuse_1": round(gbps["direct"] / gbps["fuse_1"], 3),
        # what verifying every unit's checksum costs kvfs.client.direct (>= 1: verified is slower)
        "verify_cost": round(gbps["unverified"] / gbps["direct"], 3),
        # cold reads through the mount against the devices' own limit (raw parallel
        # O_DIRECT preads of the same extents), both inside the throttle
        "cold_vs_raw": round(gbps["fuse"] / gbps["raw"], 3),
        "direct_reads_counted": st["files"]["direct_reads"],
        "batched": batch_out,
    }
    escaped = gbps["raw"] > 1.15 * limit
    if escaped:
        out["error"] = (
            f"raw reads ran at {gbps['raw']:.2f} GB/s, above the {limit:.2f} GB/s "
            f"the throttles allow: the reads escaped the throttle"
        )
    if args.json:
        print(dumps(out))
        return 1 if escaped else 0
    print(
        f"cold reads of {args.blocks} blocks of 32 MiB back to back per sample, {args.rounds} "
        f"rounds, order rotated; {args.threads} reader threads on every path but fuse_1; "
        f"4 namespaces at {args.bps / 1e6:.0f} MB/s ({limit:.2f} GB/s in all); median"
    )
    print(f"{'path':<12}{'GB/s':>8}{'vs limit':>10}")
    for k in paths_order:
        print(f"{k:<12}{gbps[k]:>8.3f}{gbps[k] / limit:>10.3f}")
    print(
        f"direct_vs_raw = {out['direct_vs_raw']}  direct_vs_fuse = {out['direct_vs_fuse']}  "
        f"direct_vs_fuse_1 = {out['direct_vs_fuse_1']}  "
        f"cold_vs_raw = {out['cold_vs_raw']}  verify_cost = {out['verify_cost']}"
    )
    b = batch_out
    print(
        f"\nbatched path: {b['blocks']} blocks of {b['block_bytes'] // KiB} KiB, {b['batch']} "
        f"per call, {args.rounds} rounds (unthrottled); per block, median [range]"
    )
    print(f"{'phase':<8}{'daemon us':>22}{'trio us':>22}  requests per batch   FUSE requests")
    for phase in ("store", "load"):
        cells = []
        for n in ("daemon_us", "trio_us"):
            lo, hi = b[f"{phase}_{n}_range"]
            cells.append(f"{b[f'{phase}_{n}']:.1f} [{lo:.1f}-{hi:.1f}]")
        asked = " ".join(f"{k}={v:g}" for k, v in sorted(b[f"{phase}_requests_per_batch"].items()))
        print(f"{phase:<8}{cells[0]:>22}{cells[1]:>22}  {asked:<20} {b[f'{phase}_fuse_requests']}")
    if escaped:
        print(out["error"], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
