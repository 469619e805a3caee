"""KV events (kvfs/events, kvfs/catalog/announce.py) from the daemon's objects, a real
SQLite catalog and pool, and a real ZMQ subscriber (kvfs.events.subscriber, what `kvfs
events` uses) on an ipc:// endpoint: a block is announced once its file is durable under a
vLLM fs-tier name, and removed once that name no longer holds it; a restart starts the stream
over with the pool's inventory; replay serves what a subscriber missed.
tests/clients/test_engines.py checks the hashes against vLLM's own events."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import trio

from kvfs.events import wire
from kvfs.events.subscriber import Subscriber
from tests.daemon.harness import eventually, run_cluster, run_service

MiB = 1 << 20
SLOW = "writeback_ms = 60000"  # nothing is written back unless someone waits for it
BASE = "Qwen_Qwen3-0.6B_0123456789ab_r0"  # vLLM's <model>_<digest>_r<rank>


def events_toml(tmp_path, **more) -> str:
    lines = [
        "[events]",
        "enabled = true",
        f'endpoint = "ipc://{tmp_path}/events"',
        f'replay_endpoint = "ipc://{tmp_path}/replay"',
        'node = "n1"',
    ] + [f"{k} = {v!r}" if isinstance(v, str) else f"{k} = {v}" for k, v in more.items()]
    return "\n".join(lines).replace("'", '"') + "\n"


def block_path(i: int, group: int = 0) -> tuple[str, int]:
    """A vLLM fs-tier path for block i, and the 64-bit hash vLLM announces for it."""
    h = (i * 0x9E3779B97F4A7C15 % (1 << 256)).to_bytes(32, "big").hex()
    return f"/{BASE}/{h[:3]}/{h[3:5]}_g{group}/{h}.bin", int(h[-16:], 16)


async def mkdirs(fs, path: str) -> None:
    parts = path.strip("/").split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/" + "/".join(parts[:i])
        try:
            fs.ino(d)
        except Exception:
            await fs.mkdir(d)


async def store(fs, path: str, data: bytes) -> None:
    """As vLLM's fs tier stores: <path>.tmp written, then renamed to <path>."""
    await mkdirs(fs, path)
    await fs.write(path + ".tmp", data)
    po, no = fs.resolve(path + ".tmp")
    pn, nn = fs.resolve(path)
    await fs.files.rename(po, no, pn, nn, 0)


async def subscribe(tmp_path, fs) -> Subscriber:
    """A subscriber of fs's events, once its subscription has reached the publisher (ZMQ's
    subscriptions are asynchronous: empty probe batches go out until one arrives), with what
    came before drained."""
    sub = Subscriber(f"ipc://{tmp_path}/events", b"", f"ipc://{tmp_path}/replay")
    pub = fs.svc.events
    with trio.fail_after(30):
        while True:
            pub._send(pub.topic(""), [])
            await trio.sleep(0.02)
            if sub.receive(0) is not None:
                break
    sub.receive_all(quiet=0.1)
    return sub


def events_of(batches) -> list[tuple[str, int, int | None]]:
    return [
        (
            type(e).__name__,
            e.block_hashes[0] if hasattr(e, "block_hashes") else None,
            getattr(e, "group_idx", None),
        )
        for _, _, b in batches
        for e in b.events
    ]


def test_a_block_is_announced_once_durable_and_removed_once_its_name_is_gone(pool_config, tmp_path):
    """Nothing while the file is only closed (a crash could still lose it); its BlockStored
    at the write-back, with vLLM's 64-bit hash, group, medium and locality; a file outside
    the layout announces nothing; an unlink's BlockRemoved once the unlink is durable."""
    cfg = pool_config(mount=SLOW, extra=events_toml(tmp_path))
    p, h = block_path(1, group=2)

    async def body(fs):
        sub = await subscribe(tmp_path, fs)
        await store(fs, p, os.urandom(300_000))
        await fs.write("/other.bin", os.urandom(1000))
        assert sub.receive(0.3) is None  # closed, not durable
        await fs.sync()
        got = sub.receive_all()
        assert events_of(got) == [("BlockStored", h, 2)]
        ev = got[0][2].events[0]
        assert (ev.medium, ev.locality, ev.block_size, ev.token_ids) == ("STORAGE", "n1", 0, [])
        assert got[0][0] == b"kv@n1@Qwen_Qwen3-0.6B"
        parent, name = fs.resolve(p)
        await fs.files.unlink(parent, name)
        assert sub.receive(0.3) is None  # the unlink is not durable yet
        await fs.sync()
        assert events_of(sub.receive_all()) == [("BlockRemoved", h, 2)]
        assert sub.gaps == 0
        st = fs.svc.statistics()["events"]
        assert (st["stored"], st["removed"], st["dropped_batches"]) == (1, 1, 0)
        sub.close()

    run_service(cfg, body)


