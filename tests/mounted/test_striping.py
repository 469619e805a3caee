"""Striping through a real mount on emulated namespaces (loop devices, cgroup throttles: v1 blkio
or v2 io.max)."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os

import pytest

from kvfs.cli import main as kvfs_main
from testing.emulate import Emulation
from tests.helpers import requires_loops, requires_throttle, write_config

MiB = 1 << 20


def formatted(tmp_path, devs, **kw):
    cfg = write_config(
        tmp_path / "k.toml", tmp_path / "state", [{"path": d.path} for d in devs], **kw
    )
    with contextlib.redirect_stdout(io.StringIO()):
        assert kvfs_main(["format", "--config", str(cfg)]) == 0
    return cfg


@requires_throttle
def test_cold_read_streams_first_bytes_before_the_whole_block(make_mount, tmp_path):
    """Without FUSE passthrough (the daemon serves reads) a cold read returns once the units
    it covers have arrived, while the rest keep streaming. (A passthrough open fetches the
    whole block before it returns: see test_passthrough_open_fetches_in_parallel.)"""
    with Emulation("1g") as emu:
        devs = [emu.loop(f"s{i}", 128 * MiB) for i in range(4)]
        m = make_mount(formatted(tmp_path, devs, dram="128MiB", mount="passthrough = false"))
        assert not m.passthrough
        data = os.urandom(32 * MiB)
        (m.mountpoint / "blk.pt").write_bytes(data)
        m.drop_caches()
        group = emu.cgroup("kvfs-stream")
        for d in devs:
            # the whole block takes ~4 s: what has arrived when the first read returns says
            # whether it waited for the block (a count of bytes, not a race on time)
            group.limit(d, read_bps=2 * MiB)
        group.add(m.pid)
        try:
            with open(m.mountpoint / "blk.pt", "rb", buffering=0) as f:
                first = f.read(MiB)
                fetched_then = m.stats()["store"]["bytes_from_pool"]
                for d in devs:
                    group.limit(d)  # then unthrottled: the rest streams on
                rest = f.read()
        finally:
            group.remove()
        assert first + rest == data
        assert fetched_then < 16 * MiB, f"the first read waited for {fetched_then} bytes"


@requires_loops  # loop devices only: no throttle
def test_a_failing_namespace_fails_only_the_io_that_touches_it(make_mount, tmp_path):
    with Emulation("1g") as emu:
        devs = [emu.loop(f"f{i}", 96 * MiB) for i in range(3)]
        m = make_mount(formatted(tmp_path, devs))
        striped = os.urandom(8 * MiB)  # units on every namespace
        (m.mountpoint / "striped.pt").write_bytes(striped)
        singles, on_ns1 = {}, set()
        for i in range(6):  # one unit each, rotating
            singles[f"s{i}"] = os.urandom(4096)
            (m.mountpoint / f"s{i}").write_bytes(singles[f"s{i}"])
            lay = json.loads(os.getxattr(m.mountpoint / f"s{i}", "user.kvfs.layout"))
            if any(ns == 1 for ns, _ in lay["unit_map"]):
                on_ns1.add(f"s{i}")
        assert 0 < len(on_ns1) < len(singles)  # both kinds, by the rotation
        devs[1].shrink_to(MiB)  # namespace 1 "goes away"
        m.drop_caches()
        # a block it cannot bring in is absent for an open that fetches it (passthrough:
        # ENOENT, an engine's miss); a read through the daemon fails with EIO
        gone = errno.ENOENT if m.stats()["data_path"]["passthrough"] else errno.EIO
        with pytest.raises(OSError) as e:
            (m.mountpoint / "striped.pt").read_bytes()
        assert e.value.errno == gone
        st = m.stats()
        assert st["namespaces"][1]["state"] == "failed"
        assert st["namespaces"][0]["state"] == "ok" and st["namespaces"][2]["state"] == "ok"
        assert "marking the namespace failed" in m.log_text()
        for name, d in singles.items():
            if name in on_ns1:  # its unit is gone: no bytes
                with pytest.raises(OSError) as err:
                    (m.mountpoint / name).read_bytes()
                # (once namespace 1 is failed for reads even a plain open answers ENOENT)
                assert err.value.errno in (gone, errno.ENOENT), name
            else:  # the others read bit-exact
                assert (m.mountpoint / name).read_bytes() == d, name
        fresh = os.urandom(6 * MiB)  # new blocks avoid the failed namespace
        (m.mountpoint / "fresh.pt").write_bytes(fresh)
        m.drop_caches()
        assert (m.mountpoint / "fresh.pt").read_bytes() == fresh
        assert os.listdir(m.mountpoint)  # metadata is served throughout


@pytest.mark.slow
@requires_throttle
def test_adaptive_placement_learns_a_throttled_namespace(make_mount, tmp_path):
    """Adaptive placement on real (throttled) devices, not only on fake namespaces: with one
    namespace at a quarter of the others' bandwidth, the pool learns a lower weight for it and
    places fewer units there, and everything still reads back bit-exact.

    The devices are slow (20 and 5 MB/s) so that their throttles, not the CPU, set how fast
    they are: at 40 and 10 MB/s, with the 2-vCPU machine busy, the loop devices' copying
    slowed the fast namespaces too and the pool rightly learned a ratio of 0.4-0.6, not 0.25."""
    with Emulation("1g") as emu:
        devs = [emu.loop(f"a{i}", 96 * MiB) for i in range(4)]
        m = make_mount(formatted(tmp_path, devs, dram="32MiB", pool='stripe_unit = "256KiB"'))
        group = emu.cgroup("kvfs-adaptive")
        for i, d in enumerate(devs):
            bps = 5e6 if i == 3 else 20e6
            group.limit(d, read_bps=bps, write_bps=bps)
        group.add(m.pid)
        try:
            blocks = {}
            for i in range(33):  # 16 units each, written back to back
                if i == 32:
                    # a block placed with the weights learned from the others (a block's
                    # placement is chosen when its writing starts)
                    w = m.stats()["tiers"]["pool"]["placement_weights"]
                blocks[f"b{i}"] = os.urandom(4 * MiB)
                (m.mountpoint / f"b{i}").write_bytes(blocks[f"b{i}"])
            layout = json.loads(os.getxattr(m.mountpoint / "b32", "user.kvfs.layout"))
        finally:
            group.remove()
        assert w[3] < 0.6 * min(w[:3]), w
        per_ns = [0] * 4
        for unit in layout["unit_map"]:
            per_ns[unit[0]] += 1
        assert per_ns[3] < min(per_ns[:3]), (per_ns, w)
        m.drop_caches()
        for name, data in blocks.items():
            assert (m.mountpoint / name).read_bytes() == data
