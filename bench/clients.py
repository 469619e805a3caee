#!/usr/bin/env python3
"""Clients: the same KV blocks stored and loaded through each engine's own file tier, on kvfs
over 4 namespaces, on ext4 over a RAID-0 of 4 devices (`raid0`: dm-stripe where the kernel has
device-mapper, else a stand-in, one device at 4x the limit; the JSON's "raid0" says which) and
on ext4 over 1 device, every device a loop device over tmpfs, throttled to --bps bytes/s (read
and write; a cgroup v1 blkio or v2 io.max limit, testing/emulate.py) and unthrottled.

  vLLM fs tier      FileSystemTierManager: O_DIRECT, O_EXCL temp + rename; every block its own
                    TransferJob, all submitted at once (16 read + 16 write threads)
  SGLang file       HiCacheFile: set / get one page after another (numpy tofile, readinto)
  LMCache NIXL      NIXL POSIX plugin, io_uring, O_DIRECT, nixl_pool_size 0; 8 chunks per
                    transfer
  ... kvfs native   kvfs's tier / backend for the same engine (kvfs only): the same stores,
                    loads read from the namespaces with kvfs.client.direct

Loads are cold: kvfs's DRAM tier and the page cache are dropped first (after a sync on ext4).
The engine runs in its own process (testing/engine.py) inside the setup's cgroup, with the
kvfs daemon. Store times are what the engine waits for: kvfs (durability "fsync", the default)
returns at close with the block in DRAM and writes it back within writeback_ms
(KVFS_TEST_DURABILITY=close: durable at close); on ext4 the
buffered writes of SGLang's file backend are in the page cache when set() returns (and cgroup v1
does not throttle their writeback).

    python bench/clients.py [--bps 100e6] [--blocks 24] [--block-mib 8] [--rounds 1] [--json]

Everything (tmpfs, loop devices, file systems, cgroups, mounts, engines) is set up and torn
down here; each table row is one pass, and with --rounds N each ratio is the median of the N
rounds' ratios (`_range`: the lowest and highest), the file systems' order alternating. Each
kvfs row has `load_busy`: each namespace's busy share of the load (its io_ticks over the
load's time) and, throttled, `load_bw_share`: the bytes read from each over its limit times
the load's time (cgroup throttling holds I/O before it reaches the device, so io_ticks stay
low however busy the reader keeps it); each ratio line has the median over the rounds of their
means: near 1 where the namespaces are what limits the load.
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import dumps, parse, parser  # noqa: E402
from testing.emulate import (
    Emulation,
    ext4_on_loop,
    ext4_on_raid0,  # noqa: E402
    kvfs_on_loops,
    throttled,
)
from testing.engine import Engine  # noqa: E402

MiB = 1 << 20

# (row name, engine, native kvfs variant?)
CLIENTS = [
    ("vLLM fs tier", "vllm", False),
    ("SGLang file", "sglang", False),
    ("LMCache NIXL", "nixl", False),
    ("vLLM kvfs tier", "vllm", True),
    ("SGLang kvfs backend", "sglang", True),
]


def drop_page_cache() -> None:
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def run_client(
    e: Engine,
    engine: str,
    native: bool,
    d: Path,
    keys: list[int],
    block: int,
    drop,
    devices=(),
    bps: float | None = None,
) -> dict:
    """Store the blocks through the engine into directory d, drop caches, load them back.
    `devices`: kvfs's namespaces, whose busy share of the load is returned (`load_busy`:
    io_ticks over the load's time) and, under a throttle of `bps` per device, the share of
    that limit the load used on each (`load_bw_share`)."""
    ticks: list[tuple[int, int]] = []

    def loading(call):
        ticks[:] = [(x.io_ticks(), x.bytes_read()) for x in devices]
        return call()

    if engine == "vllm":
        e.call("open", root=str(d), block=block, slots=len(keys), tier="kvfs" if native else "fs")
        s = e.call("transfer_many", kind="store", keys=keys, per_job=1)
        drop()
        ld = loading(lambda: e.call("transfer_many", kind="load", keys=keys, per_job=1))
        ok = s["success"] and ld["success"] and ld["exact"]
        store_s, load_s = s["seconds"], ld["seconds"]
    elif engine == "sglang":
        e.call("open", dir=str(d), page=block, backend="kvfs" if native else "file")
        s = e.call("set", keys=keys, timed=True)
        drop()
        ld = loading(lambda: e.call("get", keys=keys, timed=True, batch=native))
        ok = all(s["ok"]) and all(x is True for x in ld["ok"])
        store_s, load_s = s["seconds"], ld["seconds"]
    else:
        layers = block // (256 * 8 * 64 * 2 * 2)
        e.call(
            "open",
            dir=str(d),
            engine="uring",
            direct=True,
            layers=layers,
            cpu_gb=round(1.25 * (len(keys) + 8) * block / 1e9 + 0.01, 3),
        )
        s = e.call("put", keys=keys, batch=8, timed=True)
        drop()
        ld = loading(lambda: e.call("batched_get", keys=keys, batch=8, timed=True))
        ok = all(x is True for x in ld["ok"])
        store_s, load_s = s["seconds"], ld["seconds"]
    e.call("close")
    if not ok:
        raise RuntimeError(
            f"{engine}{' (kvfs native)' if native else ''}: blocks did not "
            f"round-trip bit-exact in {d}"
        )
    total = len(keys) * block
    out = {"store_gbps": total / store_s / 1e9, "load_gbps": total / load_s / 1e9}
    if devices:  # each namespace's io_ticks over the load's time (the engine's own timing)
        out["load_busy"] = [
            round(min(1.0, (x.io_ticks() - t) / 1e3 / load_s), 3)
            for x, (t, _) in zip(devices, ticks)
        ]
        if bps:
            out["load_bw_share"] = [
                round((x.bytes_read() - b) / (bps * load_s), 3) for x, (_, b) in zip(devices, ticks)
            ]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--bps", type=float, default=100e6, help="bytes/s per device when throttled")
    ap.add_argument("--blocks", type=int, default=24, help="blocks per client and pass")
    ap.add_argument("--block-mib", type=int, default=8, help="block size (a multiple of 2)")
    ap.add_argument("--only", default="", help="comma-separated engines (vllm,sglang,nixl)")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="passes per client and device speed (the file systems' order "
        "alternates); ratios are the medians of the rounds', with their range",
    )
    args = parse(ap, argv)
    block = args.block_mib * MiB
    keys = list(range(1, args.blocks + 1))
    data = args.blocks * block
    wanted = [c for c in CLIENTS if not args.only or c[1] in args.only.split(",")]
    rows: list[dict] = []
    with (
        tempfile.TemporaryDirectory(prefix="kvfs-clients-") as tmp,
        Emulation(f"{(6 * data) // MiB + 3072}m") as emu,
        contextlib.ExitStack() as stack,
    ):
        tmp = Path(tmp)
        engines = {}
        for _, engine, _ in wanted:
            if engine not in engines:
                engines[engine] = stack.enter_context(
                    Engine(engine, tmp / f"{engine}.log", timeout=600)
                )
        for e in engines.values():
            e.ready()
        for throttle in (args.bps, None):
            label = f"{args.bps / 1e6:.0f} MB/s" if throttle else "unthrottled"
            tag = "t" if throttle else "u"
            with (
                ext4_on_loop(emu, tmp, f"ext4{tag}", data + 256 * MiB, throttle) as on_ext4,
                ext4_on_raid0(emu, tmp, f"raid0{tag}", 4, data + 256 * MiB, throttle) as on_raid0,
                kvfs_on_loops(emu, tmp, f"kvfs{tag}", 4, data + 256 * MiB, throttle) as on_kvfs,
            ):
                m = on_kvfs.kvfs
                raid0_kind = on_raid0.raid0
                for rnd in range(args.rounds):
                    for name, engine, native in wanted:
                        e = engines[engine]
                        order = ["kvfs"] if native else ["raid0", "ext4", "kvfs"]
                        for fs in order[::-1] if rnd % 2 else order:
                            setup = {"kvfs": on_kvfs, "ext4": on_ext4, "raid0": on_raid0}[fs]
                            root = setup.root / f"{engine}-{native}"
                            drop = m.drop_caches if fs == "kvfs" else drop_page_cache
                            with throttled(setup, e.proc.pid):  # the engine's I/O meets it
                                r = run_client(
                                    e,
                                    engine,
                                    native,
                                    root,
                                    keys,
                                    block,
                                    drop,
                                    on_kvfs.devices if fs == "kvfs" else (),
                                    throttle,
                                )
                            shutil.rmtree(root)
                            rows.append(
                                {"client": name, "fs": fs, "throttle": label, "round": rnd, **r}
                            )
    out = {
        "bps_per_device": args.bps,
        "blocks": args.blocks,
        "block_bytes": block,
        "rounds": args.rounds,
        "raid0": raid0_kind,
        "rows": [
            {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()} for r in rows
        ],
        "ratios": {},
    }
    by = {(r["client"], r["fs"], r["throttle"], r["round"]): r for r in rows}
    for name, engine, native in wanted:
        base = next(n for n, e, nat in CLIENTS if e == engine and not nat)
        for label in sorted({r["throttle"] for r in rows}):
            per: dict[str, list[float]] = {}
            for rnd in range(args.rounds):
                k, x = by.get((name, "kvfs", label, rnd)), by.get((base, "ext4", label, rnd))
                r0 = by.get((base, "raid0", label, rnd))
                if not (k and x and r0):
                    continue
                for key in ("load_busy", "load_bw_share"):
                    if key in k:
                        per.setdefault(key, []).append(statistics.mean(k[key]))
                for op in ("store", "load"):
                    for b, ref in (("raid0", r0), ("ext4", x)):
                        per.setdefault(f"{op}_kvfs_vs_{b}", []).append(
                            k[f"{op}_gbps"] / ref[f"{op}_gbps"]
                        )
            if per:
                out["ratios"][f"{name} | {label}"] = {
                    **{key: round(statistics.median(v), 2) for key, v in per.items()},
                    **{
                        f"{key}_range": [round(min(v), 2), round(max(v), 2)]
                        for key, v in per.items()
                    },
                }
    if args.json:
        print(dumps(out))
        return 0
    print(
        f"{args.blocks} blocks of {args.block_mib} MiB per client; kvfs on 4 loop namespaces, "
        f"raid0: {raid0_kind}, ext4 on 1 loop device; throttled: {args.bps / 1e6:.0f} MB/s "
        f"per device"
    )
    print(f"{'client':<22}{'fs':<6}{'devices':<13}{'round':>6}{'store GB/s':>11}{'load GB/s':>11}")
    for r in rows:
        print(
            f"{r['client']:<22}{r['fs']:<6}{r['throttle']:<13}{r['round']:>6}"
            f"{r['store_gbps']:>11.3f}{r['load_gbps']:>11.3f}"
        )
    print(
        f"\n{'kvfs vs raid0 and ext4 (same engine, each its own tier; median of rounds)':<58}"
        f"{'store/raid0':>12}{'load/raid0':>11}{'store/ext4':>11}{'load/ext4':>10}"
        f"{'busy':>6}{'bw':>6}"
    )
    for k, v in out["ratios"].items():
        print(
            f"{k:<58}{v['store_kvfs_vs_raid0']:>12.2f}{v['load_kvfs_vs_raid0']:>11.2f}"
            f"{v['store_kvfs_vs_ext4']:>11.2f}{v['load_kvfs_vs_ext4']:>10.2f}"
            f"{v.get('load_busy', float('nan')):>6.2f}{v.get('load_bw_share', float('nan')):>6.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
