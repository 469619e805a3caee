"""Drive the real LMCache 0.5.6 (CPU-only) against a directory; print one JSON line of results.

    python -m tests.lmcache.lmc_driver local_disk DIR --odirect 1 --chunks 12
    python -m tests.lmcache.lmc_driver evict DIR --chunks 12
    python -m tests.lmcache.lmc_driver overfill DIR --chunks 24 --max-gb 0.03
    python -m tests.lmcache.lmc_driver fs_put DIR --chunks 12
    python -m tests.lmcache.lmc_driver fs_get DIR --chunks 12
    python -m tests.lmcache.lmc_driver stall DIR --backend local_disk --chunks 6   (interactive)

Chunks are bf16 KV tensors of 4 layers x 256 tokens x 8 heads x 64 = 2 MiB, with contents derived
from the chunk number, so a second process can check what a first one stored.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import threading
import time

import torch

KV_SHAPE = (4, 2, 256, 8, 64)  # layers, K/V, tokens, kv heads, head dim
SHAPE = (2, 4, 256, 8 * 64)  # the same chunk as LMCache stores it (MemoryFormat.KV_2LTD)
MODEL = "meta-llama/Llama-3.1-8B"


def expected(i: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + i)
    return torch.randn(SHAPE, generator=g).to(torch.bfloat16)


def setup(
    directory: str,
    *,
    odirect: bool = False,
    max_gb: float = 1.0,
    remote: bool = False,
    plugin: bool = False,
):
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.pin_monitor import PinMonitor
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

    kwargs = dict(
        chunk_size=256,
        local_cpu=False,
        max_local_cpu_size=0.25,
        extra_config={"use_odirect": odirect, "disk_io_threads": 4},
    )
    if plugin:
        kwargs.update(storage_plugins=["kvfs"])
        kwargs["extra_config"] = {
            "storage_plugin.kvfs.module_path": "kvfs.client.lmcache_backend",
            "storage_plugin.kvfs.class_name": "KvfsBackend",
            "kvfs.path": directory,
            "kvfs.verify": True,
        }
    elif remote:
        # LMCache 0.5.6 parses remote_url with a mandatory host and port ("fs:///dir" is
        # refused as "missing host"); the fs connector ignores both and uses the path.
        kwargs.update(remote_url=f"fs://localhost:0{directory}", remote_serde="naive")
    else:
        kwargs.update(local_disk=directory, max_local_disk_size=max_gb)
    config = LMCacheEngineConfig.from_defaults(**kwargs)
    meta = LMCacheMetadata(
        model_name=MODEL,
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
    return config, meta, loop, cpu


def key(i: int):
    from lmcache.utils import CacheEngineKey

    # LMCache chunk hashes are signed 64-bit: use negative ones too
    return CacheEngineKey(
        MODEL, 1, 0, (i * 0x9E3779B97F4A7C15) % (1 << 64) - (1 << 63), torch.bfloat16
    )


def alloc(cpu, i: int):
    from lmcache.v1.memory_management import MemoryFormat

    obj = cpu.allocate(torch.Size(SHAPE), torch.bfloat16, MemoryFormat.KV_2LTD)
    obj.tensor.copy_(expected(i))
    return obj


def put_all(backend, cpu, n: int, first: int = 0) -> None:
    for i in range(first, first + n):
        obj = alloc(cpu, i)
        backend.submit_put_task(key(i), obj)
        deadline = time.monotonic() + 60
        while backend.exists_in_put_tasks(key(i)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"put of chunk {i} did not finish")
            time.sleep(0.005)
        obj.ref_count_down()


def put_batch(backend, cpu, n: int, first: int = 0) -> None:
    """Chunks first..first+n-1 in one batched put, as LMCache's storage manager puts them."""
    objs = [alloc(cpu, i) for i in range(first, first + n)]
    futures = backend.batched_submit_put_task([key(i) for i in range(first, first + n)], objs)
    for f in futures or []:
        if f is not None:
            f.result(60)
    for obj in objs:
        obj.ref_count_down()


def same(obj, i: int) -> bool:
    return obj is not None and torch.equal(obj.tensor.view(SHAPE), expected(i))


