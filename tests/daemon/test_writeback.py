"""Write-back (durability = "fsync", the default): close is not a commit, fsync is; closed
files are written back in batches within `writeback_ms`. Each invariant of kvfs/write/writeback.py
has a test here, driven through the files layer with a real pool and a real SQLite catalog;
a "crash" is a stop without the shutdown's write-back (harness.run_service(crash=True)).
tests/mounted/test_crash.py kills a mounted daemon with kill -9."""

import errno
import os

import pytest
import trio

from kvfs.errors import KvfsError
from tests.daemon.harness import eventually, run_service

MiB = 1 << 20
SLOW = "writeback_ms = 60000"  # nothing is written back unless someone waits for it


def _absent(fs, path: str) -> bool:
    try:
        fs.ino(path)
    except KvfsError as e:
        assert e.errno == errno.ENOENT
        return True
    return False


def test_close_is_not_a_commit_fsync_is(pool_config):
    """A closed file is the file's content at once (read, stat), but not durable: a crash
    loses it (never partly). One fsync'd before its close survives the crash, whole."""
    cfg = pool_config(mount=SLOW)
    kept, lost = os.urandom(3 * MiB + 5), os.urandom(2 * MiB)

    async def first(fs):
        await fs.write("/lost", lost)
        assert await fs.read("/lost") == lost
        assert fs.files.getattr(fs.ino("/lost")).size == len(lost)
        assert fs.files.catalog.get(fs.ino("/lost")).blob is None  # not committed
        fh = await fs.open("/kept", os.O_CREAT | os.O_WRONLY)
        await fs.files.write(fh, 0, kept)
        await fs.files.fsync(fh)
        assert fs.files.catalog.get(fs.ino("/kept")).blob is not None
        await fs.close(fh)
        assert fs.svc.statistics()["writeback"]["queued"] == 1  # /lost only

    async def after_crash(fs):
        assert await fs.read("/kept") == kept
        assert _absent(fs, "/lost")

    run_service(cfg, first, crash=True)
    run_service(cfg, after_crash)


def test_closed_files_are_durable_within_the_delay(pool_config):
    """Without fsync, closed files are written back within writeback_ms: after waiting for
    it, a crash loses none; the statistics count them and their time to durability."""
    cfg = pool_config(mount="writeback_ms = 50")
    blocks = {f"/b{i}": os.urandom(256 * 1024 + i) for i in range(20)}

    async def first(fs):
        for path, data in blocks.items():
            await fs.write(path, data)
        wb = fs.svc.durability
        await eventually(lambda: wb.dirty_bytes == 0 and not fs.files.catalog.unsynced, 10)
        st = fs.svc.statistics()["writeback"]
        assert st["files"] == 20 and st["batches"] >= 1 and st["errors"] == 0
        assert st["close_to_durable_ms"]["max"] > 0

    async def after_crash(fs):
        for path, data in blocks.items():
            assert await fs.read(path) == data

    run_service(cfg, first, crash=True)
    run_service(cfg, after_crash)


def test_many_closed_files_go_in_one_batch_of_one_transaction(pool_config):
    """A batch is one job and one fdatasync per namespace and one catalog transaction: 64
    closed files cost a handful of syncs, not 64."""
    cfg = pool_config(n=2, mount=SLOW)

    async def body(fs):
        for i in range(64):  # BATCH_FILES: the 64th close starts the batch
            await fs.write(f"/s{i}", os.urandom(64 * 1024))
        wb, cat, pool = fs.svc.durability, fs.files.catalog, fs.svc.pool
        await eventually(lambda: wb.stats.files == 64, 10)
        assert wb.stats.batches == 1 and wb.stats.largest_batch == 64
        assert cat.group.syncs <= 2
        assert sum(ns.syncs for ns in pool.namespaces) <= 2

    run_service(cfg, body)


