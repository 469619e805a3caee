"""FUSE passthrough on this kernel, established by experiment (docs/passthrough.md sums it up).

A minimal pyfuse3 file system defined in this file (run as a subprocess: `python THIS serve ...`)
serves memfds through passthrough with the pyfuse3 that mount/fuse/build.sh patches, and logs every
request that reaches it. The tests check what the kernel does by itself, what it still sends to the
daemon, and which combinations of opens it refuses, with the errno that the user's open() gets.
They assert what this kernel (6.18) does, so a kernel that behaves differently fails here.
"""

from __future__ import annotations

import errno
import fcntl
import json
import mmap
import os
import random
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

MiB = 1 << 20
TIMEOUT = 60.0  # entry and attribute timeouts: long, so that only invalidations ask again

# name -> (size, backing kind, the mode of the 1st, 2nd, ... open; the last one repeats)
# Modes: pt        passthrough with the inode's backing id (registered at the first such open,
#                  closed at the last release, as libfuse's passthrough_hp does)
#        pt_fresh  passthrough with a new backing id for the same memfd (closed at its release)
#        pt_other  passthrough with a new backing id for the file's second memfd (other bytes)
#        pt_keep   pt with keep_cache
#        pt_default  FileInfo(fh=..., backing_id=...), the other fields left at their defaults
#        pt_dup_closed  pt, registered from a dup of the memfd fd that is closed right after
#        pt_closed passthrough with a backing id that was closed again before the open reply
#        plain     no passthrough: the daemon serves read/write, page cache, no keep_cache
#        direct    no passthrough, direct_io
FILES: dict[str, tuple[int, str, list[str]]] = {
    "pt": (4 * MiB, "memfd", ["pt"]),
    "pt_write": (1 * MiB, "memfd", ["pt"]),
    "pt_getattr": (1 * MiB, "memfd", ["pt"]),
    "two_backing": (1 * MiB, "memfd", ["pt", "pt_other"]),
    "fresh_id": (1 * MiB, "memfd", ["pt", "pt_fresh"]),
    "sequential_other": (1 * MiB, "memfd", ["pt", "pt_other"]),
    "pt_then_plain": (1 * MiB, "memfd", ["pt", "plain"]),
    "plain_then_pt": (1 * MiB, "memfd", ["plain", "pt"]),
    "pt_then_direct": (1 * MiB, "memfd", ["pt", "direct"]),
    "direct_then_pt": (1 * MiB, "memfd", ["direct", "pt"]),
    "pt_keep": (1 * MiB, "memfd", ["pt_keep"]),
    "pt_default": (1 * MiB, "memfd", ["pt_default"]),
    "closed_before": (1 * MiB, "memfd", ["pt_closed"]),
    "closed_after": (1 * MiB, "memfd", ["pt"]),
    "dup_closed": (1 * MiB, "memfd", ["pt_dup_closed"]),
    "sealed": (1 * MiB, "sealed", ["pt"]),
    "madvise_huge": (4 * MiB, "madvise", ["pt"]),
    "huge_tmpfs": (4 * MiB, "huge_tmpfs", ["pt"]),
}

SHARED_ID_MODES = ("pt", "pt_keep", "pt_default", "pt_dup_closed")


def content(name: str, size: int, other: bool = False) -> bytes:
    return random.Random(f"{name}/{other}").randbytes(size)


# --------------------------------------------------------------------------------------------------
# The file system (runs in a subprocess)
# --------------------------------------------------------------------------------------------------


