"""Linux AIO (kvfs/pool/linux_aio.py) on a real file opened with O_DIRECT: round trips, many I/Os in
flight, fdatasync, the errors a read or write would raise, and a cancelled caller that still
waits for its I/O (its memory is in use until the kernel is done)."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os

import pytest
import trio

from kvfs.pool import linux_aio

MiB = 1 << 20


@pytest.fixture
def direct_file(tmp_path):
    path = tmp_path / "ns.img"
    with open(path, "wb") as f:
        f.truncate(8 * MiB)
    try:
        fd = os.open(path, os.O_RDWR | os.O_DIRECT)
    except OSError as e:
        pytest.skip(f"O_DIRECT is not supported under {tmp_path}: {e.strerror}")
    yield path, fd
    os.close(fd)


def run_with_engine(fn):
    async def main():
        eng = linux_aio.engine()
        if eng is None:
            pytest.skip("Linux AIO is not available to this process (io_setup refused)")
        return await fn(eng)

    return trio.run(main)


def test_writes_and_reads_in_flight_together_round_trip(direct_file):
    path, fd = direct_file
    blocks = [os.urandom(64 << 10) for _ in range(64)]

    async def body(eng):
        async def write(i):
            mem = mmap.mmap(-1, len(blocks[i]))
            mem[:] = blocks[i]
            view = memoryview(mem)
            # (every other one from two places at once)
            views = [view] if i % 2 else [view[:4096], view[4096:]]
            assert await eng.pwritev(fd, views, i * len(mem)) == len(mem)

        async with trio.open_nursery() as n:
            for i in range(len(blocks)):
                n.start_soon(write, i)
        await eng.fdatasync(fd)
        got = {}

        async def read(i):
            n = len(blocks[i])
            mem = mmap.mmap(-1, 2 * n)
            view = memoryview(mem)  # into the second half: one view, or two
            views = [view[n:]] if i % 2 else [view[n : n + 8192], view[n + 8192 :]]
            assert await eng.preadv(fd, views, i * n) == n
            got[i] = mem[n:]

        async with trio.open_nursery() as n:
            for i in range(len(blocks)):
                n.start_soon(read, i)
        assert eng.submitted == 2 * len(blocks) + 1
        return got

    got = run_with_engine(body)
    assert all(got[i] == blocks[i] for i in range(len(blocks)))
    assert path.read_bytes()[: 64 * (64 << 10)] == b"".join(blocks)


def test_a_read_past_the_end_is_short_and_errors_are_raised_as_oserror(direct_file, tmp_path):
    _, fd = direct_file
    ro = os.open(tmp_path / "ns.img", os.O_RDONLY | os.O_DIRECT)

    async def body(eng):
        mem = mmap.mmap(-1, 1 << 20)
        whole, page = [memoryview(mem)], [memoryview(mem)[:4096]]
        assert await eng.preadv(fd, whole, 8 * MiB - 4096) == 4096  # the last page
        assert await eng.preadv(fd, page, 8 * MiB) == 0  # at the end
        with pytest.raises(OSError) as e:
            await eng.preadv(fd, page, -4096)  # no such offset
        assert e.value.errno == errno.EINVAL
        with pytest.raises(OSError) as e:
            await eng.pwritev(ro, page, 0)  # not open for writing
        assert e.value.errno == errno.EBADF
        with pytest.raises(OSError) as e:
            await eng.preadv(123456, page, 0)  # no such descriptor
        assert e.value.errno == errno.EBADF
        # an error the completion reports (io_submit took the read): memory it cannot write
        libc = ctypes.CDLL(None, use_errno=True)
        ro_mem = mmap.mmap(-1, 4096)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(ro_mem))
        assert libc.mprotect(ctypes.c_void_p(addr), 4096, mmap.PROT_READ) == 0
        with pytest.raises(OSError) as e:
            await eng.preadv(fd, [memoryview(ro_mem)], 0)
        assert e.value.errno == errno.EFAULT

    try:
        run_with_engine(body)
    finally:
        os.close(ro)


def test_a_cancelled_caller_still_waits_for_its_io(direct_file):
    _, fd = direct_file

    async def body(eng):
        mem = mmap.mmap(-1, 4096)
        mem[:] = b"k" * 4096
        await eng.pwritev(fd, [memoryview(mem)], 0)
        mem[:] = bytes(4096)
        with trio.CancelScope() as scope:
            scope.cancel()
            n = await eng.preadv(fd, [memoryview(mem)], 0)  # not abandoned: the kernel writes mem
            got = mem[:]
            await trio.lowlevel.checkpoint()  # the cancellation lands here
            raise AssertionError("not cancelled")
        assert scope.cancelled_caught
        return n, got

    n, got = run_with_engine(body)
    assert n == 4096 and got == b"k" * 4096


def test_turned_off_the_engine_is_none_and_io_goes_to_threads(monkeypatch):
    monkeypatch.setattr(linux_aio, "_disabled", True)

    async def main():
        return linux_aio.engine()

    assert trio.run(main) is None
