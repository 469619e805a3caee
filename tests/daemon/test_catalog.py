"""The SQLite catalog at scale: a bounded node cache in front of the database, group commit,
readdir by offset, the pool's LRU and policy orders, the free map rebuilt from the rows, schemas 1
and 2 read."""

import errno
import os
import sqlite3
import stat

import numpy as np
import pytest
import trio

from kvfs.catalog.sqlite import SqliteCatalog
from kvfs.errors import KvfsError
from kvfs.pool.layout import Layout
from tests.daemon.harness import run_service

MiB = 1 << 20


def test_nodes_beyond_the_cache_are_read_back_from_the_database(pool_config):
    cfg = pool_config()
    names = [f"f{i:04d}".encode() for i in range(300)]

    async def first(fs):
        cat = fs.files.catalog
        cat.node_rows.cache_nodes = 16  # far fewer than the files
        await fs.mkdir("/d")
        for i, n in enumerate(names):
            await fs.write("/d/" + n.decode(), n * (i + 1))
        d = fs.ino("/d")
        assert cat.node_rows.cached <= 16
        held = cat.lookup(d, names[0])  # a node somebody holds stays one object
        for n in names[1:]:
            cat.lookup(d, n)
        assert cat.lookup(d, names[0]) is held and cat.find(held.ino) is held
        assert [x.name for x in cat.entries(d)] == names
        assert cat.get(d).nlink == 2 and cat.node_count == len(names) + 2
        for i, n in enumerate(names[:20]):
            assert await fs.read("/d/" + n.decode()) == n * (i + 1)
        await fs.mkdir("/d/sub")
        cat.node_rows._cache.clear()
        del held
        assert cat.get(d).nlink == 3  # a directory's subdirectories, counted in SQL

    async def second(fs):
        cat = fs.files.catalog
        assert cat.node_rows.cached < 16 and cat.file_count == len(names)
        for i, n in enumerate(names):
            assert await fs.read("/d/" + n.decode()) == n * (i + 1)

    run_service(cfg, first)
    run_service(cfg, second)


def test_concurrent_commits_share_transactions_and_wal_syncs(pool_config):
    cfg = pool_config()

    async def run(fs):
        cat = fs.files.catalog
        await fs.write("/warm", b"x")
        t0, s0 = cat.commits, cat.group.syncs
        async with trio.open_nursery() as nursery:
            for i in range(64):
                nursery.start_soon(fs.write, f"/f{i}", os.urandom(4096))
        assert cat.commits - t0 < 64 and cat.group.syncs - s0 < 64
        assert not cat.unsynced

    run_service(cfg, run)


def test_readdir_pages_by_offset_with_pending_files_in_place(pool_config):
    cfg = pool_config()

    async def run(fs):
        cat = fs.files.catalog
        await fs.mkdir("/d")
        for i in range(300):
            await fs.write(f"/d/c{i}", b"")
        fh = await fs.open("/d/pending", os.O_CREAT | os.O_WRONLY)  # no row yet
        d = fs.ino("/d")
        listing = cat.listing(d)
        first = [n.name for _, n in zip(range(200), listing.after(0))]
        mid = cat.lookup(d, first[-1]).cookie
        await fs.files.unlink(d, b"c250")
        rest = [n.name for n in listing.after(mid)]
        names = first + rest
        assert len(names) == len(set(names)) == 300 and b"pending" in names
        assert b"c250" not in names
        await fs.close(fh)

    run_service(cfg, run)


