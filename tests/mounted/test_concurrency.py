"""Blocking disk I/O never runs on the trio thread: one slow read must not stall the others."""

from __future__ import annotations

import os
import threading

from testing.emulate import Emulation
from tests.helpers import requires_throttle, wait_until, write_config

MiB = 1 << 20
pytestmark = requires_throttle


def test_a_slow_cold_read_does_not_stall_other_requests(make_mount, tmp_path):
    with Emulation("1g") as emu:
        dev = emu.loop("slow", 256 * MiB)
        cfg = write_config(
            tmp_path / "k.toml", tmp_path / "state", [{"path": dev.path}], dram="128MiB"
        )
        from kvfs.cli import main as kvfs_main

        assert kvfs_main(["format", "--config", str(cfg)]) == 0
        m = make_mount(cfg)
        big, small = m.mountpoint / "big", m.mountpoint / "small"
        big.write_bytes(os.urandom(24 * MiB))
        small.write_bytes(b"s" * 4096)
        m.drop_caches()
        small.read_bytes()  # resident again
        group = emu.cgroup("kvfs-test")
        # the cold read crawls (24 MiB at 256 KiB/s: minutes) until the small requests are
        # done: it cannot finish first, however slow the machine (no race on time)
        group.limit(dev, read_bps=256 << 10)
        group.add(m.pid)
        done = threading.Event()

        def cold_read() -> None:
            with open(big, "rb", buffering=0) as f:
                while f.read(MiB):
                    pass
            done.set()

        def fetches() -> int:  # counted when a fetch starts (its first I/O, of 4 MiB, takes
            # 16 s at this rate: the namespaces count bytes once an I/O ends)
            return m.stats()["store"]["fetches"]

        before = fetches()
        t = threading.Thread(target=cold_read)
        t.start()
        wait_until(lambda: fetches() > before or done.is_set(), 30, "the cold read to start")
        served = 0
        while not done.is_set() and served < 10:
            os.stat(small)
            os.listdir(m.mountpoint)
            with open(small, "rb") as f:
                assert f.read() == b"s" * 4096
            served += 1
        still_reading = not done.is_set()
        group.limit(dev)  # unthrottled: the cold read completes
        t.join(60)
        group.remove()
        assert still_reading and served == 10, "small requests waited behind the slow read"
        assert done.is_set(), "the cold read did not complete once unthrottled"
