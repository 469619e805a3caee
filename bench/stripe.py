#!/usr/bin/env python3
"""Striping: cold reads and writes of 32 MiB blocks through kvfs on 1, 2 and 4 namespaces.

Every namespace is a loop device over a file on a private tmpfs, throttled with a cgroup limit
(v1 blkio or v2 io.max, whichever the machine has: testing/emulate.py) of --bps bytes/s for reads
and for writes; the kvfs daemon runs in that cgroup. In one run:

  kvfs Nns     write B blocks through the mount (open, one write, fsync, close: durable in
               either durability mode; `write_gbps`), then read
               them back cold (DRAM tier and page cache dropped) with one thread, 1 MiB reads
  plainfs      the same blocks as plain files on ext4 on one such throttled device, read cold
               by the same single-threaded reader (what LMCache's local_disk does today)
  raid0        the same on ext4 over a RAID-0 of 4 such devices (dm-stripe where the kernel
               has device-mapper, else a stand-in: one device at 4x the limit; `raid0` says
               which): `read_4ns_vs_raid0`, `write_4ns_vs_raid0`
  hetero       4 namespaces, one of them throttled to half: how close cold reads get to the sum
               of the namespaces' bandwidths (1.0 = all of it), with placement weights learned
               and with static equal weights. Both rows first write, read and delete the same
               warm-up of 8 blocks (`warmup_blocks`), so that adaptive placement has measured
               the namespaces before the blocks that are timed; only the placement differs.

Every read must return the whole block (a short read fails the run), and one block per run is
read back cold and checked bit-exact.

    python bench/stripe.py [--bps 100e6] [--blocks 6] [--json]

Everything (tmpfs, loop devices, cgroups, mounts) is set up and torn down here.
"""

from __future__ import annotations

import contextlib
import io as io_mod
import mmap
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import dumps, parse, parser  # noqa: E402
from bench.reads import digest, read_full  # noqa: E402
from testing.emulate import Emulation, ext4_on_loop, ext4_on_raid0  # noqa: E402
from testing.mount import MountedKvfs, write_config  # noqa: E402

MiB = 1 << 20
BLOCK = 32 * MiB
HETERO_WARMUP = 8  # blocks written, read and deleted before the hetero rows are timed


def read_cold(paths: list[Path], size: int = BLOCK) -> float:
    """Read each file whole with 1 MiB requests; seconds. A short read fails the run."""
    view = memoryview(mmap.mmap(-1, MiB))
    t = time.perf_counter()
    for p in paths:
        read_full(p, view, size)
    return time.perf_counter() - t


def verify_one(path: Path, data: bytes) -> None:
    """One block per run, read cold through the path measured, must come back bit-exact."""
    read_full(path, memoryview(mmap.mmap(-1, MiB)), len(data), check=digest(data))


def write_blocks(paths: list[Path], blocks: list[bytes]) -> float:
    t = time.perf_counter()
    for p, data in zip(paths, blocks):
        fd = os.open(p, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)  # durable (kvfs's default durability "fsync": close alone is not)
        finally:
            os.close(fd)
    return time.perf_counter() - t


