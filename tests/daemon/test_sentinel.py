"""A shared pool behind Redis Sentinel, without the kernel: two nodes' daemon objects in one trio
run, a real master, two real replicas and three real sentinels (testing/redis_sentinel.py): with
one replica, the promoted master would have none left and refuse writes (min-replicas-to-write
1) until the old one came back. A failover is a kill -9 of the master (or Sentinel's own
FAILOVER, which demotes a live one); replicas that do not confirm are SIGSTOPped ones."""

from __future__ import annotations

import errno
import itertools
import os
import signal

import pytest
import trio

from kvfs.errors import KvfsError
from testing.redis_sentinel import SentinelGroup, _ask
from tests.daemon.harness import eventually, known, run_cluster
from tests.helpers import write_config

MiB = 1 << 20
_names = itertools.count()


@pytest.fixture
def group(tmp_path):
    g = SentinelGroup(tmp_path / "redis", replicas=2).start()
    yield g
    for s in g.servers:  # a test may leave one stopped
        if s.proc is not None:
            os.kill(s.proc.pid, signal.SIGCONT)
    g.stop()


@pytest.fixture
def configs(tmp_path, group):
    def make(n: int = 2, **cluster) -> list:
        name = f"t{os.getpid()}-{next(_names)}"
        (tmp_path / "shared").mkdir(exist_ok=True)
        nss = [{"path": str(tmp_path / "shared" / f"ns{i}.img"), "size": "32MiB"} for i in range(2)]
        keys = {
            "sentinels": group.sentinel_addresses,
            "master_name": group.name,
            "name": name,
            "grace_seconds": 1.0,
            "lease_seconds": 3.0,
            "regions": 8,
            "free_target": 0.0,
            "replica_timeout_ms": 300,
            **cluster,
        }
        out = []
        for i in range(n):
            body = "".join(f"{k} = {_toml(v)}\n" for k, v in {**keys, "node_id": f"n{i}"}.items())
            out.append(
                write_config(
                    tmp_path / f"n{i}.toml",
                    tmp_path / f"state{i}",
                    nss,
                    dram="16MiB",
                    extra="[cluster]\n" + body,
                    pool='stripe_unit = "256KiB"\nevict = "lru"',
                    # (what these tests hold is told at the close: a write-back's failures
                    # go to fsync instead, and the torture's failover cycles check those)
                    mount='durability = "close"',
                )
            )
        return out

    return make


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return repr(v)


