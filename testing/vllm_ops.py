"""vLLM's secondary KV tiers (vllm/v1/kv_offload/tiering) driven without a model, the way
vLLM's own tests/v1/kv_offload/tiering/test_fs_tier.py does: a page-aligned CPU "primary tier"
of block slots, TransferJobs to store slots to the tier and load them back.

The tier is made by vLLM's SecondaryTierFactory from a config dict, as a vLLM server makes it
from kv_connector_extra_config: {"type": "fs", "root_dir": ...} for vLLM's FileSystemTierManager,
or {"type": "KvfsTier", "module_path": "kvfs.client.vllm_tier", ...} for kvfs's own.
"""

from __future__ import annotations

import mmap
import os
import time
from unittest.mock import MagicMock

import numpy as np
import torch
from vllm.v1.kv_offload.base import (
    LookupResult,
    OffloadingKVEventsConfig,
    ReqContext,
    ScheduleEndContext,
    make_offload_key,
)
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.base import TransferJob
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

from testing.engine import content

BLOCK = 2 << 20  # bytes per KV block (one chunk of one block)


def _spec(model: str, block: int, events: bool = False) -> MagicMock:
    spec = MagicMock()
    spec.config = OffloadingConfig(
        groups=(),
        worker_kv_bytes_per_block=block,
        enable_kv_cache_events=events,
        extra_config={},
        engine_id="kvfs-test",
        model=OffloadingModelConfig(name=model, dtype="bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=1,
            tp_size=1,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
    )
    spec.blocks_per_chunk = 1
    spec.kv_events_config = OffloadingKVEventsConfig(
        enable_kv_cache_events=events, self_describing_kv_events=False
    )
    return spec


def key(n: int):
    return make_offload_key(n.to_bytes(8, "big"), 0)


def close(state: dict) -> None:
    tier = state.pop("tier", None)
    if tier is not None:
        tier.shutdown()


def open_tier(
    state: dict,
    root: str,
    tier: str = "fs",
    slots: int = 16,
    threads: int = 16,
    model: str = "meta-llama/Llama-3.1-8B",
    block: int = BLOCK,
    events: bool = False,
    **extra,
) -> dict:
    """`events`: vLLM's KV events on, for the tier too (its `enable_kv_events`), as a server
    started with --kv-events-config has them (read with `kv_events`)."""
    close(state)
    buf = state.get("buf")
    if buf is None or len(buf) != slots * block:
        buf = state["buf"] = mmap.mmap(-1, slots * block)  # page-aligned, like pinned memory
    primary = torch.frombuffer(buf, dtype=torch.uint8).view(slots, block)
    cfg = {
        "type": "fs",
        "root_dir": root,
        "n_read_threads": threads,
        "n_write_threads": threads,
        **extra,
    }
    if tier == "kvfs":
        cfg.update(type="KvfsTier", module_path="kvfs.client.vllm_tier")
    if events:
        cfg["enable_kv_events"] = True
    spec = _spec(model, block, events)
    t = SecondaryTierFactory.create_secondary_tier(cfg, memoryview(primary.numpy()), spec)
    state["spec"] = spec
    state.update(tier=t, primary=primary, slots=slots, block=block, job=state.get("job", 0))
    return {
        "class": type(t).__name__,
        "o_direct": t._use_o_direct,
        "config": t.file_mapper.get_config_file_path(),
        "file0": t.file_mapper.get_file_name(key(0)),
    }


def _run(state: dict, submit, keys: list[int], first_slot: int) -> dict:
    tier = state["tier"]
    state["job"] += 1
    job = TransferJob(
        job_id=state["job"],
        keys=[key(k) for k in keys],
        chunk_ids=np.arange(first_slot, first_slot + len(keys)),
        is_promotion=submit == "load",
        req_context=ReqContext(req_id="io"),
    )
    (tier.submit_load if submit == "load" else tier.submit_store)(job)
    tier.drain_jobs()
    results = list(tier.get_finished_jobs())
    assert len(results) == 1 and results[0].job_id == job.job_id, results
    r = results[0]
    return {
        "success": bool(r.success),
        "ok_keys": None
        if r.successful_keys is None
        else [int.from_bytes(bytes(k)[:8], "big") for k in r.successful_keys],
    }


def store(state: dict, keys: list[int], batch: int | None = None, timed: bool = False):
    """Store blocks `keys` (contents from `content`), `batch` blocks per job; with `timed`,
    also the seconds the jobs took (filling the slots not counted)."""
    slots = state["slots"]
    batch = min(batch or slots, slots)
    out, seconds = [], 0.0
    for i in range(0, len(keys), batch):
        part = keys[i : i + batch]
        for j, k in enumerate(part):
            state["primary"][j] = torch.from_numpy(content(k, state["block"]))
        t = time.perf_counter()
        out.append(_run(state, "store", part, 0)["success"])
        seconds += time.perf_counter() - t
    return {"ok": out, "seconds": seconds} if timed else out


def load(state: dict, keys: list[int]) -> dict:
    """Load blocks `keys` in one job into zeroed slots; which arrived bit-exact, and the
    seconds the job took."""
    assert len(keys) <= state["slots"]
    state["primary"][: len(keys)] = 0
    t = time.perf_counter()
    r = _run(state, "load", keys, 0)
    r["seconds"] = time.perf_counter() - t
    r["exact"] = [
        bool(np.array_equal(state["primary"][j].numpy(), content(k, state["block"])))
        for j, k in enumerate(keys)
    ]
    return r


def transfer_many(state: dict, kind: str, keys: list[int], per_job: int = 1) -> dict:
    """Many requests at once: block i in slot i, `per_job` blocks per TransferJob, every job
    submitted before any is waited for (vLLM's 16+16 threads run them in parallel). Seconds
    from the first submit to the last job done; for loads, which blocks arrived bit-exact."""
    tier, primary, block = state["tier"], state["primary"], state["block"]
    assert len(keys) <= state["slots"]
    if kind == "store":
        for j, k in enumerate(keys):
            primary[j] = torch.from_numpy(content(k, block))
    else:
        primary[: len(keys)] = 0
    jobs = []
    t = time.perf_counter()
    for i in range(0, len(keys), per_job):
        state["job"] += 1
        job = TransferJob(
            job_id=state["job"],
            keys=[key(k) for k in keys[i : i + per_job]],
            chunk_ids=np.arange(i, min(i + per_job, len(keys))),
            is_promotion=kind == "load",
            req_context=ReqContext(req_id=f"r{i}"),
        )
        (tier.submit_load if kind == "load" else tier.submit_store)(job)
        jobs.append(job.job_id)
    tier.drain_jobs()
    seconds = time.perf_counter() - t
    results = {r.job_id: r.success for r in tier.get_finished_jobs()}
    out = {"seconds": seconds, "success": all(results.get(j) for j in jobs)}
    if kind == "load":
        out["exact"] = all(
            np.array_equal(primary[j].numpy(), content(k, block)) for j, k in enumerate(keys)
        )
    return out


def lookup(state: dict, keys: list[int], timeout: float = 10.0) -> list[str]:
    """vLLM's scheduler loop for lookups: ask, end the step, ask again until answered."""
    tier = state["tier"]
    state["job"] += 1
    ctx = ReqContext(req_id=f"lookup-{state['job']}")
    deadline = time.monotonic() + timeout
    res = [tier.lookup(key(k), ctx) for k in keys]
    while any(r is LookupResult.RETRY for r in res) and time.monotonic() < deadline:
        tier.on_schedule_end(ScheduleEndContext(new_req_ids=[], preempted_req_ids=()))
        time.sleep(0.005)
        res = [tier.lookup(key(k), ctx) for k in keys]
    tier.on_request_finished(ctx)
    return [r.name for r in res]


def kv_events(state: dict) -> str:
    """The KV events vLLM itself announces for what the tier did since the last call: the
    tier's OffloadingEvents made KV events by vLLM's OffloadingEventsTracker, as the
    offloading connector makes them, in one KVEventBatch encoded by vLLM's encoder (hex)."""
    import msgspec
    from vllm.distributed.kv_events import KVEventBatch
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.events import (
        OffloadingEventsTracker,
    )

    tracker = OffloadingEventsTracker(state["spec"].kv_events_config)
    events = list(tracker.take_events(state["tier"].take_events()))
    return msgspec.msgpack.Encoder().encode(KVEventBatch(ts=time.time(), events=events)).hex()


def files(state: dict, root: str) -> list[str]:
    out = []
    for d, _, names in os.walk(root):
        out += [os.path.relpath(os.path.join(d, n), root) for n in names]
    return sorted(out)


OPS = {
    "open": open_tier,
    "store": store,
    "load": load,
    "transfer_many": transfer_many,
    "lookup": lookup,
    "files": files,
    "kv_events": kv_events,
    "close": close,
}
