"""Deadlines on trio's clock, tested with trio's mock clock instead of sleeps: direct-read
leases, direct-write allocations, readahead streams and writer chains, and the cluster link's
reconnects and call timeouts. Time only jumps where a test says so (`wait_out`)."""

from __future__ import annotations

import errno
import os

import pytest
import trio
import trio.testing

from kvfs.errors import KvfsError
from kvfs.tiers.readahead import CHAIN_GAP_SECONDS, IDLE_SECONDS
from tests.daemon.harness import ROOT, known, mock_clock, run_service, wait_out

MiB = 1 << 20


def test_a_direct_read_lease_holds_the_old_version_until_it_expires(pool_config):
    cfg = pool_config(size="16MiB")
    clock = mock_clock()

    async def body(fs):
        direct = fs.svc.direct
        await fs.write("/f", os.urandom(3 * MiB))
        await fs.sync()
        [lease] = await direct.lease(ROOT, 1, [b"f"], ttl=30)
        free = fs.svc.space.free
        await fs.write("/f", os.urandom(3 * MiB))  # a new version: the old one is retired
        await fs.sync()
        assert fs.svc.space.free == free - 3 * MiB  # ... but leased: its space is kept
        await wait_out(clock, 29)
        assert fs.files.leases.stats.expired_leases == 0
        # released in time (by the connection that took it): counted as a read
        [stale] = direct.release(2, [lease.id], [True])  # (another connection's word)
        assert stale.errno == errno.ESTALE
        assert direct.release(1, [lease.id], [True]) == [None]
        assert fs.files.leases.stats.direct_reads == 1
        assert fs.svc.space.free == free  # and now it is free

        [lease] = await direct.lease(ROOT, 1, [b"f"], ttl=30)
        await fs.write("/f", os.urandom(3 * MiB))
        await fs.sync()
        await wait_out(clock, 31.5)  # the reader stalled: expired
        assert fs.files.leases.stats.expired_leases == 1
        assert fs.svc.space.free == free  # the space went back
        [stale] = direct.release(1, [lease.id], [True])  # ... and its reader learns it
        assert stale.errno == errno.ESTALE

    run_service(cfg, body, clock)


def test_a_direct_write_allocation_expires_and_its_space_returns(pool_config):
    cfg = pool_config(size="16MiB")
    clock = mock_clock()

    async def body(fs):
        direct = fs.svc.direct
        free = fs.svc.space.free
        [a] = await direct.allocate(ROOT, 1, [(b"g", 2 * MiB, 0o644, {})], ttl=20)
        assert fs.svc.space.free == free - 2 * MiB
        await wait_out(clock, 21.5)  # expired by the periodic check
        assert fs.files.allocations.stats.expired_allocations == 1
        assert fs.svc.space.free == free
        [e] = await direct.commit(ROOT, 1, [(a.id, [0] * a.layout.nunits)])
        assert e.errno == errno.ESTALE
        [b] = await direct.allocate(ROOT, 1, [(b"g", MiB, 0o644, {})], ttl=20)
        await wait_out(clock, 20.5)  # past its deadline, before the check
        [e] = await direct.commit(ROOT, 1, [(b.id, [0])])  # the commit itself refuses it
        assert e.errno == errno.ESTALE
        assert fs.svc.space.free == free
        assert not known(fs, "/g")  # nothing was made

    run_service(cfg, body, clock)


def test_a_reader_that_pauses_starts_a_new_readahead_stream(pool_config):
    cfg = pool_config(dram="64MiB")
    clock = mock_clock()

    async def open_close(fs, path, pid):
        r = await fs.files.open(fs.ino(path), os.O_RDONLY, pid)
        await fs.close(r.fh)

    async def body(fs):
        for i in range(6):  # one writer: a chain c0 -> c5
            p, n = fs.resolve(f"/c{i}")
            r, _ = await fs.files.create(p, n, 0o644, os.O_CREAT | os.O_WRONLY, 0, 0, 77)
            await fs.files.write(r.fh, 0, os.urandom(4096))
            await fs.close(r.fh)
        # written back before the clock jumps (wait_out): a write-back in flight in a worker
        # thread meanwhile would see its I/O deadline pass
        await fs.svc.flush()
        ra = fs.svc.readahead
        pid = 4321
        for i in range(3):
            await open_close(fs, f"/c{i}", pid)
        assert ra.window_of(pid) == 4 and ra.stats.streams == 1
        await wait_out(clock, IDLE_SECONDS - 0.5)  # a pause shorter than IDLE_SECONDS
        await open_close(fs, "/c3", pid)
        assert ra.window_of(pid) == 8 and ra.stats.streams == 1
        await wait_out(clock, IDLE_SECONDS + 0.5)  # a longer one: a new stream
        await open_close(fs, "/c4", pid)
        assert ra.stats.streams == 2 and ra.window_of(pid) == 1
        assert ra.stats.predicted_hits == 3  # the new stream predicted nothing

    run_service(cfg, body, clock)


def test_a_writer_that_pauses_starts_no_chain_link(pool_config):
    cfg = pool_config()
    clock = mock_clock()

    async def create(fs, name, pid=55):
        p, n = fs.resolve(name)
        r, _ = await fs.files.create(p, n, 0o644, os.O_CREAT | os.O_WRONLY, 0, 0, pid)
        await fs.close(r.fh)
        return fs.ino(name)

    async def body(fs):
        cat = fs.files.catalog
        a = await create(fs, "/a")
        await wait_out(clock, CHAIN_GAP_SECONDS - 0.5)
        b = await create(fs, "/b")
        assert cat.next_of(a) == b  # soon after: the chain goes on
        await wait_out(clock, CHAIN_GAP_SECONDS + 0.5)
        c = await create(fs, "/c")
        assert cat.next_of(b) is None and cat.parent_of(c) is None  # too late: unrelated

    run_service(cfg, body, clock)


