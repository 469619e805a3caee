"""Promises the README makes that no other test checked: rename with RENAME_NOREPLACE and
RENAME_EXCHANGE, durable when fsync() returns, reads that are never short, which call a full
pool fails (and that the previous version stays, also after kill -9), a rename that commits a
source still open for writing, and the one documented exception (a fork+exec while writing)."""

from __future__ import annotations

import ctypes
import errno
import os
import random
import subprocess

import pytest

MiB = 1 << 20
AT_FDCWD = -100
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
_libc = ctypes.CDLL(None, use_errno=True)


def renameat2(old, new, flags: int) -> None:
    if _libc.renameat2(AT_FDCWD, os.fsencode(old), AT_FDCWD, os.fsencode(new), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), str(old))


def close_after_kill(fd: int) -> None:
    """Close a descriptor whose daemon may have been killed meanwhile (close then fails)."""
    try:
        os.close(fd)
    except OSError:
        pass


def errno_of(fn, *args) -> int:
    with pytest.raises(OSError) as e:
        fn(*args)
    return e.value.errno


def test_rename_noreplace_and_exchange(mnt):
    d = mnt.mountpoint
    (d / "a").write_bytes(b"A" * 5000)
    (d / "b").write_bytes(b"B" * 7)
    (d / "dir").mkdir()
    (d / "dir" / "inside").write_bytes(b"in")
    # NOREPLACE: an existing target is left alone
    assert errno_of(renameat2, d / "a", d / "b", RENAME_NOREPLACE) == errno.EEXIST
    assert (d / "a").read_bytes() == b"A" * 5000 and (d / "b").read_bytes() == b"B" * 7
    renameat2(d / "a", d / "c", RENAME_NOREPLACE)  # a free name: an ordinary rename
    assert not (d / "a").exists() and (d / "c").read_bytes() == b"A" * 5000
    # EXCHANGE: both names stay, their contents (inodes) trade places
    ino_b, ino_c = os.stat(d / "b").st_ino, os.stat(d / "c").st_ino
    renameat2(d / "b", d / "c", RENAME_EXCHANGE)
    assert (d / "b").read_bytes() == b"A" * 5000 and (d / "c").read_bytes() == b"B" * 7
    assert (os.stat(d / "b").st_ino, os.stat(d / "c").st_ino) == (ino_c, ino_b)
    assert os.stat(d / "b").st_size == 5000
    renameat2(d / "dir", d / "b", RENAME_EXCHANGE)  # a directory and a file
    assert (d / "b" / "inside").read_bytes() == b"in" and (d / "dir").read_bytes() == b"A" * 5000
    assert errno_of(renameat2, d / "c", d / "missing", RENAME_EXCHANGE) == errno.ENOENT
    assert (
        errno_of(renameat2, d / "c", d / "dir", RENAME_EXCHANGE | RENAME_NOREPLACE) == errno.EINVAL
    )
    assert errno_of(renameat2, d / "b", d / "b" / "sub", RENAME_NOREPLACE) == errno.EINVAL
    assert sorted(os.listdir(d)) == ["b", "c", "dir"]
    mnt.restart()  # and it is what the catalog holds
    assert sorted(os.listdir(d)) == ["b", "c", "dir"]
    assert (d / "b" / "inside").read_bytes() == b"in"
    assert (d / "dir").read_bytes() == b"A" * 5000 and (d / "c").read_bytes() == b"B" * 7


@pytest.mark.parametrize("rewrite", [False, True])
def test_durable_when_fsync_returns(mnt, rewrite):
    """kill -9 right after fsync() returned, the writer still holding the file open: after a
    remount the file has exactly the fsynced bytes (writes after the fsync may be lost)."""
    p = mnt.mountpoint / "f.pt"
    if rewrite:
        p.write_bytes(b"old version")
    first = os.urandom(3 * MiB + 17)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        assert os.write(fd, first) == len(first)
        os.fsync(fd)
        os.pwrite(fd, b"after the fsync", len(first))  # not synced: may be lost
        mnt.kill()  # kill -9, mount cleared
    finally:
        close_after_kill(fd)
    mnt.start()
    assert p.read_bytes() == first


