#!/usr/bin/env python3
"""End to end with real LMCache: store KV chunks, then read them back cold, on kvfs (four
namespaces), on ext4 over a RAID-0 of four devices of the same kind (`raid0`: dm-stripe where
the kernel has device-mapper, else a stand-in, one device at 4x the per-device limit; the
JSON's "raid0" says which) and on plain ext4 (one device), side by side in one run.

LMCache 0.5.6's LocalDiskBackend (`local_disk`, 8 disk I/O threads) stores N chunks of 32 MiB
(Llama-3.1-8B shape, bf16: 32 layers x 2 x 256 tokens x 8 KV heads x 128), the page cache and
kvfs's DRAM tier are dropped, and `batched_get_blocking` reads them all back; every chunk is
checked bit-exact against what was stored. kvfs keeps the memory of the dropped blocks as
spares, within its DRAM capacity, as a full tier has its evicted blocks' memory in steady
state: the cold read fetches every byte from the namespaces, checksums verified, into reused
memory (`--fresh-memory` gives the spares back first). The same run also drives kvfs's LMCache
plugin (kvfs/client/lmcache_backend.py: direct writes and direct reads, no FUSE copy).

Devices are loop devices over files on a tmpfs, throttled per device (cgroup v1 blkio or v2
io.max, whichever the machine has):
  throttled   100 MB/s per device (devices are the limit, slow ones)
  gbps1       1 GB/s per device (devices are the limit, as NVMe-oF namespaces are)
  fast        unthrottled (the "devices" run at memory speed: every extra copy shows)
The LMCache process and the kvfs daemon both run in the throttled cgroup.

    python bench/e2e_lmcache.py [--chunks 24] [--speeds throttled,gbps1,fast] [--repeat 3] [--json]
                                [--conversations C] [--prefetch-ab]

Ratios (kvfs / ext4; for stores, ext4's store time / kvfs's; `_vs_raid0` the same against the
RAID-0): `<speed>_read_vs_ext4` and
`<speed>_store_vs_ext4` with O_DIRECT (`use_odirect: true`), `..._nodirect` without, and
`plugin_<speed>_read_vs_ext4` / `plugin_<speed>_store_vs_ext4` for the plugin.
A store is timed twice: `store` until LMCache's put tasks are done (what LMCache waits for: on
ext4 a buffered write may then be in the page cache only, its writeback not throttled by a
cgroup v1 limit; on kvfs the chunks are in DRAM, up to its dirty limit not yet written back; the
plugin's are durable), and `store_durable` until every chunk's file is also fsync'd from the
LMCache process: the same promise on every file system, the fair comparison. Each ratio is the
median of `--repeat` rounds, each round running ext4, kvfs and the plugin back to back (noise
hits all alike); `ratios_range` has each ratio's lowest and highest round. Memory is touched
once first (testing/emulate.py `warm_memory`): on a virtual machine fresh memory is slow once.

`--conversations C`: LMCache's prefix-hit pattern. The chunks are C conversations' prefixes,
each stored in order (chunk 0, 1, ... of one conversation, then the next), and the cold read is
C retrievals, one per conversation, each a `batched_get_blocking` of its prefix, one after
another, in the reverse order of the stores (so what kvfs learned past a conversation's end
leads to one already read: readahead wins only within a conversation). `--prefetch-ab` runs
kvfs's `local_disk` rows twice, `[prefetch] enabled` true and false (the order alternating by
round): `<speed>_read_prefetch_on_vs_off`, and each against the RAID-0 (`..._prefetch_off`).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import dumps, parse, parser  # noqa: E402
from testing.emulate import (  # noqa: E402
    Emulation,
    ext4_on_loop,
    ext4_on_raid0,
    warm_memory,
)

MiB = 1 << 20
KV_SHAPE = (32, 2, 256, 8, 128)  # Llama-3.1-8B: layers, K/V, tokens, kv heads, head dim
CHUNK = 32 * MiB
SPEEDS = {"throttled": 100e6, "gbps1": 1e9, "fast": None}
THREADS = 8


# --- the LMCache process ---------------------------------------------------------------------
def worker(argv: list[str]) -> None:
    """In its own process: store, wait for the word, read back cold, verify; print results."""
    import asyncio
    import logging
    import threading

    import torch
    import xxhash
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.memory_management import MemoryFormat
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.pin_monitor import PinMonitor
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

    logging.disable(logging.WARNING)
    mode, directory, n, odirect = argv[0], argv[1], int(argv[2]), argv[3] == "1"
    conversations = int(argv[4]) if len(argv) > 4 else 0
    model = "meta-llama/Llama-3.1-8B"
    kwargs = dict(chunk_size=256, local_cpu=False, max_local_cpu_size=2 * n * CHUNK / 1e9 + 0.5)
    if mode == "plugin":
        kwargs.update(
            storage_plugins=["kvfs"],
            extra_config={
                "storage_plugin.kvfs.module_path": "kvfs.client.lmcache_backend",
                "storage_plugin.kvfs.class_name": "KvfsBackend",
                "kvfs.path": directory,
                "kvfs.threads": THREADS,
            },
        )
    else:
        kwargs.update(
            local_disk=directory,
            max_local_disk_size=4 * n * CHUNK / 1e9,
            extra_config={"use_odirect": odirect, "disk_io_threads": THREADS},
        )
    config = LMCacheEngineConfig.from_defaults(**kwargs)
    meta = LMCacheMetadata(
        model_name=model,
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=torch.bfloat16,
        kv_shape=KV_SHAPE,
    )
    PinMonitor.GetOrCreate(config)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    cpu = LocalCPUBackend(config, meta, dst_device="cpu")
    if mode == "plugin":
        from collections import OrderedDict

        from lmcache.v1.storage_backend import storage_plugin_launcher

        backends: OrderedDict = OrderedDict()
        storage_plugin_launcher(config, meta, loop, cpu, "cpu", backends)
        backend = backends["kvfs"]
    else:
        from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend

        backend = LocalDiskBackend(config, loop, cpu, dst_device="cpu")
    shape = torch.Size((2, KV_SHAPE[0], 256, KV_SHAPE[3] * KV_SHAPE[4]))
    keys = [
        CacheEngineKey(
            model, 1, 0, (i * 0x9E3779B97F4A7C15) % (1 << 64) - (1 << 63), torch.bfloat16
        )
        for i in range(n)
    ]
    objs, digests = [], []
    for i in range(n):
        obj = cpu.allocate(shape, torch.bfloat16, MemoryFormat.KV_2LTD)
        g = torch.Generator().manual_seed(i)
        obj.tensor.view(torch.int16).copy_(
            torch.randint(-32768, 32767, shape, generator=g, dtype=torch.int16)
        )
        digests.append(xxhash.xxh3_64_intdigest(obj.byte_array))
        objs.append(obj)
    t = time.perf_counter()
    for k, obj in zip(keys, objs):
        backend.submit_put_task(k, obj)
    while any(backend.exists_in_put_tasks(k) for k in keys):
        time.sleep(0.001)
    store_s = time.perf_counter() - t
    # then durable on every file system alike: each chunk's file fsync'd from this process
    # (in its throttle group), as an engine that needs the chunks after a crash would. LMCache
    # itself never fsyncs: ext4 may still hold them in its page cache (a buffered write's
    # bytes, an O_DIRECT write's metadata) and kvfs in DRAM, awaiting its write-back
    from concurrent.futures import ThreadPoolExecutor

    def fsync(name: str) -> None:
        fd = os.open(os.path.join(directory, name), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(fsync, os.listdir(directory)))
    durable_s = time.perf_counter() - t
    for obj in objs:
        obj.ref_count_down()
    print("STORED " + json.dumps({"store_s": store_s, "store_durable_s": durable_s}), flush=True)
    sys.stdin.readline()  # the parent dropped the caches
    t = time.perf_counter()
    if conversations:  # one retrieval per conversation's prefix, the last stored first
        per = -(-n // conversations)
        got = [None] * n
        for c in reversed(range(conversations)):
            part = range(c * per, min(n, (c + 1) * per))
            for i, o in zip(part, backend.batched_get_blocking([keys[i] for i in part])):
                got[i] = o
    else:
        got = backend.batched_get_blocking(keys)
    read_s = time.perf_counter() - t
    exact = sum(
        1
        for o, d in zip(got, digests)
        if o is not None and xxhash.xxh3_64_intdigest(o.byte_array) == d
    )
    print("READ " + json.dumps({"read_s": read_s, "exact": exact}), flush=True)
    os._exit(0)  # LMCache leaves non-daemon workers behind


# --- the harness -----------------------------------------------------------------------------
def drop_page_cache() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def run_lmcache(
    mode: str, directory: Path, n: int, odirect: bool, group, drop, conversations: int = 0
) -> dict:
    proc = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--worker",
            mode,
            str(directory),
            str(n),
            "1" if odirect else "0",
            str(conversations),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parent.parent,
    )
    if group is not None:
        group.add(proc.pid)
    out: dict = {}
    try:
        for line in proc.stdout:
            if line.startswith("STORED "):
                out.update(json.loads(line[7:]))
                drop()
                proc.stdin.write("go\n")
                proc.stdin.flush()
            elif line.startswith("READ "):
                out.update(json.loads(line[5:]))
                break
    finally:
        proc.wait(60)
    if out.get("exact") != n:
        raise RuntimeError(
            f"{mode} on {directory}: {out.get('exact')} of {n} chunks read back bit-exact ({out})"
        )
    out["read_gbps"] = n * CHUNK / out["read_s"] / 1e9
    out["store_gbps"] = n * CHUNK / out["store_s"] / 1e9
    return out


def run_ext4(
    tmp: Path, n: int, bps, odirect: bool, raid0: bool = False, conversations: int = 0
) -> dict:
    """LMCache's local_disk on ext4: on one device, or (`raid0`) on a RAID-0 of 4 devices at
    `bps` each (testing/emulate.py's ext4_on_raid0: dm-stripe, or its stand-in)."""
    size = n * CHUNK + 512 * MiB
    with (
        Emulation(f"{size // MiB + 1024}m") as emu,
        (
            ext4_on_raid0(emu, tmp, "raid0", 4, size, bps)
            if raid0
            else ext4_on_loop(emu, tmp, "ext4", size, bps)
        ) as setup,
    ):
        (setup.root / "lmcache").mkdir()
        out = run_lmcache(
            "local_disk",
            setup.root / "lmcache",
            n,
            odirect,
            setup.group,
            drop_page_cache,
            conversations,
        )
        if raid0:
            out["raid0"] = setup.raid0
        return out


def run_kvfs(
    tmp: Path,
    n: int,
    bps,
    odirect: bool,
    mode: str = "local_disk",
    fresh_memory: bool = False,
    conversations: int = 0,
    prefetch: bool = True,
) -> dict:
    from kvfs.cli import main as kvfs_main
    from testing.mount import MountedKvfs, write_config

    per_ns = n * CHUNK // 4 + 256 * MiB
    with Emulation(f"{4 * per_ns // MiB + 512}m") as emu:
        devs = [emu.loop(f"ns{i}", per_ns) for i in range(4)]
        cfg = write_config(
            tmp / "kvfs.toml",
            tmp / "state",
            [{"path": d.path} for d in devs],
            dram=f"{n * CHUNK // MiB + 512}MiB",
            extra="" if prefetch else "[prefetch]\nenabled = false",
        )
        with contextlib.redirect_stdout(io.StringIO()):
            if kvfs_main(["format", "--force", "--config", str(cfg)]) != 0:
                raise RuntimeError("kvfs format failed")
        group = emu.cgroup("e2e-kvfs")
        if bps:
            for d in devs:
                group.limit(d, read_bps=bps, write_bps=bps)
        with MountedKvfs(tmp / "mnt", cfg, tmp / "kvfs.log") as m:
            group.add(m.pid)
            (m.mountpoint / "lmcache").mkdir()

            def drop() -> None:
                m.control("drop_dram", {"memory": True} if fresh_memory else None)
                drop_page_cache()

            out = run_lmcache(
                mode, m.mountpoint / "lmcache", n, odirect, group, drop, conversations
            )
            st = m.stats()
            out["passthrough"] = st["data_path"]["passthrough"]
            out["memory"] = st["data_path"]["memory"]
            out["prefetch"] = st.get("prefetch")
        import shutil

        shutil.rmtree(tmp / "state", ignore_errors=True)
        return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        worker(argv[1:])
        return 0
    ap = parser(__doc__)
    ap.add_argument("--chunks", type=int, default=24)
    ap.add_argument("--speeds", default="throttled,gbps1,fast")
    ap.add_argument("--no-nodirect", action="store_true", help="skip the use_odirect: false rows")
    ap.add_argument("--repeat", type=int, default=3, help="rounds; ratios are their medians")
    ap.add_argument(
        "--fresh-memory",
        action="store_true",
        help="kvfs gives the dropped blocks' memory back before the cold read",
    )
    ap.add_argument(
        "--conversations",
        type=int,
        default=0,
        help="LMCache's prefix-hit pattern: one retrieval per conversation (0: one batch)",
    )
    ap.add_argument(
        "--prefetch-ab",
        action="store_true",
        help="kvfs's local_disk rows with [prefetch] on and off",
    )
    args = parse(ap, argv)
    speeds = [s for s in args.speeds.split(",") if s]
    n = args.chunks
    warm_memory(min(16, 6 * n * CHUNK / (1 << 30) + 2))
    rows: dict[str, dict] = {}
    rounds: dict[str, list[float]] = {}
    out: dict = {
        "chunks": n,
        "chunk_bytes": CHUNK,
        "threads": THREADS,
        "repeat": args.repeat,
        "fresh_memory": args.fresh_memory,
        "conversations": args.conversations,
    }
    conv = args.conversations

    def ratio(key: str, value: float) -> None:
        rounds.setdefault(key, []).append(value)

    with tempfile.TemporaryDirectory(prefix="kvfs-e2e-") as tmp:
        tmp = Path(tmp)
        for rnd in range(args.repeat):
            for speed in speeds:
                bps = SPEEDS[speed]
                for odirect in (True,) if args.no_nodirect else (True, False):
                    tag = "" if odirect else "_nodirect"
                    r0 = rows[f"{speed}{tag} raid0"] = run_ext4(
                        tmp, n, bps, odirect, raid0=True, conversations=conv
                    )
                    out["raid0"] = r0.pop("raid0")
                    e = rows[f"{speed}{tag} ext4"] = run_ext4(
                        tmp, n, bps, odirect, conversations=conv
                    )
                    on_off = [True, False] if args.prefetch_ab and odirect else [True]
                    for prefetch in on_off if rnd % 2 == 0 else on_off[::-1]:
                        rows[f"{speed}{tag} kvfs" + ("" if prefetch else " prefetch off")] = (
                            run_kvfs(
                                tmp,
                                n,
                                bps,
                                odirect,
                                fresh_memory=args.fresh_memory,
                                conversations=conv,
                                prefetch=prefetch,
                            )
                        )
                    k = rows[f"{speed}{tag} kvfs"]
                    if len(on_off) == 2:
                        off = rows[f"{speed}{tag} kvfs prefetch off"]
                        ratio(f"{speed}_read_prefetch_on_vs_off", off["read_s"] / k["read_s"])
                        ratio(
                            f"{speed}_read_vs_raid0_prefetch_off",
                            off["read_gbps"] / r0["read_gbps"],
                        )
                    for base, b in (("raid0", r0), ("ext4", e)):
                        ratio(f"{speed}_read_vs_{base}{tag}", k["read_gbps"] / b["read_gbps"])
                        ratio(f"{speed}_store_vs_{base}{tag}", b["store_s"] / k["store_s"])
                        ratio(
                            f"{speed}_store_durable_vs_{base}{tag}",
                            b["store_durable_s"] / k["store_durable_s"],
                        )
                if speed != "throttled":
                    p = rows[f"{speed} plugin"] = run_kvfs(
                        tmp, n, bps, True, mode="plugin", conversations=conv
                    )
                    for base in ("raid0", "ext4"):
                        b = rows[f"{speed} {base}"]
                        ratio(f"plugin_{speed}_read_vs_{base}", p["read_gbps"] / b["read_gbps"])
                        ratio(f"plugin_{speed}_store_vs_{base}", b["store_s"] / p["store_s"])
                        ratio(
                            f"plugin_{speed}_store_durable_vs_{base}",
                            b["store_durable_s"] / p["store_durable_s"],
                        )
    for key, vs in rounds.items():
        out[key] = round(statistics.median(vs), 3)
    out["ratios_range"] = {k: [round(min(v), 3), round(max(v), 3)] for k, v in rounds.items()}
    out["rows"] = {
        k: {kk: (round(vv, 4) if isinstance(vv, float) else vv) for kk, vv in v.items()}
        for k, v in rows.items()
    }
    if args.json:
        print(dumps(out))
        return 0
    print(
        f"LMCache 0.5.6, {n} chunks of 32 MiB, {THREADS} disk threads; kvfs on 4 namespaces, "
        f"raid0: {out.get('raid0')}, ext4 on 1; reads cold (page cache and kvfs DRAM dropped)"
    )
    print(f"{'run (the last round)':<26}{'store GB/s':>11}{'read GB/s':>11}")
    for name, r in rows.items():
        print(f"{name:<26}{r['store_gbps']:>11.2f}{r['read_gbps']:>11.2f}")
    print(f"ratios: median of {args.repeat} round(s) [lowest, highest]")
    for key, (lo, hi) in out["ratios_range"].items():
        print(f"  {key} = {out[key]}  [{lo}, {hi}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
