"""KV events' naming rule and wire format (kvfs/events): which paths are blocks, which hash
each announces, and bytes identical to vLLM's own encoder's."""

from __future__ import annotations

import time

import pytest

from kvfs.events import wire
from kvfs.events.naming import BlockKey, NamingRule

H = "5f" * 28 + "0123456789abcdef"  # a 32-byte block hash, in hex


def names(path: str) -> list[bytes]:
    return [p.encode() for p in path.strip("/").split("/")]


def test_the_vllm_rule_reads_hash_group_and_model_from_an_fs_tier_path():
    rule = NamingRule.named("vllm")
    p = f"/mnt/kv/meta-llama_Llama-3.1-8B_0123456789ab_r0/{H[:3]}/{H[3:5]}_g3/{H}.bin"
    assert rule.depth == 4
    assert rule.match(names(p)[-1])
    assert rule.key(names(p)) == BlockKey(0x0123456789ABCDEF, 3, "meta-llama_Llama-3.1-8B")


@pytest.mark.parametrize(
    "path",
    [
        f"/m_0123456789ab_r0/{H[:3]}/{H[3:5]}_g0/{H}.bin.tmp",  # not renamed yet
        f"/m_0123456789ab_r0/{H[:3]}/{H[3:5]}_g0/{H}",
        f"/m_0123456789ab/{H[:3]}/{H[3:5]}_g0/{H}.bin",  # no rank
        f"/m_0123456789ab_r0/{H[:3]}/{H[3:5]}/{H}.bin",  # no group
        f"/{H[:3]}/{H[3:5]}_g0/{H}.bin",  # too shallow
        "/m_0123456789ab_r0/abc/de_g0/xyz.bin",
    ],
)
def test_other_paths_are_not_blocks(path):
    rule = NamingRule.named("vllm")
    assert not rule.match(names(path)[-1]) or rule.key(names(path)) is None


def test_a_rule_of_ones_own_needs_a_hash_group_and_reads_short_hashes():
    rule = NamingRule.named("vllm", r"blocks/(?P<hash>[0-9a-f]+)\.kv")
    assert rule.depth == 2
    assert rule.key(names("/x/blocks/ff01.kv")) == BlockKey(0xFF01, None, "")
    with pytest.raises(ValueError, match="no .*hash"):
        NamingRule(r"blocks/(?P<h>[0-9a-f]+)")
    with pytest.raises(ValueError, match="unknown layout"):
        NamingRule.named("sglang")


def test_the_bytes_are_vllms_own():
    """kvfs's batch, encoded, is byte for byte what vLLM's KVEventBatch encodes to (required
    fields present even when null, defaulted ones left out), and vLLM decodes it."""
    kv = pytest.importorskip(
        "vllm.distributed.kv_events", reason="vLLM (make install-clients) is not installed"
    )
    import msgspec

    ts = time.time()
    ours = wire.KVEventBatch(
        ts=ts,
        events=[
            wire.stored(0xFEDCBA9876543210, 1, "n1"),
            wire.removed(7, None, None),
            wire.AllBlocksCleared(),
        ],
    )
    theirs = kv.KVEventBatch(
        ts=ts,
        events=[
            kv.BlockStored(
                block_hashes=[0xFEDCBA9876543210],
                parent_block_hash=None,
                token_ids=[],
                block_size=0,
                lora_id=None,
                medium=kv.MEDIUM_STORAGE,
                lora_name=None,
                group_idx=1,
                locality="n1",
            ),
            kv.BlockRemoved(block_hashes=[7], medium=kv.MEDIUM_STORAGE),
            kv.AllBlocksCleared(),
        ],
    )
    assert wire.encode(ours) == msgspec.msgpack.Encoder().encode(theirs)
    back = msgspec.msgpack.Decoder(kv.KVEventBatch).decode(wire.encode(ours))
    assert back.events[0].block_hashes == [0xFEDCBA9876543210]
    assert isinstance(back.events[1], kv.BlockRemoved)


