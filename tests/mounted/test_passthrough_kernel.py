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
TIMEOUT = 60.0          # entry and attribute timeouts: long, so that only invalidations ask again

# name -> (size, backing kind, the mode of the 1st, 2nd, ... open; the last one repeats)
# Modes: pt        passthrough with the inode's backing id (registered at the first such open,
#                  closed at the last release, as libfuse's passthrough_hp does)
#        pt_fresh  passthrough with a new backing id for the same memfd (closed at its release)
#        pt_other  passthrough with a new backing id for the file's second memfd (other bytes)
#        pt_keep   pt with keep_cache
#        pt_default  FileInfo(fh=..., backing_id=...) with pyfuse3's other defaults (keep_cache=1)
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
    "sealed": (1 * MiB, "sealed", ["pt"]),
    "madvise_huge": (4 * MiB, "madvise", ["pt"]),
    "huge_tmpfs": (4 * MiB, "huge_tmpfs", ["pt"]),
}


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
            self.opens = 0                  # opens so far (selects the mode)
            self.backing_id = 0             # the inode's shared backing id ("pt"), 0 if none
            self.users = 0                  # open files using it
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
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                            fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK)
            return fd

    class Handle:
        def __init__(self, node: Node, mode: str, backing_id: int, fd: int):
            self.node, self.mode, self.backing_id, self.fd = node, mode, backing_id, fd

    class FS(pyfuse3.Operations):
        enable_passthrough = True

        def __init__(self) -> None:
            super().__init__()
            self.log_file = open(log_path, "a", buffering=1)
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

        def _attr(self, node: Node | None) -> "pyfuse3.EntryAttributes":
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
            if name.startswith(b"ctl-close-"):          # close the inode's backing id now
                node = self.by_name[name[len(b"ctl-close-"):]]
                pyfuse3.passthrough_close(node.backing_id)
                self.log("ctl-close", node.name, backing_id=node.backing_id)
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
                if not pyfuse3.readdir_reply(token, node.name.encode(), self._attr(node),
                                             node.ino - pyfuse3.ROOT_INODE):
                    break

        async def releasedir(self, fh):
            pass

        async def open(self, inode, flags, ctx):
            node = self.nodes[inode]
            mode = node.modes[min(node.opens, len(node.modes) - 1)]
            node.opens += 1
            fh, self.next_fh = self.next_fh, self.next_fh + 1
            fd, bid = node.fd, 0
            if mode in ("pt", "pt_keep", "pt_default"):
                if not node.backing_id:
                    node.backing_id = pyfuse3.passthrough_open(node.fd)
                node.users += 1
                bid = node.backing_id
            elif mode == "pt_fresh":
                bid = pyfuse3.passthrough_open(node.fd)
            elif mode == "pt_other":
                fd = node.other_fd
                bid = pyfuse3.passthrough_open(fd)
            elif mode == "pt_closed":
                bid = pyfuse3.passthrough_open(node.fd)
                pyfuse3.passthrough_close(bid)
            self.handles[fh] = Handle(node, mode, bid, fd)
            self.log("open", node.name, fh=fh, mode=mode, backing_id=bid,
                     accmode=flags & os.O_ACCMODE, o_direct=bool(flags & os.O_DIRECT))
            if mode == "pt_default":
                return pyfuse3.FileInfo(fh=fh, backing_id=bid)
            return pyfuse3.FileInfo(fh=fh, backing_id=bid, keep_cache=mode == "pt_keep",
                                    direct_io=mode == "direct")

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
            if h.mode in ("pt", "pt_keep", "pt_default") and h.backing_id == h.node.backing_id:
                h.node.users -= 1
                if h.node.users == 0:
                    pyfuse3.passthrough_close(h.node.backing_id)
                    h.node.backing_id = 0
            elif h.mode in ("pt_fresh", "pt_other"):
                pyfuse3.passthrough_close(h.backing_id)

    fs = FS()
    options = set(pyfuse3.default_options) | {"fsname=pt-test"}
    if auto_unmount:
        options.add("auto_unmount")
    pyfuse3.init(fs, mountpoint, options)
    try:   # before the kernel's INIT is answered
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


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    serve(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "1")
    sys.exit(0)
