"""Reads under faults, on a real pool and catalog without the kernel: a namespace whose reads
hang (a stalled NVMe-oF path, by the thread and Linux AIO paths' calls) costs a reader at most
`[pool] read_timeout_ms` (plus its bytes at 64 MB/s), then the namespace is failed for reads
and every read of a block with units on it fails at once, while blocks on the other
namespaces read bit-exact; once the hung reads end, a probe makes it readable again, and
every block reads back bit-exact (the late I/O landed in memory no other block was given).
tests/mounted/test_read_faults.py does the same with a real throttled device, through the
kernel and the I/O worker processes."""

from __future__ import annotations

import errno
import os
import time

import pytest
import trio

from kvfs.errors import KvfsError, Unreadable
from kvfs.pool import linux_aio
from kvfs.pool import namespace as device
from tests.daemon.harness import ROOT, run_service

KiB, MiB = 1 << 10, 1 << 20
DEADLINE_S = 0.3


class Hang:
    """Reads of one namespace's descriptor hang while `on` (both I/O paths' calls)."""

    def __init__(self, monkeypatch):
        self.fd, self.on, self.hung = -1, False, 0
        real_preadv, real_aio = device.os.preadv, linux_aio.Engine.preadv
        hang = self

        def preadv(fd, views, offset, *rest):
            if fd == hang.fd and hang.on:
                hang.hung += 1
                while hang.on:  # (a worker thread, stuck in the kernel)
                    time.sleep(0.01)
            return real_preadv(fd, views, offset, *rest)

        async def aio_preadv(self, fd, views, offset, nowait=False):
            if fd == hang.fd and hang.on:
                hang.hung += 1
                with trio.CancelScope(shield=True):  # (an AIO in flight is waited for)
                    while hang.on:
                        await trio.sleep(0.01)
            return await real_aio(self, fd, views, offset, nowait)

        monkeypatch.setattr(device.os, "preadv", preadv)
        monkeypatch.setattr(linux_aio.Engine, "preadv", aio_preadv)


@pytest.mark.parametrize("io", ["auto", "threads"])
def test_a_hung_namespace_costs_a_reader_the_deadline_then_nothing(pool_config, monkeypatch, io):
    cfg = pool_config(
        n=2,
        durability="fsync",
        pool=(
            f'io_engine = "{io}"\nio_workers = 0\nstripe_unit = "256KiB"\n'
            f"read_timeout_ms = {int(DEADLINE_S * 1000)}"
        ),
    )
    hang = Hang(monkeypatch)
    # blocks of one unit (on one namespace each) and of several (on both)
    files = {f"/s{i}": os.urandom(100 * KiB + i) for i in range(8)}
    files.update({f"/b{i}": os.urandom(2 * MiB + 4096 * i) for i in range(3)})

    async def body(fs):
        try:
            await check(fs)
        finally:
            hang.on = False  # (a failed check must not leave a thread hung at shutdown)

    async def check(fs):
        for path, data in files.items():
            await fs.write(path, data)
        await fs.sync()
        pool, store = fs.svc.pool, fs.svc.store
        ns0 = pool.namespaces[0]
        on0 = {p for p in files if 0 in fs.files.catalog.get(fs.ino(p)).blob.layout.ns}
        off0 = set(files) - on0
        assert {"/b0", "/b1", "/b2"} <= on0 and off0, (on0, off0)
        store.drop_dram()
        hang.fd, hang.on = ns0.fd, True

        # the first reader waits the deadline out, no more: EIO mid-read (it had opened)
        limit = pool.read_limit(2 * MiB)
        t0 = time.monotonic()
        with pytest.raises(Unreadable) as e:
            await fs.read("/b0")
        took = time.monotonic() - t0
        assert e.value.errno == errno.EIO and e.value.waited, e.value
        assert limit <= took <= limit + 0.5, (took, limit)
        assert hang.hung and ns0.stats.read_state == "failed", ns0.stats
        assert pool.failed_for_reads() == [0]

        # then every open of a block with units there fails at once: ENOENT (a miss)
        for path in sorted(on0):
            t0 = time.monotonic()
            with pytest.raises(KvfsError) as e:
                await fs.read(path)
            assert e.value.errno == errno.ENOENT, (path, e.value)
            assert time.monotonic() - t0 < 0.05, path
        # ... and a fetch already waiting there is not joined (the opener of a passthrough
        # open: the whole block)
        rec = fs.files.catalog.get(fs.ino("/b0")).blob
        t0 = time.monotonic()
        with pytest.raises(Unreadable) as e:
            await store.materialize(rec)
        assert not e.value.waited and time.monotonic() - t0 < 0.05
        # a direct reader (kvfs.client.direct) is not leased a block it would wait for; in
        # the same batch, a block elsewhere is
        direct = fs.svc.direct
        bad, good = await direct.lease(ROOT, 1, [b"b1", min(off0)[1:].encode()], ttl=30)
        assert isinstance(bad, KvfsError) and bad.errno == errno.ENOENT, bad
        assert "failed for reads" in str(bad)
        assert direct.release(1, [good.id], [True]) == [None]
        # blocks on the other namespace read bit-exact meanwhile
        for path in sorted(off0):
            assert await fs.read(path) == files[path], path
        assert ns0.stats.reads_refused >= 1

        # healed: the hung reads end, a probe answers, and it is read again (no remount)
        hang.on = False
        with trio.fail_after(10):
            while ns0.stats.read_state != "ok":
                await trio.sleep(0.05)
        store.drop_dram()
        for path, data in files.items():
            assert await fs.read(path) == data, path

    run_service(cfg, body)


def test_no_deadline_waits_for_the_device(pool_config, monkeypatch):
    """read_timeout_ms = 0: a reader waits as long as the device takes (and nothing is
    failed for reads)."""
    cfg = pool_config(n=1, durability="fsync", pool="io_workers = 0\nread_timeout_ms = 0")
    hang = Hang(monkeypatch)
    data = os.urandom(300 * KiB)

    async def body(fs):
        await fs.write("/f", data)
        await fs.sync()
        fs.svc.store.drop_dram()
        ns0 = fs.svc.pool.namespaces[0]
        hang.fd, hang.on = ns0.fd, True

        async def heal() -> None:
            await trio.sleep(1.0)
            hang.on = False

        async with trio.open_nursery() as n:
            n.start_soon(heal)
            t0 = time.monotonic()
            assert await fs.read("/f") == data
            assert time.monotonic() - t0 >= 0.9
        assert ns0.stats.read_state == "ok" and not ns0.stats.read_timeouts

    run_service(cfg, body)
