"""Mount lifecycle: pre-flight checks, opening the layers, the FUSE main loop, clean shutdown.

Start-up checks everything that can be checked without side effects first (privileges,
/dev/fuse, the mountpoint, the state directory, the namespaces), so that bad input gets a
one-line `StartupError` and creates or destroys nothing. Only then are the state directory,
the catalog and (for a brand-new pool) the namespace files created.

Shutdown: SIGTERM, SIGINT or SIGHUP end the FUSE main loop; the mount is then removed, access
times are persisted and the catalog closed. Files still open for writing are not committed
(as after a crash, they are absent or keep their previous version).
"""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import gc
import logging
import os
import signal
import stat
import sys
from pathlib import Path
from typing import Callable

import pyfuse3
import trio

from kvfs.client.mounts import abort_connection, mount_entry
from kvfs.config import Config, mem_total
from kvfs.errors import StartupError
from kvfs.fs.kernel import KernelCache
from kvfs.fs.operations import FuseOps
from kvfs.knobs import Knobs
from kvfs.pool.buffer import MEMORY
from kvfs.service import Service, open_layers

log = logging.getLogger("kvfs.daemon")

FUSE_DEVICE = "/dev/fuse"
READ_AHEAD_KB = 1024  # page-cache readahead of the mount: 1 MiB FUSE read requests
# pyfuse3 request tasks kept waiting for requests: a task whose handler waits (a commit, a
# fetch) is replaced by a new one while none waits, and one is ended while more than this
# many wait. Under a steady load of concurrent files four went back and forth, a task
# started and ended for every few requests; idle tasks cost a little memory each.
IDLE_TASKS = 32
# How long a worker thread that finished its I/O may wait for the GIL while the trio thread
# runs Python (5 ms by default): its result waits as long. With 0.5 ms, 256 KiB loads went
# from 2,530-2,590 to 2,830-2,860 files/s and stores from 1,330-1,450 to 1,490-1,510 (side by
# side; 0.1 ms was no better).
GIL_SWITCH_SECONDS = 0.0005
GC_YOUNG = 20_000


def _writable_dir_or_creatable(path: Path) -> None:
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise StartupError(f"state_dir {path}: {probe} is not a directory", errno.ENOTDIR)
    if not os.access(probe, os.W_OK | os.X_OK):
        raise StartupError(f"state_dir {path}: {probe} is not writable", errno.EACCES)


def preflight(cfg: Config, mountpoint: Path) -> None:
    """Check what can be checked without changing anything; raise StartupError otherwise."""
    if os.geteuid() != 0:
        raise StartupError(
            "kvfs mount must run as root (it opens /dev/fuse and the namespace devices)",
            errno.EPERM,
        )
    try:
        st = os.stat(FUSE_DEVICE)
        if not stat.S_ISCHR(st.st_mode):
            raise FileNotFoundError
    except FileNotFoundError:
        raise StartupError(
            f"{FUSE_DEVICE} is missing: this kernel or container has no FUSE "
            f"(load the fuse module, or give the container /dev/fuse)",
            errno.ENODEV,
        ) from None
    entry = mount_entry(mountpoint)
    if entry is not None and entry["fstype"].startswith("fuse"):
        try:
            os.statvfs(mountpoint)  # never cached by the kernel: reaches the daemon
        except OSError as e:
            if e.errno == errno.ENOTCONN:
                raise StartupError(
                    f"mountpoint {mountpoint}: a stale mount is left there (its "
                    f"daemon died); run `umount {mountpoint}` first",
                    errno.EBUSY,
                ) from None
    try:
        st = os.stat(mountpoint)
    except FileNotFoundError:
        raise StartupError(f"mountpoint {mountpoint}: does not exist", errno.ENOENT) from None
    except OSError as e:
        if e.errno == errno.ENOTCONN:
            raise StartupError(
                f"mountpoint {mountpoint}: a stale mount is left there (its daemon "
                f"died); run `umount {mountpoint}` first",
                errno.EBUSY,
            ) from None
        raise StartupError(f"mountpoint {mountpoint}: {e.strerror}", e.errno) from None
    if not stat.S_ISDIR(st.st_mode):
        raise StartupError(f"mountpoint {mountpoint}: not a directory", errno.ENOTDIR)
    if entry is not None or os.path.ismount(mountpoint):
        raise StartupError(
            f"mountpoint {mountpoint}: busy (something is already mounted there)", errno.EBUSY
        )
    sd = cfg.state_dir
    if sd.exists():
        if not sd.is_dir():
            raise StartupError(f"state_dir {sd}: not a directory", errno.ENOTDIR)
        if not os.access(sd, os.W_OK | os.X_OK):
            raise StartupError(f"state_dir {sd}: not writable", errno.EACCES)
    else:
        _writable_dir_or_creatable(sd)
    if cfg.metrics_port:
        import socket

        try:
            with socket.socket(
                socket.AF_INET6 if ":" in cfg.metrics_address else socket.AF_INET
            ) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((cfg.metrics_address, cfg.metrics_port))
        except OSError as e:
            raise StartupError(
                f"metrics_port {cfg.metrics_port}: cannot listen on "
                f"{cfg.metrics_address}: {e.strerror}",
                e.errno,
            ) from None
    real_mp = os.path.realpath(mountpoint)
    if os.path.realpath(sd) == real_mp or os.path.realpath(sd).startswith(real_mp + os.sep):
        raise StartupError(f"state_dir {sd}: must not be inside the mountpoint", errno.EINVAL)


