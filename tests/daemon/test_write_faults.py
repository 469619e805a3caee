"""A device error at each step of a write (a pwritev, a short write, io_submit, the fdatasync),
on the worker-thread and the Linux AIO paths, injected into one namespace's descriptor while
a real pool and catalog run: it never reaches the daemon's nursery, a block it hit is placed
again on a healthy namespace, and what could not be written is reported as Linux reports a
write-back error (errseq): to the next fsync of every descriptor open at the error, and to a
later opener's fsync if nobody has seen it. tests/mounted/test_faults.py and bench/faults.py
do the same with real devices that fill or stall."""

from __future__ import annotations

import errno
import os

import pytest

from kvfs.errors import KvfsError
from kvfs.pool import linux_aio
from kvfs.pool import namespace as device
from kvfs.pool.requests import IOV_MAX
from tests.daemon.harness import run_service

KiB, MiB = 1 << 10, 1 << 20
SLOW = "writeback_ms = 60000"  # nothing is written back unless someone waits for it
STEPS = [
    "every_write",
    "first_write",
    "short_write",
    "fdatasync",
    "first_write_and_fdatasync",
    "submit",
]


class Fault:
    """Fail `step` on the descriptor of namespace `victim` (by both I/O paths' calls)."""

    def __init__(self, monkeypatch, step: str):
        self.step, self.fd, self.on, self.hits = step, -1, True, 0
        self.writes = 0
        real_pwritev, real_sync = device.os.pwritev, device.os.fdatasync
        real_aio_w, real_aio_s = linux_aio.Engine.pwritev, linux_aio.Engine.fdatasync
        fault = self

        def write_fails(fd) -> bool:
            if fd != fault.fd or not fault.on:
                return False
            fault.writes += 1
            return fault.step in ("every_write", "short_write", "submit") or (
                fault.step.startswith("first_write") and fault.writes == 1
            )

        def sync_fails(fd) -> bool:
            return fd == fault.fd and fault.on and fault.step.endswith("fdatasync")

        def pwritev(fd, views, offset):
            if write_fails(fd):
                fault.hits += 1
                if fault.step == "short_write":
                    return 0  # the device ended: no byte written
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            return real_pwritev(fd, views, offset)

        def fdatasync(fd):
            if sync_fails(fd):
                fault.hits += 1
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            return real_sync(fd)

        async def aio_pwritev(self, fd, views, offset, nowait=False):
            if write_fails(fd):
                fault.hits += 1
                if fault.step == "short_write":
                    return 0
                # (io_submit's own refusal, or the completion's result: both raise here)
                raise OSError(errno.EIO if fault.step != "submit" else errno.EBADF, "injected")
            return await real_aio_w(self, fd, views, offset, nowait)

        async def aio_fdatasync(self, fd):
            if sync_fails(fd):
                fault.hits += 1
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            return await real_aio_s(self, fd)

        monkeypatch.setattr(device.os, "pwritev", pwritev)
        monkeypatch.setattr(device.os, "fdatasync", fdatasync)
        monkeypatch.setattr(linux_aio.Engine, "pwritev", aio_pwritev)
        monkeypatch.setattr(linux_aio.Engine, "fdatasync", aio_fdatasync)


async def _reported_once(files, fh: int) -> None:
    """The next fsync of `fh` fails with EIO, the one after returns 0 (each descriptor hears
    of a write-back error once)."""
    with pytest.raises(KvfsError) as e:
        await files.fsync(fh)
    assert e.value.errno == errno.EIO
    await files.fsync(fh)


def _files(n: int = 12) -> dict[str, bytes]:
    # small (one unit, staged: AIO where the engine is "auto") and large (worker threads)
    return {f"/f{i}": os.urandom((64 * KiB if i % 3 else 3 * MiB) + i) for i in range(n)}


