"""Tiers, pinning, chains and readahead, driven through the files layer without the kernel."""

from __future__ import annotations

import errno
import os

import pytest
import trio
import trio.testing

from kvfs.catalog.tree import LINK_HINT, LINK_READ, LINK_WRITE
from kvfs.errors import KvfsError
from tests.daemon.harness import known, run_service

MiB = 1 << 20


async def settle() -> None:
    await trio.testing.wait_all_tasks_blocked()


async def until(predicate, timeout: float = 10.0) -> None:
    """Wait for background work (fetches run in worker threads) to reach a state."""
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.005)


async def write_chain(fs, names, size=MiB, pid=4242):
    for n in names:
        parent, name = fs.resolve(n)
        r, _ = await fs.files.create(parent, name, 0o644, os.O_CREAT | os.O_WRONLY, 0, 0, pid)
        await fs.files.write(r.fh, 0, os.urandom(size))
        await fs.close(r.fh)
    await fs.sync()  # (written back: in the pool, resident in DRAM)


async def read_file(fs, path, pid):
    r = await fs.files.open(fs.ino(path), os.O_RDONLY, pid)
    data = await fs.read_fh(r.fh, fs.files.getattr(fs.ino(path)).size)
    await fs.close(r.fh)
    return data


def test_a_block_read_from_the_pool_is_promoted_to_dram(pool_config):
    async def body(fs):
        await fs.write("/b", os.urandom(2 * MiB))
        await fs.sync()
        fs.svc.store.drop_dram()
        rec = fs.files.catalog.get(fs.ino("/b")).blob
        assert fs.svc.store.tier_of(rec) == "pool"
        await read_file(fs, "/b", 1)
        await until(lambda: fs.svc.store.tier_of(rec) == "dram")
        t = fs.svc.store.stats.tiers
        assert t["pool"].hits == 1 and t["dram"].misses == 1
        await read_file(fs, "/b", 1)
        assert t["dram"].hits == 1

    run_service(pool_config(), body)


def test_pinned_blocks_stay_in_dram_until_unpinned(pool_config):
    cfg = pool_config(dram="8MiB")

    async def body(fs):
        await fs.write("/pinned", os.urandom(3 * MiB))
        await fs.sync()
        ino = fs.ino("/pinned")
        await fs.files.xattrs.set_pin(ino, True)
        rec = fs.files.catalog.get(ino).blob
        fs.svc.store.drop_dram()
        for i in range(6):  # pressure: 18 MiB through an 8 MiB tier
            await fs.write(f"/other{i}", os.urandom(3 * MiB))
            await read_file(fs, f"/other{i}", 1)
        assert fs.svc.store.tier_of(rec) == "dram"
        big = os.urandom(7 * MiB)
        await fs.write("/big", big)  # fits in the pool, not pinned beside 3 MiB
        with pytest.raises(KvfsError) as e:  # more than the tier can hold pinned
            await fs.files.xattrs.set_pin(fs.ino("/big"), True)
        assert e.value.errno == errno.ENOSPC
        assert b"user.kvfs.pin" not in fs.files.catalog.get(fs.ino("/big")).xattrs
        assert await fs.read("/big") == big
        await fs.files.xattrs.set_pin(ino, False)
        fs.svc.store.drop_dram()
        assert fs.svc.store.tier_of(rec) == "pool"
        await fs.files.xattrs.set_pin(ino, True)

    async def after_restart(fs):
        ino = fs.ino("/pinned")
        await until(lambda: fs.svc.store.tier_of(fs.files.catalog.get(ino).blob) == "dram")
        # a rewrite of a pinned file keeps it pinned
        await fs.write("/pinned", os.urandom(2 * MiB))
        fs.svc.store.drop_dram()
        assert fs.svc.store.tier_of(fs.files.catalog.get(ino).blob) == "dram"

    run_service(cfg, body)
    run_service(cfg, after_restart)


