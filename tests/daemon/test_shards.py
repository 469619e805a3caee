"""A pool whose catalog is spread over three Redis shards (`[cluster] shards`,
docs/cluster.md "More than one Redis"), without the kernel: two nodes' daemon objects in one
trio run, three real redis-servers started here."""

from __future__ import annotations

import errno
import itertools
import os

import pytest
import trio

from kvfs.catalog.redis.shards import shard_of
from kvfs.errors import KvfsError, StartupError
from testing.redis_server import RedisServer
from tests.daemon.harness import eventually, known, run_cluster
from tests.daemon.test_cluster import data, put
from tests.helpers import write_config

MiB = 1 << 20
SHARDS = 3
PINNED = [1, 0, 0, 0]
_names = itertools.count()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    out = [RedisServer(tmp_path_factory.mktemp(f"redis{k}")).start() for k in range(SHARDS)]
    yield out
    for s in out:
        s.stop()


@pytest.fixture
def configs(tmp_path, servers):
    """configs(n, ...) -> n config paths: same namespaces, the same three shards."""

    def make(n: int = 2, size: str = "32MiB", grace: float = 1.0, lease: float = 3.0, **kw):
        name = f"s{os.getpid()}-{next(_names)}"
        nss = [{"path": str(tmp_path / "shared" / f"ns{i}.img"), "size": size} for i in range(2)]
        (tmp_path / "shared").mkdir(exist_ok=True)
        shards = ", ".join(f'"{s.url}"' for s in servers[1:])
        out = []
        for i in range(n):
            extra = (
                f'[cluster]\nredis = "{servers[0].url}"\nshards = [{shards}]\n'
                f'node_id = "n{i}"\nname = "{name}"\ngrace_seconds = {grace}\n'
                f"lease_seconds = {lease}\nregions = {kw.get('regions', 8)}\n"
                f"free_target = 0.0\n"
            )
            out.append(
                write_config(
                    tmp_path / f"n{i}.toml",
                    tmp_path / f"state{i}",
                    nss,
                    dram="16MiB",
                    extra=extra,
                    pool=f'stripe_unit = "256KiB"\nevict = "{kw.get("evict", "lru")}"',
                    mount=f'durability = "{kw.get("durability", "fsync")}"'
                    + (f"\n{kw['mount_extra']}" if "mount_extra" in kw else ""),
                )
            )
        return out

    return make


async def dirs_by_shard(fs, count: int = 3) -> dict[int, list[str]]:
    """Make directories until each shard holds the entries of `count` of them."""
    out: dict[int, list[str]] = {k: [] for k in range(SHARDS)}
    for i in itertools.count():
        if all(len(v) >= count for v in out.values()):
            return out
        path = f"/dir{i}"
        await fs.mkdir(path)
        out[shard_of(fs.ino(path), SHARDS)].append(path)


async def keys_per_shard(fs, pattern: str) -> list[int]:
    counts = []
    for sh in fs.svc.catalog.shards:
        counts.append(len(await sh.link.call("KEYS", sh.link.key(pattern))))
    return counts


def test_files_in_directories_of_every_shard_are_shared_by_two_nodes(configs):
    """Each directory's files go in its own shard (every shard gets its share); the other
    node follows the three change logs and reads every file."""

    async def body(a, b):
        by = await dirs_by_shard(a)
        paths = [f"{d}/f{j}" for ds in by.values() for d in ds for j in range(2)]
        for i, p in enumerate(paths):
            await a.write(p, data(i, 100_000 + i))
        await a.sync()  # one write-back batch: one publish per shard
        await eventually(lambda: all(known(b, p) for p in paths))
        for i, p in enumerate(paths):
            assert await b.read(p) == data(i, 100_000 + i)
        # the file records are spread: each shard holds its directories' files
        assert all(n >= 6 for n in await keys_per_shard(a, "b:*"))
        assert b.svc.catalog.statistics()["shards"] == SHARDS
        # a directory whose entries are elsewhere than its record (the root's shard) has a
        # marker there naming its parent
        d = next(ds[0] for k, ds in by.items() if k != shard_of(1, SHARDS))
        ino = a.ino(d)
        own = a.svc.catalog.shard_of_dir(ino).link
        assert await own.call("GET", own.key("o", ino)) == b"1"

    run_cluster(configs(2), body)