def test_lru_order_and_the_free_map_come_from_the_rows(pool_config):
    cfg = pool_config()

    async def first(fs):
        for i in range(6):
            await fs.write(f"/f{i}", os.urandom(300_000 + i))
        await fs.sync()  # (written back: rows)
        await fs.read("/f0")  # read: most recently used (not yet flushed)
        cat = fs.files.catalog
        order = [ino for _, ino in cat.lru_files()]
        assert order[-1] == fs.ino("/f0") and order[0] == fs.ino("/f1")
        await fs.svc.flush()
        assert [ino for _, ino in cat.lru_files()] == order
        # a read not yet flushed is older than a write since: f6 is now the most recent
        await fs.write("/f6", os.urandom(1000))
        await fs.sync()
        order = [ino for _, ino in cat.lru_files()]
        await fs.read("/f2")
        await fs.write("/f7", os.urandom(1000))
        await fs.sync()
        got = [ino for _, ino in cat.lru_files()]
        assert got[-3:] == [fs.ino("/f6"), fs.ino("/f2"), fs.ino("/f7")], got
        await fs.svc.flush()
        assert [ino for _, ino in cat.lru_files()] == got
        ns, off, length, units = cat.extents()
        assert all(
            np.array_equal(x, y) for x, y in zip((ns, off, length, units), cat._extents_by_row())
        )
        ref = [
            (e.ns, e.offset, e.length) for n in cat.files() for e in n.blob.layout.unit_extents()
        ]
        assert sorted(zip(ns.tolist(), off.tolist(), length.tolist())) == sorted(ref)
        pool = fs.svc.pool
        before = [a.extents() for a in pool.allocators]
        pool.attach(cat.layouts())
        assert [a.extents() for a in pool.allocators] == before

    run_service(cfg, first)