@pytest.mark.parametrize(
    "table, what",
    [
        ('endpoint = "localhost:5557"', "not a ZMQ endpoint"),
        ("pattern = '(?P<h>[0-9a-f]+)'", "no .*hash"),
        ("pattern = '(?P<hash>[0-9a-f]+'", "missing \\)"),
        ('topic = "kv@{pod}"', "pod"),
        ('layout = "sglang"', "events.layout"),
        ("buffer_steps = 0", "events.buffer_steps"),
        ("enabeld = true", "unknown key events.enabeld"),
    ],
)
def test_a_bad_events_table_is_refused_naming_the_problem(table, what):
    from kvfs.config import from_dict
    from kvfs.errors import ConfigError
    import tomllib

    with pytest.raises(ConfigError, match=what):
        from_dict(tomllib.loads("[events]\n" + table))


def test_events_are_off_by_default_and_read_when_on():
    from kvfs.config import from_dict

    assert not from_dict({}).events.enabled
    ev = from_dict({"events": {"enabled": True, "replay_endpoint": "tcp://*:5558"}}).events
    assert (ev.enabled, ev.endpoint, ev.replay_endpoint) == (True, "tcp://*:5557", "tcp://*:5558")


def test_a_slow_subscriber_loses_batches_sees_the_gap_and_replay_fills_it(tmp_path):
    """The publisher never waits for a subscriber: one that reads nothing while batches go
    out loses those beyond the queues' high-water marks, its sequence numbers show how many,
    and the replay endpoint gives them back, in order."""
    import threading

    import trio
    import zmq

    from kvfs.events.publisher import Publisher
    from kvfs.events.subscriber import Subscriber

    pub = Publisher(
        endpoint=f"ipc://{tmp_path}/ev",
        replay_endpoint=f"ipc://{tmp_path}/rp",
        rule=NamingRule.named("vllm"),
        node="n",
        locality=None,
        hwm=4,
    )
    sub = Subscriber(f"ipc://{tmp_path}/ev", b"", f"ipc://{tmp_path}/rp")
    sub.sub.setsockopt(zmq.RCVHWM, 4)
    sub.sub.disconnect(f"ipc://{tmp_path}/ev")  # (the new limit applies to new connections)
    sub.sub.connect(f"ipc://{tmp_path}/ev")
    out: dict = {}

    def client() -> None:
        first = None  # subscribed once a probe arrives (ZMQ's subscription is asynchronous)
        deadline = time.monotonic() + 30
        while first is None and time.monotonic() < deadline:
            got = sub.receive(0.05)
            first = got[1] if got is not None else None
        out["ready"].set()
        out["sent"].wait(30)
        seqs = [first] + [s for _, s, _ in sub.receive_all(quiet=0.3)]
        missing = [s for s in range(first, seqs[-1] + 1) if s not in seqs]
        out["seqs"], out["missing"] = seqs, missing
        out["replayed"] = [s for _, s, _ in sub.replay(missing[0])] if missing else []

    async def main() -> None:
        out["ready"], out["sent"] = threading.Event(), threading.Event()
        async with trio.open_nursery() as n:
            await n.start(pub.serve)
            t = threading.Thread(target=client)
            t.start()
            while not out["ready"].is_set():  # probes until the subscriber has one
                pub.durable([(True, BlockKey(1 << 40, 0, "m"))])
                await trio.sleep(0.02)
            for i in range(2000):  # nobody reads meanwhile
                pub.durable([(True, BlockKey(i, 0, "m"))])
            out["total"] = pub.seq
            out["sent"].set()
            await trio.to_thread.run_sync(t.join)
            n.cancel_scope.cancel()

    trio.run(main)
    sub.close()
    pub.close()
    assert out["missing"], "the slow subscriber was meant to lose batches"
    assert sub.gaps >= 1 and sub.missed == len(out["missing"])
    assert out["replayed"] == list(range(out["missing"][0], out["total"]))  # every one since
    assert pub.batches == out["total"] and pub.dropped == 0  # sending never failed nor waited