def test_a_rename_across_shards_is_exdev_and_within_one_is_atomic(configs):
    async def body(a, b):
        by = await dirs_by_shard(a, 2)
        (x, y), other = by[0][:2], by[1][0]
        await put(a, f"{x}/f", data(1, 5000))
        await eventually(lambda: known(b, f"{x}/f"))
        with pytest.raises(KvfsError) as e:
            await a.files.rename(a.ino(x), b"f", a.ino(other), b"f", 0)
        assert e.value.errno == errno.EXDEV
        # within a shard (two directories of the same shard): one script, seen on b
        await a.files.rename(a.ino(x), b"f", a.ino(y), b"g", 0)
        await eventually(lambda: known(b, f"{y}/g") and not known(b, f"{x}/f"))
        assert await b.read(f"{y}/g") == data(1, 5000)
        # a file not published yet goes anywhere: it is published in its final directory
        await a.write(f"{x}/tmp", data(2, 7000))
        await a.files.rename(a.ino(x), b"tmp", a.ino(other), b"final", 0)
        await a.sync()
        await eventually(lambda: known(b, f"{other}/final"))
        assert await b.read(f"{other}/final") == data(2, 7000)
        assert not known(b, f"{x}/tmp")

    run_cluster(configs(2), body)


def test_a_directory_whose_entries_are_in_another_shard_than_its_record(configs):
    """mkdir puts the directory's marker in its entries' shard and its record in its
    parent's; rmdir checks it is empty there, then removes both; a create in a removed
    directory fails on any node."""

    async def body(a, b):
        root = shard_of(1, SHARDS)
        i = 0
        while shard_of(a.files.catalog._next_ino, SHARDS) == root:
            await a.mkdir(f"/pad{i}")
            i += 1
        await a.mkdir("/d")
        d = a.ino("/d")
        assert shard_of(d, SHARDS) != root
        own = a.svc.catalog.shard_of_dir(d).link
        await eventually(lambda: known(b, "/d"))
        await put(b, "/d/x", b"x" * 3000)
        await b.mkdir("/d/sub")
        await eventually(lambda: known(a, "/d/x") and known(a, "/d/sub"))
        await b.files.rmdir(d, b"sub")
        await eventually(lambda: not known(a, "/d/sub"))
        # a believes /d is empty, Redis knows better
        a.files.catalog.nodes[d].children.pop(b"x")
        with pytest.raises(KvfsError) as e:
            await a.files.rmdir(1, b"d")
        assert e.value.errno == errno.ENOTEMPTY
        assert await own.call("EXISTS", own.key("o", d)) == 1
        await b.files.unlink(d, b"x")
        await eventually(lambda: not known(a, "/d/x"))
        await a.files.rmdir(1, b"d")
        assert await own.call("EXISTS", own.key("o", d)) == 0
        # a create on b, whether or not b has heard: never published (refused at once, or by
        # the directory's own shard when b's write-back publishes it: reported to the fsync)
        try:
            fh = await b.open("/d/late", os.O_CREAT | os.O_WRONLY)
        except KvfsError as e:
            assert e.errno == errno.ENOENT  # b had heard
        else:
            await b.files.write(fh, 0, b"late")
            reader = await b.open("/d/late", os.O_RDONLY)
            await b.close(fh)
            await b.sync()
            try:
                await b.files.fsync(reader)
            except KvfsError as e:  # refused by the directory's shard
                assert e.errno in (errno.EIO, errno.ESTALE)  # (ESTALE: as with one shard)
            # (or b heard of the rmdir before its write-back: the file went with its directory,
            # as an unlinked file's, and its fsync has nothing to report)
            await b.files.release(reader)
        assert await own.call("HLEN", own.key("d", d)) == 0
        await eventually(lambda: not known(b, "/d"))

    run_cluster(configs(2), body)


def test_a_node_that_lost_its_leases_publishes_in_no_shard(configs):
    """The leases are in the first shard, copied to the others: a copy expires with its
    lease, and a publish in any shard checks its copy there."""

    async def body(a, b):
        by = await dirs_by_shard(a, 1)
        await put(a, f"{by[2][0]}/first", b"x" * MiB)
        cat = a.svc.catalog
        token = cat.redis.token
        ttls = []
        for sh in cat.shards:
            keys = await sh.link.call("KEYS", sh.link.key("lease:*"))
            assert keys and all([await sh.link.call("GET", k) == token.encode() for k in keys])
            ttls.append(min([await sh.link.call("PTTL", k) for k in keys]))
        assert max(ttls[1:]) <= ttls[0] + 50  # a copy never outlives its lease
        for sh in cat.shards:  # they expire, everywhere
            await sh.link.call("DEL", *await sh.link.call("KEYS", sh.link.key("lease:*")))
        for k in range(SHARDS):
            path = f"{by[k][0]}/second"
            fh = await a.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC)
            await a.files.write(fh, 0, b"y" * MiB)
            reader = await a.open(path, os.O_RDONLY)
            await a.close(fh)
            await a.sync()
            with pytest.raises(KvfsError) as e:
                await a.files.fsync(reader)
            await a.files.release(reader)
            assert e.value.errno == errno.EIO
            assert not known(a, path)
        await a.mkdir("/after")
        await eventually(lambda: known(b, "/after"))
        assert not any(known(b, f"{by[k][0]}/second") for k in range(SHARDS))

    run_cluster(configs(2, lease=30.0), body)