def test_schema_1_is_upgraded_at_open(tmp_path):
    path = tmp_path / "catalog.sqlite"
    c = sqlite3.connect(path, isolation_level=None)
    c.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE blobs (id INTEGER PRIMARY KEY, size INTEGER NOT NULL, unit INTEGER NOT NULL,
            ns BLOB NOT NULL, offsets BLOB NOT NULL, sums BLOB NOT NULL,
            created_ns INTEGER NOT NULL);
        CREATE TABLE nodes (ino INTEGER PRIMARY KEY, parent INTEGER NOT NULL, name BLOB NOT NULL,
            cookie INTEGER NOT NULL, mode INTEGER NOT NULL, uid INTEGER NOT NULL,
            gid INTEGER NOT NULL, atime_ns INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,
            ctime_ns INTEGER NOT NULL, blob INTEGER REFERENCES blobs(id), target BLOB,
            UNIQUE (parent, name));
        CREATE TABLE xattrs (ino INTEGER NOT NULL, name BLOB NOT NULL, value BLOB NOT NULL,
            PRIMARY KEY (ino, name));
        CREATE TABLE links (pred INTEGER NOT NULL, succ INTEGER NOT NULL, source INTEGER NOT NULL,
            weight REAL NOT NULL, PRIMARY KEY (pred, succ));
    """)
    lay = Layout(5000, MiB, (0,), (MiB,), (1234,))
    ns, offs, sums = lay.pack()
    c.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    c.execute("INSERT INTO meta VALUES ('blob_hwm', '9')")
    c.execute("INSERT INTO blobs VALUES (7, 5000, ?, ?, ?, ?, 1)", (MiB, ns, offs, sums))
    c.execute(
        "INSERT INTO nodes VALUES (1, 1, x'', 0, ?, 0, 0, 1, 1, 1, NULL, NULL)",
        (stat.S_IFDIR | 0o755,),
    )
    c.execute(
        "INSERT INTO nodes VALUES (16, 1, ?, 1, ?, 0, 0, 1, 1, 1, 7, NULL)",
        (b"old.pt", stat.S_IFREG | 0o644),
    )
    c.execute("INSERT INTO xattrs VALUES (16, ?, ?)", (b"user.kvfs.pin", b"1"))
    c.close()
    cat = SqliteCatalog.open(path)
    try:
        node = cat.lookup(1, b"old.pt")
        assert (
            node.blob.id == 7
            and node.blob.layout == lay
            and node.xattrs == {b"user.kvfs.pin": b"1"}
        )
        assert cat.next_blob_id() == 10 and cat.file_count == 1
        assert [n.ino for n in cat.pinned_files()] == [16]
        e = cat.extents()
        assert e[0].tolist() == [0] and e[1].tolist() == [MiB] and e[2].tolist() == [8192]
        assert np.array_equal(e[3], [MiB])
    finally:
        cat.close()


def test_schema_2_is_upgraded_at_open_and_its_files_join_the_policys_order_first(tmp_path):
    from kvfs.catalog.sqlite_schema import NODES_TABLE

    path = tmp_path / "catalog.sqlite"
    c = sqlite3.connect(path, isolation_level=None)
    c.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        + NODES_TABLE.replace(", prio REAL, uses INTEGER NOT NULL DEFAULT 0", "")
    )
    lay = Layout(5000, MiB, (0,), (MiB,), (1234,))
    ns, offs, sums = lay.pack()
    c.execute("INSERT INTO meta VALUES ('schema_version', '2')")
    c.execute(
        "INSERT INTO nodes VALUES (1, 1, x'', 0, ?, 0, 0, 1, 1, 1, NULL, NULL, NULL, NULL, "
        "NULL, NULL, NULL, NULL)",
        (stat.S_IFDIR | 0o755,),
    )
    for ino, name, atime in ((16, b"a", 50), (17, b"b", 10), (18, b"c", 30)):
        c.execute(
            "INSERT INTO nodes VALUES (?, 1, ?, 1, ?, 0, 0, ?, 1, 1, NULL, ?, 5000, ?, ?, ?, ?, 1)",
            (ino, name, stat.S_IFREG | 0o644, atime, ino, MiB, ns, offs, sums),
        )
    c.close()
    cat = SqliteCatalog.open(path)
    try:
        node = cat.lookup(1, b"a")
        assert node.blob.layout == lay and node.prio is None and node.uses == 0
        assert list(cat.scored_files()) == [] and cat.lowest_priority() is None
        assert trio.run(cat.score_unscored) == 3
        order = list(cat.scored_files())
        assert [ino for _, ino, _ in order] == [17, 18, 16]  # oldest use first
        assert all(-1.0 < p <= 0.0 for _, _, p in order) and node.prio == order[-1][2]
        assert cat._meta("schema_version") == "3"
    finally:
        cat.close()


def test_the_policys_order_and_ghosts_live_in_the_rows_across_restarts(pool_config):
    """pool.evict = "prefix": each file's priority and uses are in its row (the daemon keeps
    no order in memory), flushed with the access times; a restart finds the same order, and
    an evicted name's uses come back when it is stored again."""
    cfg = pool_config(pool='evict = "prefix"')
    seen = {}

    async def first(fs):
        cat = fs.files.catalog
        for i in range(4):
            await fs.write(f"/f{i}", os.urandom(10_000))
        await fs.sync()
        await fs.read("/f2")
        for _ in range(3):
            await fs.read("/f1")  # reused most, and last: last to go
        order = [ino for _, ino, _ in cat.scored_files()]
        assert order[-2:] == [fs.ino("/f2"), fs.ino("/f1")], order
        assert cat.find(fs.ino("/f1")).uses == 4
        await fs.svc.flush()
        assert [ino for _, ino, _ in cat.scored_files()] == order
        seen["order"] = [(bid, ino) for bid, ino, _ in cat.scored_files()]
        seen["prio"] = [p for _, _, p in cat.scored_files()]
        seen["f1"] = fs.ino("/f1")
        assert await fs.files.evict(fs.ino("/f1"), 0) > 0  # evicted: its ghost stays
        assert cat.ghost_count() == 1

    async def second(fs):
        cat = fs.files.catalog
        got = list(cat.scored_files())
        assert [(b, i) for b, i, _ in got] == [x for x in seen["order"] if x[1] != seen["f1"]]
        assert [p for _, _, p in got] == seen["prio"][:-1]
        f0, f2 = cat.find(fs.ino("/f0")), cat.find(fs.ino("/f2"))
        assert f2.uses == 2 and f0.uses == 1 and f2.prio > f0.prio  # the read was kept
        # the policy keeps no floor in memory across a restart: it starts at the lowest
        # priority left in the rows (where files stored or read next will rank from)
        assert fs.svc.space._rule().floor == got[0][2] == min(seen["prio"][:-1]) > 0.0
        await fs.write("/f1", os.urandom(10_000))  # stored again
        await fs.sync()
        assert cat.find(fs.ino("/f1")).uses == 5 and cat.ghost_count() == 0
        assert [i for _, i, _ in cat.scored_files()][-1] == fs.ino("/f1")

    run_service(cfg, first)
    run_service(cfg, second)