def serve(mountpoint: str, log_path: str, huge_dir: str, auto_unmount: bool) -> None:
    import pyfuse3
    import trio

    class Node:
        def __init__(self, ino: int, name: str, size: int, kind: str, modes: list[str]):
            self.ino, self.name, self.modes, self.kind = ino, name, modes, kind
            self.opens = 0  # opens so far (selects the mode)
            self.backing_id = 0  # the inode's shared backing id ("pt"), 0 if none
            self.users: dict[int, int] = {}  # backing id -> open files using it
            self.closed: set[int] = set()  # ids closed early (ctl-close)
            self.fd = self._backing(size, content(name, size))
            self.other_fd = self._backing(size, content(name, size, other=True))

        def _backing(self, size: int, data: bytes) -> int:
            if self.kind == "huge_tmpfs":
                path = os.path.join(huge_dir, f"{self.name}.{len(data)}.{id(data)}")
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
                os.unlink(path)
            else:
                flags = os.MFD_CLOEXEC | (os.MFD_ALLOW_SEALING if self.kind == "sealed" else 0)
                fd = os.memfd_create(self.name, flags)
            os.ftruncate(fd, size)
            if self.kind == "madvise":
                with mmap.mmap(fd, size) as m:
                    m.madvise(mmap.MADV_HUGEPAGE)
                    m[:] = data
            else:
                os.pwrite(fd, data, 0)
            if self.kind == "sealed":
                fcntl.fcntl(
                    fd,
                    fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK,
                )
            return fd

    class Handle:
        def __init__(self, node: Node, mode: str, backing_id: int, fd: int):
            self.node, self.mode, self.backing_id, self.fd = node, mode, backing_id, fd

    class FS(pyfuse3.Operations):
        enable_passthrough = True

        def __init__(self) -> None:
            super().__init__()
            self.log_file = open(log_path, "a", buffering=1)  # noqa: SIM115 - open for the run
            self.nodes: dict[int, Node] = {}
            self.by_name: dict[bytes, Node] = {}
            for i, (name, (size, kind, modes)) in enumerate(FILES.items()):
                if kind == "huge_tmpfs" and not huge_dir:
                    continue
                node = Node(pyfuse3.ROOT_INODE + 1 + i, name, size, kind, modes)
                self.nodes[node.ino] = node
                self.by_name[name.encode()] = node
                self.log("backing", name, pid=os.getpid(), fd=node.fd, other_fd=node.other_fd)
            self.handles: dict[int, Handle] = {}
            self.next_fh = 1

        def log(self, op: str, name: str = "", **kw) -> None:
            self.log_file.write(json.dumps({"op": op, "name": name, **kw}) + "\n")

        def init(self) -> None:
            self.log("init", enabled=pyfuse3.passthrough_enabled())

        def _attr(self, node: Node | None) -> pyfuse3.EntryAttributes:
            a = pyfuse3.EntryAttributes()
            if node is None:
                a.st_ino, a.st_mode, a.st_nlink = pyfuse3.ROOT_INODE, stat.S_IFDIR | 0o755, 2
            else:
                a.st_ino, a.st_mode, a.st_nlink = node.ino, stat.S_IFREG | 0o644, 1
                a.st_size = os.fstat(node.fd).st_size
            a.st_blksize = 4096
            a.entry_timeout = a.attr_timeout = TIMEOUT
            return a

        async def lookup(self, parent, name, ctx):
            if name in self.by_name:
                return self._attr(self.by_name[name])
            if name.startswith(b"ctl-close-"):  # close the inode's backing id now
                node = self.by_name[name[len(b"ctl-close-") :]]
                pyfuse3.passthrough_close(node.backing_id)
                self.log("ctl-close", node.name, backing_id=node.backing_id)
                node.closed.add(node.backing_id)
                node.backing_id = 0
            elif name == b"ctl-probe":
                self.probe()
            raise pyfuse3.FUSEError(errno.ENOENT)

        def probe(self) -> None:
            """Which fds the kernel takes as backing files, and what closing does, as errnos."""

            def errno_of(fn, *args) -> int:
                try:
                    fn(*args)
                    return 0
                except OSError as e:
                    return e.errno

            r, w = os.pipe()
            dfd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
            node = self.by_name[b"pt"]
            ro = os.open(f"/proc/self/fd/{node.fd}", os.O_RDONLY)
            results = {
                "pipe": errno_of(pyfuse3.passthrough_open, r),
                "directory": errno_of(pyfuse3.passthrough_open, dfd),
                "chardev": errno_of(pyfuse3.passthrough_open, os.open("/dev/null", os.O_RDONLY)),
                "bad_fd": errno_of(pyfuse3.passthrough_open, 12345),
                "close_unknown_id": errno_of(pyfuse3.passthrough_close, 4242),
            }
            bid = pyfuse3.passthrough_open(ro)
            results["readonly_memfd"] = 0
            results["close_once"] = errno_of(pyfuse3.passthrough_close, bid)
            results["close_twice"] = errno_of(pyfuse3.passthrough_close, bid)
            for fd in (r, w, dfd, ro):
                os.close(fd)
            self.log("probe", **results)

        async def getattr(self, inode, ctx):
            node = self.nodes.get(inode)
            self.log("getattr", node.name if node else "/")
            return self._attr(node)

        async def setattr(self, inode, attr, fields, fh, ctx):
            node = self.nodes[inode]
            self.log("setattr", node.name, size=attr.st_size if fields.update_size else None)
            if fields.update_size:
                os.ftruncate(node.fd, attr.st_size)
            return self._attr(node)

        async def opendir(self, inode, ctx):
            return 0

        async def readdir(self, fh, start_id, token):
            for node in list(self.nodes.values())[start_id:]:
                if not pyfuse3.readdir_reply(
                    token, node.name.encode(), self._attr(node), node.ino - pyfuse3.ROOT_INODE
                ):
                    break

        async def releasedir(self, fh):
            pass

        async def open(self, inode, flags, ctx):
            node = self.nodes[inode]
            mode = node.modes[min(node.opens, len(node.modes) - 1)]
            node.opens += 1
            fh, self.next_fh = self.next_fh, self.next_fh + 1
            fd, bid = node.fd, 0
            if mode in SHARED_ID_MODES:
                if not node.backing_id:
                    if mode == "pt_dup_closed":  # the kernel keeps its own reference
                        dup = os.dup(node.fd)
                        node.backing_id = pyfuse3.passthrough_open(dup)
                        os.close(dup)
                    else:
                        node.backing_id = pyfuse3.passthrough_open(node.fd)
                bid = node.backing_id
                node.users[bid] = node.users.get(bid, 0) + 1
            elif mode == "pt_fresh":
                bid = pyfuse3.passthrough_open(node.fd)
            elif mode == "pt_other":
                fd = node.other_fd
                bid = pyfuse3.passthrough_open(fd)
            elif mode == "pt_closed":
                bid = pyfuse3.passthrough_open(node.fd)
                pyfuse3.passthrough_close(bid)
            self.handles[fh] = Handle(node, mode, bid, fd)
            self.log(
                "open",
                node.name,
                fh=fh,
                mode=mode,
                backing_id=bid,
                accmode=flags & os.O_ACCMODE,
                o_direct=bool(flags & os.O_DIRECT),
            )
            if mode in ("pt_default", "pt_dup_closed"):
                return pyfuse3.FileInfo(fh=fh, backing_id=bid)
            return pyfuse3.FileInfo(
                fh=fh, backing_id=bid, keep_cache=mode == "pt_keep", direct_io=mode == "direct"
            )

        async def create(self, parent, name, mode, flags, ctx):
            """A new file: a new memfd, opened in passthrough at once."""
            ino = max(self.nodes) + 1
            node = Node(ino, name.decode(), 0, "memfd", ["pt"])
            self.nodes[ino], self.by_name[name] = node, node
            self.log("backing", node.name, pid=os.getpid(), fd=node.fd, other_fd=node.other_fd)
            node.opens = 1
            node.backing_id = pyfuse3.passthrough_open(node.fd)
            node.users[node.backing_id] = 1
            fh, self.next_fh = self.next_fh, self.next_fh + 1
            self.handles[fh] = Handle(node, "pt", node.backing_id, node.fd)
            self.log("create", node.name, fh=fh, backing_id=node.backing_id)
            return pyfuse3.FileInfo(fh=fh, backing_id=node.backing_id), self._attr(node)

        async def read(self, fh, off, size):
            h = self.handles[fh]
            self.log("read", h.node.name, fh=fh, off=off, size=size)
            return os.pread(h.fd, size, off)

        async def write(self, fh, off, buf):
            h = self.handles[fh]
            self.log("write", h.node.name, fh=fh, off=off, size=len(buf))
            return os.pwrite(h.fd, buf, off)

        async def flush(self, fh):
            self.log("flush", self.handles[fh].node.name, fh=fh)

        async def fsync(self, fh, datasync):
            self.log("fsync", self.handles[fh].node.name, fh=fh)

        async def release(self, fh):
            h = self.handles.pop(fh)
            self.log("release", h.node.name, fh=fh)
            node, bid = h.node, h.backing_id
            if h.mode in SHARED_ID_MODES:
                node.users[bid] -= 1
                if node.users[bid] == 0 and bid not in node.closed:
                    pyfuse3.passthrough_close(bid)
                    if node.backing_id == bid:
                        node.backing_id = 0
            elif h.mode in ("pt_fresh", "pt_other"):
                pyfuse3.passthrough_close(h.backing_id)

    fs = FS()
    options = set(pyfuse3.default_options) | {"fsname=pt-test"}
    if auto_unmount:
        options.add("auto_unmount")
    pyfuse3.init(fs, mountpoint, options)
    try:  # before the kernel's INIT is answered
        pyfuse3.passthrough_open(fs.by_name[b"pt"].fd)
        fs.log("pre_init_open", errno=0)
    except OSError as e:
        fs.log("pre_init_open", errno=e.errno)

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pyfuse3.main)
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    pyfuse3.terminate()
                    break

    try:
        trio.run(run)
    finally:
        pyfuse3.close(unmount=True)