def test_a_writer_of_a_closed_file_waits_for_its_write_back(pool_config):
    """A closed file's buffer is never written again: a writer that opens it (O_TRUNC or not)
    has it written back first, so a crash finds one whole version or the other, never a mix
    of the two."""
    cfg = pool_config(mount=SLOW)
    v1, v2 = b"1" * (2 * MiB), b"2" * MiB

    async def first(fs):
        await fs.write("/f", v1)
        fh = await fs.open("/f", os.O_WRONLY | os.O_TRUNC)
        assert fs.files.catalog.get(fs.ino("/f")).blob.size == len(v1)  # v1 durable
        await fs.files.write(fh, 0, v2)
        await fs.close(fh)
        fh = await fs.open("/f", os.O_WRONLY)  # in place: v2 durable first
        await fs.files.write(fh, 0, b"3")
        await fs.close(fh)
        assert await fs.read("/f") == b"3" + v2[1:]

    async def after_crash(fs):
        assert await fs.read("/f") == v2

    run_service(cfg, first, crash=True)
    run_service(cfg, after_crash)


def test_a_renamed_closed_file_replaces_its_target_atomically(pool_config):
    """tmp-then-rename: a file that never had a row is renamed in memory and inserted under
    its final name by its write-back (before it, a crash finds neither name); over a file
    with a row, the rename waits for the source to be durable, so the target's row never goes
    before what replaces it: a crash finds the old target or the new one, never none (and,
    as on ext4, a rename not yet durable leaves the source under its temporary name)."""
    cfg = pool_config(mount=SLOW)
    old, new, fresh = b"o" * 5000, b"n" * 7000, b"f" * 3000

    async def first(fs):
        await fs.write("/target", old)
        await fs.sync()
        await fs.write("/t.tmp", new)
        await fs.files.rename(1, b"t.tmp", 1, b"target", 0)
        assert fs.files.catalog.get(fs.ino("/target")).blob.size == len(new)  # committed
        await fs.write("/f.tmp", fresh)
        await fs.files.rename(1, b"f.tmp", 1, b"fresh", 0)
        assert fs.files.catalog.get(fs.ino("/fresh")).blob is None  # not yet written back

    async def after_crash(fs):
        # the rename was not durable: the target is the old one, whole, the new one is there
        # under its temporary name; the file never written back is under neither name
        assert await fs.read("/target") == old and await fs.read("/t.tmp") == new
        assert _absent(fs, "/fresh") and _absent(fs, "/f.tmp")
        await fs.files.rename(1, b"t.tmp", 1, b"target", 0)
        await fs.write("/g.tmp", fresh)
        await fs.files.rename(1, b"g.tmp", 1, b"g", 0)
        await fs.files.sync_all()  # fsyncdir

    async def after_second_crash(fs):
        assert await fs.read("/target") == new and _absent(fs, "/t.tmp")
        assert await fs.read("/g") == fresh and _absent(fs, "/g.tmp")

    run_service(cfg, first, crash=True)
    run_service(cfg, after_crash, crash=True)
    run_service(cfg, after_second_crash)


def test_dirty_bytes_are_bounded_and_writers_wait_for_them(pool_config):
    """Writers that open or create files wait while more than dirty_limit bytes of closed
    files are not durable; the waits are counted."""
    cfg = pool_config(mount=SLOW + '\ndirty_limit = "4MiB"')

    async def body(fs):
        wb = fs.svc.durability
        most = 0
        for i in range(12):
            await fs.write(f"/d{i}", os.urandom(MiB))
            most = max(most, wb.dirty_bytes)
        assert most <= 4 * MiB + MiB  # the limit, and the file that crossed it
        st = fs.svc.statistics()["writeback"]
        assert st["dirty_waits"] >= 2 and st["files"] >= 8

    run_service(cfg, body)


def test_a_closed_file_is_never_evicted_before_its_write_back(pool_config):
    """Dirty blocks are never evicted: a full pool writes closed files back, then evicts them
    in the policy's order; no file closed is lost to a writer that needs room."""
    cfg = pool_config(size="32MiB", mount=SLOW)

    async def body(fs):
        size = fs.svc.pool.capacity // 8 - 4096  # a's two versions and b-d: 5/8 full
        datas = {}
        await fs.write("/a", os.urandom(size))
        await fs.sync()  # a has a committed version...
        for name in "abcd":
            datas[name] = os.urandom(size)
            await fs.write(f"/{name}", datas[name])  # ... and a closed new one
        for name in "abcd":
            assert not fs.files.evictable(fs.ino(f"/{name}"), 0)
            assert await fs.files.evict(fs.ino(f"/{name}"), 0) == 0
        assert fs.svc.space.evictions == 0
        await fs.write("/e", os.urandom(5 * size))  # room: the closed ones written back
        assert fs.svc.space.evictions >= 1
        gone = [n for n in "abcd" if _absent(fs, f"/{n}")]
        assert 1 <= len(gone) == fs.svc.space.evictions
        for name in set("abcd") - set(gone):
            assert await fs.read(f"/{name}") == datas[name]

    run_service(cfg, body)


