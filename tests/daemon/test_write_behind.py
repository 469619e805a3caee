"""Write-behind: units a sequential writer has finished are written before close() (with
durability "close": when close is not a commit, the write-back batches the units instead)."""

from __future__ import annotations

import os

import trio

from tests.daemon.harness import run_service

MiB = 1 << 20


async def until(predicate, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.005)


def written(fs) -> int:
    return sum(ns.stats.bytes_written for ns in fs.svc.pool.namespaces)


def test_units_are_written_before_close_and_the_block_is_exact(pool_config):
    cfg = pool_config(n=3, durability="close")  # (write-behind: close commits)
    data = os.urandom(9 * MiB + 100)

    async def body(fs):
        fh = await fs.open("/blk", os.O_CREAT | os.O_WRONLY)
        for off in range(0, len(data), MiB):
            await fs.files.write(fh, off, data[off : off + MiB])
        await until(lambda: written(fs) >= 8 * MiB)  # behind the writer, before close
        await fs.close(fh)
        assert await fs.read("/blk") == data
        await fs.sync()
        lay = fs.files.catalog.get(fs.ino("/blk")).blob.layout
        assert set(lay.ns) == {0, 1, 2}

    async def again(fs):
        assert await fs.read("/blk") == data

    run_service(cfg, body)
    run_service(cfg, again)


def test_rewritten_and_truncated_units_and_abandoned_sessions_leave_no_garbage(pool_config):
    cfg = pool_config(n=2, durability="close")

    async def body(fs):
        pool = fs.svc.pool
        free0 = pool.free
        data = bytearray(os.urandom(6 * MiB))
        fh = await fs.open("/a", os.O_CREAT | os.O_RDWR)
        for off in range(0, len(data), MiB):
            await fs.files.write(fh, off, bytes(data[off : off + MiB]))
        await until(lambda: written(fs) >= 4 * MiB)
        patch = os.urandom(1000)  # into a unit written behind
        await fs.files.write(fh, MiB + 5, patch)
        data[MiB + 5 : MiB + 5 + 1000] = patch
        await fs.files.setattr(fs.ino("/a"), fh, size=3 * MiB + 10)  # cuts a unit in two
        del data[3 * MiB + 10 :]
        await fs.close(fh)
        assert await fs.read("/a") == bytes(data)
        # a session abandoned after writing behind: unlinked before close
        fh = await fs.open("/b", os.O_CREAT | os.O_WRONLY)
        for off in range(0, 5 * MiB, MiB):
            await fs.files.write(fh, off, os.urandom(MiB))
        await until(lambda: written(fs) >= 7 * MiB)
        p, n = fs.resolve("/b")
        await fs.files.unlink(p, n)
        await fs.close(fh)
        p, n = fs.resolve("/a")
        await fs.files.unlink(p, n)
        await until(lambda: pool.free == free0)
        assert fs.svc.space.reserved == 0

    run_service(cfg, body)
