"""What one FUSE request costs through pyfuse3: a null file system, side by side with tmpfs.

Run as root with the venv that `make install` built:

    .venv/bin/python mount/fuse/bench_requests.py [--files 20000] [--compare DIR] [--json]

It mounts a one-directory pyfuse3 file system (this script, in a subprocess) that answers every
request from a dict and does no I/O: what remains is the cost of the request itself (the kernel
round trip, libfuse, pyfuse3's request loop, a trio task). Measured, each side by side with the
same calls on a tmpfs directory:

  create   create+write(4 KiB)+close of new files, 1 and 8 threads (LOOKUP, CREATE, WRITE,
           FLUSH, RELEASE, and a GETATTR of the directory per create, which the kernel's
           default_permissions needs after the directory changed)
  stat     stat of every name after the kernel dropped its dentries (one LOOKUP each), 1 and 4
           threads

and for each the daemon's CPU time per request (its /proc stat over the requests it counted);
also create+write+close of new files written in 4 writes of 1 KiB (8 threads), where stock
FUSE asks for security.capability before each write.

With `--killpriv` the compare column is the installed pyfuse3 with the file system's
`enable_killpriv_v2` and `user_xattrs_only` off (mount/fuse/pyfuse3-killpriv.patch), alternating
with them on: the GETXATTRs the kernel no longer sends, and what the ones it still sends cost
when pyfuse3's request loop answers them.

With `--processes N` it measures instead what more processes serving the same FUSE session
add (issue 19's question before any multi-process design): the file system forks N-1
copies of itself after mounting, all reading requests from the one /dev/fuse descriptor (the
kernel hands each request to one reader; FUSE_DEV_IOC_CLONE would give each its own
descriptor onto the same queue). Their state cannot be shared, so the files are made before
the fork and only read: cold stats (1, 4 and 8 threads) and loads (open, read 4 KiB, close;
8 threads), with 1 serving process and with N, alternating, and the CPU of all of them.
With `--compare DIR` the same runs are made a second time with the pyfuse3 package found in
DIR (e.g. a copy of the stock build) in place of the installed one, alternating, and the table
gives both: that is how mount/fuse/pyfuse3-requests.patch was measured.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import stat
import subprocess
import sys
import tempfile
import threading
import time

ROOT = 1
TIMEOUT = 60.0
DATA = b"d" * 4096


def serve(
    mountpoint: str, counts_path: str, processes: int = 1, static: int = 0, killpriv: int = 0
) -> None:
    import pyfuse3
    import trio

    class NullFS(pyfuse3.Operations):
        def __init__(self) -> None:
            super().__init__()
            self.names: dict[bytes, int] = {}
            self.attrs: dict[int, list] = {ROOT: [stat.S_IFDIR | 0o755, 0]}
            self.next_ino = ROOT + 1
            self.requests = 0

        def entry(self, ino: int) -> pyfuse3.EntryAttributes:
            mode, size = self.attrs[ino]
            e = pyfuse3.EntryAttributes()
            e.st_ino = ino
            e.st_mode = mode
            e.st_size = size
            e.st_nlink = 1
            e.entry_timeout = e.attr_timeout = TIMEOUT
            return e

        async def lookup(self, parent, name, ctx=None):
            self.requests += 1
            ino = self.names.get(name)
            if ino is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self.entry(ino)

        async def getattr(self, inode, ctx=None):
            self.requests += 1
            return self.entry(inode)

        async def create(self, parent, name, mode, flags, ctx):
            self.requests += 1
            ino = self.next_ino
            self.next_ino += 1
            self.names[name] = ino
            self.attrs[ino] = [stat.S_IFREG | 0o644, 0]
            return pyfuse3.FileInfo(fh=ino), self.entry(ino)

        async def open(self, inode, flags, ctx):
            self.requests += 1
            return pyfuse3.FileInfo(fh=inode)

        async def read(self, fh, off, size):
            self.requests += 1
            return DATA[off : off + size]

        async def write(self, fh, off, buf):
            self.requests += 1
            a = self.attrs[fh]
            a[1] = max(a[1], off + len(buf))
            return len(buf)

        async def flush(self, fh):
            self.requests += 1

        async def release(self, fh):
            self.requests += 1

        async def forget(self, inode_list):
            self.requests += 1

        on_init = None  # called once the session's INIT is answered

        def init(self) -> None:
            if self.on_init is not None:
                self.on_init()

        async def getxattr(self, inode, name, ctx):
            if name == b"user.requests":
                replies = getattr(pyfuse3, "foreign_xattr_replies", None)  # (a stock build)
                below = replies() if replies is not None else 0
                return str(self.requests + below).encode()
            self.requests += 1
            raise pyfuse3.FUSEError(errno.ENODATA)

    ops = NullFS()
    ops.enable_killpriv_v2 = ops.user_xattrs_only = bool(killpriv)
    for i in range(static):  # read-only files, made before any fork
        ops.names[b"s-%d" % i] = ops.next_ino
        ops.attrs[ops.next_ino] = [stat.S_IFREG | 0o644, len(DATA)]
        ops.next_ino += 1
    pyfuse3.init(ops, mountpoint, set(pyfuse3.default_options) | {"fsname=nullfs"})
    children = []
    if processes > 1:
        # the session's INIT is answered before the fork (a forked copy of the session that
        # had not seen it would answer every request EIO): serve until it arrives, then fork
        # (cancelled rather than terminated: pyfuse3.terminate ends the session for good)
        async def until_init() -> None:
            async with trio.open_nursery() as nursery:
                ops.on_init = nursery.cancel_scope.cancel
                nursery.start_soon(pyfuse3.main)

        trio.run(until_init)
        ops.on_init = None
    for _ in range(processes - 1):  # more readers of the same /dev/fuse descriptor
        pid = os.fork()
        if pid == 0:
            children = None
            break
        children.append(pid)
    if children is not None:  # (which pyfuse3 served; with forks, their pids)
        with open(counts_path + ".tmp", "w") as f:
            f.write(" ".join(map(str, children)) if processes > 1 else pyfuse3.__file__)
        os.rename(counts_path + ".tmp", counts_path)

    async def run() -> None:
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                import signal

                with trio.open_signal_receiver(signal.SIGTERM) as signals:
                    async for _ in signals:
                        pyfuse3.terminate()
                        return

            nursery.start_soon(stop_on_signal)
            await pyfuse3.main(min_tasks=4)
            nursery.cancel_scope.cancel()

    if children is None:  # a forked reader: serve until terminated
        import signal

        signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
        trio.run(pyfuse3.main)
        os._exit(0)
    try:
        trio.run(run)
    finally:
        for pid in children:
            os.kill(pid, 15)
            os.waitpid(pid, 0)
        pyfuse3.close(unmount=True)


def parallel(n: int, threads: int, fn) -> float:
    def work(k: int) -> None:
        for i in range(k, n, threads):
            fn(i)

    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    t = time.perf_counter()
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    return time.perf_counter() - t


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drop_dentries() -> None:
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2")


def measure(root: str, n: int, pid: int | None) -> dict:
    """create (1 and 8 threads) then cold stat (1 and 4 threads) of n files under root."""
    data = b"x" * 4096
    out = {}

    def requests() -> int:
        return int(os.getxattr(root, "user.requests")) if pid else 0

    def timed(name: str, threads: int, fn, count: int) -> None:
        r0, c0 = requests(), cpu_seconds(pid) if pid else 0.0
        dt = parallel(count, threads, fn)
        out[f"{name}_per_s"] = count / dt
        if pid:
            nreq, cpu = requests() - r0, cpu_seconds(pid) - c0
            out[f"{name}_requests_per_op"] = round(nreq / count, 2)
            out[f"{name}_us_per_request"] = cpu / max(1, nreq) * 1e6
            out[f"{name}_daemon_us_per_op"] = cpu / count * 1e6

    for threads in (1, 8):
        d = os.path.join(root, f"c{threads}")

        def create(i: int, d=d) -> None:
            fd = os.open(f"{d}-{i}", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            os.write(fd, data)
            os.close(fd)

        timed(f"create_{threads}t", threads, create, n)

    def create4w(i: int) -> None:
        fd = os.open(f"{root}/w-{i}", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        for k in range(4):
            os.write(fd, data[k * 1024 : (k + 1) * 1024])
        os.close(fd)

    timed("create4w_8t", 8, create4w, n)
    for threads in (1, 4):
        drop_dentries()
        timed(f"stat_{threads}t", threads, lambda i: os.stat(f"{root}/c8-{i}"), n)
    return out


def measure_readers(root: str, n: int, pids: list[int]) -> dict:
    """Cold stats (1, 4, 8 threads) and loads (open, read 4 KiB, close; 8 threads) of the n
    files made before the fork, and the CPU of all serving processes per operation."""
    out = {}

    def cpu() -> float:
        return sum(cpu_seconds(p) for p in pids)

    def load(i: int) -> None:
        fd = os.open(f"{root}/s-{i}", os.O_RDONLY)
        if os.read(fd, 8192) != DATA:
            raise RuntimeError("wrong bytes")
        os.close(fd)

    for name, threads, fn in (
        ("stat", 1, None),
        ("stat", 4, None),
        ("stat", 8, None),
        ("load", 8, load),
    ):
        drop_dentries()
        c0 = cpu()
        dt = parallel(n, threads, fn or (lambda i: os.stat(f"{root}/s-{i}")))
        out[f"{name}_{threads}t_per_s"] = n / dt
        out[f"{name}_{threads}t_daemon_us_per_op"] = (cpu() - c0) / n * 1e6
    return out


@contextlib.contextmanager
def null_mounted(serve_args: list[str], env: dict | None = None):
    """The null file system mounted by a subprocess (`--serve MNT WHICH *serve_args`):
    yields (mountpoint, its pid, what it wrote to WHICH once up); unmounted after."""
    with tempfile.TemporaryDirectory(prefix="kvfs-null-") as tmp:
        mnt = os.path.join(tmp, "mnt")
        os.mkdir(mnt)
        which = os.path.join(tmp, "which")
        proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", mnt, which, *serve_args], env=env
        )
        try:
            deadline = time.monotonic() + 30
            while not (os.path.ismount(mnt) and os.path.exists(which)):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the null file system did not mount")
                time.sleep(0.02)
            with open(which) as f:
                yield mnt, proc.pid, f.read()
        finally:
            proc.terminate()
            proc.wait(30)
            subprocess.run(["umount", "-l", mnt], capture_output=True)


def run_readers(n: int, processes: int) -> dict:
    with null_mounted([str(processes), str(n)]) as (mnt, pid, which):
        children = [int(p) for p in which.split()] if processes > 1 else []
        return measure_readers(mnt, n, [pid] + children)


def run_null(n: int, pyfuse3_dir: str | None, killpriv: bool = False) -> dict:
    env = dict(os.environ)
    if pyfuse3_dir:
        env["PYTHONPATH"] = pyfuse3_dir + os.pathsep + env.get("PYTHONPATH", "")
    with null_mounted(["1", "0", str(int(killpriv))], env) as (mnt, pid, which):
        return {**measure(mnt, n, pid), "pyfuse3": which}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        serve(argv[1], argv[2], *map(int, argv[3:6]))
        return 0
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--compare", metavar="DIR", help="a directory holding another pyfuse3")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument(
        "--killpriv",
        action="store_true",
        help="compare: the installed pyfuse3 without enable_killpriv_v2 and user_xattrs_only",
    )
    ap.add_argument(
        "--processes",
        type=int,
        default=0,
        help="compare 1 serving process with this many (read-only files)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_requests.py: needs root (mounting)", file=sys.stderr)
        return 2
    if args.processes > 1:
        return readers_main(args)
    rows: dict[str, list[dict]] = {"installed": [], "compare": []}
    with tempfile.TemporaryDirectory(prefix="kvfs-tmpfs-") as t:
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", t], check=True)
        try:
            tmpfs = measure(t, args.files, None)
        finally:
            subprocess.run(["umount", t], check=True)
    for r in range(args.rounds):
        order = ["installed", "compare"] if r % 2 == 0 else ["compare", "installed"]
        for which in order:
            if which == "compare" and not (args.compare or args.killpriv):
                continue
            other = which == "compare"
            rows[which].append(
                run_null(
                    args.files,
                    args.compare if other else None,
                    killpriv=not (other and args.killpriv),
                )
            )

    def median(which: str, key: str) -> float:
        xs = sorted(x[key] for x in rows[which])
        return xs[len(xs) // 2]

    keys = [k for k in rows["installed"][0] if k != "pyfuse3"]
    out = {
        "files": args.files,
        "tmpfs": tmpfs,
        "installed": {k: median("installed", k) for k in keys},
        "pyfuse3": rows["installed"][0]["pyfuse3"],
    }
    if args.compare or args.killpriv:
        out["compare"] = {k: median("compare", k) for k in keys}
        out["compare_pyfuse3"] = rows["compare"][0]["pyfuse3"] + (
            " (killpriv v2 and user_xattrs_only off)" if args.killpriv else ""
        )
    if args.json:
        print(json.dumps(out))
        return 0
    cols = ["tmpfs", "installed"] + (["compare"] if "compare" in out else [])
    print(
        f"{args.files} files; installed pyfuse3: {out['pyfuse3']}"
        + (f"; compare: {out['compare_pyfuse3']}" if "compare" in out else "")
    )
    print(f"{'':<28}" + "".join(f"{c:>12}" for c in cols))
    for k in keys:
        vals = [tmpfs.get(k)] + [out[c].get(k) for c in cols[1:]]
        print(f"{k:<28}" + "".join(f"{v:>12.1f}" if v is not None else f"{'':>12}" for v in vals))
    return 0


def readers_main(args) -> int:
    """`--processes N`: 1 serving process against N, alternating, medians of --rounds."""
    rows: dict[int, list[dict]] = {1: [], args.processes: []}
    for r in range(args.rounds):
        for p in [1, args.processes] if r % 2 == 0 else [args.processes, 1]:
            rows[p].append(run_readers(args.files, p))
    keys = list(rows[1][0])
    med = {p: {k: sorted(x[k] for x in rs)[len(rs) // 2] for k in keys} for p, rs in rows.items()}
    ratio = {k: med[args.processes][k] / med[1][k] for k in keys if k.endswith("_per_s")}
    if args.json:
        print(
            json.dumps(
                {
                    "files": args.files,
                    "rounds": args.rounds,
                    "processes": args.processes,
                    "one": med[1],
                    "many": med[args.processes],
                    "many_vs_one": ratio,
                    "rows": {str(p): rs for p, rs in rows.items()},
                }
            )
        )
        return 0
    print(f"{args.files} read-only files, {args.rounds} rounds (medians); serving processes:")
    print(f"{'':<28}{1:>12}{args.processes:>12}{'ratio':>12}")
    for k in keys:
        print(
            f"{k:<28}{med[1][k]:>12.1f}{med[args.processes][k]:>12.1f}"
            + (f"{ratio[k]:>12.2f}" if k in ratio else "")
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