def test_a_full_pool_is_told_at_close_and_a_closed_file_always_fits(pool_config):
    """A close allocates the extents its write-back will write (making room as a commit
    would): a pool that cannot take the file says so at close (ENOSPC), and every file whose
    close returned is written back, never dropped for want of room."""
    cfg = pool_config(n=2, size="24MiB", pool='evict = "never"', mount=SLOW)

    async def body(fs):
        closed, refused = {}, 0
        for i in range(20):
            data = os.urandom(3 * MiB + 4096 * i)
            try:
                await fs.write(f"/w{i}", data)
                closed[f"/w{i}"] = data
            except KvfsError as e:
                assert e.errno == errno.ENOSPC
                refused += 1
                assert _absent(fs, f"/w{i}")
        assert refused and closed
        await fs.sync()
        assert fs.svc.durability.stats.errors == 0
        fs.svc.store.drop_dram()
        for path, data in closed.items():
            assert await fs.read(path) == data
        assert fs.svc.space.reserved == 0

    run_service(cfg, body)


def test_space_an_unlink_frees_is_not_reused_before_the_unlink_is_durable(pool_config):
    """An unlink returns before it is durable; until it is, a crash finds the file's row,
    so its extents must still hold its bytes: they are free only after the WAL sync."""
    cfg = pool_config(mount=SLOW)
    data, g = os.urandom(3 * MiB), os.urandom(3 * MiB)

    async def first(fs):
        await fs.write("/f", data)
        await fs.sync()
        free = fs.svc.pool.free
        await fs.files.unlink(1, b"f")
        assert fs.svc.pool.free == free  # not yet
        assert fs.files.catalog.unsynced
        await fs.write("/g", g)  # takes other space
        await fs.svc.durability.sync_all()
        assert fs.svc.pool.free == free  # f's space back, g's taken

    async def crash_before_sync(fs):
        free = fs.svc.pool.free
        await fs.files.unlink(1, b"g")
        assert fs.svc.pool.free == free

    async def after_crash(fs):
        assert _absent(fs, "/f")
        assert await fs.read("/g") == g  # the unlink was lost, g is whole

    run_service(cfg, first)
    run_service(cfg, crash_before_sync, crash=True)
    run_service(cfg, after_crash)


def test_a_closed_file_unlinked_before_its_write_back_keeps_its_size(pool_config):
    """A closed file removed before its write-back is never written (its memory goes at
    once), but the kernel may still ask for the inode's attributes (a stat racing with the
    unlink, an O_PATH descriptor): they say what was written, as ext4's would, not 0 (the
    soak saw "stat says 0 bytes" once). Its content is gone for good once the kernel forgets
    the inode."""
    cfg = pool_config(mount=SLOW)
    data = os.urandom(2 * MiB + 3)

    async def run(fs):
        await fs.write("/tmp", data)
        ino = (await fs.files.lookup(1, b"tmp")).ino  # the kernel holds the inode
        await fs.files.rename(1, b"tmp", 1, b"f", 0)  # (as the soak's file was)
        await fs.files.unlink(1, b"f")
        assert fs.svc.durability.dirty_bytes == 0  # never written
        attr = fs.files.getattr(ino)
        assert (attr.size, attr.nlink) == (len(data), 0)
        fs.files.forget(ino, fs.files.handles.lookups[ino])  # (create's and lookup's)
        assert ino not in fs.files._gone_sizes
        with pytest.raises(KvfsError):
            fs.files.getattr(ino)

    run_service(cfg, run)