@pytest.mark.parametrize("io", ["auto", "threads"])
@pytest.mark.parametrize("step", STEPS)
def test_a_failed_namespace_is_written_around_and_nothing_is_lost(
    pool_config, monkeypatch, step, io
):
    """Two namespaces, one failing at `step` during a write-back batch: the daemon lives on,
    every file is written to the other namespace instead (placed again), fsync returns 0,
    and every file reads back bit-exact from the pool; the namespace is marked failed."""
    cfg = pool_config(
        n=2, durability="fsync", mount=SLOW, pool=f'io_engine = "{io}"\nstripe_unit = "1MiB"'
    )
    files = _files()
    fault = Fault(monkeypatch, step)

    async def body(fs):
        pool = fs.svc.pool
        fault.fd = pool.namespaces[0].fd
        for path, data in files.items():
            await fs.write(path, data)
        fh = await fs.open("/f0", os.O_RDONLY)
        await fs.files.fsync(fh)  # the batch: every file durable
        await fs.close(fh)
        assert fault.hits, "the fault was never met"
        assert pool.namespaces[0].stats.state == "failed"
        wb = fs.svc.statistics()["writeback"]
        assert (
            wb["errors"] == 0 and wb["placed_again"] + fs.files.sessions.stats.placed_again >= 1
        ), wb
        fault.on = False
        fs.svc.store.drop_dram()
        for path, data in files.items():
            assert await fs.read(path) == data, path
            layout = fs.files.catalog.get(fs.ino(path)).blob.layout
            if step != "first_write":  # (there the others' writes succeeded: durable)
                assert 0 not in layout.ns, (path, layout.ns)  # nothing on the failed one

    run_service(cfg, body)


@pytest.mark.parametrize("io", ["auto", "threads"])
@pytest.mark.parametrize("step", ["every_write", "first_write_and_fdatasync", "submit"])
def test_a_write_back_that_fails_everywhere_is_reported_as_linux_does(
    pool_config, monkeypatch, step, io
):
    """One namespace, failing: the write-back of closed files fails (the daemon lives on).
    The error goes to the next fsync of each descriptor open when it happened (once each),
    then to the first fsync of a later opener (nobody had seen it for that file), and to an
    fsync of a directory opened before; no fsync returns 0 as if the file were written. The
    file keeps its previous version, and the stop says what it could not write."""
    cfg = pool_config(n=1, durability="fsync", mount=SLOW, pool=f'io_engine = "{io}"')
    old = os.urandom(100 * KiB)
    fault = Fault(monkeypatch, step)
    stops: list[int] = []

    async def body(fs):
        files = fs.files
        for p in ("/f", "/g", "/h"):
            await fs.write(p, old)
        await fs.sync()
        fault.fd = fs.svc.pool.namespaces[0].fd
        dir_seen = files.write_errors.sample()  # a directory handle opened now
        reader = await fs.open("/f", os.O_RDONLY)  # open across the failure
        new = {p: os.urandom(200 * KiB) for p in ("/f", "/g", "/h")}
        for p, d in new.items():
            await fs.write(p, d)  # closed: waits for write-back
        # a reader of /h's closed content, which it reads before the failure
        midway = await fs.open("/h", os.O_RDONLY)
        assert await files.read(midway, 0, 4096) == new["/h"][:4096]
        await files.sync_all()  # the batch, which fails
        assert fault.hits
        st = fs.svc.statistics()["writeback"]
        assert st["errors"] == 3, st
        # the reader that read the dropped content reads no other version under the same
        # open: EIO (a new open reads the previous version)
        with pytest.raises(KvfsError) as e:
            await files.read(midway, 4096, 4096)
        assert e.value.errno == errno.EIO
        await fs.close(midway)
        # the descriptor open across it hears of it, once
        await _reported_once(files, reader)
        # /f's error was seen: a later opener starts past it
        after = await fs.open("/f", os.O_RDONLY)
        await files.fsync(after)
        # nobody saw /g's: its first later opener hears of it, once; the next one does not
        late = await fs.open("/g", os.O_RDONLY)
        await _reported_once(files, late)
        later = await fs.open("/g", os.O_RDONLY)
        await files.fsync(later)
        for fh in (reader, after, late, later):
            await fs.close(fh)
        # a directory opened before the failure, once
        with pytest.raises(KvfsError) as e:
            await files.fsyncdir(dir_seen)
        assert e.value.errno == errno.EIO
        assert await files.fsyncdir(files.write_errors.seq) == files.write_errors.seq
        fault.on = False
        for p in ("/f", "/g", "/h"):
            assert await fs.read(p) == old  # the previous version, whole
        fs.svc.store.drop_dram()
        assert await fs.read("/f") == old
        # /h's error was never reported to anyone: the stop says so (and exits non-zero)
        stops.append(files.write_errors.unseen())

    run_service(cfg, body)
    assert stops == [1]