# --- the cluster link: reconnects and call timeouts, against a fake Redis in this trio run -----
class FakeRedis:
    """Answers PING with PONG over RESP, until told to go silent or to refuse connections."""

    def __init__(self) -> None:
        self.silent = False
        self.refusing = False
        self.connections = 0
        self.port = 0

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        if self.refusing:
            await stream.aclose()
            return
        try:
            while True:
                data = await stream.receive_some()
                if not data:
                    return
                if self.silent:
                    continue  # reads the request, never answers
                for _ in range(data.count(b"SELECT")):
                    await stream.send_all(b"+OK\r\n")
                for _ in range(data.count(b"PING")):
                    await stream.send_all(b"+PONG\r\n")
        except trio.BrokenResourceError:
            pass


def _link(port: int):
    from kvfs.config import ClusterConfig
    from kvfs.redis.link import ClusterLink

    link = ClusterLink(ClusterConfig(redis=f"redis://127.0.0.1:{port}/0", node_id="t"))
    link.quiet = True
    return link


def test_the_cluster_link_times_out_waits_between_reconnects_and_comes_back():
    from kvfs.redis.link import CALL_TIMEOUT, RECONNECT_SECONDS

    async def main():
        redis = FakeRedis()
        async with trio.open_nursery() as nursery:
            await nursery.start(redis.serve)
            redis.silent = True  # accepts connections, never answers
            link = _link(redis.port)
            t = trio.current_time()
            with pytest.raises(KvfsError) as e:  # (it hung in SELECT at connect)
                await link.call("PING")
            assert e.value.errno == errno.EIO and not link.online
            assert trio.current_time() - t == pytest.approx(CALL_TIMEOUT, abs=0.01)
            redis.silent = False
            await trio.sleep(RECONNECT_SECONDS)
            assert await link.call("PING") == b"PONG" and link.online
            redis.silent = True  # Redis stops answering
            t = trio.current_time()
            with pytest.raises(KvfsError) as e:
                await link.call("PING")
            assert e.value.errno == errno.EIO and not link.online
            assert trio.current_time() - t == pytest.approx(CALL_TIMEOUT, abs=0.01)
            redis.silent = False
            redis.refusing = True  # down: connections are closed at once
            failures, conns = link.failures, redis.connections
            with pytest.raises(KvfsError):  # within the back-off: not even tried
                await link.call("PING")
            assert link.failures == failures and redis.connections == conns
            await trio.sleep(RECONNECT_SECONDS)  # (autojump: no real waiting)
            with pytest.raises(KvfsError):  # tried: and failed again
                await link.call("PING")
            assert redis.connections == conns + 1 and not link.online
            redis.refusing = False  # back
            await trio.sleep(RECONNECT_SECONDS)
            assert await link.call("PING") == b"PONG"
            assert link.online and link.down_since is None
            await link.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_commit_that_keeps_meeting_enospc_gives_up_after_two_waits_for_room(pool_config):
    """A full shared pool where room keeps appearing and being taken by others: each attempt
    to make room may wait (grace periods, regions given back), and the writer waits in a
    request even SIGKILL cannot interrupt, so the commit gives up with ENOSPC after about two
    such waits, not after ROOM_TRIES of them (a torture writer hung for minutes)."""
    from kvfs.write.sessions import ROOM_SECONDS, ROOM_TRIES

    cfg = pool_config(size="16MiB", durability="close")  # (an error at close)
    clock = mock_clock()

    async def body(fs):
        space, store = fs.svc.space, fs.svc.store
        space.room_wait = 5.0
        waits = []

        async def make_room(exclude, need):  # waits out a grace period: "room"
            waits.append(trio.current_time())
            await trio.sleep(space.room_wait)
            return True

        async def full(buf, size, **kw):
            raise KvfsError(errno.ENOSPC, "pool is full (test)")

        space.make_room, store.write = make_room, full
        fs.svc.files.sessions.write_behind = False  # (every commit then goes to store.write)
        clock.autojump_threshold = 0
        t0 = trio.current_time()
        try:
            with pytest.raises(KvfsError) as e:
                await fs.write("/f", b"x" * MiB)
        finally:
            clock.autojump_threshold = float("inf")
        assert e.value.errno == errno.ENOSPC
        assert 2 <= len(waits) <= 3 < ROOM_TRIES
        assert trio.current_time() - t0 <= 2 * space.room_wait + ROOM_SECONDS + space.room_wait

    run_service(cfg, body, clock)


def test_a_statistics_snapshot_is_given_twice_within_a_second_of_trio_time(pool_config):
    """getfattr asks for the size, then the value: the second ask gets the same snapshot if it
    comes within Control.STATS_REUSE of trio's clock (the daemon's one clock), a fresh one
    after."""
    clock = mock_clock()

    async def body(fs):
        control = fs.svc.control
        first = await control.getxattr(1, b"user.kvfs.stats", 0)
        await fs.write("/f", os.urandom(MiB))  # counters move
        assert await control.getxattr(1, b"user.kvfs.stats", 0) == first  # the second ask
        third = await control.getxattr(1, b"user.kvfs.stats", 0)
        await fs.write("/g", os.urandom(MiB))
        await wait_out(clock, 2 * control.STATS_REUSE)
        fourth = await control.getxattr(1, b"user.kvfs.stats", 0)
        assert fourth != third  # too old to give again: taken anew
        assert await control.getxattr(1, b"user.kvfs.stats", 0) == fourth

    run_service(pool_config(size="16MiB"), body, clock)