def test_a_full_sharded_pool_evicts_from_every_shard(configs):
    """Eviction follows one order over the shards' orders: the least recently used files
    go first, whichever shard holds them."""

    async def body(a, b):
        by = await dirs_by_shard(a, 1)
        ds = [by[k][0] for k in range(SHARDS)]
        cap = a.svc.pool.capacity
        n = int(cap * 0.8) // (2 * MiB)
        for i in range(n):
            await put(a, f"{ds[i % SHARDS]}/old{i}", data(i, 2 * MiB))
        await eventually(lambda: known(b, f"{ds[(n - 1) % SHARDS]}/old{n - 1}"))
        for i in range(n // 2, n):  # the newest become the most recently used
            await b.read(f"{ds[i % SHARDS]}/old{i}")
        await b.svc.catalog.flush_atimes()
        for i in range(n // 2):
            await put(b, f"{ds[i % SHARDS]}/new{i}", data(1000 + i, 2 * MiB))
        await eventually(lambda: any(not known(a, f"{ds[i % SHARDS]}/old{i}") for i in range(3)))
        gone = [i for i in range(n) if not known(b, f"{ds[i % SHARDS]}/old{i}")]
        assert {i % SHARDS for i in gone} == set(range(SHARDS)), gone  # from every shard
        assert all(i < n // 2 for i in gone), gone  # the least recently used
        for i in range(n // 2):
            assert await b.read(f"{ds[i % SHARDS]}/new{i}") == data(1000 + i, 2 * MiB)

    run_cluster(configs(2, grace=0.5), body)


def test_a_node_started_later_loads_every_shard_and_a_shard_missing_is_refused(configs, servers):
    paths = []

    async def write(a):
        by = await dirs_by_shard(a, 1)
        for k in range(SHARDS):
            paths.append(f"{by[k][0]}/f")
            await put(a, paths[-1], data(k, 70_000))

    cfgs = configs(2)
    run_cluster(cfgs[:1], write)

    async def read(b):
        for k, p in enumerate(paths):
            assert await b.read(p) == data(k, 70_000)

    run_cluster(cfgs[1:], read)

    # the same pool configured with its shards in another order (or one left out) is refused
    text = cfgs[1].read_text()
    swapped = text.replace(servers[1].url, "@@").replace(servers[2].url, servers[1].url)
    cfgs[1].write_text(swapped.replace("@@", servers[2].url))

    async def never(b):
        raise AssertionError("started with its shards swapped")

    with pytest.raises(StartupError) as e:
        run_cluster(cfgs[1:], never)
    assert "shard" in str(e.value)


def test_shard_of_is_stable():
    """The shard of a directory is a function of its inode alone, which every node, every
    restart and every version must agree on: pinned values (CRC-32 of the inode's 8 bytes,
    little-endian), and an even spread."""
    assert [shard_of(i, 3) for i in (1, 2, 3, (7 << 32) | 1)] == PINNED
    assert shard_of(12345, 1) == 0
    spread = [shard_of((5 << 32) | i, 3) for i in range(3000)]
    assert all(900 < spread.count(k) < 1100 for k in range(3))


def test_a_shard_behind_its_own_sentinel_fails_over_alone(tmp_path):
    """Two shards, each a master with two replicas watched by sentinels (the nodes list all
    the sentinels; each shard's master is found by its own name): shard 1's master is killed;
    the nodes follow it to the promoted replica, every file whose close returned is still
    there, in both shards, and stores go on in both ("close" mode: a close is the
    acknowledgement; confirm = "up": the dead master is not waited for)."""
    import signal

    from testing.redis_sentinel import SentinelGroup
    from tests.daemon.test_sentinel import write_until_it_works

    groups = [
        SentinelGroup(tmp_path / f"redis{k}", replicas=2, name=f"kvfs-{k}").start()
        for k in range(2)
    ]
    try:
        sentinels = ", ".join(f'"{a}"' for g in groups for a in g.sentinel_addresses)
        nss = [{"path": str(tmp_path / "shared" / f"ns{i}.img"), "size": "32MiB"} for i in range(2)]
        (tmp_path / "shared").mkdir()
        cfgs = [
            write_config(
                tmp_path / f"n{i}.toml",
                tmp_path / f"state{i}",
                nss,
                dram="16MiB",
                extra=(
                    f'[cluster]\nsentinels = [{sentinels}]\nmaster_name = "kvfs-0"\n'
                    f'shards = ["kvfs-1"]\nnode_id = "n{i}"\nconfirm = "up"\n'
                    f"replica_timeout_ms = 300\ngrace_seconds = 1.0\nlease_seconds = 3.0\n"
                ),
                pool='stripe_unit = "256KiB"',
                mount='durability = "close"',
            )
            for i in range(2)
        ]

        async def body(a, b):
            ds: dict[int, str] = {}
            for i in itertools.count():
                if len(ds) == 2:
                    break
                await a.mkdir(f"/d{i}")
                ds.setdefault(shard_of(a.ino(f"/d{i}"), 2), f"/d{i}")
            await eventually(lambda: all(known(b, d) for d in ds.values()))
            before = {f"{ds[i % 2]}/f{i}": data(i, 200_000 + i) for i in range(8)}
            for i, (path, payload) in enumerate(before.items()):
                await (a if i % 2 else b).write(path, payload)
            old = await trio.to_thread.run_sync(groups[1].kill_master)
            new = await trio.to_thread.run_sync(groups[1].wait_failover, old)
            for k in (0, 1):
                await write_until_it_works(a, f"{ds[k]}/after", data(100 + k, 300_000))
            for fs in (a, b):
                await eventually(
                    lambda fs=fs: all(known(fs, p) for p in [*before, f"{ds[1]}/after"])
                )
                for path, payload in before.items():
                    assert await fs.read(path) == payload
                assert await fs.read(f"{ds[1]}/after") == data(101, 300_000)
            link = a.svc.catalog.shards[1].link
            assert link.failovers >= 1 and link.where.endswith(f":{new.port} (master 'kvfs-1')")
            assert a.svc.catalog.shards[0].link.failovers == 0  # shard 0 did not move

        run_cluster(cfgs, body)
    finally:
        for g in groups:
            for s in g.servers:
                if s.proc is not None:
                    os.kill(s.proc.pid, signal.SIGCONT)
            g.stop()


def test_a_shard_whose_redis_is_down_is_named_and_the_others_go_on(configs, servers):
    """One shard's Redis killed: the node says which (statistics, `kvfs doctor`); stores in
    the other shards' directories go on (in the region the node holds: taking a new one
    needs every shard) and reach the other node, whose follower of the lost shard alone
    waits to reload it; once it is back, stores in its directories work again."""
    from kvfs.cli.doctor import check_cluster

    async def body(a, b):
        by = await dirs_by_shard(a, 1)
        await put(a, f"{by[0][0]}/before", data(4, 70_000))  # (a region leased, with room)
        await eventually(lambda: known(b, f"{by[0][0]}/before"))
        down = servers[2]
        await trio.to_thread.run_sync(down.kill)
        try:
            for fs in (a, b):  # (both nodes' followers of it have failed)
                await eventually(lambda fs=fs: not fs.svc.catalog.statistics()["online"])
            st = a.svc.catalog.statistics()
            assert st["offline"] == [f"127.0.0.1:{down.port}"], st
            (finding,) = check_cluster("/mnt", st)
            assert finding.status == "fail" and f":{down.port} is unreachable" in finding.detail
            for i in range(3):  # (each seen through b's follower of shard 0, one by one)
                await put(a, f"{by[0][0]}/while_down{i}", data(5 + i, 70_000))
                await eventually(lambda i=i: known(b, f"{by[0][0]}/while_down{i}"))
                assert await b.read(f"{by[0][0]}/while_down{i}") == data(5 + i, 70_000)
        finally:
            await trio.to_thread.run_sync(down.start)
        await eventually(lambda: a.svc.catalog.statistics()["online"], 20)
        for k in range(SHARDS):
            await put(a, f"{by[k][0]}/after", data(16 + k, 70_000))
            await eventually(lambda k=k: known(b, f"{by[k][0]}/after"), 20)
            assert await b.read(f"{by[k][0]}/after") == data(16 + k, 70_000)

    run_cluster(configs(2, lease=30.0), body)


def test_a_shard_away_stops_no_renewal_elsewhere_and_its_copies_are_set_before_a_publish(
    configs, servers, monkeypatch
):
    """The leases are in shard 0 and copied to each other shard, where a publish checks its
    copy. A renewal while one shard is away still renews the copies in the shards after it
    (they were renewed in turn, and the first failure ended the round: theirs ran out too),
    and the first publish in the shard that was away sets its copies again first if they may
    have run out meanwhile (else it is refused until the next renewal). A torture over three
    shards (seed 33) dropped write-backs in both shards so, their fsyncs returning EIO. The
    renewals are the test's own here (the background ones are stopped), so nothing races."""
    from kvfs.cluster.space import ClusterSpace

    async def no_renewals(self):
        await trio.sleep_forever()

    monkeypatch.setattr(ClusterSpace, "_renew_leases", no_renewals)

    async def body(a, b):
        by = await dirs_by_shard(a, 1)
        await put(a, f"{by[1][0]}/before", data(1, 70_000))  # a holds a region: copies set
        space = a.svc.space
        held = sorted(space.regions.deadline)
        first, second = space.leases.shards
        token = space.leases.link.token.encode()
        await second.call("PEXPIRE", second.key("lease", held[0]), 400)
        down = servers[1]
        await trio.to_thread.run_sync(down.kill)
        try:
            await space.leases.renew(held, space.lease_ms)
        finally:
            await trio.to_thread.run_sync(down.start)
        assert space.leases.stale == {first}
        assert await second.call("PTTL", second.key("lease", held[0])) > 10_000
        await eventually(lambda: a.svc.catalog.statistics()["online"], 20)
        for r in held:  # as if they ran out while the shard was away
            await first.call("DEL", first.key("lease", r))
        await put(a, f"{by[1][0]}/back", data(3, 70_000))
        assert await first.call("GET", first.key("lease", held[0])) == token
        assert space.leases.stale == set()
        await eventually(lambda: known(b, f"{by[1][0]}/back"), 20)
        assert await b.read(f"{by[1][0]}/back") == data(3, 70_000)

    run_cluster(configs(2, lease=30.0), body)


def test_a_write_back_group_waits_for_its_files_per_shard_and_is_one_call_per_shard(
    configs, monkeypatch
):
    """Written batches are grouped until GROUP_FILES files per shard wait (here 4: 12 over
    the 3 shards), so a file's shard gets as large a publish as one shard would; the group
    is split by shard before PUBLISH_FILES (here 8) splits a shard's part, so 12 files are
    one call per shard, not two parts each split three ways."""
    from kvfs.catalog.redis import catalog as redis_catalog
    from kvfs.write import writeback

    monkeypatch.setattr(writeback, "BATCH_FILES", 4)
    monkeypatch.setattr(writeback, "GROUP_FILES", 4)
    monkeypatch.setattr(redis_catalog, "PUBLISH_FILES", 8)
    calls: list[tuple[int, int]] = []  # (shard, files) of each publish call
    real = redis_catalog.RedisCatalog._commit_sent

    async def counted(self, sent, args, touched, out, t, sh):
        calls.append((sh.k, len(sent)))
        return await real(self, sent, args, touched, out, t, sh)

    monkeypatch.setattr(redis_catalog.RedisCatalog, "_commit_sent", counted)

    async def body(a, b):
        by = await dirs_by_shard(a, 1)
        wb = a.svc.durability
        paths = [f"{by[k][0]}/f{j}" for j in range(4) for k in range(SHARDS)]
        await a.sync()
        calls.clear()
        publishes, grouped = wb.stats.publishes, wb.stats.grouped_batches
        for i, p in enumerate(paths):
            await a.write(p, data(i, 20_000 + i))
            if i % 4 == 3 and i < 11:  # a batch of 4 written, waiting for the group
                await eventually(lambda i=i: len(wb._gathered) == (i + 1) // 4)
                assert not calls
        await eventually(lambda: all(known(b, p) for p in paths))
        assert wb.stats.publishes - publishes == 1
        assert wb.stats.grouped_batches - grouped == 2
        assert sorted(calls) == [(k, 4) for k in range(SHARDS)], calls
        for i, p in enumerate(paths):
            assert await b.read(p) == data(i, 20_000 + i)

    run_cluster(configs(2, mount_extra="writeback_ms = 5000"), body)