def run_local_disk(args) -> dict:
    from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend

    config, meta, loop, cpu = setup(args.dir, odirect=bool(args.odirect))
    disk = LocalDiskBackend(config, loop, cpu, dst_device="cpu")
    n = args.chunks
    put_all(disk, cpu, n)
    files = sorted(os.listdir(args.dir))
    ok_get = [same(disk.get_blocking(key(i)), i) for i in range(n)]
    ok_batched = [
        same(o, i) for i, o in zip(range(n), disk.batched_get_blocking([key(i) for i in range(n)]))
    ]
    for i in range(n):
        disk.pin(key(i))
    objs = asyncio.run_coroutine_threadsafe(
        disk.batched_get_non_blocking("lookup-1", [key(i) for i in range(n)]), loop
    ).result(60)
    ok_async = [same(o, i) for i, o in zip(range(n), objs)]
    return {
        "files": files,
        "get_blocking": ok_get,
        "batched_get_blocking": ok_batched,
        "batched_get_non_blocking": ok_async,
        "use_odirect": disk.use_odirect,
        "f_bsize": disk.os_disk_bs,
    }


def run_evict(args) -> dict:
    from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend

    # room for 5 chunks of 2 MiB: putting 12 makes LMCache unlink the oldest ones
    config, meta, loop, cpu = setup(args.dir, max_gb=5 * 2.1 * (1 << 20) / 1e9)
    disk = LocalDiskBackend(config, loop, cpu, dst_device="cpu")
    n = args.chunks
    put_all(disk, cpu, n)
    contained = [disk.contains(key(i)) for i in range(n)]
    kept_ok = [same(disk.get_blocking(key(i)), i) for i in range(n) if contained[i]]
    return {"contained": contained, "kept_ok": kept_ok, "files": sorted(os.listdir(args.dir))}


def run_overfill(args) -> dict:
    """local_disk with max_local_disk_size = --max-gb: what LMCache lists, what is on disk, and
    what get_blocking does for each chunk it lists."""
    from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend

    config, meta, loop, cpu = setup(args.dir, max_gb=args.max_gb)
    disk = LocalDiskBackend(config, loop, cpu, dst_device="cpu")
    n = args.chunks
    put_all(disk, cpu, n)
    contained = [disk.contains(key(i)) for i in range(n)]

    def present() -> list[bool]:
        return [os.path.exists(disk._key_to_path(key(i))) for i in range(n)]

    on_disk = present()
    got = []
    for i in range(n):
        if not contained[i]:
            got.append("miss")
            continue
        try:
            got.append("ok" if same(disk.get_blocking(key(i)), i) else "wrong")
        except Exception as e:  # noqa: BLE001 - what LMCache does with a chunk that is gone
            got.append(type(e).__name__)
    # again after the reads: an eviction made by the last puts tells the kernel to forget the
    # name asynchronously (kvfs/fs/kernel.py), so the first look may still find it cached
    on_disk_after = present()
    return {
        "contained": contained,
        "on_disk": on_disk,
        "on_disk_after": on_disk_after,
        "get_blocking": got,
    }


def run_fs(args, put: bool) -> dict:
    from lmcache.v1.storage_backend.remote_backend import RemoteBackend

    config, meta, loop, cpu = setup(args.dir, remote=True)
    remote = RemoteBackend(config, meta, loop, cpu, dst_device="cpu")
    n = args.chunks
    if put:
        put_all(remote, cpu, n)
        return {"files": sorted(os.listdir(args.dir))}
    contained = [remote.contains(key(i)) for i in range(n)]
    ok = [same(remote.get_blocking(key(i)), i) for i in range(n)]
    missing = remote.contains(key(n + 100))
    return {"contained": contained, "get_blocking": ok, "contains_missing": missing}


