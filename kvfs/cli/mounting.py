"""kvfs mount, kvfs umount, kvfs format."""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import errno
import functools
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from kvfs import config as config_mod
from kvfs.cli.common import fail as _fail
from kvfs.errors import StartupError

log = logging.getLogger("kvfs")


# the daemon's log lines (bench/torture.py reads its evictions from them)
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _setup_logging(level: str, logfile: Path | None) -> None:
    handler: logging.Handler
    if logfile is not None:
        handler = logging.FileHandler(logfile)
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


# --- mount -------------------------------------------------------------------------------------
def cmd_mount(args: argparse.Namespace) -> int:
    from kvfs import daemon

    if os.geteuid() != 0:
        raise StartupError(
            "kvfs mount must run as root (it opens /dev/fuse and the namespace devices)",
            errno.EPERM,
        )
    cfg = config_mod.load(args.config)
    mountpoint = Path(args.mountpoint).absolute()
    if not args.foreground:
        return _spawn_daemon(args, cfg, mountpoint)

    ready_fd = args.ready_fd

    def ready(error: str | None) -> None:
        nonlocal ready_fd
        if ready_fd is None:
            return
        msg = "OK\n" if error is None else f"ERR {error}\n"
        try:
            os.write(ready_fd, msg.encode())
            os.close(ready_fd)
        except OSError:
            pass
        ready_fd = None

    _setup_logging(cfg.log_level, None)

    # started by `kvfs mount` in the background: log to a file once the state dir exists
    def log_to_file() -> None:
        _setup_logging(cfg.log_level, cfg.state_dir / "kvfs.log")

    on_state_dir = log_to_file if args.ready_fd is not None else None
    try:
        return daemon.run(cfg, mountpoint, ready, on_state_dir=on_state_dir)
    finally:
        if ready_fd is not None:
            ready("the daemon stopped during start-up")


def _spawn_daemon(args: argparse.Namespace, cfg, mountpoint: Path) -> int:
    r, w = os.pipe()
    cmd = [
        sys.executable,
        "-m",
        "kvfs",
        "mount",
        str(mountpoint),
        "--foreground",
        "--ready-fd",
        str(w),
    ]
    if args.config:
        cmd += ["--config", str(Path(args.config).absolute())]
    proc = subprocess.Popen(
        cmd,
        pass_fds=(w,),
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(w)
    with os.fdopen(r) as f:
        answer = f.read()
    if answer.startswith("OK"):
        print(f"kvfs mounted at {mountpoint} (pid {proc.pid}, log {cfg.state_dir / 'kvfs.log'})")
        return 0
    if answer.startswith("ERR "):
        proc.wait()
        return _fail(answer[4:].strip())
    code = proc.wait()
    return _fail(
        f"the daemon exited during start-up (status {code}); see {cfg.state_dir / 'kvfs.log'}"
    )


# --- umount ------------------------------------------------------------------------------------
def _umount2(path: str, flags: int = 0) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.umount2(path.encode(), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)


def cmd_umount(args: argparse.Namespace) -> int:
    from kvfs.client.mounts import abort_connection, mount_entry

    mp = os.path.realpath(args.mountpoint)
    entry = mount_entry(mp)
    if entry is None:
        return _fail(f"not a mount point: {args.mountpoint}")
    if entry["fstype"] != "fuse.kvfs":
        return _fail(f"not a kvfs mount: {args.mountpoint} ({entry['fstype']})")
    pid = None
    if args.abort and not abort_connection(entry["dev"]):
        return _fail(f"{args.mountpoint}: no FUSE connection found for device {entry['dev']}")
    try:
        pid = json.loads(os.getxattr(mp, "user.kvfs.stats"))["pid"]
    except OSError as e:
        if e.errno not in (errno.ENOTCONN, errno.ECONNABORTED):
            return _fail(f"{args.mountpoint}: cannot reach the daemon: {e.strerror}")
    except (ValueError, KeyError):
        pass
    try:
        _umount2(mp, 2 if args.lazy else 0)  # MNT_DETACH
    except OSError as e:
        if e.errno == errno.EBUSY:
            return _fail(
                f"{args.mountpoint}: busy (files are open under it); close them or use --lazy"
            )
        return _fail(f"{args.mountpoint}: umount failed: {e.strerror}")
    if pid is not None:
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            return _fail(
                f"{args.mountpoint}: unmounted, but daemon {pid} is still running (if it "
                f"cannot finish exiting, `kvfs umount --abort` fails what it waits for)"
            )
    return 0


# --- format ------------------------------------------------------------------------------------
def cmd_format(args: argparse.Namespace) -> int:
    import trio

    from kvfs.service import format_layers

    if os.geteuid() != 0:
        return _fail("kvfs format must run as root")
    cfg = config_mod.load(args.config)
    pool_id, catalog = trio.run(functools.partial(format_layers, cfg, force=args.force))
    print(
        f"formatted pool {pool_id}: {len(cfg.pool.namespaces)} namespace(s), stripe unit "
        f"{cfg.pool.stripe_unit}; catalog {catalog}"
    )
    return 0


# --- parsers -----------------------------------------------------------------------------------
def add_parsers(sub) -> None:
    m = sub.add_parser("mount", help="mount kvfs (in the background unless --foreground)")
    m.add_argument("mountpoint")
    m.add_argument("--config", "-c", help="TOML config file (default: the embedded default)")
    m.add_argument(
        "--foreground", "-f", action="store_true", help="stay in the foreground, log to stderr"
    )
    m.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    m.set_defaults(func=cmd_mount)

    u = sub.add_parser("umount", help="unmount kvfs and wait for its daemon to exit")
    u.add_argument("mountpoint")
    u.add_argument("--lazy", "-l", action="store_true", help="detach now even if files are open")
    u.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the daemon")
    u.add_argument(
        "--abort",
        action="store_true",
        help="abort the FUSE connection first: requests still waiting fail (for a "
        "daemon that died, or was killed and cannot finish exiting)",
    )
    u.set_defaults(func=cmd_umount)

    f = sub.add_parser(
        "format", help="initialise a pool (and the local tier) on the configured devices"
    )
    f.add_argument("--config", "-c", help="TOML config file (default: the embedded default)")
    f.add_argument(
        "--force",
        action="store_true",
        help="overwrite existing kvfs pools, other signatures and the catalog",
    )
    f.set_defaults(func=cmd_format)
