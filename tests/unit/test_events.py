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
    import tomllib

    from kvfs.config import from_dict
    from kvfs.errors import ConfigError

    with pytest.raises(ConfigError, match=what):
        from_dict(tomllib.loads("[events]\n" + table))


@pytest.mark.parametrize(
    "endpoint", ["tcp://*:99999", "tcp://*:0", "tcp://*:*", "tcp://host:", "tcp://:5557", "ipc://"]
)
def test_an_endpoint_zmq_would_bind_elsewhere_is_refused_naming_key_and_value(endpoint):
    """ZMQ takes port 99999 as 34463 and "*" or 0 as any free port: no router could be told
    where to subscribe. One line naming the key and the value."""
    from kvfs.config import from_dict
    from kvfs.errors import ConfigError

    for key in ("endpoint", "replay_endpoint"):
        with pytest.raises(ConfigError) as e:
            from_dict({"events": {key: endpoint}})
        msg = str(e.value)
        assert f"events.{key}" in msg and repr(endpoint) in msg and "\n" not in msg
    ok = ["tcp://*:5557", "tcp://10.0.0.1:65535", "tcp://[::1]:1", "tcp://eth0;10.0.0.2:5557"]
    for endpoint in ok + ["ipc:///run/kvfs/events"]:
        assert from_dict({"events": {"endpoint": endpoint}}).events.endpoint == endpoint


@pytest.mark.parametrize(
    "topic", ["kv@{pod}@{model}", "kv@{node}@{}", "kv@{node.name}", "kv@{node"]
)
def test_a_topic_with_an_unknown_field_is_refused_naming_the_fields_allowed(topic):
    from kvfs.config import from_dict
    from kvfs.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        from_dict({"events": {"topic": topic}})
    msg = str(e.value)
    assert msg.startswith("config: events.topic: ") and repr(topic) in msg
    assert "{node}, {model}" in msg and "\n" not in msg
    if "pod" in topic:
        assert "unknown field {pod}" in msg
    assert from_dict({"events": {"topic": "kv@{model}@{node}"}}).events.topic


def _publisher(tmp_path, model: str = "", replay: bool = True):
    from kvfs.events.publisher import Publisher

    return Publisher(
        endpoint=f"ipc://{tmp_path}/ev",
        replay_endpoint=f"ipc://{tmp_path}/rp" if replay else None,
        rule=NamingRule.named("vllm"),
        node="n",
        locality=None,
        model=model,
    )


def _sent(pub) -> list[tuple[bytes, list[str]]]:
    """What the publisher sent (its replay buffer): (topic, event types) per batch."""
    return [
        (topic, [type(e).__name__ for e in wire.decode(payload).events])
        for _, topic, payload in pub._buffer
    ]


@pytest.mark.parametrize("model", ["", "served"])
@pytest.mark.parametrize("held", [[], ["a"], ["a", "b"]])
def test_a_start_clears_once_on_the_nodes_topic_whatever_the_pool_holds(tmp_path, model, held):
    """The start's AllBlocksCleared has no model: it goes once, first, on the node's topic
    (`kv@n@`, a prefix of each of its models' topics; with `model` configured, that model's
    topic, the only one), whether the pool is empty or holds blocks of one model or two, and
    the inventory after it on each block's topic. A subscriber of `kv@n@` gets it once, and
    no other topic's clear after some of the inventory."""
    pub = _publisher(tmp_path, model, replay=False)
    try:
        pub.resync(BlockKey(i, 0, m) for m in held for i in range(3))
        pub.durable([(True, BlockKey(9, 0, m)) for m in held or ["a"]])
        sent = _sent(pub)
    finally:
        pub.close()
    node = b"kv@n@" + model.encode()
    assert sent[0] == (node, ["AllBlocksCleared"])
    assert [t for t, kinds in sent if "AllBlocksCleared" in kinds] == [node]
    topics = {t for t, _ in sent[1:]}
    assert topics == ({node} if model else {b"kv@n@" + m.encode() for m in held or ["a"]})
    assert all(t.startswith(b"kv@n@") for t, _ in sent)


class _Replaying:
    """A publisher's replay endpoint answered on a thread (as its trio task does in the
    daemon), while the test sends on the publisher's PUB socket."""

    def __init__(self, pub):
        import threading

        self.pub = pub
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        sock = self.pub._replay
        while not self.stop.is_set():
            if sock.poll(20):
                self.pub._answer(sock, sock.recv_multipart())

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.pub.close()


