"""`python mount/demo.py MOUNTPOINT`: write a sample KV block through a mount, read it back,
check it bit for bit, and print what kvfs did and how to go on (used by `make run`). A script
beside the mount helper, not part of the package: nothing in kvfs/ needs it."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

from kvfs.units import format_size

SAMPLE = "demo/meta-llama-Llama-3.1-8B@1@0@-274654dcc82ea3f3@bfloat16.pt"
SIZE = 32 << 20  # one 256-token chunk of Llama-3.1-8B in bf16


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python mount/demo.py MOUNTPOINT", file=sys.stderr)
        return 2
    mnt = argv[0]
    path = os.path.join(mnt, SAMPLE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = os.urandom(SIZE)
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        f.write(data)
        t1 = time.perf_counter()
        os.fsync(f.fileno())  # the durability point (with durability "close": close)
        t2 = time.perf_counter()
    write_s, sync_s = t1 - t0 + time.perf_counter() - t2, t2 - t1
    t1 = time.perf_counter()
    with open(path, "rb") as f:
        back = f.read()
    t2 = time.perf_counter()
    if back != data:
        print(f"kvfs demo: {path} did not read back identical", file=sys.stderr)
        return 1
    stats = json.loads(os.getxattr(mnt, "user.kvfs.stats"))
    durable = (
        f"fsync() made it durable in the pool in {sync_s:.3f} s "
        f"(close() alone: within writeback_ms)"
        if "writeback" in stats
        else 'durable in the pool once close() returned (durability "close")'
    )
    pool, dram = stats["tiers"]["pool"], stats["tiers"]["dram"]
    vfs = os.statvfs(mnt)
    where, data_path = os.path.abspath(mnt), stats["data_path"]
    sha = hashlib.sha256(back).hexdigest()[:16]
    capacity, free = format_size(pool["capacity"]), format_size(pool["free"])
    spaces = len(stats["namespaces"])
    used, budget = format_size(dram["used"]), format_size(dram["capacity"])
    route = (
        "FUSE passthrough: the kernel moves file data without the daemon"
        if data_path["passthrough"]
        else "through the daemon: " + data_path["why"]
    )
    stats_cmd = f"getfattr --only-values -n user.kvfs.stats {mnt} | python3 -m json.tool"
    print(f"""
kvfs is mounted at {where}
  wrote  {SAMPLE} ({format_size(SIZE)}) in {write_s:.3f} s; {durable}
  read   it back bit-exact in {t2 - t1:.3f} s (sha256 {sha}...)
  pool   {capacity} on {spaces} namespace(s), {free} free; statfs block size {vfs.f_bsize}
  DRAM   {used} of {budget} in use ({data_path["memory"]})
  path   {route}

Use it:
  point LMCache at it:  LMCACHE_LOCAL_DISK=file://{where}/lmcache  LMCACHE_MAX_LOCAL_DISK_SIZE=2
  inspect it:           ls -l {mnt}/demo;  {stats_cmd}
  unmount it:           .venv/bin/kvfs umount {mnt}    (or: make clean-mount)
""")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