@pytest.mark.parametrize("durability", ["fsync", "close"])
def test_a_close_after_a_namespace_failed_mid_commit_is_placed_again(
    pool_config, monkeypatch, durability
):
    """The one-file path (a commit at close, or a write-back's block that met ENOSPC or a
    failed namespace) places a block again once when a namespace fails under it."""
    cfg = pool_config(
        n=3,
        durability=durability,
        mount="" if durability == "close" else SLOW,
        pool='stripe_unit = "256KiB"',
    )
    data = os.urandom(4 * MiB + 5)
    fault = Fault(monkeypatch, "every_write")

    async def body(fs):
        fault.fd = fs.svc.pool.namespaces[1].fd
        fh = await fs.open("/big", os.O_CREAT | os.O_WRONLY)
        await fs.files.write(fh, 0, data)
        await fs.files.fsync(fh)
        await fs.close(fh)
        assert fault.hits
        fault.on = False
        fs.svc.store.drop_dram()
        assert await fs.read("/big") == data
        assert 1 not in fs.files.catalog.get(fs.ino("/big")).blob.layout.ns

    run_service(cfg, body)


def test_vectored_writes_split_at_iov_max(pool_config, monkeypatch):
    """A sparse file's block has a view per data or hole run: 16 MiB with 4 KiB written in
    every 8 KiB is 2,048 views, past IOV_MAX (1,024): it goes in several calls, is stored
    and reads back (in one call it failed with EINVAL, marked the namespace failed, and the
    file was dropped)."""
    cfg = pool_config(
        n=1,
        size="128MiB",
        durability="fsync",
        mount=SLOW,
        pool='stripe_unit = "4MiB"',
        dram="128MiB",
    )
    page = os.urandom(4 * KiB)
    want = bytearray(16 * MiB)
    for off in range(0, 16 * MiB, 8 * KiB):
        want[off : off + 4 * KiB] = page
    calls: list[int] = []
    real = device.os.pwritev

    def pwritev(fd, views, offset):
        calls.append(len(views))
        return real(fd, views, offset)

    monkeypatch.setattr(device.os, "pwritev", pwritev)

    async def body(fs):
        fh = await fs.open("/sparse", os.O_CREAT | os.O_WRONLY)
        for off in range(0, 16 * MiB, 8 * KiB):
            await fs.files.write(fh, off, page)
        await fs.files.fsync(fh)
        await fs.close(fh)
        assert fs.svc.pool.namespaces[0].stats.state == "ok"
        assert max(calls) <= IOV_MAX < sum(calls), calls
        fs.svc.store.drop_dram()
        assert await fs.read("/sparse") == bytes(want[: 16 * MiB - 4 * KiB])

    run_service(cfg, body)