def _until_followed(sub, pub, key: BlockKey = BlockKey(1 << 40, 0, "m")):
    """Probe batches until the subscriber's `follow` gives something (ZMQ subscriptions and
    reconnections are asynchronous)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pub.durable([(True, key)])
        got = sub.follow(0.05)
        if got is not None:
            return got
    raise AssertionError("no batch reached the subscriber")


def _restart(tmp_path, sub, first, *, replay: bool = True, inventory: int = 2, reconnect=None):
    """`first` closed and a publisher started on its endpoints, with `inventory` blocks held;
    the subscriber, disconnected meanwhile when `reconnect` is given, reconnected after
    `reconnect` batches more."""
    ep = f"ipc://{tmp_path}/ev"
    if reconnect is not None:
        sub.sub.disconnect(ep)
    first.close()
    pub = _publisher(tmp_path, replay=replay)
    served = _Replaying(pub) if replay else None
    pub.resync(BlockKey(i, 0, "m") for i in range(inventory))
    if reconnect is not None:
        for i in range(reconnect):
            pub.durable([(True, BlockKey(100 + i, 0, "m"))])
        sub.sub.connect(ep)
    return pub, served


@pytest.mark.parametrize("reconnect", [None, 60])
def test_a_subscriber_across_a_restart_says_so_and_replays_the_new_stream_from_0(
    tmp_path, reconnect
):
    """A daemon restart numbers its batches from 0 again and sends its AllBlocksCleared and
    inventory at once, before a subscriber connected across it has reconnected: it next
    sees the sequence go backwards (2 after 53) or, past a long new stream, jump ahead. Either
    way `follow` says the publisher restarted and gives the new stream from 0 (the clear, the
    inventory, what came since), and batches it replayed are not given twice."""
    from kvfs.events.subscriber import Subscriber

    first = _publisher(tmp_path)
    served = _Replaying(first)
    sub = Subscriber(f"ipc://{tmp_path}/ev", b"", f"ipc://{tmp_path}/rp")
    try:
        _until_followed(sub, first)
        for i in range(50 if reconnect is None else 5):
            first.durable([(True, BlockKey(i, 0, "m"))])
        while sub.next_seq < first.seq:
            assert sub.follow(5) is not None
        before = sub.next_seq
        served.stop.set()
        served.thread.join(5)
        pub, served = _restart(tmp_path, sub, first, reconnect=reconnect)
        note, batches = _until_followed(sub, pub)
        assert note is not None and note.kind == "restart" and note.cleared
        assert note.expected == before and (note.seq < before) == (reconnect is None)
        assert "publisher restarted" in str(note) and "replayed from 0" in str(note)
        seqs = [s for _, s, _ in batches]
        assert seqs == list(range(len(seqs))) and seqs[-1] == pub.seq - 1
        kinds = [[type(e).__name__ for e in b.events] for _, _, b in batches]
        assert kinds[0] == ["AllBlocksCleared"] and kinds[1] == ["BlockStored"] * 2
        assert sub.restarts == 1 and sub.gaps == 0
        pub.durable([(True, BlockKey(7, 0, "m"))])  # the stream goes on, nothing twice
        assert sub.follow(5) == (None, [(b"kv@n@m", pub.seq - 1, wire.decode(pub._buffer[-1][2]))])
        assert sub.follow(0.2) is None
    finally:
        sub.close()
        served.close()


def test_without_a_replay_endpoint_a_restart_or_a_loss_means_every_block_is_gone(tmp_path):
    """Without a replay endpoint nothing tells what was missed: a sequence gone backwards is
    a restart, a jump a loss, and either way every block the publisher announced is gone."""
    from kvfs.events.subscriber import Subscriber

    first = _publisher(tmp_path, replay=False)
    sub = Subscriber(f"ipc://{tmp_path}/ev")
    try:
        _until_followed(sub, first)
        for i in range(20):
            first.durable([(True, BlockKey(i, 0, "m"))])
        while sub.next_seq < first.seq:
            assert sub.follow(5) is not None
        pub, _ = _restart(tmp_path, sub, first, replay=False)
        note, batches = _until_followed(sub, pub)
        assert (note.kind, note.cleared, note.replayed) == ("restart", True, 0)
        assert "every block announced before is gone" in str(note)
        assert [s for _, s, _ in batches] == [note.seq] and note.seq < note.expected
        sub.sub.disconnect(f"ipc://{tmp_path}/ev")
        for i in range(5):
            pub.durable([(True, BlockKey(50 + i, 0, "m"))])
        sub.sub.connect(f"ipc://{tmp_path}/ev")
        note, batches = _until_followed(sub, pub)
        assert (note.kind, note.cleared) == ("lost", True) and note.seq > note.expected
        assert sub.restarts == 1 and sub.gaps == 1
        pub.close()
    finally:
        sub.close()


def test_a_gap_of_the_same_publisher_is_replayed_and_a_replay_from_a_seq_not_given_twice(
    tmp_path,
):
    """Batches lost while the publisher ran on: the replay of the last batch seen is that
    batch again, so `follow` replays what followed it, says how many were missed, and clears
    nothing; batches `start_from` replayed and the socket brings too are not given twice."""
    from kvfs.events.subscriber import Subscriber

    pub = _publisher(tmp_path)
    served = _Replaying(pub)
    ep = f"ipc://{tmp_path}/ev"
    sub = Subscriber(ep, b"", f"ipc://{tmp_path}/rp")
    try:
        _until_followed(sub, pub)
        for i in range(3):  # the socket has them; the replay from 0 too
            pub.durable([(True, BlockKey(i, 0, "m"))])
        time.sleep(0.2)
        replayed = sub.start_from(0)
        assert [s for _, s, _ in replayed] == list(range(pub.seq))
        assert sub.follow(0.3) is None
        expected = pub.seq
        sub.sub.disconnect(ep)
        for i in range(5):
            pub.durable([(True, BlockKey(10 + i, 0, "m"))])
        sub.sub.connect(ep)
        note, batches = _until_followed(sub, pub)
        assert (note.kind, note.cleared, note.expected) == ("gap", False, expected)
        assert note.seq > expected and "batch(es) missed, replayed" in str(note)
        assert [s for _, s, _ in batches] == list(range(expected, pub.seq))
        assert sub.restarts == 0 and sub.gaps == 1 and sub.missed == note.seq - expected
    finally:
        sub.close()
        served.close()


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
