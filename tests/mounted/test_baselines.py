"""The baselines the benches compare kvfs with (testing/emulate.py): ext4 on a RAID-0 of the same
devices (dm-stripe where the kernel has device-mapper), else its stand-in, ext4 on one device
limited to the sum of the devices' limits. What a bench reports as `_vs_raid0` is only as good
as this set-up: it must hold the bytes, say which kind it is, and carry the limit it claims."""

from __future__ import annotations

import os

from testing.emulate import Emulation, IoMaxGroup, ext4_on_raid0, raid0_support
from tests.helpers import requires_loops, requires_throttle

MiB = 1 << 20


def _limits(group) -> str:
    name = "io.max" if isinstance(group, IoMaxGroup) else "blkio.throttle.write_bps_device"
    return (group.dir / name).read_text()


@requires_loops
def test_raid0_baseline_holds_the_bytes_and_says_what_it_is(tmp_path):
    with Emulation("512m") as emu, ext4_on_raid0(emu, tmp_path, "r0", 4, 128 * MiB, None) as r:
        data = os.urandom(3 * MiB + 17)
        (r.root / "block").write_bytes(data)
        r.drop()  # read from the device, not the cache
        assert (r.root / "block").read_bytes() == data
        if raid0_support() is None:
            assert r.raid0.startswith("ext4 on dm-stripe") and "4 loop devices" in r.raid0
        else:
            assert r.raid0.startswith("stand-in") and raid0_support() in r.raid0
        assert r.group is None  # unthrottled: no cgroup


@requires_throttle
def test_raid0_baseline_is_limited_as_four_devices_are(tmp_path):
    bps = 50e6
    with Emulation("512m") as emu, ext4_on_raid0(emu, tmp_path, "r0", 4, 128 * MiB, bps) as r:
        limits = _limits(r.group)
        if raid0_support() is None:  # each of the 4 devices at bps
            assert limits.count(str(int(bps))) >= 1 and str(int(4 * bps)) not in limits
        else:  # the stand-in's one device at the sum
            assert (
                f"{r.dev.devno} {int(4 * bps)}" in limits
                or f"{r.dev.devno} rbps={int(4 * bps)}" in limits
            ), limits
        assert r.group.contains(os.getpid())  # this process's I/O meets the limit
