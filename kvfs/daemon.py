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

import errno
import faulthandler
import fcntl
import logging
import os
import signal
import stat
from pathlib import Path
from typing import Callable

import pyfuse3
import trio

from dataclasses import dataclass

from kvfs.catalog.sqlite import SqliteCatalog
from kvfs.config import Config
from kvfs.errors import StartupError
from kvfs.fuse_ops import FuseOps
from kvfs.local import LocalTier
from kvfs.pool import Pool
from kvfs.service import Service

log = logging.getLogger("kvfs.daemon")

FUSE_DEVICE = "/dev/fuse"
READ_AHEAD_KB = 1024     # page-cache readahead of the mount: 1 MiB FUSE read requests


def mount_entry(mountpoint: str | os.PathLike, *, resolve: bool = True) -> dict | None:
    """The /proc/self/mountinfo entry for a mount point, or None.

    `resolve=False` when the path is already canonical: the daemon must never stat its own
    mountpoint from the thread that serves it (the request would wait for itself).
    """
    target = os.path.realpath(mountpoint) if resolve else os.fspath(mountpoint)
    found = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            point = fields[4].encode().decode("unicode_escape")
            if point == target:
                rfields = right.split()
                found = {"dev": fields[2], "mountpoint": point, "fstype": rfields[0],
                         "source": rfields[1] if len(rfields) > 1 else ""}
    return found          # the last entry wins: it is the one on top


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
        raise StartupError("kvfs mount must run as root (it opens /dev/fuse and the namespace "
                           "devices)", errno.EPERM)
    try:
        st = os.stat(FUSE_DEVICE)
        if not stat.S_ISCHR(st.st_mode):
            raise FileNotFoundError
    except FileNotFoundError:
        raise StartupError(f"{FUSE_DEVICE} is missing: this kernel or container has no FUSE "
                           f"(load the fuse module, or give the container /dev/fuse)",
                           errno.ENODEV) from None
    entry = mount_entry(mountpoint)
    if entry is not None and entry["fstype"].startswith("fuse"):
        try:
            os.statvfs(mountpoint)       # never cached by the kernel: reaches the daemon
        except OSError as e:
            if e.errno == errno.ENOTCONN:
                raise StartupError(f"mountpoint {mountpoint}: a stale mount is left there (its "
                                   f"daemon died); run `umount {mountpoint}` first",
                                   errno.EBUSY) from None
    try:
        st = os.stat(mountpoint)
    except FileNotFoundError:
        raise StartupError(f"mountpoint {mountpoint}: does not exist", errno.ENOENT) from None
    except OSError as e:
        if e.errno == errno.ENOTCONN:
            raise StartupError(f"mountpoint {mountpoint}: a stale mount is left there (its daemon "
                               f"died); run `umount {mountpoint}` first", errno.EBUSY) from None
        raise StartupError(f"mountpoint {mountpoint}: {e.strerror}", e.errno) from None
    if not stat.S_ISDIR(st.st_mode):
        raise StartupError(f"mountpoint {mountpoint}: not a directory", errno.ENOTDIR)
    if entry is not None or os.path.ismount(mountpoint):
        raise StartupError(f"mountpoint {mountpoint}: busy (something is already mounted there)",
                           errno.EBUSY)
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
            with socket.socket(socket.AF_INET6 if ":" in cfg.metrics_address else socket.AF_INET) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((cfg.metrics_address, cfg.metrics_port))
        except OSError as e:
            raise StartupError(f"metrics_port {cfg.metrics_port}: cannot listen on "
                               f"{cfg.metrics_address}: {e.strerror}", e.errno) from None
    real_mp = os.path.realpath(mountpoint)
    if os.path.realpath(sd) == real_mp or os.path.realpath(sd).startswith(real_mp + os.sep):
        raise StartupError(f"state_dir {sd}: must not be inside the mountpoint", errno.EINVAL)


class _Undo:
    """Directories created during start-up, removed again if start-up fails."""

    def __init__(self) -> None:
        self.dirs: list[Path] = []

    def mkdir(self, path: Path) -> None:
        missing = []
        p = path
        while not p.exists():
            missing.append(p)
            p = p.parent
        for d in reversed(missing):
            d.mkdir(mode=0o700)
            self.dirs.append(d)

    def rollback(self) -> None:
        for d in reversed(self.dirs):
            try:
                d.rmdir()
            except OSError:
                pass