def test_local_tier_takes_demoted_and_promoted_blocks(pool_config, tmp_path):
    local = f'[local]\npath = "{tmp_path}/local.img"\nsize = "64MiB"\n'
    cfg = pool_config(dram="8MiB", extra=local)

    async def body(fs):
        store = fs.svc.store
        assert store.local is not None
        a = os.urandom(3 * MiB)
        await fs.write("/a", a)
        await fs.sync()
        rec = fs.files.catalog.get(fs.ino("/a")).blob
        store.drop_dram()
        await read_file(fs, "/a", 1)  # first pass: promoted to DRAM, not to local (admission)
        await settle()
        assert not store.local.has(rec.id)
        store.drop_dram()
        await read_file(fs, "/a", 1)  # second pass: admitted to the local tier
        await until(lambda: store.local.has(rec.id))
        store.drop_dram()
        assert store.tier_of(rec) == "local"
        data = await read_file(fs, "/a", 1)
        assert store.stats.tiers["local"].hits == 1 and data == a  # served by the local tier
        # demotion: a block pushed out of DRAM by pressure goes to local when admitted
        b_data = os.urandom(3 * MiB)
        await fs.write("/b", b_data)
        await fs.sync()
        b = fs.files.catalog.get(fs.ino("/b")).blob
        store.local.admission.admit(b.id, b.size)  # seen once already
        for i in range(3):
            await fs.write(f"/p{i}", os.urandom(3 * MiB))
        await until(lambda: store.tier_of(b) == "local")
        hits = store.stats.tiers["local"].hits
        assert await read_file(fs, "/b", 1) == b_data  # from the local tier
        assert store.stats.tiers["local"].hits == hits + 1

    run_service(cfg, body)


def test_chains_learned_from_write_order_read_order_and_hints(pool_config):
    cfg = pool_config()

    async def body(fs):
        cat = fs.files.catalog
        await write_chain(fs, ["/c0", "/c1", "/c2"], size=4096, pid=os.getpid())
        i0, i1, i2 = (fs.ino(p) for p in ("/c0", "/c1", "/c2"))
        assert cat.next_of(i0) == i1 and cat.links_of(i0)[i1][0] == LINK_WRITE
        await read_file(fs, "/c0", os.getpid())
        await read_file(fs, "/c2", os.getpid())  # a reader that skips c1
        assert cat.links_of(i0)[i2][0] == LINK_READ
        assert cat.next_of(i0) == i2  # read order outranks write order
        parent, name = fs.resolve("/c1")
        await fs.svc.control.setxattr(i0, b"user.kvfs.next", b"c1", 0)
        assert cat.next_of(i0) == i1 and cat.links_of(i0)[i1][0] == LINK_HINT
        assert cat.parent_of(i1) == i0

    async def after_restart(fs):
        cat = fs.files.catalog
        assert cat.next_of(fs.ino("/c0")) == fs.ino("/c1")  # links persist

    run_service(cfg, body)
    run_service(cfg, after_restart)


def test_readahead_window_grows_along_a_chain_and_shrinks_on_a_miss(pool_config):
    cfg = pool_config(dram="128MiB")

    async def body(fs):
        names = [f"/k{i}" for i in range(20)]
        await write_chain(fs, names, size=MiB)
        await write_chain(fs, ["/x0", "/x1", "/x2"], size=MiB, pid=99)
        await trio.sleep(0)
        fs.svc.store.drop_dram()
        ra, st = fs.svc.readahead, fs.svc.store.stats
        pid = 555
        await read_file(fs, names[0], pid)
        assert ra.window_of(pid) == 1 and st.prefetch_issued == 1  # a new stream: one ahead
        await until(lambda: fs.svc.store.inflight == 0)
        await read_file(fs, names[1], pid)  # as the chain predicted
        assert ra.window_of(pid) == 2 and st.prefetch_issued == 3
        for n in names[2:4]:
            await until(lambda: fs.svc.store.inflight == 0)
            await read_file(fs, n, pid)
        assert ra.window_of(pid) == 8  # k4..k11 prefetched
        await until(lambda: fs.svc.store.inflight == 0)
        assert ra.stats.predicted_hits == 3 and st.prefetch_used >= 2
        # Open k4 and then jump elsewhere with no checkpoint in between (Files.open does not
        # yield without passthrough): k4 grows the window to 16 and queues k12..k19, which are
        # still queued or just started when the miss comes, so the miss must cancel them.
        store = fs.svc.store
        stream = ra.streams[next(reversed(ra.streams))]
        cancelled = st.prefetch_cancelled
        h4 = await fs.files.open(fs.ino(names[4]), os.O_RDONLY, pid)
        assert ra.window_of(pid) == 16 and ra.stats.predicted_hits == 4
        queued = [r.id for r in stream.ahead.values() if r.id in store._prefetch_queue]
        running = [
            r.id
            for r in stream.ahead.values()
            if store.blobs.get(r.id) is not None and store.blobs[r.id].fetch is not None
        ]
        assert len(queued) >= 1 and len(queued) + len(running) == 8, (queued, running)
        hx = await fs.files.open(fs.ino("/x0"), os.O_RDONLY, pid)  # a miss
        assert ra.window_of(pid) == 8
        assert ra.stats.predicted_misses == 1
        assert set(stream.ahead) == {fs.ino("/x1"), fs.ino("/x2")}  # the new chain's
        assert not set(queued) & set(store._prefetch_queue)
        assert st.prefetch_cancelled - cancelled == len(queued)  # counted at once
        await fs.close(h4.fh)
        await fs.close(hx.fh)
        await until(lambda: store.inflight == 0)
        # the running ones stopped issuing units: each ends cancelled, or complete if all its
        # units were already on their way
        assert len(queued) <= st.prefetch_cancelled - cancelled <= len(queued) + len(running)

    run_service(cfg, body)