def test_looking_up_a_name_longer_than_255_bytes_is_enametoolong(pool_config):
    """SqliteCatalog.lookup (its own, not TreeCatalog's) answers as ext4 and tmpfs do."""
    cfg = pool_config()

    async def run(fs):
        await fs.mkdir("/d")
        for parent in (1, fs.ino("/d")):
            with pytest.raises(KvfsError) as e:
                fs.files.catalog.lookup(parent, b"L" * 256)
            assert e.value.errno == errno.ENAMETOOLONG

    run_service(cfg, run)


def test_a_create_after_a_lookups_miss_asks_sqlite_nothing_and_misses_stay_true(pool_config):
    """open(O_CREAT) of a new name is a LOOKUP (a miss) then a CREATE: the miss is remembered,
    so the create does not query the name again, nor does a lookup of it again; a name that
    appears since (a create, a rename, a mkdir, a symlink) is no longer a miss."""
    cfg = pool_config(durability="close")

    async def run(fs):
        cat = fs.files.catalog
        await fs.mkdir("/d")
        d = fs.ino("/d")
        queries = []
        cat._conn.set_trace_callback(queries.append)
        try:
            for name in (b"a", b"b", b"c"):
                with pytest.raises(KvfsError):
                    cat.lookup(d, name)
            queries.clear()
            cat.create_file(d, b"a", 0o644, 0, 0)  # after its miss: no query
            with pytest.raises(KvfsError) as e:
                cat.lookup(d, b"b")  # a miss looked up again (an exists-check): no query
            assert e.value.errno == errno.ENOENT
            assert not [q for q in queries if "name" in q], queries
        finally:
            cat._conn.set_trace_callback(None)
        with pytest.raises(KvfsError) as e:
            cat.create_file(d, b"a", 0o644, 0, 0)
        assert e.value.errno == errno.EEXIST
        await fs.write("/d/x", b"x")
        await fs.files.rename(d, b"x", d, b"b", 0)  # b appears by a rename
        with pytest.raises(KvfsError) as e:
            cat.create_file(d, b"b", 0o644, 0, 0)
        assert e.value.errno == errno.EEXIST
        assert cat.lookup(d, b"b").ino == fs.ino("/d/b")
        await fs.files.mkdir(d, b"c", 0o755, 0, 0)  # c by a mkdir
        with pytest.raises(KvfsError) as e:
            cat.create_file(d, b"c", 0o644, 0, 0)
        assert e.value.errno == errno.EEXIST
        assert cat.lookup(d, b"c").is_dir
        for name in (b"e", b"f"):
            with pytest.raises(KvfsError):
                cat.lookup(d, name)
        await fs.files.symlink(d, b"e", b"/d/a", 0, 0)  # e by a symlink
        assert cat.lookup(d, b"e").is_symlink
        await fs.write("/d/f", b"f")  # f by a create, committed
        cat.node_rows.uncache(fs.ino("/d/f"))  # (asked of its row, not of memory)
        assert cat.lookup(d, b"f").ino == fs.ino("/d/f")

    run_service(cfg, run)


