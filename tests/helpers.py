"""Helpers shared by the test levels: config files, a real mount, polling with deadlines."""

from __future__ import annotations

import os

import pytest

# (re-exported: the tests import them from here)
from testing.mount import ROOT, is_mounted, wait_until, write_config  # noqa: F401
from testing.mount import MountedKvfs as Mount  # noqa: F401

MiB = 1 << 20


def can_mount() -> str | None:
    """None if this machine can run FUSE mounts, else why not."""
    if os.geteuid() != 0:
        return "needs root"
    if not os.path.exists("/dev/fuse"):
        return "needs /dev/fuse"
    return None


requires_mount = pytest.mark.skipif(can_mount() is not None, reason=str(can_mount()))


def _emulation(throttle: bool) -> str | None:
    from testing.emulate import available

    return available(throttle=throttle)


# Tests on emulated namespaces: loop devices alone, or loop devices throttled by a cgroup (v1
# blkio or v2 io.max, whichever the machine has; testing/emulate.py). Each says why it skips.
requires_loops = pytest.mark.skipif(_emulation(False) is not None, reason=str(_emulation(False)))
requires_throttle = pytest.mark.skipif(_emulation(True) is not None, reason=str(_emulation(True)))