# --------------------------------------------------------------------------------------------------
# The tests
# --------------------------------------------------------------------------------------------------


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (FUSE passthrough needs CAP_SYS_ADMIN)"
    if not os.path.exists("/dev/fuse"):
        return "needs /dev/fuse"
    try:
        import pyfuse3
    except ImportError as e:
        return f"pyfuse3 is not importable: {e}"
    if not hasattr(pyfuse3, "passthrough_open"):
        return "pyfuse3 has no passthrough API (stock build): `make install` builds the patched one"
    return None


pytestmark = [
    pytest.mark.mounted,
    pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason())),
]


def _wait(cond, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


class Server:
    """The file system of this file, mounted in a subprocess; its request log, read back."""

    def __init__(self, base: Path, name: str, huge_dir: str = "", auto_unmount: bool = False):
        self.mnt = base / name
        self.mnt.mkdir()
        self.log_path = base / f"{name}.log"
        self.log_path.touch()
        self.out = open(base / f"{name}.out", "wb")  # noqa: SIM115 - closed by stop()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "serve",
                str(self.mnt),
                str(self.log_path),
                huge_dir,
                "1" if auto_unmount else "0",
            ],
            stdout=self.out,
            stderr=subprocess.STDOUT,
        )
        try:
            init = _wait(
                lambda: self._first("init") or self.proc.poll() is not None,
                20,
                "the file system to get INIT",
            )
            if init is True:
                raise AssertionError(f"the file system exited: {self.output()}")
            self.passthrough = init["enabled"]
            self.backing = {e["name"]: e for e in self.lines() if e["op"] == "backing"}
        except BaseException:
            self.stop()
            raise

    def output(self) -> str:
        self.out.flush()
        return Path(self.out.name).read_text(errors="replace")[-3000:]

    def lines(self) -> list[dict]:
        return [json.loads(line) for line in self.log_path.read_text().splitlines()]

    def _first(self, op: str) -> dict | None:
        return next((e for e in self.lines() if e["op"] == op), None)

    def mark(self) -> int:
        return len(self.lines())

    def ops(self, name: str, since: int) -> list[str]:
        """The requests for file *name* that reached the daemon since mark() returned *since*."""
        return [e["op"] for e in self.lines()[since:] if e["name"] == name]

    def wait_ops(self, name: str, since: int, *want: str) -> list[str]:
        def arrived() -> list[str] | None:
            got = self.ops(name, since)
            return got if all(w in got for w in want) else None

        return _wait(arrived, 5, f"{want} for {name}")

    def path(self, name: str) -> str:
        return str(self.mnt / name)

    def backing_bytes(self, name: str, other: bool = False) -> bytes:
        """The daemon's backing memfd of *name*, as it is now (root reads it through /proc)."""
        b = self.backing[name]
        with open(f"/proc/{b['pid']}/fd/{b['other_fd' if other else 'fd']}", "rb") as f:
            return f.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if os.path.ismount(self.mnt):
            subprocess.run(["umount", "-l", str(self.mnt)], check=False)
        self.out.close()


