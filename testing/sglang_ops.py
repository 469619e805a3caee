"""SGLang's HiCache L3 storage (sglang 0.5.23) driven without a model: the backend made by
StorageBackendFactory.create_backend(...) from a HiCacheStorageConfig, as SGLang's cache
controller makes it, then its page API (set / exists / batch_exists / get). Pages are bf16
tensors of `PAGE` bytes; keys are sha256 hex strings like SGLang's page hashes.

backend="file" is SGLang's HiCacheFile (directory from SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR);
backend="kvfs" is kvfs's, loaded by SGLang's "dynamic" backend from its module path.
"""

from __future__ import annotations

import hashlib
import os
import time

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

from testing.engine import content

PAGE = 2 << 20


def key(k: int) -> str:
    return hashlib.sha256(str(k).encode()).hexdigest()


def value(k: int, page: int = PAGE) -> torch.Tensor:
    return torch.from_numpy(content(k, page)).view(torch.bfloat16)


def close(state: dict) -> None:
    b = state.pop("backend", None)
    if b is not None and hasattr(b, "close"):
        b.close()


def open_backend(
    state: dict,
    dir: str,
    backend: str = "file",
    extra: dict | None = None,
    model: str = "meta-llama/Llama-3.1-8B",
    tp_rank: int = 0,
    tp_size: int = 1,
    page: int = PAGE,
) -> dict:
    close(state)
    state["page"] = page
    os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = dir
    extra = dict(extra or {})
    name = backend
    if backend == "kvfs":
        name = "dynamic"
        extra.update(
            backend_name="kvfs",
            module_path="kvfs.client.sglang_backend",
            class_name="KvfsHiCacheStorage",
        )
    cfg = HiCacheStorageConfig(
        tp_rank=tp_rank,
        tp_size=tp_size,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=False,
        enable_storage_metrics=False,
        is_page_first_layout=True,
        model_name=model,
        extra_config=extra or None,
    )
    b = StorageBackendFactory.create_backend(name, cfg, None)
    state["backend"] = b
    ev = b._evictor
    return {
        "class": type(b).__name__,
        "dir": b.file_path,
        "evicts": ev.enabled,
        "max_size": ev.max_size_bytes,
        "indexed": len(ev._lru),
    }


def set_pages(state: dict, keys: list[int], timed: bool = False, batch: bool = False):
    """Set pages one by one, as SGLang's backup thread does (`batch`: in one batch_set call, as
    its cache controller does); with `timed`, also the seconds the sets took (making the
    values not counted)."""
    b = state["backend"]
    values = [value(k, state["page"]) for k in keys]
    t = time.perf_counter()
    if batch:
        ok = [bool(b.batch_set([key(k) for k in keys], values))] * len(keys)
    else:
        ok = [bool(b.set(key(k), v)) for k, v in zip(keys, values)]
    seconds = time.perf_counter() - t
    return {"ok": ok, "seconds": seconds} if timed else ok


def exists(state: dict, keys: list[int]) -> list[bool]:
    b = state["backend"]
    return [bool(b.exists(key(k))) for k in keys]


def batch_exists(state: dict, keys: list[int]) -> dict:
    """SGLang's prefix lookups: v1 (a count) and v2 (KV pages, no extra pools)."""
    b = state["backend"]
    ks = [key(k) for k in keys]
    return {"v1": b.batch_exists(ks), "v2": b.batch_exists_v2(ks).kv_hit_pages}


def get(state: dict, keys: list[int], timed: bool = False, batch: bool = False):
    """Per page: True (bit-exact), False (wrong bytes), None (a miss). `batch`: one batch_get
    call (SGLang's file backend reads one page after another either way). With `timed`, also
    the seconds the reads took."""
    b = state["backend"]
    targets = [torch.zeros(state["page"] // 2, dtype=torch.bfloat16) for _ in keys]
    t = time.perf_counter()
    if batch:
        got = b.batch_get([key(k) for k in keys], targets)
    else:
        got = [b.get(key(k), target) for k, target in zip(keys, targets)]
    seconds = time.perf_counter() - t
    out = [
        None
        if g is None
        else bool(torch.equal(g.view(torch.uint8), value(k, state["page"]).view(torch.uint8)))
        for k, g in zip(keys, got)
    ]
    return {"ok": out, "seconds": seconds} if timed else out


def evictor(state: dict) -> dict:
    ev = state["backend"]._evictor
    return {"total": ev._total_bytes, "indexed": len(ev._lru)}


def files(state: dict, dir: str) -> list[str]:
    return sorted(os.listdir(dir))


def names(state: dict, keys: list[int]) -> list[str]:
    """The file each page is stored in."""
    b = state["backend"]
    return [b._get_suffixed_key(key(k)) + ".bin" for k in keys]


def stats(state: dict):
    return state["backend"].get_stats()


OPS = {
    "open": open_backend,
    "set": set_pages,
    "exists": exists,
    "batch_exists": batch_exists,
    "get": get,
    "evictor": evictor,
    "files": files,
    "names": names,
    "stats": stats,
    "close": close,
}