def test_lookups_of_cached_names_ask_sqlite_nothing_and_agree_with_it(pool_config):
    """A lookup of a name whose node is in the cache is answered from memory (the stat of a
    file just stored, LMCache's exists-check). Renames, exchanges, replaces, unlinks and cache
    evictions change names under it: after each of 600 random ones, over a cache of 8 nodes,
    every name resolves as a model of the tree says (and as SQLite does), and a gone name
    is ENOENT."""
    import random

    from kvfs.catalog.tree import RENAME_EXCHANGE

    cfg = pool_config(durability="close")
    rng = random.Random(7)

    async def run(fs):
        cat = fs.files.catalog
        cat.node_rows.cache_nodes = 8
        await fs.mkdir("/a")
        await fs.mkdir("/b")
        dirs = [fs.ino("/a"), fs.ino("/b")]
        model: dict[tuple[int, bytes], int] = {}
        for i in range(24):
            d = dirs[i % 2]
            name = f"f{i}".encode()
            await fs.write(f"/{'ab'[i % 2]}/f{i}", name)
            model[(d, name)] = cat.lookup(d, name).ino
        gone: set[tuple[int, bytes]] = set()
        for step in range(600):
            keys = sorted(model)
            src = rng.choice(keys)
            op = rng.random()
            if op < 0.45:  # rename (maybe replacing)
                dst = (rng.choice(dirs), f"f{rng.randrange(40)}".encode())
                await fs.files.rename(src[0], src[1], dst[0], dst[1], 0)
                if dst != src:
                    model[dst] = model.pop(src)
                    gone.add(src)
                    gone.discard(dst)
            elif op < 0.65 and len(keys) > 1:  # exchange
                dst = rng.choice([k for k in keys if k != src])
                await fs.files.rename(src[0], src[1], dst[0], dst[1], RENAME_EXCHANGE)
                model[src], model[dst] = model[dst], model[src]
            elif op < 0.8 and len(keys) > 4:  # unlink
                await fs.files.unlink(*src)
                del model[src]
                gone.add(src)
            else:  # a new file
                key = (rng.choice(dirs), f"f{rng.randrange(40)}".encode())
                if key in model:
                    continue
                await fs.write(f"/{'ab'[dirs.index(key[0])]}/{key[1].decode()}", key[1])
                model[key] = cat.lookup(*key).ino
                gone.discard(key)
            for key in rng.sample(sorted(model), min(6, len(model))):
                assert cat.lookup(*key).ino == model[key], (step, key)
            for key in list(gone)[:6]:
                with pytest.raises(KvfsError) as e:
                    cat.lookup(*key)
                assert e.value.errno == errno.ENOENT
        for key, ino in model.items():  # SQLite says the same
            assert (
                cat._conn.execute(
                    "SELECT ino FROM nodes WHERE parent=? AND name=?", key
                ).fetchone()[0]
                == ino
            )
        # a cached name: no query
        key = next(iter(model))
        cat.lookup(*key)
        queries = []
        cat._conn.set_trace_callback(queries.append)
        try:
            assert cat.lookup(*key).ino == model[key]
        finally:
            cat._conn.set_trace_callback(None)
        assert not queries, queries
        assert len(cat.node_rows._names) <= 2 * cat.node_rows.cached + 1

    run_service(cfg, run)


def test_cached_chain_links_agree_with_the_rows(pool_config, monkeypatch):
    """The links of recently used blocks are kept in memory (kvfs/catalog/sqlite_chains.py);
    with a cache far smaller than the chain, what the catalog answers (next, parent, the
    links) is what its rows say, while links are learned, after a block in the middle is
    removed, and after a restart (rows only)."""
    from kvfs.catalog import sqlite_chains
    from kvfs.catalog.tree import LINK_READ, LINK_WRITE

    monkeypatch.setattr(sqlite_chains, "CHAIN_CACHE", 4)
    cfg = pool_config()
    answers = {}

    def from_rows(cat, ino):
        cat.chains.write_queued()  # (learned links are written in batches)
        succ = cat._conn.execute(
            "SELECT succ FROM links WHERE pred=? ORDER BY source DESC, weight DESC", (ino,)
        ).fetchall()
        pred = cat._conn.execute(
            "SELECT pred FROM links WHERE succ=? ORDER BY source DESC, weight DESC", (ino,)
        ).fetchall()
        live = lambda rows: next((x for (x,) in rows if cat.chains._linked(x)), None)  # noqa: E731
        return live(succ), live(pred)

    def check(cat, inos):
        for ino in inos:
            assert (cat.next_of(ino), cat.parent_of(ino)) == from_rows(cat, ino), ino
            cat.chains.write_queued()
            rows = {
                s: (src, w)
                for s, src, w in cat._conn.execute(
                    "SELECT succ, source, weight FROM links WHERE pred=?", (ino,)
                )
            }
            assert cat.links_of(ino) == rows

    async def first(fs):
        cat = fs.files.catalog
        for i in range(12):
            await fs.write(f"/c{i}", b"x" * (i + 1))
        inos = [fs.ino(f"/c{i}") for i in range(12)]
        for a, b in zip(inos, inos[1:]):
            check(cat, [a, b])  # (both ways now in the cache)
            cat.link(a, b, LINK_WRITE)
            check(cat, [a, b])
        for _ in range(2):  # a stronger source, then more weight
            for a, b in zip(inos[::2], inos[2::2]):
                check(cat, [a, b])
                cat.link(a, b, LINK_READ)
                check(cat, [a, b])
        check(cat, inos)
        check(cat, inos[4:7])
        await fs.files.unlink(fs.resolve("/c5")[0], b"c5")
        check(cat, inos[:5] + inos[6:])
        assert cat.next_of(inos[4]) != inos[5] and cat.parent_of(inos[6]) != inos[5]
        await cat.flush_links()
        answers.update({ino: (cat.next_of(ino), cat.parent_of(ino)) for ino in inos})
        answers["inos"] = inos

    async def second(fs):
        cat = fs.files.catalog
        inos = answers.pop("inos")
        check(cat, inos[:5] + inos[6:])
        assert {ino: (cat.next_of(ino), cat.parent_of(ino)) for ino in inos} == answers

    run_service(cfg, first)
    run_service(cfg, second)