def test_a_file_unlinked_while_its_write_back_writes_frees_each_version_once(pool_config):
    """A rewritten file unlinked while its batch is writing its data: the unlink retires the
    old version, the write-back records nothing and gives its new extents back; every byte of
    space comes back once, and the daemon goes on (it once freed the old version twice)."""
    cfg = pool_config(mount=SLOW)

    async def run(fs):
        await fs.write("/f", os.urandom(2 * MiB))
        await fs.sync()
        await fs.write("/other", b"o" * 4096)
        await fs.sync()
        free = fs.svc.pool.free
        pool = fs.svc.durability.pool
        entered, gate = trio.Event(), trio.Event()
        write_batch = pool.write_batch

        async def held(blocks):
            entered.set()
            await gate.wait()
            return await write_batch(blocks)

        pool.write_batch = held
        await fs.write("/f", os.urandom(3 * MiB))  # closed: queued
        async with trio.open_nursery() as n:
            n.start_soon(fs.sync)
            await entered.wait()
            await fs.files.unlink(1, b"f")
            gate.set()
        pool.write_batch = write_batch
        await fs.sync()
        assert _absent(fs, "/f")
        assert fs.svc.pool.free == free + 2 * MiB  # the old version's space, once
        assert fs.svc.statistics()["writeback"]["errors"] == 0
        await fs.write("/g", os.urandom(5 * MiB))  # and the pool still works
        await fs.sync()
        assert await fs.read("/other") == b"o" * 4096

    run_service(cfg, run)


def test_a_failed_write_back_drops_the_file_and_fsync_says_so(pool_config, monkeypatch):
    """A write-back that fails (a namespace's I/O error) drops what was closed, as a failed
    commit at close would: the file reads as its previous version (or has no name), the
    error is logged and counted, and an fsync waiting for the file gets it."""
    cfg = pool_config(mount=SLOW)
    old = os.urandom(MiB)

    async def body(fs):
        await fs.write("/f", old)
        await fs.sync()
        pool = fs.svc.pool

        async def failing(blocks):
            return [
                KvfsError(errno.EIO, "namespace 0: write: Input/output error (test)")
                for _ in blocks
            ]

        monkeypatch.setattr(pool, "write_batch", failing)
        await fs.write("/f", os.urandom(600 * 1024))  # (below a unit: no write-behind)
        await fs.write("/new", os.urandom(600 * 1024))
        fh = await fs.open("/f", os.O_RDONLY)
        with pytest.raises(KvfsError) as e:
            await fs.files.fsync(fh)
        assert e.value.errno == errno.EIO
        await fs.close(fh)
        await fs.svc.durability.sync_all()
        monkeypatch.undo()
        assert await fs.read("/f") == old
        assert _absent(fs, "/new")
        assert fs.svc.statistics()["writeback"]["errors"] == 2

    run_service(cfg, body)


def test_tree_changes_are_durable_within_the_delay_or_at_fsyncdir(pool_config):
    """mkdir, symlink, rename... return once applied: a crash right after may lose them (a
    suffix of them, never a middle one); fsyncdir (`sync_all`) makes them durable."""
    cfg = pool_config(mount=SLOW)

    async def first(fs):
        await fs.mkdir("/kept")
        await fs.files.sync_all()
        await fs.mkdir("/lost")

    async def after_crash(fs):
        fs.ino("/kept")
        assert _absent(fs, "/lost")

    run_service(cfg, first, crash=True)
    run_service(cfg, after_crash)


def test_durability_close_commits_at_close(pool_config):
    """durability = "close": close() returns once the file is durable (the mode kept)."""
    cfg = pool_config(durability="close")

    async def first(fs):
        assert fs.svc.durability.mode == "close"
        await fs.write("/f", b"x" * 1000)
        assert fs.files.catalog.get(fs.ino("/f")).blob is not None

    async def after_crash(fs):
        assert await fs.read("/f") == b"x" * 1000

    run_service(cfg, first, crash=True)
    run_service(cfg, after_crash)


def test_unmount_writes_back_what_is_closed(pool_config):
    cfg = pool_config(mount=SLOW)

    async def first(fs):
        await fs.write("/f", b"y" * 4096)
        await trio.sleep(0)

    async def second(fs):
        assert await fs.read("/f") == b"y" * 4096

    run_service(cfg, first)
    run_service(cfg, second)