def test_cancelled_prefetch_releases_its_buffer_and_a_reader_can_still_read(pool_config):
    cfg = pool_config(dram="64MiB")

    async def body(fs):
        data = os.urandom(8 * MiB)
        await fs.write("/p", data)
        await fs.sync()
        store = fs.svc.store
        rec = fs.files.catalog.get(fs.ino("/p")).blob
        store.drop_dram()
        assert store.prefetch(rec)
        assert store.cancel_prefetch(rec)
        await until(lambda: store.inflight == 0)
        assert not store.is_resident(rec)
        assert await read_file(fs, "/p", 1) == data
        await until(lambda: store.inflight == 0)
        store.drop_dram()
        assert store.prefetch(rec)  # a reader arrives: it completes
        store.cancel_prefetch(rec)
        assert await read_file(fs, "/p", 3) == data

    run_service(cfg, body)


def resident_outside_the_index(store) -> list[int]:
    """Blocks with a resident buffer the DRAM tier does not account (never evicted, never
    dropped: their memory leaks)."""
    return [
        bid
        for bid, cb in store.blobs.items()
        if (cb.resident is not None) != (bid in store.dram.sizes)
    ]


def test_making_room_that_falls_short_forgets_no_resident_copy(pool_config):
    """The DRAM tier evicts what it can for a fetch even when that is not enough (a held block
    is in the way); the copies it took out must leave DRAM too. They stayed resident outside
    its index: never evicted or dropped again, their memory leaked (found by bench/soak.py:
    descriptors of block buffers left after drop_dram)."""
    cfg = pool_config(dram="8MiB")

    async def body(fs):
        store = fs.svc.store
        for name, size in (("/a", 2 * MiB), ("/b", 4 * MiB), ("/c", 7 * MiB)):
            await fs.write(name, os.urandom(size))
        store.drop_dram()
        await read_file(fs, "/a", 1)  # a: resident, not held
        hb = await fs.files.open(fs.ino("/b"), os.O_RDONLY, 2)
        await fs.read_fh(hb.fh, 4 * MiB)  # b: resident, held open
        await read_file(fs, "/c", 3)  # needs more than a can give
        await until(lambda: store.inflight == 0)
        assert resident_outside_the_index(store) == []
        await fs.close(hb.fh)
        store.drop_dram()
        assert not any(cb.resident is not None for cb in store.blobs.values())

    run_service(cfg, body)


def test_the_store_keeps_nothing_of_blocks_it_no_longer_holds(pool_config):
    """Hundreds of small files through an 8 MiB DRAM tier, some read, replaced or unlinked,
    every block evicted in the end: the store keeps bookkeeping only for blocks still resident,
    and the reads-per-file counter only for files that exist. The store's
    index of resident blocks by use (`_open`, pruned only over the descriptor limit) kept a
    CachedBlob for every block ever evicted or retired, about 1 KB each: the daemon's memory
    grew ~5 MB a minute in bench/soak.py and never came back."""
    cfg = pool_config(dram="8MiB", size="64MiB", pool='evict = "lru"')

    async def body(fs):
        store = fs.svc.store
        for i in range(400):
            await fs.write(f"/f{i % 300}", os.urandom(64 * 1024 + i))
            if i % 3 == 0:
                await fs.read(f"/f{i % 300}")
            victim = f"f{(i * 13) % 300}"
            if i % 7 == 0 and known(fs, "/" + victim):
                await fs.files.unlink(1, victim.encode())
        await fs.sync()
        live = {fs.ino(f"/f{k}") for k in range(300) if known(fs, f"/f{k}")}
        assert fs.files.hits and set(fs.files.hits) <= live  # (reads per file: live files)
        resident = [bid for bid, cb in store.blobs.items() if cb.resident is not None]
        assert resident and len(store._open) <= len(resident), (len(store._open), len(resident))
        store.drop_dram()
        assert len(store._open) == 0 and len(store.blobs) == 0, (len(store._open), len(store.blobs))

    run_service(cfg, body)
