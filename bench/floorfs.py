"""The floor of kvfs's stack: a pyfuse3 file system that keeps every file in memory and does
nothing else, with the same mount options, timeouts and passthrough as kvfs.

It answers each request from dicts and binds each open to the file's memfd by passthrough (so
the bytes move in the kernel, as on kvfs); nothing is durable, nothing is checked, there is no
catalog, no device and no policy. Whatever it reaches is the most any file system built on
pyfuse3 and trio can reach on this machine, so `bench/block_sizes.py --floor` measures it
beside kvfs and ext4: kvfs / floor is the part of the gap that is kvfs's own work, floor / ext4
the part that is the stack's.

The kernel sends it the requests it sends kvfs (the request counts in its statistics are
compared in the bench): a store is LOOKUP (a negative entry), CREATE, GETXATTR
(security.capability), FLUSH, RELEASE and a GETATTR of the directory; a cold stat a LOOKUP; a
cold load LOOKUP, OPEN and RELEASE (read-only opens ask for no FLUSH).

    python bench/floorfs.py MOUNTPOINT         (as root; SIGTERM unmounts)
"""

from __future__ import annotations

import ast
import contextlib
import errno
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testing.emulate import drop_kernel_caches
from testing.mount import wait_until

ATTR_TIMEOUT = 30.0  # kvfs's default mount.attr_timeout (one node)
IDLE_TASKS = 32  # as kvfs/daemon.py