@pytest.mark.parametrize(
    "io, durability",
    [("auto", "fsync"), ("threads", "fsync"), ("auto", "close"), ("threads", "close")],
)
def test_a_hung_namespace_holds_no_fsync_past_its_deadline(
    pool_config, monkeypatch, io, durability
):
    """A namespace whose writes hang (a stalled NVMe-oF path): the write-back's share on it
    is given up at its deadline (io_timeout_ms), the namespace failed and the files written
    elsewhere, so fsync returns in about the deadline and every file reads back; the hung
    I/O's extents are freed only once it ends (nothing else may be placed there before)."""
    import time

    import trio

    cfg = pool_config(
        n=2,
        durability=durability,
        mount=SLOW if durability == "fsync" else "",
        pool=f'io_engine = "{io}"\nio_timeout_ms = 300',
    )
    files = _files(6)
    hang = {"fd": -1, "seconds": 2.0, "hung": 0}
    real_pwritev, real_aio = device.os.pwritev, linux_aio.Engine.pwritev

    def pwritev(fd, views, offset):
        if fd == hang["fd"]:
            hang["hung"] += 1
            time.sleep(hang["seconds"])  # (a worker thread, stuck in the kernel)
        return real_pwritev(fd, views, offset)

    async def aio_pwritev(self, fd, views, offset, nowait=False):
        if fd == hang["fd"]:
            hang["hung"] += 1
            with trio.CancelScope(shield=True):  # (an AIO in flight is waited for)
                await trio.sleep(hang["seconds"])
        return await real_aio(self, fd, views, offset, nowait)

    monkeypatch.setattr(device.os, "pwritev", pwritev)
    monkeypatch.setattr(linux_aio.Engine, "pwritev", aio_pwritev)

    async def body(fs):
        pool = fs.svc.pool
        ns0 = pool.namespaces[0]
        free0 = pool.allocators[0].free_bytes
        hang["fd"] = ns0.fd
        t0 = time.monotonic()
        for path, data in files.items():  # ("close": each close commits)
            await fs.write(path, data)
        fh = await fs.open("/f0", os.O_RDONLY)
        await fs.files.fsync(fh)
        took = time.monotonic() - t0
        await fs.close(fh)
        assert hang["hung"] and ns0.stats.timeouts >= 1 and ns0.stats.state == "failed"
        assert took < hang["seconds"], took  # not the whole hang
        assert ns0.late >= 1 and not ns0.on_probation()
        # the hung share's extents are still taken while its I/O is in flight ...
        assert pool.allocators[0].free_bytes < free0
        hang["fd"] = -1
        with trio.fail_after(10):
            while ns0.late:
                await trio.sleep(0.05)
        await trio.sleep(0.05)
        assert pool.allocators[0].free_bytes == free0  # ... and freed once it ended
        fs.svc.store.drop_dram()
        for path, data in files.items():
            assert await fs.read(path) == data, path
            assert 0 not in fs.files.catalog.get(fs.ino(path)).blob.layout.ns

    run_service(cfg, body)


@pytest.mark.parametrize("changes", [1, 100])
def test_the_checksums_are_those_of_the_bytes_written(pool_config, monkeypatch, changes):
    """A large block is written from its live memory, which the kernel may write meanwhile
    (a passthrough writer, a shared writable mapping kept after close: `Buffer.shared`). The
    checksums recorded are those of the bytes on the device: taken again after the write,
    which is repeated while they differ, or made from a copy when the memory keeps changing.
    (Taken once before the write, they did not match what a concurrent writer left written:
    once the block left the DRAM tier, the whole file read EIO.)"""
    cfg = pool_config(n=1, durability="fsync", mount=SLOW, pool='stripe_unit = "1MiB"')
    data = os.urandom(3 * MiB)
    real = device.os.pwritev
    state = {"buf": None, "left": changes}

    def pwritev(fd, views, offset):
        buf = state["buf"]
        if buf is not None and state["left"] > 0:
            # a writer changes the first page between the checksums and the write
            state["left"] -= 1
            os.pwrite(buf.fd, os.urandom(4096), 0)
        return real(fd, views, offset)

    monkeypatch.setattr(device.os, "pwritev", pwritev)

    async def body(fs):
        await fs.write("/big", data)
        st = fs.files.handles.states[fs.ino("/big")]
        buf = st.session.buffer
        buf.shared = True
        state["buf"] = buf
        fh = await fs.open("/big", os.O_RDONLY)
        await fs.files.fsync(fh)
        await fs.close(fh)
        state["buf"] = None
        assert state["left"] < changes
        fs.svc.store.drop_dram()
        got = await fs.read("/big")  # no EIO: checksums match the device
        assert got[4096:] == data[4096:]

    run_service(cfg, body)
