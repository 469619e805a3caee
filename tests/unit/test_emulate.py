"""The device throttles of testing/emulate.py, on directories laid out like each cgroup version
(this machine's cgroup v2 hierarchy has no io controller, so io.max is checked here against a
copy of its layout; on a machine that has one, the mounted tests throttle through it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testing.emulate import BlkioGroup, IoMaxGroup, throttle_support


class Dev:
    devno = "7:3"


def v2_root(tmp_path: Path, controllers: str) -> Path:
    root = tmp_path / "unified"
    root.mkdir()
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("\n")
    (root / "cgroup.procs").write_text("")
    return root


def v1_blkio(tmp_path: Path) -> Path:
    blkio = tmp_path / "blkio"
    blkio.mkdir()
    (blkio / "blkio.throttle.read_bps_device").write_text("")
    (blkio / "cgroup.procs").write_text("")
    return blkio


def test_the_kind_of_throttle_is_chosen_at_run_time(tmp_path):
    absent = tmp_path / "absent"
    v2 = v2_root(tmp_path, "cpuset cpu io memory pids")
    v1 = v1_blkio(tmp_path)
    assert throttle_support(blkio=v1, v2_roots=[v2], choice="auto") == ("v1", str(v1))
    assert throttle_support(blkio=v1, v2_roots=[v2], choice="v2") == ("v2", str(v2))
    assert throttle_support(blkio=absent, v2_roots=[v2], choice="auto") == ("v2", str(v2))
    kind, why = throttle_support(blkio=v1, v2_roots=[v2], choice="none")
    assert kind is None and "KVFS_THROTTLE=none" in why
    (v2 / "cgroup.controllers").write_text("hugetlb\n")  # like this machine's
    kind, why = throttle_support(blkio=absent, v2_roots=[v2], choice="auto")
    assert kind is None
    assert "no cgroup v1 blkio" in why and "no io controller" in why and "hugetlb" in why
    kind, why = throttle_support(blkio=absent, v2_roots=[absent], choice="auto")
    assert kind is None and "no cgroup v2 hierarchy" in why


def test_an_unknown_throttle_name_is_an_error_not_a_skip(tmp_path):
    with pytest.raises(ValueError, match="KVFS_THROTTLE='v3'"):
        throttle_support(blkio=tmp_path, v2_roots=[tmp_path], choice="v3")


def test_cgroup_v2_is_chosen_only_when_io_can_be_enabled_below_its_root(tmp_path):
    v2 = v2_root(tmp_path, "cpu io memory")
    absent = tmp_path / "absent"
    (v2 / "cgroup.subtree_control").write_text("")
    assert throttle_support(blkio=absent, v2_roots=[v2], choice="v2") == ("v2", str(v2))
    assert (v2 / "cgroup.subtree_control").read_text() == "+io\n"  # enabled
    (v2 / "cgroup.subtree_control").unlink()
    (v2 / "cgroup.subtree_control").mkdir()  # a write that fails, as EBUSY would
    kind, why = throttle_support(blkio=absent, v2_roots=[v2], choice="v2")
    assert kind is None and "cannot be enabled" in why and "+io" in why


def test_io_max_limits_a_device_in_its_own_group(tmp_path):
    root = v2_root(tmp_path, "io memory")
    g = IoMaxGroup("bench-1", root)
    assert (root / "cgroup.subtree_control").read_text() == "+io\n"  # io enabled below
    g.limit(Dev(), read_bps=200e6, write_bps=1e9)
    assert (
        root / "bench-1" / "io.max"
    ).read_text() == "7:3 rbps=200000000 wbps=1000000000 riops=max wiops=max\n"
    g.limit(Dev(), read_iops=20000)
    assert (
        root / "bench-1" / "io.max"
    ).read_text() == "7:3 rbps=max wbps=max riops=20000 wiops=max\n"
    g.add(4242)
    assert (root / "bench-1" / "cgroup.procs").read_text() == "4242\n"
    g.release(4242)
    assert (root / "cgroup.procs").read_text() == "4242\n"


def test_blkio_limits_a_device_in_its_own_group(tmp_path):
    blkio = v1_blkio(tmp_path)
    g = BlkioGroup("bench-1", blkio)
    g.limit(Dev(), read_bps=200e6, write_bps=1e9)
    d = blkio / "bench-1"
    assert (d / "blkio.throttle.read_bps_device").read_text() == "7:3 200000000\n"
    assert (d / "blkio.throttle.write_bps_device").read_text() == "7:3 1000000000\n"
    assert (d / "blkio.throttle.read_iops_device").read_text() == "7:3 0\n"
    g.add(4242)
    assert (d / "cgroup.procs").read_text() == "4242\n"


def test_raid0_support_asks_the_kernel_not_the_device_node(tmp_path, monkeypatch):
    """`dmsetup` makes /dev/mapper/control on first use even where the kernel has no
    device-mapper (then every bench with a RAID-0 baseline died instead of using the
    stand-in): /proc/misc says whether the driver is there."""
    import shutil

    from testing.emulate import raid0_support

    monkeypatch.setattr(shutil, "which", lambda name: f"/sbin/{name}")
    misc = tmp_path / "misc"
    misc.write_text(" 229 fuse\n 237 loop-control\n")
    assert "no device-mapper" in raid0_support(misc)
    misc.write_text(" 229 fuse\n 236 device-mapper\n")
    assert raid0_support(misc) is None
    assert "cannot ask" in raid0_support(tmp_path / "absent")