def test_a_block_stored_again_under_its_name_is_announced_as_stored_alone(pool_config, tmp_path):
    """A rewrite of the same name, or a rename over it (vLLM storing a block it had), keeps
    the name holding the block throughout: BlockStored again, never a BlockRemoved."""
    cfg = pool_config(mount=SLOW, extra=events_toml(tmp_path))
    p, h = block_path(7)

    async def body(fs):
        sub = await subscribe(tmp_path, fs)
        await store(fs, p, os.urandom(200_000))
        await fs.sync()
        assert events_of(sub.receive_all()) == [("BlockStored", h, 0)]
        await store(fs, p, os.urandom(200_000))  # renamed over the committed file
        await fs.sync()
        await fs.write(p, os.urandom(100_000))  # rewritten in place
        await fs.sync()
        assert events_of(sub.receive_all()) == [("BlockStored", h, 0), ("BlockStored", h, 0)]
        sub.close()

    run_service(cfg, body)


def test_a_restart_clears_the_stream_and_announces_what_the_pool_holds(pool_config, tmp_path):
    """A daemon killed after a commit, before its announcement, loses the announcement (and
    a closed file not yet written back loses the file): after the restart the stream starts
    with AllBlocksCleared and a BlockStored for every block the pool holds, nothing else."""
    cfg = pool_config(mount=SLOW, extra=events_toml(tmp_path))
    kept = [block_path(i) for i in range(5)]
    lost = block_path(99)

    async def first(fs):
        for p, _ in kept:
            await store(fs, p, os.urandom(100_000))
        await fs.sync()
        await store(fs, lost[0], os.urandom(100_000))  # closed, never written back

    async def after(fs):
        sub = Subscriber(f"ipc://{tmp_path}/events", b"", f"ipc://{tmp_path}/replay")
        got = await trio.to_thread.run_sync(sub.replay, 0)  # (served on trio)
        evs = events_of(got)
        assert evs[0] == ("AllBlocksCleared", None, None)
        assert sorted(evs[1:]) == sorted(("BlockStored", h, 0) for _, h in kept)
        assert [seq for _, seq, _ in got] == list(range(len(got)))
        # the clear on the node's topic, a prefix of its models' (no model is configured)
        assert [t for t, _, _ in got] == [b"kv@n1@"] + [b"kv@n1@Qwen_Qwen3-0.6B"] * (len(got) - 1)
        sub.close()

    run_service(cfg, first, crash=True)
    run_service(cfg, after)


