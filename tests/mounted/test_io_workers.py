"""Cold loads of large blocks by the I/O worker processes (kvfs/pool/io_workers.py), through a
real mount: bit-exact, and a worker killed in the middle of loads loses nothing."""

from __future__ import annotations

import os
import random
import signal
import threading

import pytest

from testing.emulate import family
from testing.mount import wait_until

MiB = 1 << 20


def content(name: str, size: int) -> bytes:
    return random.Random(name).randbytes(size)


def workers(m) -> dict:
    return m.stats()["tiers"]["pool"]["io_workers"] or {}


def stored_cold(m, prefix: str, n: int) -> list[str]:
    """n blocks of 4 MiB stored, durable, and dropped from the DRAM tier: their names."""
    names = [f"{prefix}{i}" for i in range(n)]
    for name in names:
        (m.mountpoint / name).write_bytes(content(name, 4 * MiB))
    m.control("flush")
    m.control("drop_dram")
    return names


@pytest.fixture
def mounted(make_mount, pool_config):
    # (io_workers named: on in the second pass of `make test` too, which turns them off)
    m = make_mount(pool_config(n=2, dram="128MiB", pool="io_workers = 1"))
    if m.stats()["data_path"]["memory"] != "tmpfs, huge pages":
        pytest.skip("block memory has no huge pages here: the workers take no fetch")
    wait_until(lambda: workers(m)["live"], what="an I/O worker")
    return m


def test_cold_loads_of_large_blocks_are_read_by_the_workers(mounted):
    m, d = mounted, mounted.mountpoint
    names = stored_cold(m, "b", 6)
    w0 = workers(m)
    (pid,) = w0["live"]
    assert pid in family(m.pid)  # the daemon's own child
    for n in names:
        assert (d / n).read_bytes() == content(n, 4 * MiB)
    w1 = workers(m)
    assert w1["reads"] - w0["reads"] >= len(names)
    assert w1["batches"] > w0["batches"] and w1["lost"] == 0 and w1["restarts"] == 0


def test_a_worker_killed_in_the_middle_of_loads_loses_nothing(mounted):
    """The worker is stopped while it holds every load's read, then killed: the daemon reads
    them again itself, each reader gets its bytes, a new worker starts, the mount serves on."""
    m, d = mounted, mounted.mountpoint
    names = stored_cold(m, "k", 8)
    before = workers(m)
    (pid,) = before["live"]
    os.kill(pid, signal.SIGSTOP)
    got: dict[str, bytes] = {}
    errors: list[BaseException] = []

    def read(n: str) -> None:
        try:
            got[n] = (d / n).read_bytes()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=read, args=(n,)) for n in names]
    for t in threads:
        t.start()
    try:  # every load has given the worker a read it will not answer
        wait_until(
            lambda: workers(m)["reads"] - before["reads"] >= len(names),
            what="reads queued to the stopped worker",
        )
    finally:
        os.kill(pid, signal.SIGKILL)
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert got == {n: content(n, 4 * MiB) for n in names}
    after = workers(m)
    assert after["restarts"] == 1 and after["lost"] >= len(names)
    wait_until(lambda: workers(m)["live"], what="a new I/O worker")
    assert workers(m)["live"] != [pid]
    m.control("drop_dram")  # and the new worker takes the next loads
    for n in names:
        assert (d / n).read_bytes() == content(n, 4 * MiB)
    assert workers(m)["reads"] > after["reads"]