@pytest.fixture(scope="module")
def fs(tmp_path_factory):
    base = tmp_path_factory.mktemp("passthrough")
    huge = base / "huge"
    huge.mkdir()
    huge_ok = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "huge=always,size=64m", "pt-huge", str(huge)],
            check=False,
            capture_output=True,
        ).returncode
        == 0
    )
    server = None
    try:
        server = Server(base, "mnt", str(huge) if huge_ok else "")
        if not server.passthrough:
            pytest.skip(
                "the kernel did not offer FUSE passthrough at INIT (needs Linux >= 6.9 "
                "with CONFIG_FUSE_PASSTHROUGH)"
            )
        server.huge_tmpfs = huge_ok
        yield server
    finally:
        if server is not None:
            server.stop()
        if huge_ok:
            subprocess.run(["umount", "-l", str(huge)], check=False)


def open_errno(path: str, flags: int = os.O_RDONLY) -> tuple[int | None, int]:
    """(fd, 0) or (None, errno) for the user's open()."""
    try:
        return os.open(path, flags), 0
    except OSError as e:
        return None, e.errno


def test_init_negotiates_passthrough_and_which_fds_can_back(fs):
    import pyfuse3

    # (INIT offered passthrough, or the fixture skipped: the probe below shows what works)
    assert pyfuse3.FileInfo(fh=1).keep_cache and not pyfuse3.FileInfo(fh=1, backing_id=7).keep_cache
    # Registering a backing file before the kernel's INIT was answered: EPERM.
    assert fs._first("pre_init_open")["errno"] == errno.EPERM
    assert not os.path.exists(fs.path("ctl-probe"))
    probe = _wait(lambda: fs._first("probe"), 5, "the probe")
    assert probe == {
        "op": "probe",
        "name": "",
        "pipe": errno.EINVAL,
        "directory": errno.EISDIR,
        "chardev": errno.EINVAL,
        "bad_fd": errno.EBADF,
        "close_unknown_id": errno.ENOENT,
        "readonly_memfd": 0,  # an O_RDONLY fd registers fine
        "close_once": 0,
        "close_twice": errno.ENOENT,
    }