def test_block_ids_are_never_given_twice_across_restarts(pool_config, monkeypatch):
    """A block id names a version to direct readers (their lease): after the newest files are
    removed and the daemon restarts, new versions still get ids past every id given before,
    although the high-water mark is written only once per BLOB_ID_STEP ids."""
    from kvfs.catalog import sqlite as sqlite_cat

    monkeypatch.setattr(sqlite_cat, "BLOB_ID_STEP", 8)
    cfg = pool_config()
    given = []

    async def first(fs):
        for i in range(20):
            await fs.write(f"/f{i}", b"x" * (i + 1))
            await fs.sync()
            given.append(fs.files.catalog.find(fs.ino(f"/f{i}")).blob.id)
        writes = fs.files.catalog.statements
        await fs.write("/f0", b"y")  # a new version: no high-water mark row
        await fs.sync()
        assert fs.files.catalog.statements - writes == 1
        given.append(fs.files.catalog.find(fs.ino("/f0")).blob.id)
        for i in [0] + list(range(5, 20)):  # the newest go: their ids leave the rows
            await fs.files.unlink(fs.resolve(f"/f{i}")[0], f"f{i}".encode())

    async def second(fs):
        await fs.write("/new", b"z")
        await fs.sync()
        assert fs.files.catalog.find(fs.ino("/new")).blob.id > max(given)

    run_service(cfg, first)
    run_service(cfg, second)


def test_a_cache_miss_writes_the_queued_links_only_when_they_are_its_own(pool_config):
    """Learned links wait in a queue for one batch. A block whose links are not cached is read
    from the rows: the queue is written first if it holds links from (or to) that block, and
    not otherwise: a chain walk reads the links from the block it just linked to, and a write
    per open was most of the catalog's work in a cold load."""
    from kvfs.catalog.tree import LINK_WRITE

    cfg = pool_config()

    async def body(fs):
        cat = fs.files.catalog
        for name in ("a", "b", "c"):
            await fs.write(f"/{name}", b"x")
        a, b, c = (fs.ino(f"/{n}") for n in ("a", "b", "c"))
        cat.link(a, b, LINK_WRITE)
        chains = cat.chains
        for ino in (a, b, c):  # (as if the cache had dropped them)
            chains._succ.pop(ino, None)
            chains._pred.pop(ino, None)
        assert cat.links_of(c) == {} and chains._link_queue  # not its links: still queued
        assert cat.parent_of(b) == a and not chains._link_queue  # its own: written, then read
        chains._succ.pop(a, None)
        assert b in cat.links_of(a)

    run_service(cfg, body)