@pytest.mark.parametrize("passthrough", ["on", "off"])
def test_reads_within_the_file_are_never_short(make_mount, pool_config, monkeypatch, passthrough):
    """A read of N bytes that lies within the file returns N bytes (the right ones), cold or
    resident, through FUSE passthrough and through the daemon (KVFS_PASSTHROUGH=off); one that
    crosses the end returns the bytes up to it."""
    if passthrough == "off":
        monkeypatch.setenv("KVFS_PASSTHROUGH", "off")
    m = make_mount(pool_config(dram="64MiB"))
    if passthrough == "on" and not m.passthrough:
        pytest.skip(f"FUSE passthrough is not in use: {m.stats()['data_path']['why']}")
    assert m.passthrough == (passthrough == "on")
    size = 9 * MiB + 12345  # units of 1 MiB and a partial last one
    data = os.urandom(size)
    (m.mountpoint / "blk").write_bytes(data)
    rng = random.Random(7)
    for cold in (True, False, True):
        if cold:
            m.drop_caches()
        fd = os.open(m.mountpoint / "blk", os.O_RDONLY)
        try:
            for _ in range(40):
                off = rng.randrange(size)
                n = rng.choice([1, 4096, MiB, 3 * MiB + 5, rng.randrange(1, 2 * MiB)])
                got = os.pread(fd, n, off)
                assert got == data[off : off + n], (off, n, len(got))
            assert os.pread(fd, 16 * MiB, 0) == data  # one read of the whole file
            assert os.pread(fd, 100, size - 10) == data[-10:]  # crosses the end
            assert os.pread(fd, 100, size) == b""
        finally:
            os.close(fd)