def _lock_state_dir(sd: Path) -> int:
    fd = os.open(sd, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise StartupError(f"state_dir {sd}: in use by another kvfs daemon", errno.EBUSY) from None
    return fd


@dataclass
class Layers:
    """What the daemon runs on: the catalog, the pool, the optional local tier, and the lock on
    the state directory."""
    catalog: SqliteCatalog      # or RedisCatalog (a shared pool)
    pool: Pool
    local: LocalTier | None
    lock_fd: int

    def close(self) -> None:
        if self.local is not None:
            self.local.close()
        self.pool.close()
        self.catalog.close()
        os.close(self.lock_fd)


def open_cluster_layers(cfg: Config) -> Layers:
    """A pool shared by several nodes: the catalog is in Redis (the first node to start creates
    it and formats the namespaces); state_dir holds only this node's lock, log and local tier.
    """
    from kvfs.catalog.redis import RedisCatalog
    undo = _Undo()
    sd = cfg.state_dir
    lock_fd = -1
    try:
        undo.mkdir(sd)
        lock_fd = _lock_state_dir(sd)

        def open_pool(pool_id: str | None) -> Pool:
            return Pool.open(cfg.pool, expect_pool_id=pool_id, create_new=pool_id is None)

        catalog, pool = trio.run(RedisCatalog.open, cfg.cluster, open_pool)
        try:
            local = LocalTier.open(cfg.local, pool.unit) if cfg.local is not None else None
        except BaseException:
            pool.close()
            raise
        return Layers(catalog, pool, local, lock_fd)
    except BaseException:
        if lock_fd >= 0:
            os.close(lock_fd)
        undo.rollback()
        raise


def open_layers(cfg: Config) -> Layers:
    """Open (or create) the catalog and the pool, bind them, and open the local tier.

    Raises StartupError, after undoing what it created, if they do not belong together.
    """
    undo = _Undo()
    sd = cfg.state_dir
    lock_fd = -1
    catalog = None
    pool = None
    try:
        catalog_exists = cfg.catalog_path.exists()
        if catalog_exists:
            lock_fd = _lock_state_dir(sd)
            catalog = SqliteCatalog.open(cfg.catalog_path)
        expect = catalog.pool_id if catalog else None
        for nc in cfg.pool.namespaces:      # the embedded default keeps its pool in state_dir
            if not nc.path.exists() and nc.size is not None and sd in nc.path.parents:
                undo.mkdir(nc.path.parent)
        pool = Pool.open(cfg.pool, expect_pool_id=expect, create_new=expect is None)
        if expect is None and not pool.created:
            raise StartupError(f"the namespaces hold pool {pool.pool_id}, but state_dir {sd} has "
                               f"no catalog for it (state_dir lost?); to start over, run "
                               f"`kvfs format --force`")
        if catalog is None:
            undo.mkdir(sd)
            lock_fd = _lock_state_dir(sd)
            catalog = SqliteCatalog.open(cfg.catalog_path)
        if catalog.pool_id is None:
            catalog.set_pool_id(pool.pool_id)
        pool.attach(catalog.layouts())
        local = LocalTier.open(cfg.local, pool.unit) if cfg.local is not None else None
        return Layers(catalog, pool, local, lock_fd)
    except BaseException:
        if pool is not None:
            pool.close()
            if pool.created:
                for nc in cfg.pool.namespaces:
                    try:
                        nc.path.unlink()
                    except OSError:
                        pass
        if catalog is not None:
            catalog.close()
            if not catalog_exists:
                for suffix in ("", "-wal", "-shm"):
                    try:
                        os.unlink(str(cfg.catalog_path) + suffix)
                    except OSError:
                        pass
        if lock_fd >= 0:
            os.close(lock_fd)
        undo.rollback()
        raise


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


async def _main(service: Service, ops: FuseOps, mountpoint: str, max_tasks: int) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(service.serve)
        nursery.start_soon(_terminate_on_signal)
        nursery.start_soon(_tune_readahead, ops, mountpoint)
        await pyfuse3.main(min_tasks=4, max_tasks=max_tasks)
        with trio.CancelScope(shield=True):
            await service.flush()
            with trio.move_on_after(5):
                await service.catalog.stop()
        nursery.cancel_scope.cancel()


async def _terminate_on_signal() -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("received %s: unmounting", signal.Signals(signum).name)
            pyfuse3.terminate()
            return


def run(cfg: Config, mountpoint: Path, ready: Callable[[str | None], None], *,
        on_state_dir: Callable[[], None] | None = None) -> int:
    """Mount and serve until unmounted or signalled. `ready(None)` is called once the mount is
    up; `ready(message)` if start-up fails (the StartupError is raised too). `on_state_dir` is
    called once the state directory exists (to move logging into it)."""
    try:
        preflight(cfg, mountpoint)
        layers = open_layers(cfg) if cfg.cluster is None else open_cluster_layers(cfg)
    except StartupError as e:
        ready(str(e))
        raise
    catalog, pool = layers.catalog, layers.pool
    if on_state_dir is not None:
        on_state_dir()
    real_mountpoint = os.path.realpath(mountpoint)     # resolved before it becomes ours
    service = Service(cfg, catalog, pool, layers.local)
    ops = FuseOps(service, cfg.mount.attr_timeout)
    options = set(pyfuse3.default_options)
    options |= {f"fsname=kvfs:{pool.pool_id[:12]}", "subtype=kvfs"}
    if cfg.mount.allow_other:
        options.add("allow_other")
    try:
        pyfuse3.init(ops, real_mountpoint, options)
    except RuntimeError as e:
        layers.close()
        msg = f"mountpoint {mountpoint}: mounting failed ({e})"
        ready(msg)
        raise StartupError(msg) from None
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    log.info("kvfs mounted at %s: pool %s, %d namespace(s), %d bytes; DRAM %d bytes; pid %d%s",
             mountpoint, pool.pool_id, len(pool.namespaces), pool.capacity, cfg.dram.capacity,
             os.getpid(), f"; shared, catalog in Redis at {catalog.redis.where} (node "
                          f"{cfg.cluster.node_id})" if cfg.cluster else "")
    ready(None)
    clean = False
    try:
        trio.run(_main, service, ops, real_mountpoint, cfg.mount.max_tasks)
        clean = True
    finally:
        pyfuse3.close(unmount=True)
        dirty = sum(1 for st in service.files.states.values()
                    if st.session is not None and st.session.dirty)
        if dirty:
            log.warning("%d file(s) open for writing were not committed", dirty)
        layers.close()
        log.info("kvfs at %s stopped%s", mountpoint, "" if clean else " after an error")
    return 0