def serve(mountpoint: str) -> None:
    import resource

    import pyfuse3
    import trio

    # a memfd per file: as many descriptors as the hard limit allows (files past it fail the
    # mount: bench/catalog_scale.py --floor makes at most FLOOR_FILES)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    root = pyfuse3.ROOT_INODE

    class Node:
        __slots__ = (
            "backing",
            "children",
            "fd",
            "ino",
            "mode",
            "mtime_ns",
            "nlink",
            "opens",
            "size",
        )

        def __init__(self, ino: int, mode: int) -> None:
            self.ino, self.mode, self.nlink, self.size = ino, mode, 1, 0
            self.fd = -1  # files: the memfd holding the bytes
            self.backing, self.opens = 0, 0  # passthrough backing id while open
            self.mtime_ns = time.time_ns()
            self.children: dict[bytes, int] | None = None

    class FloorFS(pyfuse3.Operations):
        enable_passthrough = True

        def __init__(self) -> None:
            super().__init__()
            top = Node(root, stat.S_IFDIR | 0o755)
            top.nlink, top.children = 2, {}
            self.nodes: dict[int, Node] = {root: top}
            self.next_ino = root + 1
            self.requests: dict[str, int] = {}

        def count(self, op: str) -> None:
            self.requests[op] = self.requests.get(op, 0) + 1

        def entry(self, n: Node) -> pyfuse3.EntryAttributes:
            e = pyfuse3.EntryAttributes()
            e.st_ino = n.ino
            e.entry_timeout = e.attr_timeout = ATTR_TIMEOUT
            e.st_mode, e.st_nlink = n.mode, n.nlink
            if n.fd >= 0 and n.opens:  # written by passthrough: the memfd knows
                n.size = os.fstat(n.fd).st_size
            e.st_size = n.size
            e.st_blksize = 1 << 20
            e.st_blocks = (n.size + 511) // 512
            e.st_atime_ns = e.st_mtime_ns = e.st_ctime_ns = n.mtime_ns
            return e

        def make(self, parent: int, name: bytes, mode: int) -> Node:
            d = self.nodes[parent]
            if d.children is None:
                raise pyfuse3.FUSEError(errno.ENOTDIR)
            if name in d.children:
                raise pyfuse3.FUSEError(errno.EEXIST)
            n = Node(self.next_ino, mode)
            self.next_ino += 1
            self.nodes[n.ino] = n
            d.children[name] = n.ino
            d.mtime_ns = time.time_ns()
            return n

        def bind(self, n: Node) -> int:
            if not n.opens:
                n.backing = pyfuse3.passthrough_open(n.fd)
            n.opens += 1
            return n.backing

        async def lookup(self, parent_inode, name, ctx=None):
            self.count("lookup")
            ino = self.nodes[parent_inode].children.get(name)
            if ino is None:  # a negative entry, as kvfs on one node
                miss = pyfuse3.EntryAttributes()
                miss.st_ino = 0
                miss.entry_timeout = ATTR_TIMEOUT
                return miss
            return self.entry(self.nodes[ino])

        async def forget(self, inode_list):
            self.count("forget")

        async def getattr(self, inode, ctx=None):
            self.count("getattr")
            return self.entry(self.nodes[inode])

        async def mkdir(self, parent_inode, name, mode, ctx):
            self.count("mkdir")
            n = self.make(parent_inode, name, stat.S_IFDIR | (mode & 0o7777))
            n.nlink, n.children = 2, {}
            return self.entry(n)

        async def create(self, parent_inode, name, mode, flags, ctx):
            self.count("create")
            n = self.make(parent_inode, name, stat.S_IFREG | (mode & 0o7777))
            n.fd = os.memfd_create("floor", os.MFD_CLOEXEC)
            return pyfuse3.FileInfo(
                fh=n.ino, backing_id=self.bind(n), keep_cache=False
            ), self.entry(n)

        async def open(self, inode, flags, ctx):
            self.count("open")
            n = self.nodes[inode]
            if flags & os.O_TRUNC:
                os.ftruncate(n.fd, 0)
            return pyfuse3.FileInfo(
                fh=inode,
                backing_id=self.bind(n),
                keep_cache=False,
                noflush=(flags & os.O_ACCMODE) == os.O_RDONLY,
            )

        async def flush(self, fh, ctx=None):
            self.count("flush")
            n = self.nodes[fh]
            n.size, n.mtime_ns = os.fstat(n.fd).st_size, time.time_ns()

        async def release(self, fh):
            self.count("release")
            n = self.nodes[fh]
            n.opens -= 1
            if not n.opens:
                pyfuse3.passthrough_close(n.backing)

        async def opendir(self, inode, ctx):
            self.count("opendir")
            return inode

        async def readdir(self, fh, start_id, token):
            names = sorted(self.nodes[fh].children.items())
            for i, (name, ino) in enumerate(names[start_id:], start_id + 1):
                if not pyfuse3.readdir_reply(token, name, self.entry(self.nodes[ino]), i):
                    break

        async def releasedir(self, fh):
            self.count("releasedir")

        async def unlink(self, parent_inode, name, ctx):
            self.count("unlink")
            d = self.nodes[parent_inode]
            ino = d.children.pop(name, None)
            if ino is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            n = self.nodes.pop(ino)
            if n.fd >= 0 and not n.opens:
                os.close(n.fd)

        async def rmdir(self, parent_inode, name, ctx):
            self.count("rmdir")
            d = self.nodes[parent_inode]
            ino = d.children.get(name)
            if ino is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            if self.nodes[ino].children:
                raise pyfuse3.FUSEError(errno.ENOTEMPTY)
            del d.children[name]
            del self.nodes[ino]

        async def getxattr(self, inode, name, ctx):
            if name == b"user.floor.requests":  # the bench's statistics: not counted
                return repr(self.requests).encode()
            self.count("getxattr")
            raise pyfuse3.FUSEError(errno.ENODATA)

    options = set(pyfuse3.default_options) | {"fsname=kvfs-floor"}
    pyfuse3.init(FloorFS(), mountpoint, options)

    async def run() -> None:
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                with trio.open_signal_receiver(signal.SIGTERM) as signals:
                    async for _ in signals:
                        pyfuse3.terminate()
                        return

            nursery.start_soon(stop_on_signal)
            await pyfuse3.main(min_tasks=IDLE_TASKS)
            nursery.cancel_scope.cancel()

    try:
        trio.run(run)
    finally:
        pyfuse3.close(unmount=True)


class FloorSetup:
    """The floor file system mounted, for the benches (the shape of testing.emulate's set-ups:
    `root`, `sync()`, `drop()`; `kvfs` is None). `pid` is its daemon's."""

    kvfs = None

    def __init__(self, root: Path, proc: subprocess.Popen):
        self.root, self.proc, self.pid = root, proc, proc.pid

    def requests(self) -> dict[str, int]:
        """The requests it has answered, by kind."""
        return ast.literal_eval(os.getxattr(self.root, "user.floor.requests").decode())

    def sync(self) -> None:
        """Nothing to do: nothing is ever written anywhere."""

    def drop(self) -> None:
        """The kernel's dentries, inodes and page cache (the files stay in its memory)."""
        drop_kernel_caches()


@contextlib.contextmanager
def floor_mounted(tmp: Path, name: str = "floor"):
    mnt = tmp / f"{name}-mnt"
    mnt.mkdir()
    proc = subprocess.Popen([sys.executable, __file__, str(mnt)])
    try:
        wait_until(
            lambda: proc.poll() is not None or os.path.ismount(mnt), what="the floor's mount"
        )
        if not os.path.ismount(mnt):
            raise RuntimeError("bench/floorfs.py: the floor file system did not mount")
        yield FloorSetup(mnt, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        finally:
            subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        raise SystemExit(2)
    serve(sys.argv[1])