@pytest.mark.parametrize("sync", ["close", "fsync"])
def test_a_full_pool_fails_the_write_or_the_commit_and_keeps_the_previous_version(
    make_mount, pool_config, sync
):
    """evict = "never" and no room: through the daemon write() itself fails with ENOSPC,
    through passthrough (writes go straight to memory) the commit does, at fsync() or close().
    Either way the fsync() or close() that follows fails, nothing is committed, the file keeps
    its previous version (a new file is gone), and so it stays after kill -9 and a remount."""
    m = make_mount(pool_config(size="32MiB", pool='evict = "never"'))
    d = m.mountpoint
    cap = m.stats()["tiers"]["pool"]["capacity"]
    old = os.urandom(2 * MiB + 3)
    (d / "f").write_bytes(old)
    filler = os.urandom(cap - 8 * MiB)
    (d / "filler").write_bytes(filler)
    for name in ("f", "new"):
        data = os.urandom(8 * MiB)
        fd = os.open(d / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        write_errno = None
        try:
            for off in range(0, len(data), MiB):
                assert os.pwrite(fd, data[off : off + MiB], off) == MiB
        except OSError as e:
            write_errno = e.errno
        if m.passthrough:
            assert write_errno is None, name
        else:
            assert write_errno == errno.ENOSPC, name
        if sync == "fsync":
            with pytest.raises(OSError) as e:
                os.fsync(fd)
            assert e.value.errno == errno.ENOSPC, name
            try:  # the error was reported: close() may report it again, or not
                os.close(fd)
            except OSError as e:
                assert e.errno == errno.ENOSPC, name
        else:
            with pytest.raises(OSError) as e:
                os.close(fd)
            assert e.value.errno == errno.ENOSPC, name
        assert (d / "f").read_bytes() == old
        assert not (d / "new").exists()
    m.kill()
    m.start()
    assert (d / "f").read_bytes() == old and (d / "filler").read_bytes() == filler
    assert not (d / "new").exists()
    (d / "new").write_bytes(b"room is there for small files")  # the failed ones gave it back
    assert (d / "new").read_bytes() == b"room is there for small files"


def test_after_a_failed_fsync_the_file_reads_as_before_while_its_writer_still_has_it_open(
    make_mount, pool_config
):
    """A failed fsync() drops what was written at once, not when the writer lets the file go
    (the kernel tells kvfs of that after close() returns, or much later: a writer may keep its
    descriptor): from the moment fsync() fails, a file rewritten reads as its previous version
    (content and size) to anyone who opens it, and to the writer itself; a new file is gone."""
    m = make_mount(pool_config(size="32MiB", pool='evict = "never"'))
    d = m.mountpoint
    cap = m.stats()["tiers"]["pool"]["capacity"]
    old = os.urandom(2 * MiB + 3)
    (d / "f").write_bytes(old)
    (d / "filler").write_bytes(os.urandom(cap - 8 * MiB))
    for name in ("f", "new"):
        fd = os.open(d / name, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            try:
                for off in range(0, 8 * MiB, MiB):
                    os.pwrite(fd, os.urandom(MiB), off)
            except OSError as e:
                assert e.errno == errno.ENOSPC and not m.passthrough, name
            assert errno_of(os.fsync, fd) == errno.ENOSPC, name
            assert (d / "f").read_bytes() == old, name
            assert (d / "f").stat().st_size == len(old), name
            assert not (d / "new").exists(), name
            assert os.pread(fd, 4 * MiB, 0) == (old if name == "f" else b""), name
        finally:
            try:
                os.close(fd)
            except OSError as e:
                assert e.errno == errno.ENOSPC, name
    assert sorted(os.listdir(d)) == ["f", "filler"]
    assert (d / "f").read_bytes() == old


def test_rename_commits_a_source_still_open_for_writing(mnt):
    """tmp-then-rename with the tmp file still open: the rename commits what was written, so
    the target is whole at once (for a new reader, and after kill -9 with the writer's file
    still open); the tmp name is gone. In "fsync" mode the rename is durable once the
    directory is fsynced (POSIX's way; in "close" mode it is at once)."""
    d = mnt.mountpoint
    (d / "final").write_bytes(b"previous version")
    data = os.urandom(5 * MiB + 77)
    fd = os.open(d / "final.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        assert os.write(fd, data) == len(data)
        os.rename(d / "final.tmp", d / "final")
        assert not (d / "final.tmp").exists()
        assert (d / "final").read_bytes() == data
        if mnt.durability == "fsync":
            dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        mnt.kill()
    finally:
        close_after_kill(fd)
    mnt.start()
    assert (d / "final").read_bytes() == data
    assert sorted(os.listdir(d)) == ["final"]


def test_a_fork_and_exec_while_writing_commits_what_was_written_so_far(mnt):
    """In "close" mode, the documented exception to "never partial": every close of a
    descriptor is a close (FUSE flush) to kvfs, and an exec closes the child's copy, so what
    the writer had written is committed then (a close by any process commits): after a kill -9
    the file holds that part. In "fsync" mode a close that leaves the file open for writing
    elsewhere freezes nothing (only the last close queues the file), so the file is absent
    until its writer closes it. Either way the writer's own close() gives the whole file."""
    d = mnt.mountpoint
    first, second = os.urandom(3 * MiB), os.urandom(MiB + 5)
    fd = os.open(d / "cut", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        assert os.write(fd, first) == len(first)
        subprocess.run(["true"], check=True)  # fork + exec
        mnt.sync()  # (all that is closed: durable)
        assert os.write(fd, second) == len(second)
        mnt.kill()  # before the writer's close
    finally:
        close_after_kill(fd)
    mnt.start()
    if mnt.durability == "close":
        assert (d / "cut").read_bytes() == first  # what the exec's close committed
    else:
        assert not (d / "cut").exists()
    fd = os.open(d / "whole", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        assert os.write(fd, first) == len(first)
        subprocess.run(["true"], check=True)
        assert os.write(fd, second) == len(second)
    finally:
        os.close(fd)
    mnt.sync()
    mnt.kill()
    mnt.start()
    assert (d / "whole").read_bytes() == first + second