async def _tune_readahead(ops: FuseOps, mountpoint: str) -> None:
    """Let the page cache ask for 1 MiB per FUSE read (the default is 128 KiB).

    The kernel caps the mount's readahead with what INIT negotiated, so this runs after INIT.
    """
    await ops.initialized.wait()
    entry = mount_entry(mountpoint, resolve=False)
    if entry is None:
        return
    path = f"/sys/class/bdi/{entry['dev']}/read_ahead_kb"
    try:
        with open(path, "w") as f:
            f.write(str(READ_AHEAD_KB))
    except OSError as e:
        log.info("could not raise %s: %s", path, e)


async def _terminate_on_signal(signals) -> None:
    async for signum in signals:
        log.info("received %s: unmounting", signal.Signals(signum).name)
        pyfuse3.terminate()
        return


def raise_fd_limit() -> None:
    """Every block in DRAM holds a descriptor (its memfd): allow as many as the hard limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as e:
            log.debug("raising the descriptor limit failed: %s", e)


def run(
    cfg: Config,
    mountpoint: Path,
    ready: Callable[[str | None], None],
    *,
    on_state_dir: Callable[[], None] | None = None,
) -> int:
    """Mount and serve until unmounted or signalled. `ready(None)` is called once the mount is
    up; `ready(message)` if start-up fails (the StartupError is raised too). `on_state_dir` is
    called once the state directory exists (to move logging into it)."""
    try:
        preflight(cfg, mountpoint)
    except StartupError as e:
        ready(str(e))
        raise
    real_mountpoint = os.path.realpath(mountpoint)  # resolved before it becomes ours
    raise_fd_limit()
    sys.setswitchinterval(GIL_SWITCH_SECONDS)
    if cfg.dram.huge_pages:
        # a backstop: writers get ENOSPC rather than the machine running out of memory
        why = MEMORY.use_private_tmpfs(mem_total() * 3 // 4)
        if why:
            log.info("block memory: memfds (%s)", why)
    return trio.run(_serve, cfg, mountpoint, real_mountpoint, ready, on_state_dir)


def _log_mounted(cfg: Config, mountpoint: Path, pool) -> None:
    """The one line that says the mount is up, and on what."""
    log.info(
        "kvfs mounted at %s: pool %s, %d namespace(s), %d bytes; DRAM %d bytes; pid %d%s",
        mountpoint,
        pool.pool_id,
        len(pool.namespaces),
        pool.capacity,
        cfg.dram.capacity,
        os.getpid(),
        f"; shared, catalog in Redis at {cfg.cluster.where} (node {cfg.cluster.node_id})"
        if cfg.cluster
        else "",
    )


async def _serve(
    cfg: Config,
    mountpoint: Path,
    real_mountpoint: str,
    ready: Callable[[str | None], None],
    on_state_dir: Callable[[], None] | None,
) -> int:
    """Start-up, serving and shutdown in one trio run, under one exit stack: whatever was
    opened is closed in reverse order however this ends."""
    async with contextlib.AsyncExitStack() as stack:
        knobs = Knobs.from_config(cfg)
        try:
            layers = await open_layers(cfg, knobs, stack)
        except StartupError as e:
            ready(str(e))
            raise
        if on_state_dir is not None:
            on_state_dir()
        service = Service(cfg, layers, knobs, kernel=KernelCache(), mount=real_mountpoint)
        # What start-up loaded (the catalog's caches, the pool's order of files: objects that
        # live as long as the daemon) leaves the collector's view, and the youngest generation
        # is collected every GC_YOUNG allocations instead of 700: a request allocates dozens.
        gc.freeze()
        gc.set_threshold(GC_YOUNG, *gc.get_threshold()[1:])
        ops = service.ops
        pool = layers.pool
        options = set(pyfuse3.default_options)
        options |= {f"fsname=kvfs:{pool.pool_id[:12]}", "subtype=kvfs"}
        if cfg.mount.allow_other:
            options.add("allow_other")
        try:
            pyfuse3.init(ops, real_mountpoint, options)
        except RuntimeError as e:
            msg = f"mountpoint {mountpoint}: mounting failed ({e})"
            ready(msg)
            raise StartupError(msg) from None
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        # Catch the stopping signals before saying the mount is up: one sent as soon as it
        # is (a harness, systemd) killed the daemon by the default action, uncleanly.
        signals = stack.enter_context(
            trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        )
        conn = mount_entry(real_mountpoint, resolve=False)
        conn_dev = conn["dev"] if conn is not None else None
        _log_mounted(cfg, mountpoint, pool)
        ready(None)
        clean = False
        lost = 0
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(service.serve)
                # (listening before the first FUSE request is answered: a client finds it
                # through the mount)
                await nursery.start(service.direct_socket.serve)
                nursery.start_soon(_terminate_on_signal, signals)
                nursery.start_soon(_tune_readahead, ops, real_mountpoint)
                await pyfuse3.main(min_tasks=IDLE_TASKS, max_tasks=cfg.mount.max_tasks)
                with trio.CancelScope(shield=True):
                    lost = await service.stop()
                nursery.cancel_scope.cancel()
            clean = True
        finally:
            # Nothing answers requests any more. A request still waiting would wait until
            # /dev/fuse closes at exit, but the process cannot exit while a thread of it is
            # blocked on an entry invalidation that such a request holds up (kvfs/client/mounts.py,
            # abort_connection): fail them first. (Skipped if the mount is gone: unmounted by
            # the kernel, its device number may already belong to another mount.)
            now = mount_entry(real_mountpoint, resolve=False)
            if conn_dev is not None and now is not None and now["dev"] == conn_dev:
                abort_connection(conn_dev)
            pyfuse3.close(unmount=True)
            dirty = service.dirty_files()
            if dirty:
                log.warning("%d file(s) open for writing were not committed", dirty)
            log.info("kvfs at %s stopped%s", mountpoint, "" if clean else " after an error")
    return 1 if lost else 0