def test_kvfs_events_across_a_restart_says_so_and_prints_the_new_stream_from_0(
    pool_config, tmp_path
):
    """`kvfs events` running across a daemon restart, as a router's subscriber would: the
    restart's AllBlocksCleared and inventory go out before it has reconnected, and the next
    batch it sees has a lower sequence number. It prints a notice (the publisher restarted,
    every block announced before is gone), then the new stream replayed from 0 (the clear,
    the inventory of what the pool holds, what came since) and goes on, nothing twice."""
    cfg = pool_config(mount=SLOW, extra=events_toml(tmp_path))
    kept = [block_path(i) for i in range(3)]
    new, h_new = block_path(9)
    endpoints = ["--endpoint", f"ipc://{tmp_path}/events"]
    endpoints += ["--replay-endpoint", f"ipc://{tmp_path}/replay"]
    cli = subprocess.Popen(
        [sys.executable, "-m", "kvfs", "events", "--json", *endpoints],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    docs: list[dict] = []
    reader = threading.Thread(target=lambda: docs.extend(map(json.loads, cli.stdout)), daemon=True)
    reader.start()

    async def printed(fs, more_than: int) -> None:
        """Probe batches until `kvfs events` has printed more than `more_than` documents."""
        pub = fs.svc.events
        with trio.fail_after(30):
            while len(docs) <= more_than:
                pub._send(pub.topic(""), [])
                await trio.sleep(0.05)

    async def first(fs):
        await printed(fs, 0)
        for p, _ in kept:
            await store(fs, p, os.urandom(100_000))
        await fs.sync()
        pub = fs.svc.events
        for _ in range(50):  # the sequence well past where the restart's will be
            pub._send(pub.topic(""), [])
        await eventually(lambda: docs[-1].get("seq") == pub.seq - 1, what="all printed")

    async def after(fs):
        await printed(fs, len(docs))
        await store(fs, new, os.urandom(100_000))
        await fs.sync()
        stored = lambda: any(d.get("events") == [_stored(h_new)] for d in docs)  # noqa: E731
        await eventually(stored, what="the new block printed")

    try:
        run_service(cfg, first, crash=True)
        before = len(docs)
        run_service(cfg, after)
    finally:
        cli.send_signal(signal.SIGINT)
        _, err = cli.communicate(timeout=30)
        reader.join(10)
    notice = docs[before]
    assert notice["notice"] == "restart" and notice["cleared"]
    assert notice["seq"] < notice["expected"] == docs[before - 1]["seq"] + 1
    assert "publisher restarted" in notice["message"]
    stream = docs[before + 1 :]
    assert [d["seq"] for d in stream] == list(range(len(stream)))  # from 0, nothing twice
    assert stream[0]["events"] == [{"type": "AllBlocksCleared"}] and stream[0]["topic"] == "kv@n1@"
    inventory = stream[1]["events"]
    assert sorted(e["block_hashes"][0] for e in inventory) == sorted(h for _, h in kept)
    assert stream[-1]["events"] == [_stored(h_new)]
    assert "1 publisher restart(s)" in err, err


def _stored(h: int) -> dict:
    """A BlockStored of hash `h` as `kvfs events --json` prints it."""
    return {
        "type": "BlockStored",
        "block_hashes": [h],
        "block_size": 0,
        "medium": "STORAGE",
        "group_idx": 0,
        "locality": "n1",
    }


def test_replay_returns_the_batches_from_a_sequence_number_and_the_end_marker(
    pool_config, tmp_path
):
    """Each durable round is one batch, numbered without gaps; a subscriber that joined late
    (or lost batches) gets them from the replay endpoint, in order, then vLLM's end marker."""
    cfg = pool_config(mount=SLOW, extra=events_toml(tmp_path))
    paths = [block_path(i) for i in range(10, 14)]

    async def body(fs):
        for p, _ in paths:
            await store(fs, p, os.urandom(50_000))
            await fs.sync()
        sub = Subscriber(f"ipc://{tmp_path}/events", b"", f"ipc://{tmp_path}/replay")
        got = await trio.to_thread.run_sync(sub.replay, 1)  # batch 0: the start's AllBlocksCleared
        assert [seq for _, seq, _ in got] == [1, 2, 3, 4]
        assert events_of(got) == [("BlockStored", h, 0) for _, h in paths]
        assert await trio.to_thread.run_sync(sub.replay, 5) == []
        assert fs.svc.statistics()["events"]["replay_requests"] == 2
        sub.close()

    run_service(cfg, body)


def test_evicted_blocks_are_announced_removed_and_held_ones_never_are(pool_config, tmp_path):
    """A small pool evicts to make room: one BlockRemoved per evicted block, each for a name
    that no longer exists, and none for a block still readable."""
    cfg = pool_config(size="16MiB", mount=SLOW, extra=events_toml(tmp_path))
    paths = [block_path(i) for i in range(40)]

    async def body(fs):
        sub = await subscribe(tmp_path, fs)
        for p, _ in paths:
            await store(fs, p, os.urandom(1 * MiB))
            await fs.sync()
        evs = events_of(sub.receive_all())
        removed = [h for kind, h, _ in evs if kind == "BlockRemoved"]
        stored = [h for kind, h, _ in evs if kind == "BlockStored"]
        assert sorted(stored) == sorted(h for _, h in paths)
        assert removed and len(removed) == len(set(removed)) == fs.svc.space.evictions
        for p, h in paths:
            try:
                fs.ino(p)
                present = True
            except Exception:
                present = False
            assert present == (h not in removed), p
        assert sub.gaps == 0
        sub.close()

    run_service(cfg, body)


def test_the_encoding_is_vllms(pool_config, tmp_path):
    """What the daemon sends decodes with kvfs's copy of vLLM's classes (and, in
    tests/unit/test_events.py, byte for byte as vLLM's own encoder makes it)."""
    cfg = pool_config(mount=SLOW, extra=events_toml(tmp_path, locality="LOCAL"))
    p, h = block_path(3)

    async def body(fs):
        sub = await subscribe(tmp_path, fs)
        await store(fs, p, b"x" * 4096)
        await fs.sync()
        ((_, _, batch),) = sub.receive_all()
        assert isinstance(batch, wire.KVEventBatch)
        assert batch.events == [wire.stored(h, 0, "LOCAL")]
        sub.close()

    run_service(cfg, body)


def shared_configs(tmp_path, redis, size: str = "32MiB", grace: float = 30.0) -> list:
    """Two nodes on one pool (Redis catalog), each with [events] on its own endpoints."""
    from tests.helpers import write_config

    (tmp_path / "shared").mkdir()
    nss = [{"path": str(tmp_path / "shared" / f"ns{i}.img"), "size": size} for i in range(2)]
    cfgs = []
    for i in range(2):
        ev = tmp_path / f"n{i}"
        ev.mkdir()
        cfgs.append(
            write_config(
                tmp_path / f"n{i}.toml",
                tmp_path / f"state{i}",
                nss,
                dram="16MiB",
                pool='stripe_unit = "256KiB"\nevict = "lru"',
                extra=f'[cluster]\nredis = "{redis.url}"\nnode_id = "n{i}"\nname = "ev"\n'
                f"grace_seconds = {grace}\n" + events_toml(ev).replace('node = "n1"\n', ""),
            )
        )
    return cfgs


def test_in_a_shared_pool_the_node_that_makes_a_change_announces_it(tmp_path, redis):
    """Two nodes on one pool (Redis catalog): a block stored by n0 is announced by n0 alone
    (n1 learns of the file but announces nothing), its unlink by n1 by n1 alone; the
    locality names the pool."""
    cfgs = shared_configs(tmp_path, redis)
    p, h = block_path(5)

    async def body(a, b):
        subs = [await subscribe(tmp_path / f"n{i}", fs) for i, fs in enumerate((a, b))]
        await store(a, p, os.urandom(300_000))
        await eventually(lambda: _known(b, p), what="n1 sees the block")
        # (n1 may see it in Redis before n0's task that hears Redis's answer announces it;
        # receive_all blocks this thread, so it is called once the announcement went out)
        await eventually(lambda: a.svc.events.stored >= 1, what="n0 announces the block")
        got = [s.receive_all() for s in subs]
        assert events_of(got[0]) == [("BlockStored", h, 0)]
        assert got[0][0][2].events[0].locality == "pool:ev"
        assert got[0][0][0] == b"kv@n0@Qwen_Qwen3-0.6B"
        assert got[1] == []
        parent, name = b.resolve(p)
        await b.files.unlink(parent, name)
        await eventually(lambda: not _known(a, p), what="n0 sees the unlink")
        await eventually(lambda: b.svc.events.removed >= 1, what="n1 announces the unlink")
        got = [s.receive_all() for s in subs]
        assert got[0] == []
        assert events_of(got[1]) == [("BlockRemoved", h, 0)]
        for s in subs:
            s.close()

    run_cluster(cfgs, body)


def test_a_shared_pool_announces_each_eviction_once_from_the_node_that_evicted(tmp_path, redis):
    """n0 fills most of a shared pool, n1 stores as much again: the cluster evicts the oldest
    blocks (whichever node needs the room, or cleans ahead, evicts), each node announces the
    evictions it made, each evicted block is announced once, and none of the blocks still
    there is announced removed on either stream."""
    cfgs = shared_configs(tmp_path, redis, grace=0.5)

    async def body(a, b):
        subs = [await subscribe(tmp_path / f"n{i}", fs) for i, fs in enumerate((a, b))]
        n = int(a.svc.pool.capacity * 0.8) // (2 * MiB)
        paths = [block_path(i) for i in range(2 * n)]
        for p, _ in paths[:n]:
            await store(a, p, os.urandom(2 * MiB))
        await a.sync()  # (published: with durability "fsync" by the write-back)
        await eventually(lambda: _known(b, paths[n - 1][0]), what="n1 sees n0's blocks")
        for p, _ in paths[n:]:
            await store(b, p, os.urandom(2 * MiB))
        await b.sync()
        assert b.svc.space.evictions > 0
        await eventually(  # every eviction durable and announced
            lambda: all(fs.svc.events.removed == fs.svc.space.evictions for fs in (a, b))
        )
        got = [events_of(s.receive_all()) for s in subs]
        removed = [h for kind, h, _ in got[0] + got[1] if kind == "BlockRemoved"]
        for fs, evs in zip((a, b), got):  # each node announces its own evictions
            assert sum(kind == "BlockRemoved" for kind, _, _ in evs) == fs.svc.space.evictions
        assert len(removed) == len(set(removed)) == a.svc.space.evictions + b.svc.space.evictions
        gone = {h for p, h in paths if not _known(b, p)}
        assert set(removed) == gone
        stored = [h for kind, h, _ in got[0] + got[1] if kind == "BlockStored"]
        assert sorted(stored) == sorted(h for _, h in paths)
        for s in subs:
            s.close()

    run_cluster(cfgs, body)


def _known(fs, path: str) -> bool:
    try:
        fs.ino(path)
        return True
    except Exception:
        return False


def test_a_failing_publisher_fails_no_change(pool_config, tmp_path, monkeypatch, caplog):
    """An announcement is never worth a change: a publisher that raises is logged, and the
    commits it was told of are durable all the same."""
    from kvfs.events.publisher import Publisher

    def broken(self, changes):
        raise RuntimeError("publisher bug")

    monkeypatch.setattr(Publisher, "durable", broken)
    cfg = pool_config(mount=SLOW, extra=events_toml(tmp_path))
    p, _ = block_path(8)
    data = os.urandom(10_000)

    async def body(fs):
        await store(fs, p, data)
        await fs.sync()
        assert fs.files.catalog.get(fs.ino(p)).blob is not None

    async def after(fs):
        assert await fs.read(p) == data

    run_service(cfg, body, crash=True)
    run_service(cfg, after)
    assert "change(s) not announced" in caplog.text


def test_a_namespace_removed_announces_exactly_its_blocks_removed(pool_config, tmp_path):
    """`kvfs pool remove --drop` (kvfs/fs/pool_admin.py): one BlockRemoved for each block
    with a unit on the namespace, none for the others, which stay; routers stop sending
    requests for exactly what is gone."""
    cfg = pool_config(
        n=3, size="64MiB", mount=SLOW, pool='stripe_unit = "256KiB"', extra=events_toml(tmp_path)
    )
    paths = [block_path(i) for i in range(12)]

    async def body(fs):
        sub = await subscribe(tmp_path, fs)
        for i, (p, _) in enumerate(paths):  # one unit (one namespace) or striped
            await store(fs, p, os.urandom(200_000 if i % 3 else 700_000))
        await fs.sync()
        sub.receive_all()
        on1 = {h for p, h in paths if 1 in fs.files.catalog.get(fs.ino(p)).blob.layout.ns}
        assert 0 < len(on1) < len(paths)
        res = await fs.svc.pool_admin.remove(1, drop=True)
        assert res["dropped_files"] == len(on1)
        await fs.sync()
        evs = events_of(sub.receive_all())
        assert sorted(h for kind, h, _ in evs if kind == "BlockRemoved") == sorted(on1), evs
        assert all(kind == "BlockRemoved" for kind, _, _ in evs)
        for p, h in paths:
            assert (h in on1) != _there(fs, p)
        assert sub.gaps == 0
        sub.close()

    run_service(cfg, body)


def _there(fs, path: str) -> bool:
    try:
        fs.ino(path)
    except Exception:  # noqa: BLE001 - ENOENT (KvfsError)
        return False
    return True
