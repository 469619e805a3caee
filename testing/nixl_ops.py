"""LMCache 0.5.6's NIXL storage backend with NIXL's POSIX plugin (nixl-cu12 1.5.1), CPU-only:
the backend LMCache builds for `enable_nixl_storage` (NixlStorageBackend.CreateNixlStorageBackend)
with its staging buffer in LMCache's CPU pool (nixl_buffer_device: cpu), chunks put, looked up
and read back through LMCache's own calls.

nixl_pool_size 0 is the dynamic backend (one file per chunk, named after its key, opened per
transfer); N > 0 the static one (N slot files opened once and kept open, chunks written in
place, LMCache's own LRU over the slots). engine "aio" (libaio, the plugin's default) or
"uring" (io_uring).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

# nixl before lmcache: LMCache imports cuda-python 13, and with it loaded the nixl meta package
# would pick nixl_cu13 (not installed) even on a machine without CUDA
import nixl._api  # noqa: F401, I001
import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_management import MemoryFormat
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.pin_monitor import PinMonitor
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.nixl_storage_backend import NixlStorageBackend

from testing.engine import content

LAYERS = 4
KV_SHAPE = (LAYERS, 2, 256, 8, 64)  # layers, K/V, tokens, kv heads, head dim: 2 MiB in bf16
MODEL = "meta-llama/Llama-3.1-8B"


def key(i: int) -> CacheEngineKey:
    # LMCache chunk hashes are signed 64-bit: negative ones too
    return CacheEngineKey(
        MODEL, 1, 0, (i * 0x9E3779B97F4A7C15) % (1 << 64) - (1 << 63), torch.bfloat16
    )


def _shape(layers: int = LAYERS) -> tuple:
    return (2, layers, 256, 8 * 64)  # a chunk as LMCache stores it (KV_2LTD)


def expected(i: int, layers: int = LAYERS) -> torch.Tensor:
    shape = _shape(layers)
    return (
        torch.from_numpy(content(i, 2 * 256 * 8 * 64 * 2 * layers)).view(torch.bfloat16).view(shape)
    )


def same(obj, i: int, layers: int = LAYERS) -> bool:
    """Bit-exact (random bytes include NaN patterns: compare them as integers)."""
    return torch.equal(
        obj.tensor.view(_shape(layers)).view(torch.int16), expected(i, layers).view(torch.int16)
    )


def close(state: dict) -> None:
    for name in ("backend", "cpu"):
        obj = state.pop(name, None)
        try:
            if obj is not None and hasattr(obj, "close"):
                obj.close()
        except OSError as e:  # its files were on a mount that is gone (a failed test)
            print(f"closing the {name}: {e}", flush=True)


def _loop(state: dict) -> asyncio.AbstractEventLoop:
    if "loop" not in state:
        loop = state["loop"] = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()
    return state["loop"]


def open_backend(
    state: dict,
    dir: str,
    pool_size: int = 0,
    direct: bool = True,
    engine: str = "aio",
    layers: int = LAYERS,
    cpu_gb: float = 0.125,
) -> dict:
    """layers: 4 makes 2 MiB chunks, 16 makes 8 MiB ones (256 tokens, 8 KV heads of 64)."""
    close(state)
    state["layers"] = layers
    params = {"use_uring": "true"} if engine == "uring" else {"use_aio": "true"}
    config = LMCacheEngineConfig.from_defaults(
        chunk_size=256,
        local_cpu=False,
        max_local_cpu_size=cpu_gb,
        nixl_buffer_device="cpu",
        save_unfull_chunk=False,
        extra_config={
            "enable_nixl_storage": True,
            "nixl_backend": "POSIX",
            "nixl_pool_size": pool_size,
            "nixl_path": dir,
            "use_direct_io": direct,
            "nixl_backend_params": params,
        },
    )
    meta = LMCacheMetadata(
        model_name=MODEL,
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=torch.bfloat16,
        kv_shape=(layers,) + KV_SHAPE[1:],
    )
    PinMonitor.GetOrCreate(config)
    os.makedirs(dir, exist_ok=True)
    cpu = LocalCPUBackend(config, meta, dst_device="cpu")
    b = NixlStorageBackend.CreateNixlStorageBackend(config, _loop(state), meta, cpu)
    state.update(backend=b, cpu=cpu, dir=dir)
    return {"class": type(b).__name__}


def put(state: dict, keys: list[int], batch: int = 4, timed: bool = False):
    """Put chunks `batch` at a time (one NIXL transfer each) and wait for them; with `timed`,
    the seconds the transfers took (filling the buffers not counted)."""
    b, cpu, layers = state["backend"], state["cpu"], state["layers"]
    seconds = 0.0
    for i in range(0, len(keys), batch):
        part = keys[i : i + batch]
        objs = []
        for k in part:
            obj = cpu.allocate(torch.Size(_shape(layers)), torch.bfloat16, MemoryFormat.KV_2LTD)
            obj.tensor.copy_(expected(k, layers))
            objs.append(obj)
        t = time.perf_counter()
        b.batched_submit_put_task([key(k) for k in part], objs)
        deadline = time.monotonic() + 120
        while any(b.exists_in_put_tasks(key(k)) for k in part):
            if time.monotonic() > deadline:
                raise TimeoutError(f"puts of {part} did not finish")
            time.sleep(0.001)
        seconds += time.perf_counter() - t
        for obj in objs:
            obj.ref_count_down()
    return {"n": len(keys), "seconds": seconds} if timed else len(keys)


def contains(state: dict, keys: list[int]) -> list[bool]:
    b = state["backend"]
    return [bool(b.contains(key(k))) for k in keys]


def get(state: dict, keys: list[int]) -> list[bool | None]:
    """Per chunk: True (bit-exact), False (wrong bytes), None (LMCache returned nothing)."""
    b = state["backend"]
    out = []
    for k in keys:
        try:
            obj = b.get_blocking(key(k))
        except Exception as e:  # noqa: BLE001 - reported as what it is
            out.append(f"{type(e).__name__}: {e}")
            continue
        if obj is None:
            out.append(None)
            continue
        out.append(same(obj, k, state["layers"]))
        obj.ref_count_down()
    return out


def batched_get(state: dict, keys: list[int], timed: bool = False, batch: int = 0):
    """batched_get_blocking calls of `batch` chunks (one NIXL transfer each; 0: all at once),
    back to back; checked after the last. With `timed`, also the seconds they took."""
    b = state["backend"]
    batch = batch or len(keys)
    t = time.perf_counter()
    objs = []
    for i in range(0, len(keys), batch):
        objs += b.batched_get_blocking([key(k) for k in keys[i : i + batch]])
    seconds = time.perf_counter() - t
    out = []
    for k, obj in zip(keys, objs):
        out.append(None if obj is None else same(obj, k, state["layers"]))
        if obj is not None:
            obj.ref_count_down()
    return {"ok": out, "seconds": seconds} if timed else out


def files(state: dict, dir: str) -> dict:
    return {n: os.stat(os.path.join(dir, n)).st_size for n in sorted(os.listdir(dir))}


OPS = {
    "open": open_backend,
    "put": put,
    "contains": contains,
    "get": get,
    "batched_get": batched_get,
    "files": files,
    "close": close,
}
