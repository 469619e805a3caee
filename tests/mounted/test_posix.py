"""POSIX behaviour through a real FUSE mount: what inference frameworks and shells rely on."""

from __future__ import annotations

import errno
import json
import mmap
import os
import stat
import subprocess
import time

import pytest

from testing.mount import wait_until

MiB = 1 << 20


def test_nested_directories_files_and_listing(mnt):
    root = mnt.mountpoint
    (root / "a" / "b" / "c").mkdir(parents=True)
    (root / "a" / "b" / "c" / "f.pt").write_bytes(b"x" * 10)
    assert sorted(os.listdir(root / "a" / "b")) == ["c"]
    assert (root / "a" / "b" / "c" / "f.pt").read_bytes() == b"x" * 10
    assert os.stat(root / "a").st_nlink == 3  # ".", its entry, and b's ".."
    with pytest.raises(OSError) as e:
        (root / "a").rmdir()
    assert e.value.errno == errno.ENOTEMPTY
    with pytest.raises(FileExistsError):
        (root / "a").mkdir()
    with pytest.raises(NotADirectoryError):
        os.listdir(root / "a" / "b" / "c" / "f.pt")
    with pytest.raises(IsADirectoryError):
        os.unlink(root / "a" / "b")
    with pytest.raises(NotADirectoryError):
        os.rmdir(root / "a" / "b" / "c" / "f.pt")
    os.unlink(root / "a" / "b" / "c" / "f.pt")
    for d in ("a/b/c", "a/b", "a"):
        os.rmdir(root / d)
    assert os.listdir(root) == []


def test_writes_at_any_offset_out_of_order_and_partial(mnt):
    p = mnt.mountpoint / "blk"
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    os.pwrite(fd, b"tail", 5 * MiB)
    os.pwrite(fd, b"B" * 300, 1 * MiB - 100)  # straddles a chunk boundary
    os.pwrite(fd, b"A", 0)
    assert os.pread(fd, 4, 5 * MiB) == b"tail"  # reads see the writer's bytes before close
    os.fsync(fd)
    os.close(fd)
    got = p.read_bytes()
    assert len(got) == 5 * MiB + 4
    assert got[0:1] == b"A" and got[1:100] == bytes(99)
    assert got[MiB - 100 : MiB + 200] == b"B" * 300
    assert got[-4:] == b"tail"
    assert os.stat(p).st_size == 5 * MiB + 4


def test_rewrite_replaces_atomically_and_old_reader_keeps_old_bytes(mnt):
    """An open reader keeps the version it opened. Through the daemon, a rewrite in place
    goes ahead meanwhile; with FUSE passthrough the kernel reads that version's memfd itself
    and allows one backing file per inode, so the rewrite is refused (ETXTBSY) until the
    readers close, and a rewrite by rename (below) is the way to replace a file being read."""
    p = mnt.mountpoint / "block.pt"
    old, new = os.urandom(4 * MiB), os.urandom(4 * MiB)
    p.write_bytes(old)
    with open(p, "rb", buffering=0) as reader:
        assert reader.read(MiB) == old[:MiB]
        if mnt.passthrough:
            with pytest.raises(OSError) as e:
                p.write_bytes(new)
            assert e.value.errno == errno.ETXTBSY
            assert p.read_bytes() == old  # nothing happened to the file
        else:
            p.write_bytes(new)  # open(O_TRUNC), write, close
        mnt.drop_caches()
        assert reader.read() == old[MiB:]  # the version it opened
    if mnt.passthrough:
        p.write_bytes(new)  # the readers are gone: it goes ahead
    assert p.read_bytes() == new
    with open(p, "rb", buffering=0) as reader:  # truncate(2) by path is a rewrite too
        if mnt.passthrough:
            with pytest.raises(OSError) as e:
                os.truncate(p, 10)
            assert e.value.errno == errno.ETXTBSY
            assert reader.read() == new
        else:
            os.truncate(p, 10)
            # the documented limit of the daemon-served path: the kernel cuts reads at the
            # inode's new size, though the bytes are the old version's
            assert reader.read() == new[:10]
    os.truncate(p, 10)
    assert p.read_bytes() == new[:10]