def run_plugin(args, put: bool) -> dict:
    from collections import OrderedDict

    from lmcache.v1.storage_backend import storage_plugin_launcher

    config, meta, loop, cpu = setup(args.dir, plugin=True)
    backends: OrderedDict = OrderedDict()
    storage_plugin_launcher(config, meta, loop, cpu, "cpu", backends)  # LMCache's own loader
    kv = backends["kvfs"]
    n = args.chunks
    out: dict = {"backend": str(kv)}
    if put:  # half one at a time, half in one batch
        put_all(kv, cpu, n // 2)
        put_batch(kv, cpu, n - n // 2, first=n // 2)
        out["files"] = sorted(os.listdir(args.dir))
    out["contained"] = [kv.contains(key(i)) for i in range(n)]
    out["get_blocking"] = [same(kv.get_blocking(key(i)), i) for i in range(n)]
    out["batched_get_blocking"] = [
        same(o, i) for i, o in zip(range(n), kv.batched_get_blocking([key(i) for i in range(n)]))
    ]
    objs = asyncio.run_coroutine_threadsafe(
        kv.batched_get_non_blocking("lookup-1", [key(i) for i in range(n)]), loop
    ).result(60)
    out["batched_get_non_blocking"] = [same(o, i) for i, o in zip(range(n), objs)]
    out["prefix_hits"] = asyncio.run_coroutine_threadsafe(
        kv.batched_async_contains("l", [key(i) for i in range(n)] + [key(n + 5)]), loop
    ).result(60)
    kv.close()
    return out


def run_stall(args) -> dict:
    """Store chunks, then load them three times, each time once the test says so on stdin
    (it stalls a namespace before the first, heals it before the second, removes it from the
    pool before the third): per load, what each chunk gave ("ok", "wrong", "miss", or the
    exception's name) and the seconds it took."""
    import sys
    from collections import OrderedDict

    if args.backend == "plugin":
        from lmcache.v1.storage_backend import storage_plugin_launcher

        config, meta, loop, cpu = setup(args.dir, plugin=True)
        backends: OrderedDict = OrderedDict()
        storage_plugin_launcher(config, meta, loop, cpu, "cpu", backends)
        b = backends["kvfs"]
    elif args.backend == "fs":
        from lmcache.v1.storage_backend.remote_backend import RemoteBackend

        config, meta, loop, cpu = setup(args.dir, remote=True)
        b = RemoteBackend(config, meta, loop, cpu, dst_device="cpu")
    else:
        from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend

        config, meta, loop, cpu = setup(args.dir)
        b = LocalDiskBackend(config, loop, cpu, dst_device="cpu")
    n = args.chunks
    put_all(b, cpu, n)

    def what(o, i) -> str:
        if o is None:
            return "miss"
        ok = same(o, i)
        o.ref_count_down()
        return "ok" if ok else "wrong"

    def load() -> dict:
        # as LMCache's engine does: a lookup, then a get of what it has; one chunk alone
        # (get_blocking), then the others in one batch (batched_get_blocking)
        out: dict = {}
        t = time.monotonic()
        try:
            out["single"] = what(b.get_blocking(key(0)), 0) if b.contains(key(0)) else "miss"
        except Exception as e:  # noqa: BLE001 - what LMCache does with the error
            out["single"] = type(e).__name__
        out["single_s"] = round(time.monotonic() - t, 3)
        t = time.monotonic()
        have = [i for i in range(1, n) if b.contains(key(i))]
        try:
            objs = b.batched_get_blocking([key(i) for i in have])
            got = {i: what(o, i) for i, o in zip(have, objs)}
            out["batched"] = [got.get(i, "miss") for i in range(1, n)]
        except Exception as e:  # noqa: BLE001 - what LMCache does with the error
            out["batched"] = type(e).__name__
        out["batched_s"] = round(time.monotonic() - t, 3)
        return out

    result: dict = {}
    for phase in ("during", "after", "removed"):
        print("READY", flush=True)
        sys.stdin.readline()
        result[phase] = load()
    return result


def main() -> None:
    logging.disable(logging.WARNING)
    p = argparse.ArgumentParser()
    p.add_argument(
        "mode",
        choices=[
            "local_disk",
            "evict",
            "overfill",
            "fs_put",
            "fs_get",
            "plugin_put",
            "plugin_get",
            "stall",
        ],
    )
    p.add_argument("--backend", choices=["local_disk", "fs", "plugin"], default="local_disk")
    p.add_argument("dir")
    p.add_argument("--odirect", type=int, default=0)
    p.add_argument("--chunks", type=int, default=12)
    p.add_argument("--max-gb", type=float, default=1.0, help="max_local_disk_size (overfill)")
    args = p.parse_args()
    if args.mode == "local_disk":
        out = run_local_disk(args)
    elif args.mode == "evict":
        out = run_evict(args)
    elif args.mode == "overfill":
        out = run_overfill(args)
    elif args.mode == "stall":
        out = run_stall(args)
    elif args.mode.startswith("plugin"):
        out = run_plugin(args, put=args.mode == "plugin_put")
    else:
        out = run_fs(args, put=args.mode == "fs_put")
    print("RESULT " + json.dumps(out), flush=True)
    os._exit(0)  # LMCache leaves non-daemon workers behind


if __name__ == "__main__":
    main()
