"""Where kvfs is mounted: the mount that holds a path, read from /proc/self/mountinfo.

The `kvfs` command and the engines' integrations (kvfs/client/*_backend.py, vllm_tier.py) both
need it; it imports nothing of either, so an integration loads no command-line code.
"""

from __future__ import annotations

import errno
import os
import subprocess

from kvfs.errors import KvfsError

FSTYPE = "fuse.kvfs"
FUSECTL = "/sys/fs/fuse/connections"


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
                found = {
                    "dev": fields[2],
                    "mountpoint": point,
                    "fstype": rfields[0],
                    "source": rfields[1] if len(rfields) > 1 else "",
                }
    return found  # the last entry wins: it is the one on top


def abort_connection(dev: str) -> bool:
    """Abort the FUSE connection of the mount whose mountinfo device is `dev` ("0:53"): every
    request waiting for its daemon fails, and every later one, as when the daemon's /dev/fuse
    is closed. False if there is no such connection (any more).

    Needed where a daemon cannot finish dying: a thread of it blocked in the kernel on an entry
    invalidation (which takes the directory's lock) while a lookup in that directory, holding
    the lock, waits for the daemon's answer. No answer ever comes, so the thread never returns,
    the process never closes /dev/fuse, and the connection is never aborted by itself."""
    major, minor = (int(x) for x in dev.split(":"))
    name = str(major << 20 | minor)  # the kernel's dev_t, as fusectl names connections
    if not os.path.exists(os.path.join(FUSECTL, name)) and not os.path.ismount(FUSECTL):
        subprocess.run(
            ["mount", "-t", "fusectl", "none", FUSECTL], capture_output=True, check=False
        )
    try:
        with open(os.path.join(FUSECTL, name, "abort"), "w") as f:
            f.write("1")
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def mounts() -> list[tuple[str, str]]:
    """Every mount of this process's namespace: (mount point, file system type), in order."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            point = left.split()[4].encode().decode("unicode_escape")
            out.append((point, right.split()[0]))
    return out


def find_mount(path: str) -> str:
    """The kvfs mount point that holds `path`; a KvfsError naming the path otherwise."""
    real = os.path.realpath(path) if os.path.lexists(path) else os.path.abspath(path)
    best = None
    for point, fstype in mounts():
        if real == point or real.startswith(point.rstrip("/") + "/"):
            if best is None or len(point) >= len(best[0]):
                best = (point, fstype)
    if best is None or best[1] != FSTYPE:
        if not os.path.exists(path) and best is None:
            raise KvfsError(errno.ENOENT, f"no such file or directory: {path}")
        raise KvfsError(errno.EINVAL, f"not a kvfs mount: {path}")
    return best[0]