def drop_page_cache() -> None:
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def run_kvfs(
    emu: Emulation,
    tmp: Path,
    name: str,
    bps: list[float],
    blocks: list[bytes],
    adaptive: bool = True,
    warmup: int = 0,
) -> dict:
    """Write the blocks through a fresh kvfs on len(bps) throttled namespaces, read them back
    cold. With `warmup`, that many blocks are first written, read and deleted, so that adaptive
    placement has learned the namespaces before the measured ones."""
    devs = [
        emu.loop(f"{name}-ns{i}", ((len(blocks) + warmup) * BLOCK) // len(bps) + 256 * MiB)
        for i in range(len(bps))
    ]
    cfg = write_config(
        tmp / f"{name}.toml",
        tmp / f"{name}-state",
        [{"path": d.path} for d in devs],
        dram="256MiB",
        pool=f"adaptive_placement = {str(adaptive).lower()}",
    )
    from kvfs.cli import main as kvfs_main

    with contextlib.redirect_stdout(io_mod.StringIO()):
        if kvfs_main(["format", "--config", str(cfg)]) != 0:
            raise RuntimeError("kvfs format failed")
    group = emu.cgroup(f"kvfs-{name}")
    for d, b in zip(devs, bps):
        group.limit(d, read_bps=b, write_bps=b)
    with MountedKvfs(tmp / f"{name}-mnt", cfg, tmp / f"{name}.log") as m:
        group.add(m.pid)
        if warmup:
            warm = [m.mountpoint / f"warm{i}.pt" for i in range(warmup)]
            write_blocks(warm, [blocks[i % len(blocks)] for i in range(warmup)])
            m.control("drop_dram")
            read_cold(warm)
            for p in warm:
                p.unlink()
        paths = [m.mountpoint / f"block{i}.pt" for i in range(len(blocks))]
        w = write_blocks(paths, blocks)
        m.control("drop_dram")
        drop_page_cache()
        r = read_cold(paths)
        m.control("drop_dram")
        drop_page_cache()
        verify_one(paths[0], blocks[0])
        stats = m.stats()
    group.remove()
    total = len(blocks) * BLOCK
    return {
        "read_gbps": total / r / 1e9,
        "write_gbps": total / w / 1e9,
        "warmup_blocks": warmup,
        "placement_weights": stats["tiers"]["pool"]["placement_weights"],
        "catalog_commit_seconds": stats["catalog"]["commit_seconds"],
        "write_seconds": w,
    }


def run_plainfs(
    emu: Emulation, tmp: Path, bps: float, blocks: list[bytes], raid0: bool = False
) -> dict:
    """The same blocks as files on ext4: on one throttled device, or (`raid0`) on a RAID-0 of 4
    (testing/emulate.py's ext4_on_raid0: dm-stripe, or its stand-in at 4x the limit). This
    process writes and reads them itself, inside the set-up's throttle group."""
    size = len(blocks) * BLOCK + 256 * MiB
    with (
        ext4_on_raid0(emu, tmp, "raid0", 4, size, bps)
        if raid0
        else ext4_on_loop(emu, tmp, "plain", size, bps)
    ) as setup:
        paths = [setup.root / f"block{i}.pt" for i in range(len(blocks))]
        t = time.perf_counter()
        for p, data in zip(paths, blocks):
            with open(p, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())  # durable, as kvfs's writes here are
        w = time.perf_counter() - t
        drop_page_cache()
        r = read_cold(paths)
        drop_page_cache()
        verify_one(paths[0], blocks[0])
        kind = setup.raid0
    total = len(blocks) * BLOCK
    return {
        "read_gbps": total / r / 1e9,
        "write_gbps": total / w / 1e9,
        **({"raid0": kind} if raid0 else {}),
    }


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument(
        "--bps", type=float, default=100e6, help="bytes/s per namespace (read and write)"
    )
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument(
        "--skip-extra", action="store_true", help="only the 1/2/4 namespace and plainfs rows"
    )
    args = parse(ap, argv)
    blocks = [os.urandom(BLOCK) for _ in range(args.blocks)]
    rows: dict[str, dict] = {}
    size = f"{(args.blocks * BLOCK * 8) // MiB + 2048}m"
    with Emulation(size) as emu, tempfile.TemporaryDirectory(prefix="kvfs-stripe-") as tmp:
        tmp = Path(tmp)
        rows["plainfs"] = run_plainfs(emu, tmp, args.bps, blocks)
        rows["raid0"] = run_plainfs(emu, tmp, args.bps, blocks, raid0=True)
        for n in (1, 2, 4):
            rows[f"kvfs {n}ns"] = run_kvfs(emu, tmp, f"n{n}", [args.bps] * n, blocks)
        if not args.skip_extra:
            het = [args.bps] * 3 + [args.bps / 2]
            rows["hetero static"] = run_kvfs(
                emu, tmp, "hets", het, blocks, adaptive=False, warmup=HETERO_WARMUP
            )
            rows["hetero adaptive"] = run_kvfs(emu, tmp, "heta", het, blocks, warmup=HETERO_WARMUP)
    r1, r4 = rows["kvfs 1ns"], rows["kvfs 4ns"]
    out = {
        "bps_per_namespace": args.bps,
        "blocks": args.blocks,
        "block_bytes": BLOCK,
        "rows": {
            k: {kk: (round(vv, 4) if isinstance(vv, float) else vv) for kk, vv in v.items()}
            for k, v in rows.items()
        },
        "read_4ns_vs_1ns": round(r4["read_gbps"] / r1["read_gbps"], 3),
        "read_4ns_vs_plainfs": round(r4["read_gbps"] / rows["plainfs"]["read_gbps"], 3),
        "read_4ns_vs_raid0": round(r4["read_gbps"] / rows["raid0"]["read_gbps"], 3),
        "write_4ns_vs_raid0": round(r4["write_gbps"] / rows["raid0"]["write_gbps"], 3),
        "raid0": rows["raid0"].pop("raid0"),
        "write_4ns_vs_1ns": round(r4["write_gbps"] / r1["write_gbps"], 3),
    }
    if "hetero adaptive" in rows:
        ideal = 3.5 * args.bps / 1e9  # the four namespaces' bandwidths added up
        out["hetero_read_vs_ideal"] = round(rows["hetero adaptive"]["read_gbps"] / ideal, 3)
        out["hetero_static_read_vs_ideal"] = round(rows["hetero static"]["read_gbps"] / ideal, 3)
    if args.json:
        print(dumps(out))
        return 0
    print(
        f"32 MiB blocks x {args.blocks}; every namespace throttled to {args.bps / 1e6:.0f} MB/s "
        f"read and write; one reader/writer thread"
    )
    print(f"{'setup':<16}{'read GB/s':>11}{'write GB/s':>12}{'warm-up':>9}")
    for k, v in rows.items():
        print(
            f"{k:<16}{v['read_gbps']:>11.3f}{v['write_gbps']:>12.3f}{v.get('warmup_blocks', 0):>9}"
        )
    for k in (
        "read_4ns_vs_1ns",
        "read_4ns_vs_plainfs",
        "write_4ns_vs_1ns",
        "hetero_read_vs_ideal",
        "hetero_static_read_vs_ideal",
    ):
        if k in out:
            print(f"{k} = {out[k]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
