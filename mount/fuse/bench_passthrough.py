"""Read and write throughput of a 64 MiB block through FUSE passthrough, against tmpfs.

Run as root with the venv that `make install` built:

    .venv/bin/python mount/fuse/bench_passthrough.py
It mounts a one-directory pyfuse3 file system (this script, in a subprocess) whose files are backed
by a memfd ("pt"), by a file on a huge=always tmpfs ("pt_huge"), or served by the daemon itself
without passthrough ("daemon"), and compares each with the same bytes in a plain tmpfs file.
Numbers go to stdout; docs/passthrough.md quotes them.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import statistics
import subprocess
import sys
import tempfile
import time

MiB = 1 << 20
SIZE = 64 * MiB
NAMES = ["pt", "pt_huge", "daemon"]


def serve(mountpoint: str, huge_dir: str) -> None:
    import pyfuse3
    import trio

    data = os.urandom(SIZE)

    def backing(huge: bool) -> int:
        if huge:
            path = os.path.join(huge_dir, "blk")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            os.unlink(path)
        else:
            fd = os.memfd_create("blk", os.MFD_CLOEXEC)
        os.pwrite(fd, data, 0)
        return fd

    fds = {"pt": backing(False), "daemon": backing(False)}
    if huge_dir:
        fds["pt_huge"] = backing(True)
    inos = {name: pyfuse3.ROOT_INODE + 1 + i for i, name in enumerate(NAMES)}

    class FS(pyfuse3.Operations):
        enable_passthrough = True

        def __init__(self) -> None:
            super().__init__()
            self.ids: dict[str, int] = {}  # file -> its backing id while open
            self.users: dict[str, int] = {}  # file -> open files

        def name(self, ino: int) -> str:
            return next(n for n, i in inos.items() if i == ino)

        def attr(self, ino: int) -> pyfuse3.EntryAttributes:
            a = pyfuse3.EntryAttributes()
            a.st_ino, a.entry_timeout, a.attr_timeout = ino, 60, 60
            if ino == pyfuse3.ROOT_INODE:
                a.st_mode, a.st_nlink = stat.S_IFDIR | 0o755, 2
            else:
                a.st_mode, a.st_nlink = stat.S_IFREG | 0o644, 1
                a.st_size = os.fstat(fds[self.name(ino)]).st_size
            return a

        async def lookup(self, parent, name, ctx):
            if name.decode() in fds:
                return self.attr(inos[name.decode()])
            raise pyfuse3.FUSEError(errno.ENOENT)

        async def getattr(self, inode, ctx):
            return self.attr(inode)

        async def open(self, inode, flags, ctx):
            name = self.name(inode)
            if name == "daemon":
                return pyfuse3.FileInfo(fh=inode, keep_cache=False)
            if not self.users.get(name):
                self.ids[name] = pyfuse3.passthrough_open(fds[name])
            self.users[name] = self.users.get(name, 0) + 1
            return pyfuse3.FileInfo(fh=inode, backing_id=self.ids[name])

        async def read(self, fh, off, size):
            return os.pread(fds[self.name(fh)], size, off)

        async def write(self, fh, off, buf):
            return os.pwrite(fds[self.name(fh)], buf, off)

        async def release(self, fh):
            name = self.name(fh)
            if name != "daemon":
                self.users[name] -= 1
                if not self.users[name]:
                    pyfuse3.passthrough_close(self.ids.pop(name))

    pyfuse3.init(FS(), mountpoint, set(pyfuse3.default_options) | {"fsname=pt-bench"})

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pyfuse3.main)
            with trio.open_signal_receiver(signal.SIGTERM) as signals:
                async for _ in signals:
                    pyfuse3.terminate()
                    break

    try:
        trio.run(run)
    finally:
        pyfuse3.close(unmount=True)


def one_pass(path: str, write: bool, chunk: int, buf: bytearray) -> float:
    """GB/s of reading (or overwriting) all of *path* in *chunk*-sized calls."""
    fd = os.open(path, os.O_RDWR if write else os.O_RDONLY)
    try:
        t = time.perf_counter()
        for off in range(0, SIZE, chunk):
            if write:
                os.pwrite(fd, buf, off)
            else:
                os.preadv(fd, [buf], off)
        return SIZE / (time.perf_counter() - t) / 1e9
    finally:
        os.close(fd)


def compare(paths: dict[str, str], write: bool, chunk: int, passes: int = 9) -> dict[str, tuple]:
    """name -> (median GB/s, median of the per-pass ratios to paths["tmpfs"]). The paths take
    turns within each pass, so that load from other processes hits all of them alike."""
    buf = bytearray(os.urandom(chunk)) if write else bytearray(chunk)
    rates: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(passes):
        for name, path in paths.items():
            rates[name].append(one_pass(path, write, chunk, buf))
    return {
        name: (
            statistics.median(r),
            statistics.median(x / t for x, t in zip(r, rates["tmpfs"], strict=True)),
        )
        for name, r in rates.items()
    }


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="pt-bench.") as base:
        mnt, tmpfs, huge = (os.path.join(base, d) for d in ("mnt", "tmpfs", "huge"))
        for d in (mnt, tmpfs, huge):
            os.mkdir(d)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=160m", "bench-tmpfs", tmpfs], check=True
        )
        huge_ok = (
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "huge=always,size=160m", "bench-huge", huge],
                check=False,
            ).returncode
            == 0
        )
        server = subprocess.Popen([sys.executable, __file__, "serve", mnt, huge if huge_ok else ""])
        try:
            deadline = time.monotonic() + 30
            while not os.path.exists(os.path.join(mnt, "pt")):
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the bench file system did not come up")
                time.sleep(0.05)
            ref = {"tmpfs": os.path.join(tmpfs, "blk"), "tmpfs_huge": os.path.join(huge, "ref")}
            for path in [ref["tmpfs"]] + ([ref["tmpfs_huge"]] if huge_ok else []):
                with open(path, "wb") as f:
                    f.write(os.urandom(SIZE))
            paths = {"tmpfs": ref["tmpfs"]}
            if huge_ok:
                paths["huge tmpfs"] = ref["tmpfs_huge"]
            paths.update(
                (name, os.path.join(mnt, name)) for name in NAMES if name != "pt_huge" or huge_ok
            )
            print(
                f"64 MiB file, kernel {os.uname().release}: median GB/s over 9 passes "
                "(median per-pass ratio to tmpfs)"
            )
            for write in (False, True):
                for chunk in (MiB, 128 << 10, 4 << 10):
                    row = [f"{'write' if write else 'read '} {chunk >> 10:4d} KiB"]
                    for name, (rate, ratio) in compare(paths, write, chunk).items():
                        row.append(f"{name} {rate:5.2f} ({ratio:4.2f}x)")
                    print("  ".join(row), flush=True)
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
            for d in (mnt, tmpfs, huge):
                if os.path.ismount(d):
                    subprocess.run(["umount", "-l", d], check=False)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2], sys.argv[3])
    else:
        main()