def test_reads_mmap_and_o_direct_never_reach_the_daemon(fs):
    want = content("pt", 4 * MiB)
    mark = fs.mark()
    fd = os.open(fs.path("pt"), os.O_RDONLY)
    try:
        assert b"".join(os.pread(fd, MiB, off) for off in range(0, 4 * MiB, MiB)) == want
        assert os.pread(fd, 4096, 3 * MiB + 5) == want[3 * MiB + 5 : 3 * MiB + 4101]
        with mmap.mmap(fd, 4 * MiB, prot=mmap.PROT_READ) as m:
            assert m[:] == want
    finally:
        os.close(fd)
    fd = os.open(fs.path("pt"), os.O_RDONLY | os.O_DIRECT)
    try:
        with mmap.mmap(-1, MiB) as buf:  # page-aligned, as O_DIRECT wants
            assert os.preadv(fd, [buf], MiB) == MiB
            assert buf[:] == want[MiB : 2 * MiB]
    finally:
        os.close(fd)
    got = fs.wait_ops("pt", mark, "release")
    assert "read" not in got and got.count("open") == 2


def test_flush_fsync_and_release_still_reach_the_daemon(fs):
    mark = fs.mark()
    fd = os.open(fs.path("pt"), os.O_RDONLY)
    os.fsync(fd)
    assert fs.ops("pt", mark) == ["open", "fsync"]
    os.close(fd)
    assert fs.wait_ops("pt", mark, "release") == ["open", "fsync", "flush", "release"]


def test_writes_land_in_the_backing_file_and_the_size(fs):
    name = "pt_write"
    want = bytearray(content(name, MiB))
    mark = fs.mark()
    fd = os.open(fs.path(name), os.O_RDWR)
    try:
        assert os.pwrite(fd, b"Y" * 10, 0) == 10
        assert os.pwrite(fd, b"X" * 4096, MiB) == 4096  # extends the file
        want[0:10] = b"Y" * 10
        want += b"X" * 4096
        assert fs.backing_bytes(name) == want
        assert os.fstat(fd).st_size == MiB + 4096
        assert os.stat(fs.path(name)).st_size == MiB + 4096
        with mmap.mmap(fd, MiB) as m:  # shared writable mapping
            m[100:105] = b"ZZZZZ"
            m.flush()
        want[100:105] = b"ZZZZZ"
        assert fs.backing_bytes(name) == want
        assert os.pread(fd, len(want), 0) == want
    finally:
        os.close(fd)
    got = fs.wait_ops(name, mark, "release")
    assert "write" not in got and "read" not in got
    assert "getattr" in got  # the stat after the passthrough write asked the daemon