def test_rename_replaces_the_target_like_os_replace(mnt):
    d = mnt.mountpoint
    (d / "k.data").write_bytes(b"old")
    tmp = d / "k.data.tmp"
    tmp.write_bytes(b"new")
    with open(d / "k.data", "rb") as held:  # an open reader of the replaced file
        os.replace(tmp, d / "k.data")
        assert held.read() == b"old"
    assert (d / "k.data").read_bytes() == b"new"
    assert not tmp.exists()
    (d / "sub").mkdir()
    os.rename(d / "k.data", d / "sub" / "moved")
    assert (d / "sub" / "moved").read_bytes() == b"new"
    with pytest.raises(OSError) as e:  # a directory cannot go inside itself
        os.rename(d / "sub", d / "sub" / "inner")
    assert e.value.errno == errno.EINVAL


def test_readdir_offsets_are_stable_across_batches_and_deletions(mnt):
    d = mnt.mountpoint / "many"
    d.mkdir()
    names = [f"meta-llama@1@0@{i:06d}@bfloat16.pt" for i in range(1500)]
    for n in names:
        (d / n).touch()
    assert sorted(os.listdir(d)) == sorted(names)
    seen = []
    with os.scandir(d) as it:  # delete entries while listing: no duplicates, no loss
        for i, entry in enumerate(it):
            seen.append(entry.name)
            if i % 3 == 0:
                os.unlink(d / names[-1 - i // 3])
    assert len(seen) == len(set(seen))
    survivors = set(os.listdir(d))
    assert survivors <= set(seen)


def test_stat_sizes_times_modes_owner(mnt):
    p = mnt.mountpoint / "f"
    before = time.time_ns()
    p.write_bytes(b"z" * 5000)
    st = os.stat(p)
    assert stat.S_ISREG(st.st_mode)
    assert st.st_size == 5000 and st.st_blocks == 16  # 2 pages of 4 KiB
    assert st.st_uid == os.geteuid() and st.st_gid == os.getegid()
    assert before - 2e9 <= st.st_mtime_ns <= time.time_ns() + 1e9
    os.chmod(p, 0o600)
    os.chown(p, 1234, 5678)
    os.utime(p, ns=(1_000_000_000, 2_000_000_000))
    st = os.stat(p)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert (st.st_uid, st.st_gid) == (1234, 5678)
    assert st.st_atime_ns == 1_000_000_000 and st.st_mtime_ns == 2_000_000_000
    mnt.restart()
    st = os.stat(p)
    assert stat.S_IMODE(st.st_mode) == 0o600 and (st.st_uid, st.st_gid) == (1234, 5678)
    assert st.st_mtime_ns == 2_000_000_000


def test_statfs_reports_the_pool(mnt):
    s = mnt.stats()["tiers"]["pool"]
    v = os.statvfs(mnt.mountpoint)
    assert v.f_bsize == 4096 and v.f_frsize == 4096
    assert v.f_blocks == s["capacity"] // 4096
    assert v.f_bfree == (s["free"] - s["reserved"]) // 4096
    (mnt.mountpoint / "f").write_bytes(os.urandom(8 * MiB))
    v2 = os.statvfs(mnt.mountpoint)
    assert v.f_bfree - v2.f_bfree == 8 * MiB // 4096
    assert v2.f_namemax == 255


def test_o_direct_reads_and_writes(mnt):
    p = mnt.mountpoint / "direct.pt"
    size = 4 * MiB
    buf = mmap.mmap(-1, size)
    data = os.urandom(size)
    buf[:] = data
    fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o644)
    assert os.write(fd, buf) == size
    os.close(fd)
    mnt.drop_caches()
    out = mmap.mmap(-1, size)
    fd = os.open(p, os.O_RDONLY | os.O_DIRECT)
    with os.fdopen(fd, "rb", buffering=0) as f:
        assert f.readinto(out) == size
    assert out[:] == data


def test_mmap_reads_and_shared_mmap_writes(mnt):
    p = mnt.mountpoint / "gds.kvcache"
    size = 3 * MiB + 4096
    data = os.urandom(size)
    # LMCache's GDS fallback: ftruncate, then write through a MAP_SHARED mapping
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    os.ftruncate(fd, size)
    m = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    m[:] = data
    m.flush()
    m.close()
    os.close(fd)
    mnt.drop_caches()
    with open(p, "rb") as f:
        shared = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # MAP_SHARED
        private = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
        assert shared[:] == data and private[:] == data
        shared.close()
        private.close()


def test_user_xattrs(mnt):
    p = mnt.mountpoint / "f"
    p.write_bytes(b"")
    os.setxattr(p, "user.model", b"llama")
    os.setxattr(p, "user.empty", b"")
    assert os.getxattr(p, "user.model") == b"llama"
    names = os.listxattr(p)
    assert sorted(n for n in names if not n.startswith("user.kvfs.")) == [
        "user.empty",
        "user.model",
    ]
    assert "user.kvfs.tier" in names
    with pytest.raises(OSError) as e:
        os.setxattr(p, "user.model", b"x", os.XATTR_CREATE)
    assert e.value.errno == errno.EEXIST
    os.removexattr(p, "user.empty")
    with pytest.raises(OSError) as e:
        os.getxattr(p, "user.empty")
    assert e.value.errno == errno.ENODATA
    with pytest.raises(OSError) as e:
        os.setxattr(p, "trusted.x", b"1")
    assert e.value.errno in (errno.ENOTSUP, errno.EPERM)
    out = subprocess.run(["getfattr", "-d", str(p)], capture_output=True, text=True, check=True)
    assert 'user.model="llama"' in out.stdout
    mnt.restart()
    assert os.getxattr(p, "user.model") == b"llama"


@pytest.mark.parametrize(
    "name",
    [
        "meta-llama-Llama-3.1-8B@1@0@-274654dcc82ea3f3@bfloat16.pt",
        "-leading-dash",
        "..dots..",
        ".hidden",
        "a b c",
        "ünïcødé-キャッシュ",
        "x" * 255,
        "a=b,c;d'e\"f\\g",
        "\t\x01ctl",
    ],
)
def test_any_linux_file_name_works(mnt, name):
    p = mnt.mountpoint / name
    p.write_bytes(b"payload")
    assert name in os.listdir(mnt.mountpoint)
    assert p.read_bytes() == b"payload"
    os.rename(p, str(p) + "2" if len(name.encode()) < 255 else mnt.mountpoint / "short")
    mnt.restart()
    listed = os.listdir(mnt.mountpoint)
    assert (name + "2" if len(name.encode()) < 255 else "short") in listed


def test_name_longer_than_255_bytes_is_refused(mnt):
    with pytest.raises(OSError) as e:
        (mnt.mountpoint / ("y" * 256)).write_bytes(b"")
    assert e.value.errno == errno.ENAMETOOLONG


def test_looking_up_a_name_longer_than_255_bytes_is_enametoolong(mnt):
    """Not ENOENT: a name that long cannot exist (ext4 and tmpfs answer ENAMETOOLONG), also
    when it is reached through a symlink."""
    d = mnt.mountpoint
    long = "z" * 262
    os.symlink(long, d / "link")
    for path, call in (
        (d / long, os.stat),
        (d / "link", os.stat),
        (d / "link", open),
        (d / long, os.unlink),
        (d / long, os.rmdir),
        (d / long, os.listdir),
    ):
        with pytest.raises(OSError) as e:
            call(path)
        assert e.value.errno == errno.ENAMETOOLONG, (path.name[:8], call)
    with pytest.raises(OSError) as e:
        os.rename(d / long, d / "x")
    assert e.value.errno == errno.ENAMETOOLONG
    assert os.listdir(d) == ["link"]


def test_symlinks_work_and_hard_links_are_refused(mnt):
    d = mnt.mountpoint
    (d / "target").write_bytes(b"t")
    os.symlink("target", d / "link")
    assert os.readlink(d / "link") == "target"
    assert (d / "link").read_bytes() == b"t"
    with pytest.raises(OSError) as e:
        os.link(d / "target", d / "hard")
    assert e.value.errno == errno.EPERM


def test_unlinked_open_file_stays_readable(mnt):
    p = mnt.mountpoint / "f"
    data = os.urandom(2 * MiB)
    p.write_bytes(data)
    with open(p, "rb") as f:
        os.unlink(p)
        assert not p.exists()
        mnt.control("drop_dram")
        assert f.read() == data
        assert os.fstat(f.fileno()).st_nlink == 0


def test_restart_is_warm_and_bit_exact(mnt):
    blobs = {f"blk{i}.pt": os.urandom((i + 1) * MiB + i) for i in range(6)}
    for n, b in blobs.items():
        (mnt.mountpoint / n).write_bytes(b)
    mnt.sync()  # (durability "fsync": written back now)
    written = mnt.stats()["store"]["bytes_to_pool"]
    mnt.restart()
    for n, b in blobs.items():
        assert (mnt.mountpoint / n).read_bytes() == b
    st = mnt.stats()
    assert st["store"]["bytes_to_pool"] == 0  # nothing was written again
    assert st["store"]["bytes_from_pool"] >= sum(map(len, blobs.values()))
    assert written >= sum(map(len, blobs.values()))


def test_shell_tools_work(mnt):
    d = mnt.mountpoint
    subprocess.run(
        f"echo hello > {d}/h && cat {d}/h >> {d}/h2 && cp {d}/h {d}/h3 && "
        f"mv {d}/h3 {d}/h4 && ls -l {d} >/dev/null && du -s {d} >/dev/null && "
        f"find {d} -name 'h*' | wc -l",
        shell=True,
        check=True,
        capture_output=True,
    )
    assert (d / "h2").read_text() == "hello\n" and (d / "h4").read_text() == "hello\n"
    r = subprocess.run(["dd", f"if={d}/h4", "of=/dev/null", "bs=1M"], capture_output=True)
    assert r.returncode == 0


def test_a_read_write_open_that_writes_nothing_commits_nothing(mnt):
    """Opening a file read-write (with passthrough: the kernel could write into its memory)
    and closing it without a write leaves its version as it was; a write through a shared
    mapping of such a handle is committed by an fsync of the file (it was not: the fsync
    returned with the write in memory only), and without one at the release of its last
    writable handle, which the kernel sends after close() has returned (the test read the
    version at once and failed when the release came later)."""
    p = mnt.mountpoint / "rw.pt"
    data = os.urandom(3 * MiB)
    p.write_bytes(data)
    gen = json.loads(os.getxattr(p, "user.kvfs.layout"))["generation"]
    commits = mnt.stats()["files"]["commits"]
    with open(p, "r+b") as f:
        assert f.read(100) == data[:100]
    assert json.loads(os.getxattr(p, "user.kvfs.layout"))["generation"] == gen
    assert mnt.stats()["files"]["commits"] == commits
    fd = os.open(p, os.O_RDWR)
    with mmap.mmap(fd, 3 * MiB, mmap.MAP_SHARED) as m:
        m[MiB : MiB + 5] = b"mmap!"  # (the page's first write fault sets the file's mtime)
        os.fsync(fd)
        first = json.loads(os.getxattr(p, "user.kvfs.layout"))["generation"]
        assert first != gen
        m[MiB : MiB + 5] = b"again"  # the page is writable already: no fault, no new mtime
        os.fsync(fd)
        synced = json.loads(os.getxattr(p, "user.kvfs.layout"))["generation"]
        assert synced != first
    want = data[:MiB] + b"again" + data[MiB + 5 :]
    os.close(fd)
    mnt.drop_caches()
    assert p.read_bytes() == want
    fd = os.open(p, os.O_RDWR)
    with mmap.mmap(fd, 3 * MiB, mmap.MAP_SHARED) as m:
        m[:4] = b"more"
    os.close(fd)
    want = b"more" + want[4:]
    wait_until(
        lambda: json.loads(os.getxattr(p, "user.kvfs.layout"))["generation"] != synced,
        10,
        "the release to commit the write through the mapping",
    )
    mnt.drop_caches()
    assert p.read_bytes() == want
    mnt.restart()
    assert p.read_bytes() == want
