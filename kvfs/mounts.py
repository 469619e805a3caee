"""Where kvfs is mounted: the mount that holds a path, read from /proc/self/mountinfo.

The `kvfs` command and the engines' integrations (kvfs/integrations/) both need it; it imports
nothing of either, so an integration loads no command-line code.
"""

from __future__ import annotations

import errno
import os

from kvfs.errors import KvfsError

FSTYPE = "fuse.kvfs"


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