def test_create_reply_carries_the_backing_id(fs):
    name = "created"
    data = os.urandom(MiB + 123)
    fd = os.open(fs.path(name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    fs.backing[name] = next(e for e in fs.lines() if e["op"] == "backing" and e["name"] == name)
    mark = fs.mark()
    try:
        assert os.pwrite(fd, data, 0) == len(data)
        assert fs.backing_bytes(name) == data
        assert os.pread(fd, len(data), 0) == data
        assert os.fstat(fd).st_size == len(data)
    finally:
        os.close(fd)
    got = fs.wait_ops(name, mark, "release")
    assert "write" not in got and "read" not in got


def test_getattr_reaches_the_daemon_after_passthrough_io(fs):
    name = "pt_getattr"
    fd = os.open(fs.path(name), os.O_RDWR)
    try:
        os.stat(fs.path(name))
        mark = fs.mark()
        os.stat(fs.path(name))
        assert fs.ops(name, mark) == []  # attributes cached (60 s)
        os.pwrite(fd, b"a" * 100, 10)
        mark = fs.mark()
        os.stat(fs.path(name))
        assert fs.ops(name, mark) == ["getattr"]  # a passthrough write invalidates them
        os.pwrite(fd, b"a" * 100, MiB)
        assert os.fstat(fd).st_size == MiB + 100
        os.stat(fs.path(name))
        mark = fs.mark()
        os.pread(fd, 10, 0)
        os.stat(fs.path(name))
        assert fs.ops(name, mark) == ["getattr"]  # so does a read (atime)
    finally:
        os.close(fd)


@pytest.mark.parametrize("name", ["two_backing", "fresh_id"])
def test_concurrent_opens_of_an_inode_must_use_one_backing_id(fs, name):
    """A second open whose backing id differs from the one the inode is open with (another file,
    or the same memfd under a new id) fails with EIO; the daemon gets its RELEASE, no FLUSH."""
    mark = fs.mark()
    a = os.open(fs.path(name), os.O_RDONLY)
    try:
        b, err = open_errno(fs.path(name))
        assert (b, err) == (None, errno.EIO)
        assert fs.wait_ops(name, mark, "release") == ["open", "open", "release"]
        assert os.pread(a, MiB, 0) == content(name, MiB)
    finally:
        os.close(a)


def test_sequential_opens_may_use_another_backing_file(fs):
    name = "sequential_other"
    mark = fs.mark()
    a = os.open(fs.path(name), os.O_RDONLY)
    assert os.pread(a, MiB, 0) == content(name, MiB)
    os.close(a)
    fs.wait_ops(name, mark, "release")
    b = os.open(fs.path(name), os.O_RDONLY)
    try:
        assert os.pread(b, MiB, 0) == content(name, MiB, other=True)
    finally:
        os.close(b)


@pytest.mark.parametrize(
    "name, second_ok",
    [
        ("pt_then_plain", False),
        ("plain_then_pt", False),
        ("pt_then_direct", False),
        ("direct_then_pt", True),
    ],
)
def test_passthrough_and_daemon_served_opens_of_one_inode(fs, name, second_ok):
    """Passthrough and cached (page cache) opens exclude each other in both orders (EIO for the
    second). A direct_io open is refused while the inode is open in passthrough, but a passthrough
    open is accepted while a direct_io one is open: each then keeps its own path."""
    mark = fs.mark()
    a = os.open(fs.path(name), os.O_RDONLY)
    try:
        b, err = open_errno(fs.path(name))
        assert err == (0 if second_ok else errno.EIO)
        if b is not None:
            try:
                m = fs.mark()
                assert os.pread(b, MiB, 0) == content(name, MiB)  # b: passthrough
                assert "read" not in fs.ops(name, m)
                m = fs.mark()
                assert os.pread(a, MiB, 0) == content(name, MiB)  # a: direct_io, daemon
                assert "read" in fs.ops(name, m)
            finally:
                os.close(b)
        assert os.pread(a, MiB, 0) == content(name, MiB)
    finally:
        os.close(a)
    fs.wait_ops(name, mark, "release")


def test_keep_cache_with_passthrough_fails_the_open(fs):
    assert open_errno(fs.path("pt_keep")) == (None, errno.EIO)
    # FileInfo(fh=..., backing_id=...): the patched pyfuse3 leaves keep_cache off
    mark = fs.mark()
    fd = os.open(fs.path("pt_default"), os.O_RDONLY)
    try:
        assert os.pread(fd, MiB, 0) == content("pt_default", MiB)
    finally:
        os.close(fd)
    assert "read" not in fs.wait_ops("pt_default", mark, "release")


def test_backing_id_lifetime(fs):
    # An id closed before the open reply: EIO.
    assert open_errno(fs.path("closed_before")) == (None, errno.EIO)
    # The memfd fd the id was registered from may be closed at once: the kernel holds the file.
    fd = os.open(fs.path("dup_closed"), os.O_RDONLY)
    try:
        assert os.pread(fd, MiB, 0) == content("dup_closed", MiB)
    finally:
        os.close(fd)
    # An id closed while a file is open with it: that file keeps reading and mapping the backing
    # file; a new open under a new id is refused (EIO) until every file of the inode is closed.
    name = "closed_after"
    want = content(name, MiB)
    mark = fs.mark()
    a = os.open(fs.path(name), os.O_RDONLY)
    try:
        assert not os.path.exists(fs.path(f"ctl-close-{name}"))
        assert "ctl-close" in fs.ops(name, mark)
        assert os.pread(a, MiB, 0) == want
        with mmap.mmap(a, MiB, prot=mmap.PROT_READ) as m:
            assert m[:] == want
        assert open_errno(fs.path(name)) == (None, errno.EIO)
        assert "read" not in fs.ops(name, mark)
    finally:
        os.close(a)
    fs.wait_ops(name, mark, "release", "release")
    fd = os.open(fs.path(name), os.O_RDONLY)
    try:
        assert os.pread(fd, MiB, 0) == want
    finally:
        os.close(fd)


def test_sealed_memfd_backing(fs):
    """A memfd sealed with F_SEAL_WRITE|GROW|SHRINK backs read-only opens and mappings. Read-write
    opens succeed too; write() gets EPERM, but a shared writable mmap through the FUSE file is
    allowed and its stores land in the sealed memfd (the seal is checked against the FUSE file,
    not the backing file): a daemon that relies on seals must refuse write opens itself."""
    name = "sealed"
    want = content(name, MiB)
    fd = os.open(fs.path(name), os.O_RDONLY)
    try:
        assert os.pread(fd, MiB, 0) == want
        with mmap.mmap(fd, MiB, prot=mmap.PROT_READ) as m:
            assert m[:] == want
    finally:
        os.close(fd)
    fd = os.open(fs.path(name), os.O_RDWR)
    try:
        with pytest.raises(OSError) as e:
            os.pwrite(fd, b"x", 0)
        assert e.value.errno == errno.EPERM
        assert fs.backing_bytes(name) == want
        with mmap.mmap(fd, MiB, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE) as m:
            m[0:4] = b"SEAL"
        assert fs.backing_bytes(name)[:4] == b"SEAL"  # the seal is bypassed
        assert fs.backing_bytes(name)[4:] == want[4:]
    finally:
        os.close(fd)


def _pmd_mapped_kib(path: str) -> int:
    """ShmemPmdMapped of this process's mapping of *path* (kB), from /proc/self/smaps."""
    smaps = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(smaps):
        if line.endswith(" " + path):
            for field in smaps[i + 1 : i + 30]:
                if field.startswith("ShmemPmdMapped:"):
                    return int(field.split()[1])
    raise AssertionError(f"no mapping of {path} in smaps")


@pytest.mark.parametrize("name", ["madvise_huge", "huge_tmpfs"])
def test_huge_page_backing(fs, name):
    """A memfd with MADV_HUGEPAGE and a file on a huge=always tmpfs both back passthrough; the
    tmpfs file's huge pages are mapped with PMDs through the FUSE file (a memfd gets huge pages
    only if /sys/kernel/mm/transparent_hugepage/shmem_enabled allows them)."""
    if name == "huge_tmpfs" and not fs.huge_tmpfs:
        pytest.skip("could not mount a huge=always tmpfs")
    want = content(name, 4 * MiB)
    fd = os.open(fs.path(name), os.O_RDONLY)
    try:
        assert os.pread(fd, 4 * MiB, 0) == want
        with mmap.mmap(fd, 4 * MiB, prot=mmap.PROT_READ) as m:
            assert m[:] == want
            if name == "huge_tmpfs":
                assert _pmd_mapped_kib(fs.path(name)) >= 2048
    finally:
        os.close(fd)


def test_auto_unmount_after_kill(tmp_path):
    """-o auto_unmount works with the private libfuse 3.17: it runs its own fusermount3 (Debian's
    3.14 one rejects --auto-unmount and the mount would stay, stale)."""
    server = Server(tmp_path, "auto", auto_unmount=True)
    try:
        assert os.path.ismount(server.mnt)
        server.proc.kill()
        server.proc.wait(10)
        _wait(lambda: not os.path.ismount(server.mnt), 10, "auto_unmount")
    finally:
        server.stop()


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    serve(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "1")
    sys.exit(0)