def data(seed: int, size: int) -> bytes:
    return (seed.to_bytes(4, "little") * (size // 4 + 1))[:size]


def stats(fs) -> dict:
    return fs.files.catalog.statistics()


async def write_until_it_works(fs, path: str, payload: bytes, timeout: float = 30.0) -> int:
    """Store `payload` at `path`, retrying while the pool's Redis is failing over (EIO); the
    number of attempts that failed."""
    failed = 0
    with trio.fail_after(timeout):
        while True:
            try:
                await fs.write(path, payload)
                return failed
            except KvfsError as e:
                assert e.errno == errno.EIO, e
                failed += 1
                await trio.sleep(0.1)


@pytest.mark.parametrize("confirm, follow_replicas", [("all", False), ("up", False), ("all", True)])
def test_nodes_follow_a_failover_and_keep_every_acknowledged_file(
    configs, group, confirm, follow_replicas
):
    """Files whose close returned before the master was killed are on the promoted replica:
    both nodes read them back, bit-exact, and publish to the new master. With confirm = "all"
    the killed master is still a replica Sentinel knows of: stores fail until it is back;
    with "up" they resume at once. With follow_replicas the followers read from replicas,
    one of which is promoted, and follow the new master's replicas after it."""

    async def body(a, b):
        before = {f"/f{i}": data(i, 300_000 + i) for i in range(12)}
        for i, (path, payload) in enumerate(before.items()):
            await (a if i % 2 else b).write(path, payload)
        old = await trio.to_thread.run_sync(group.kill_master)
        new = await trio.to_thread.run_sync(group.wait_failover, old)
        if confirm == "all":
            on_new = f"127.0.0.1:{new.port} (master 'kvfs')"
            with trio.fail_after(20):  # (stores fail while the nodes find it)
                while stats(a)["master"] != on_new:
                    with pytest.raises(KvfsError):
                        await a.write("/refused", data(99, 1000))
                    await trio.sleep(0.1)
            with pytest.raises(KvfsError) as e:  # found, but a replica it knows is dead
                await a.write("/refused", data(99, 1000))
            assert e.value.errno == errno.EIO and stats(a)["replicas_confirming"] == 2
            await trio.to_thread.run_sync(group.restart, old)
        failed = await write_until_it_works(a, "/after_a", data(100, 400_000))
        await write_until_it_works(b, "/after_b", data(101, 400_000))
        for fs in (a, b):
            await eventually(lambda: all(known(fs, p) for p in [*before, "/after_a", "/after_b"]))
            for path, payload in before.items():
                assert await fs.read(path) == payload
            assert await fs.read("/after_a") == data(100, 400_000)
            assert stats(fs)["failovers"] >= 1 and stats(fs)["master"].endswith(
                f":{new.port} (master 'kvfs')"
            )
        assert failed < 300
        if confirm == "up":
            await trio.to_thread.run_sync(group.restart, old)
        await a.write("/last", b"x" * 5000)  # replicated to the old master, now a replica
        assert _ask(old.port, "ROLE")[0] == b"slave"

    run_cluster(configs(2, confirm=confirm, follow_replicas=follow_replicas), body)


def test_a_change_no_replica_confirms_fails_and_the_node_takes_no_lease_from_it(configs, group):
    """With the replicas stopped, the master still accepts changes (min-replicas-max-lag has
    not run out) but WAIT gets no confirmation: the store fails with EIO (no_replica = "fail"),
    a lease granted meanwhile is not used, and files stored before are still read. Once the
    replicas answer again, stores work."""

    async def body(a):
        await a.write("/before", data(1, 200_000))
        replicas = [s for s in group.servers if s is not group.master]
        for r in replicas:
            os.kill(r.proc.pid, signal.SIGSTOP)
        try:
            held = set(a.svc.space.regions.held())
            with pytest.raises(KvfsError) as e:
                await a.write("/during", data(2, 3 * MiB))
            assert e.value.errno == errno.EIO
            assert stats(a)["unreplicated"] >= 1
            assert set(a.svc.space.regions.held()) <= held
            assert await a.read("/before") == data(1, 200_000)
        finally:
            for r in replicas:
                os.kill(r.proc.pid, signal.SIGCONT)
        await write_until_it_works(a, "/during", data(2, 3 * MiB))
        assert await a.read("/during") == data(2, 3 * MiB)

    run_cluster(configs(1), body)


def test_with_no_replica_wait_a_store_waits_for_the_replicas(configs, group):
    """no_replica = "wait": the store blocks while the replicas are stopped and completes once
    they answer; nothing fails."""

    async def body(a):
        replicas = [s for s in group.servers if s is not group.master]
        await a.write("/warm", b"w" * 5000)  # leases taken while the replicas answer
        for r in replicas:
            os.kill(r.proc.pid, signal.SIGSTOP)
        done = trio.Event()

        async def store():
            await a.write("/waited", data(3, 200_000))
            done.set()

        async with trio.open_nursery() as n:
            n.start_soon(store)
            await trio.sleep(1.5)
            assert not done.is_set() and stats(a)["replica_waits"] >= 1
            for r in replicas:
                os.kill(r.proc.pid, signal.SIGCONT)
            with trio.fail_after(10):
                await done.wait()
        assert await a.read("/waited") == data(3, 200_000)
        assert stats(a)["unreplicated"] == 0

    run_cluster(configs(1, no_replica="wait"), body)


def test_a_node_talking_to_a_demoted_master_stops_writing_to_it(configs, group, caplog):
    """Sentinel's FAILOVER promotes a replica and turns the live master into a replica (and
    closes that server's client connections); both nodes find the new master through Sentinel
    and publish there, and every file stays readable. (A write reaching the demoted server on
    a connection left open would get READONLY: ClusterLink drops its connections then; no test
    reaches that path, since Sentinel closes them first.)"""

    async def body(a, b):
        await a.write("/one", data(5, 100_000))
        old = group.master
        _ask(group.sentinel_ports[0], "SENTINEL", "FAILOVER", group.name)
        new = await trio.to_thread.run_sync(group.wait_failover, old)
        await eventually(lambda: group.role(old) == b"slave", timeout=20)
        await write_until_it_works(a, "/two", data(6, 100_000))
        await write_until_it_works(b, "/three", data(7, 100_000))
        assert stats(a)["master"].endswith(f":{new.port} (master 'kvfs')")
        await eventually(lambda: known(b, "/two") and known(a, "/three"))
        assert await b.read("/two") == data(6, 100_000)
        assert await a.read("/one") == data(5, 100_000)

    caplog.set_level("INFO", logger="kvfs")
    run_cluster(configs(2), body)
    # each node says the master moved; the follower never calls a failover an outage
    # (it did: "Redis at ... is unreachable (Sentinel named another master)")
    assert caplog.text.count("(Sentinel failover); following it") >= 2
    assert "Sentinel named another master" not in caplog.text


def test_a_replica_promoted_behind_the_master_s_back_stops_its_acknowledgements(configs, group):
    """A split brain as a loaded machine made one in bench/torture.py --failover: Sentinel
    promoted a replica while the old master still ran and still had its other replica, which
    went on confirming the old master's changes; those were lost when the old master and that
    replica were turned into replicas of the promoted one. kvfs waits for every replica
    Sentinel counts as up, so the promoted one's silence fails the change instead."""

    async def body(a):
        await a.write("/before", data(8, 100_000))
        assert stats(a)["replicas_confirming"] == 2
        rogue = next(s for s in group.servers if s is not group.master)
        _ask(rogue.port, "REPLICAOF", "NO", "ONE")  # what Sentinel sends the one it promotes
        with pytest.raises(KvfsError) as e:
            await a.write("/during", data(9, 100_000))
        assert e.value.errno == errno.EIO and stats(a)["unreplicated"] >= 1

    run_cluster(configs(1), body)


def _xreads(port: int) -> int:
    """XREAD calls a server has run (INFO commandstats)."""
    for line in _ask(port, "INFO", "commandstats").decode().splitlines():
        if line.startswith("cmdstat_xread:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


def test_followers_read_from_replicas_and_fall_back_to_the_master(configs, group):
    """follow_replicas: each node's follower reads the change log from a replica, so the
    master runs no XREAD while the nodes store and see each other's files. A replica that
    loses its master (re-pointed at a port where nothing listens) is left for the master at
    its next read, and the follower comes back to a replica once one is linked again;
    nothing is reloaded for either move."""

    async def body(a, b):
        await eventually(lambda: all(stats(fs)["following"][0] != "master" for fs in (a, b)))
        on_a, on_b = stats(a)["following"][0], stats(b)["following"][0]
        assert on_a.startswith("replica 127.0.0.1:") and on_b.startswith("replica 127.0.0.1:")
        master = group.master.port
        replicas = [s for s in group.servers if s is not group.master]
        x0, r0 = _xreads(master), sum(_xreads(r.port) for r in replicas)
        files = {f"/r{i}": data(20 + i, 150_000 + i) for i in range(6)}
        for i, (path, payload) in enumerate(files.items()):
            await (a if i % 2 else b).write(path, payload)
        for fs in (a, b):
            await eventually(lambda fs=fs: all(known(fs, p) for p in files))
            for path, payload in files.items():
                assert await fs.read(path) == payload
        assert _xreads(master) == x0
        assert sum(_xreads(r.port) for r in replicas) > r0
        resyncs = stats(b)["resyncs"]

        followed = group.server(int(on_b.rsplit(":", 1)[1]))
        _ask(followed.port, "REPLICAOF", "127.0.0.1", "1")  # its master gone, as it sees it
        try:
            await eventually(lambda: stats(b)["following"][0] == "master", timeout=10)
            assert stats(b)["replica_fallbacks"] == 1
        finally:
            _ask(followed.port, "REPLICAOF", "127.0.0.1", str(master))
        await trio.to_thread.run_sync(group.wait_replicas, group.master, len(replicas))
        await write_until_it_works(a, "/after", data(40, 200_000))
        await eventually(lambda: known(b, "/after"))
        assert await b.read("/after") == data(40, 200_000)
        await eventually(lambda: stats(b)["following"][0] != "master", timeout=15)
        await a.write("/back", data(41, 100_000))
        await eventually(lambda: known(b, "/back"))
        assert stats(b)["resyncs"] == resyncs

    run_cluster(configs(2, follow_replicas=True), body)
