"""The POSIX that vLLM's fs tier, SGLang's HiCacheFile and LMCache's NIXL POSIX backend use,
each checked on its own through a real mount (tests/clients/ drives the libraries themselves).

    vLLM      O_DIRECT probe file; O_CREAT|O_EXCL|O_DIRECT temp file, write, rename; 16+16 threads
    SGLang    stat, tmp file, rename; statvfs (f_bavail) and mtime drive its LRU eviction
    NIXL      O_CREAT|O_RDWR|O_DIRECT, in-place writes through libaio or io_uring
    LMCache   GDS fallback: ftruncate + MAP_SHARED writes
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import subprocess
import threading

import pyfuse3
import pytest

from tests.helpers import wait_until

pytestmark = pytest.mark.mounted
# FUSE_FALLOCATE reaches kvfs only through a pyfuse3 built with mount/fuse/pyfuse3-fallocate.patch;
# without it the kernel answers EOPNOTSUPP (and glibc's posix_fallocate writes zeros instead)
needs_fallocate = pytest.mark.skipif(
    not hasattr(pyfuse3.Operations, "fallocate"),
    reason="pyfuse3 lacks the fallocate handler (mount/fuse/pyfuse3-fallocate.patch)",
)

MiB = 1 << 20
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02


def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    """The fallocate(2) system call itself (glibc's posix_fallocate would emulate it)."""
    if _libc.fallocate(fd, mode, offset, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def aligned(data: bytes) -> mmap.mmap:
    m = mmap.mmap(-1, len(data))
    m[:] = data
    return m


def free_pages(mnt) -> int:
    v = os.statvfs(mnt.mountpoint)
    assert v.f_bavail == v.f_bfree
    return v.f_bfree


# --- O_EXCL -------------------------------------------------------------------------------------
def test_o_excl_refuses_a_committed_and_a_pending_name(mnt):
    d = mnt.mountpoint
    (d / "done.bin").write_bytes(b"x")
    with pytest.raises(FileExistsError):
        os.open(d / "done.bin", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    # vLLM's temp file: still being written (not yet committed) when a second writer tries it
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_TRUNC | os.O_DIRECT
    fd = os.open(d / "blk.bin_1.tmp", flags, 0o644)
    with pytest.raises(FileExistsError):
        os.open(d / "blk.bin_1.tmp", flags, 0o644)
    os.write(fd, aligned(b"a" * 4096))
    os.close(fd)
    os.replace(d / "blk.bin_1.tmp", d / "blk.bin")
    assert (d / "blk.bin").read_bytes() == b"a" * 4096


def test_o_excl_has_exactly_one_winner_among_racing_threads(mnt):
    p = mnt.mountpoint / "race.tmp"
    won, lost = [], []

    def attempt(i: int) -> None:
        try:
            fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_DIRECT, 0o644)
        except FileExistsError:
            lost.append(i)
            return
        os.write(fd, aligned(bytes([i]) * 4096))
        os.close(fd)
        won.append(i)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(lost) == 15
    assert p.read_bytes() == bytes([won[0]]) * 4096


# --- O_DIRECT switched on with fcntl ------------------------------------------------------------
def test_fcntl_setfl_turns_o_direct_on_and_off(mnt):
    p = mnt.mountpoint / "toggle.bin"
    data = os.urandom(2 * MiB)
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    os.write(fd, data[:MiB])  # buffered
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)
    assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT
    assert os.pwrite(fd, aligned(data[MiB:]), MiB) == MiB  # direct, aligned
    out = mmap.mmap(-1, 2 * MiB)
    assert os.preadv(fd, [out], 0) == 2 * MiB
    assert out[:] == data
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
    assert not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT
    assert os.pread(fd, 5, 3) == data[3:8]  # unaligned again
    os.close(fd)
    mnt.drop_caches()
    assert p.read_bytes() == data


# --- fallocate ---------------------------------------------------------------------------------
@needs_fallocate
def test_fallocate_mode_0_extends_reserves_and_reads_zeros(mnt):
    p = mnt.mountpoint / "prealloc.bin"
    before = free_pages(mnt)
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    os.write(fd, b"head")
    fallocate(fd, 0, 0, 8 * MiB)
    assert os.fstat(fd).st_size == 8 * MiB
    assert before - free_pages(mnt) == 8 * MiB // 4096  # reserved at once
    assert os.pread(fd, 8, 0) == b"head" + bytes(4)
    fallocate(fd, 0, MiB, MiB)  # inside: nothing changes
    assert os.fstat(fd).st_size == 8 * MiB
    os.pwrite(fd, b"tail", 8 * MiB - 4)
    os.close(fd)
    assert before - free_pages(mnt) == 8 * MiB // 4096
    mnt.restart()
    got = p.read_bytes()
    assert len(got) == 8 * MiB and got[:4] == b"head" and got[-4:] == b"tail"
    assert got[4:-4] == bytes(8 * MiB - 8)


@needs_fallocate
def test_fallocate_past_the_pool_fails_and_other_modes_are_refused(make_mount, pool_config):
    m = make_mount(pool_config(size="64MiB", pool='evict = "never"'))
    p = m.mountpoint / "big.bin"
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        with pytest.raises(OSError) as e:
            fallocate(fd, 0, 0, 1 << 30)
        assert e.value.errno in (errno.ENOSPC, errno.EFBIG)
        assert os.fstat(fd).st_size == 0
        for mode in (FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE):
            with pytest.raises(OSError) as e:
                fallocate(fd, mode, 0, MiB)
            assert e.value.errno == errno.EOPNOTSUPP
        fallocate(fd, 0, 0, 16 * MiB)
        assert os.fstat(fd).st_size == 16 * MiB
    finally:
        os.close(fd)


# --- sparse files ------------------------------------------------------------------------------
def test_large_sparse_ftruncate_costs_no_memory_and_reads_zeros(make_mount, pool_config):
    # a file four times the DRAM tier, made by ftruncate and written at both ends
    m = make_mount(pool_config(size="512MiB", dram="32MiB"))
    p = m.mountpoint / "sparse.bin"
    size = 128 * MiB
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    os.ftruncate(fd, size)
    assert os.fstat(fd).st_size == size
    os.pwrite(fd, b"first", 0)
    os.pwrite(fd, b"last", size - 4)
    assert os.pread(fd, 16, 64 * MiB) == bytes(16)
    assert m.stats()["tiers"]["dram"]["used"] < 16 * MiB  # holes take no memory
    os.close(fd)
    m.restart()
    with open(p, "rb") as f:
        assert f.read(5) == b"first"
        f.seek(64 * MiB)
        assert f.read(MiB) == bytes(MiB)
        f.seek(size - 4)
        assert f.read() == b"last"
    with pytest.raises(OSError) as e:
        os.truncate(p, 1 << 40)
    assert e.value.errno in (errno.EFBIG, errno.ENOSPC)
    assert os.stat(p).st_size == size


# --- shared writable mmap ----------------------------------------------------------------------
def test_shared_mmap_writes_into_an_existing_file_are_durable(mnt):
    p = mnt.mountpoint / "chunk.kvcache"
    old = os.urandom(4 * MiB)
    p.write_bytes(old)
    patch = os.urandom(MiB)
    fd = os.open(p, os.O_RDWR)
    m = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    assert m[:MiB] == old[:MiB]
    m[MiB : 2 * MiB] = patch
    m.flush()
    m.close()
    os.close(fd)
    mnt.restart()
    assert p.read_bytes() == old[:MiB] + patch + old[2 * MiB :]


# --- O_NOATIME ---------------------------------------------------------------------------------
def test_o_noatime_opens_and_leaves_atime_alone(mnt):
    p = mnt.mountpoint / "scan.bin"
    p.write_bytes(b"q" * 8192)
    os.utime(p, ns=(1_000_000_000, 2_000_000_000))
    fd = os.open(p, os.O_RDONLY | os.O_NOATIME)
    assert os.read(fd, 8192) == b"q" * 8192
    os.close(fd)
    assert os.stat(p).st_atime_ns == 1_000_000_000
    mnt.restart()
    assert os.stat(p).st_atime_ns == 1_000_000_000
    with open(p, "rb") as f:  # a plain open does count as an access
        f.read()
    assert os.stat(p).st_atime_ns > 2_000_000_000


# --- libaio and io_uring -----------------------------------------------------------------------
@pytest.mark.parametrize("engine", ["libaio", "io_uring"])
def test_async_o_direct_io_with_libaio_and_io_uring(mnt, engine):
    """fio writes 16 MiB with O_DIRECT at queue depth 8 (sequentially, then random 128 KiB
    overwrites in place, NIXL's pattern), and verifies every block it wrote."""
    p = mnt.mountpoint / f"{engine}.bin"
    common = [
        "fio",
        "--name=kv",
        f"--filename={p}",
        f"--ioengine={engine}",
        "--direct=1",
        "--iodepth=8",
        "--size=16M",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_state_save=0",
        "--output-format=terse",
        "--minimal",
    ]
    for extra in (["--rw=write", "--bs=1M"], ["--rw=randwrite", "--bs=128k"]):
        r = subprocess.run(common + extra, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "verify" not in r.stderr.lower(), r.stderr
    assert os.stat(p).st_size == 16 * MiB
    mnt.drop_caches()
    r = subprocess.run(
        common + ["--rw=read", "--bs=128k", "--verify_only"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr


# --- statvfs -----------------------------------------------------------------------------------
def test_statvfs_tracks_writes_unlinks_and_open_unlinked_files(mnt):
    d = mnt.mountpoint
    base = free_pages(mnt)
    fd = os.open(d / "w.bin", os.O_CREAT | os.O_WRONLY, 0o644)
    w = os.urandom(3 * MiB)
    assert os.write(fd, w) == len(w)
    # reserved while written through the daemon; with passthrough the writes reach memory
    # only, and the space is taken at close
    assert base - free_pages(mnt) == (0 if mnt.passthrough else 3 * MiB // 4096)
    os.close(fd)
    assert base - free_pages(mnt) == 3 * MiB // 4096
    (d / "x.bin").write_bytes(os.urandom(5 * MiB + 1))  # rounded up to a page
    assert base - free_pages(mnt) == (8 * MiB + 4096) // 4096
    mnt.sync()  # (durability "fsync": written back; a closed file is in the pool now)
    assert base - free_pages(mnt) == (8 * MiB + 4096) // 4096
    os.unlink(d / "x.bin")
    # freed by the unlink once it is durable: at once with durability "close", within the
    # write-back delay with "fsync" (a crash before then finds the row: its bytes must be there)
    wait_until(lambda: base - free_pages(mnt) == 3 * MiB // 4096, 10, "the unlink's space")
    with open(d / "w.bin", "rb") as f:
        os.unlink(d / "w.bin")
        mnt.sync()
        assert base - free_pages(mnt) == 3 * MiB // 4096  # still read: still used
        assert f.read() == w
    wait_until(lambda: free_pages(mnt) == base, 10, "the space of the last reader's file")
    assert os.statvfs(d).f_files >= 1


# --- mtimes ------------------------------------------------------------------------------------
def test_mtimes_order_writes_survive_rename_and_restart(mnt):
    """SGLang seeds its LRU from mtimes at start-up, oldest first."""
    d = mnt.mountpoint / "hicache"
    d.mkdir()
    names = [f"k{i}.bin" for i in range(5)]
    for n in names:
        tmp = d / f".{n}.tmp"
        tmp.write_bytes(os.urandom(64 * 1024))
        before = os.stat(tmp).st_mtime_ns
        os.replace(tmp, d / n)
        assert os.stat(d / n).st_mtime_ns == before  # rename keeps the mtime
    mtimes = {n: os.stat(d / n).st_mtime_ns for n in names}
    assert sorted(names, key=mtimes.get) == names
    assert len(set(mtimes.values())) == len(names)
    mnt.restart()
    assert {n: os.stat(d / n).st_mtime_ns for n in names} == mtimes
    (d / names[0]).write_bytes(b"rewritten")
    assert os.stat(d / names[0]).st_mtime_ns > mtimes[names[-1]]


# --- reading after unlink ----------------------------------------------------------------------
def test_o_direct_and_mmap_readers_keep_reading_after_unlink(mnt):
    p = mnt.mountpoint / "gone.bin"
    data = os.urandom(4 * MiB)
    p.write_bytes(data)
    fd = os.open(p, os.O_RDONLY | os.O_DIRECT)
    with open(p, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    os.unlink(p)
    mnt.control("drop_dram")
    out = mmap.mmap(-1, 4 * MiB)
    assert os.preadv(fd, [out], 0) == 4 * MiB and out[:] == data
    assert m[:] == data
    m.close()
    os.close(fd)
    assert not p.exists()
