"""Run a kvfs daemon in a subprocess and drive it as a user would (tests and benchmarks).

with MountedKvfs(mountpoint, config_path, log_path) as m:
    (m.mountpoint / "x").write_bytes(b"...")
    m.drop_caches()          # cold reads: DRAM tier and kernel page cache dropped
    print(m.stats())
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from kvfs.client.mounts import abort_connection, mount_entry

ROOT = Path(__file__).resolve().parent.parent


def wait_until(
    predicate: Callable[[], bool],
    timeout: float = 30.0,
    what: str = "condition",
    interval: float = 0.02,
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def write_config(
    path: Path,
    state_dir: Path,
    namespaces: list[dict],
    *,
    dram: str = "64MiB",
    extra: str = "",
    pool: str = "",
    mount: str = "",
) -> Path:
    """Write a kvfs config. `extra` holds top-level keys and other tables (it goes first);
    `pool` holds keys of the [pool] table, `mount` of the [mount] table.
    KVFS_TEST_DURABILITY=close (or fsync) in the environment sets `[mount] durability` where
    `mount` does not, shared pools included (`make test` runs the mounted tests again in
    "close" mode). KVFS_TEST_IO=threads likewise sets `[pool] io_engine` and `io_workers = 0`
    (the second pass reads and writes small blocks by worker threads, as the first does by
    Linux AIO, and fetches on the daemon's own threads, as the first does by I/O worker
    processes)."""
    io = os.environ.get("KVFS_TEST_IO", "").strip()
    if io and "io_engine" not in pool:
        pool = f'io_engine = "{io}"\n' + pool
    if io == "threads" and "io_workers" not in pool:
        pool = "io_workers = 0\n" + pool
    mode = os.environ.get("KVFS_TEST_DURABILITY", "").strip()
    if mode and "durability" not in mount and "[mount]" not in extra:
        mount = f'durability = "{mode}"\n' + mount
    lines = [f'state_dir = "{state_dir}"', extra, "[dram]", f'capacity = "{dram}"', "[pool]"]
    if pool:
        lines.append(pool)
    for ns in namespaces:
        lines.append("[[pool.namespace]]")
        for k, v in ns.items():
            lines.append(f"{k} = {json.dumps(v)}")
    if mount:
        lines += ["[mount]", mount]
    path.write_text("\n".join(lines) + "\n")
    return path


def log_tail(path: Path, nchars: int = 4000) -> str:
    """The end of a log file ("" if it cannot be read): for error messages."""
    try:
        return path.read_text(errors="replace")[-nchars:]
    except OSError:
        return ""


def mount_device(path: Path) -> str | None:
    e = mount_entry(path)
    return e["dev"] if e is not None and e["fstype"] == "fuse.kvfs" else None


def is_mounted(path: Path) -> bool:
    return mount_device(path) is not None


class MountedKvfs:
    """A kvfs daemon in the foreground in a subprocess, mounted at `mountpoint`."""

    def __init__(
        self,
        mountpoint: Path,
        config: Path,
        log: Path,
        *,
        nofile: int | None = None,
        env: dict | None = None,
    ):
        """`nofile`: run the daemon with at most this many open descriptors (RLIMIT_NOFILE,
        soft and hard). `env`: variables set in the daemon's environment (over this one's)."""
        self.env = env
        self.mountpoint = mountpoint
        self.config = config
        self.log = log
        self.nofile = nofile
        self.proc: subprocess.Popen | None = None
        self.dev: str | None = None  # the mount's device ("0:53"), once mounted

    def start(self, timeout: float = 30.0) -> "MountedKvfs":
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        logf = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kvfs",
                "mount",
                str(self.mountpoint),
                "--foreground",
                "--config",
                str(self.config),
            ],
            stdout=logf,
            stderr=subprocess.STDOUT,
            cwd=ROOT if (ROOT / "kvfs").is_dir() else None,
            preexec_fn=self._limit if self.nofile else None,
            env={**os.environ, **self.env} if self.env else None,
        )
        logf.close()
        deadline = time.monotonic() + timeout
        while not is_mounted(self.mountpoint):
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"kvfs exited with {self.proc.returncode} during start-up:\n" + self.log_text()
                )
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError("kvfs did not mount in time:\n" + self.log_text())
            time.sleep(0.02)
        self.dev = mount_device(self.mountpoint)
        return self

    def _limit(self) -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

    def open_descriptors(self) -> int:
        """How many descriptors the daemon holds open now."""
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def log_text(self) -> str:
        return log_tail(self.log)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stats(self) -> dict:
        return json.loads(os.getxattr(self.mountpoint, "user.kvfs.stats"))

    @property
    def passthrough(self) -> bool:
        """Is file data served by FUSE passthrough (else through the daemon)?"""
        return bool(self.stats().get("data_path", {}).get("passthrough"))

    @property
    def durability(self) -> str:
        """ "fsync" (close is not a commit; closed files are written back in batches) or
        "close"."""
        return self.stats()["files"]["durability"]

    def sync(self) -> None:
        """Every closed file and every change durable, as an application asks for it: an
        fsync of the mount's root directory (FUSE_FSYNCDIR)."""
        fd = os.open(self.mountpoint, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def control(self, action: str, args: dict | None = None) -> dict:
        ctl = self.mountpoint / ".kvfs-control"
        try:
            os.setxattr(ctl, f"user.kvfs.{action}", json.dumps(args or {}).encode())
        finally:
            result = json.loads(os.getxattr(ctl, "user.kvfs.result"))
        return result

    def drop_caches(self) -> None:
        """Cold reads: drop kvfs's DRAM tier and the kernel's page cache."""
        self.control("drop_dram")
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1")

    def stop(self, timeout: float = 30.0) -> int:
        """Unmount cleanly (SIGTERM) and wait for the daemon; returns its exit status."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._clear_mount()
        code = self.proc.returncode
        self.proc = None
        return code

    def kill(self) -> None:
        """kill -9 the daemon, then clear the stale mount it leaves."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                # A thread of the killed daemon is stuck in the kernel: an entry invalidation
                # (eviction) waits for a directory lock that a request to this very daemon holds
                # (a rename waiting for its lookup). The process cannot finish dying, so its
                # /dev/fuse is never closed and the requests never fail. Aborting the
                # connection fails them, and the daemon exits (kvfs/client/mounts.py; by the device
                # number: the mount may already be detached from its mountpoint).
                if self.dev is None or not abort_connection(self.dev):
                    subprocess.run(["umount", "-f", str(self.mountpoint)], capture_output=True)
                self.proc.wait(30)
        self._clear_mount()
        self.proc = None

    def _clear_mount(self) -> None:
        if is_mounted(self.mountpoint):
            r = subprocess.run(["umount", str(self.mountpoint)], capture_output=True)
            if r.returncode != 0:
                subprocess.run(["umount", "-l", str(self.mountpoint)], capture_output=True)
        wait_until(lambda: not is_mounted(self.mountpoint), 10, "the mount to go away")

    def restart(self) -> "MountedKvfs":
        self.stop()
        return self.start()

    def __enter__(self) -> "MountedKvfs":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def cpu_seconds(pid: int, *, user_only: bool = False) -> float:
    """A process's CPU time so far (user + system, all its threads; with `user_only` user
    time alone), from /proc/PID/stat, with its child processes' (the daemon's I/O workers,
    kvfs/pool/io_workers.py): those running, and those ended and reaped."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[13])
    if not user_only:
        ticks += int(fields[12]) + int(fields[14])
    seconds = ticks / os.sysconf("SC_CLK_TCK")
    children = []  # (each thread's: a worker is started from a thread)
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                children += [int(c) for c in f.read().split()]
        except OSError:
            pass
    for child in children:
        try:
            seconds += cpu_seconds(child, user_only=user_only)
        except (OSError, IndexError, ValueError):
            pass  # it ended meanwhile
    return seconds


def live_cpu_seconds(pid: int) -> float:
    """A process's CPU time so far to the nanosecond (`cpu_seconds` counts clock ticks, 10 ms):
    the sum of its threads' /proc schedstat, with its child processes' likewise. Threads that
    have ended are not counted (a short measurement's: trio keeps its worker threads 10 s)."""
    seconds = 0.0
    children = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                seconds += int(f.read().split()[0]) / 1e9
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                children += [int(c) for c in f.read().split()]
        except (OSError, IndexError, ValueError):
            pass  # it ended meanwhile
    for child in children:
        try:
            seconds += live_cpu_seconds(child)
        except OSError:
            pass
    return seconds


def process_memory(pid: int) -> dict:
    """A process's resident memory from /proc/PID/status, in bytes: VmRSS, RssAnon, RssFile,
    RssShmem (what benchmarks report for the daemon)."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[k] = int(v.split()[0]) * 1024
    return out
