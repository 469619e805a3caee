"""Nothing made durable is ever lost: kill -9 the daemon during writes, remount, verify.

In "close" mode every version whose close() returned is durable. In "fsync" mode (the default)
a version is durable once fsync returned; one only closed may be lost in a crash if it was
closed within the write-back window before the kill (`[mount] writeback_ms` plus the time a
batch takes to write: WINDOW_BOUND_S here, generous for this shared 2-core machine;
bench/torture.py measures the window). Never a partial or garbled file, in either mode."""

import os
import random
import subprocess
import sys
import time

import pytest

from tests.helpers import wait_until
from tests.mounted.crash_writer import content, parse, read_log

pytestmark = pytest.mark.slow

WINDOW_BOUND_S = 2.0


def verify(
    mountpoint, log_path, cycle: int, killed_at: float, durability: str, floor: dict[str, int]
) -> dict:
    """Check the remounted files against the writer's log of `cycle` (killed at `killed_at`)
    and `floor` (each name's version found after the previous cycles; updated). Returns
    {"required": versions that had to survive, "lost_window_s": the oldest close lost}."""
    required = dict(floor)
    closed_late: dict[str, list[tuple[int, float]]] = {}
    n_required = 0
    for n, v, kind, t, c in read_log(log_path):
        if c != cycle:
            continue
        if durability == "close" or kind == "fsync" or t < killed_at - WINDOW_BOUND_S:
            required[n] = max(required.get(n, 0), v)
            n_required += 1
        else:
            closed_late.setdefault(n, []).append((v, t))
    present = {}
    for name in os.listdir(mountpoint):
        data = (mountpoint / name).read_bytes()
        n, v = parse(data)
        assert data == content(n, v), f"{name}: version {v} is partial or garbled"
        if ".tmp" in name:  # a tmp file whose close returned but rename did not happen
            continue
        assert n == name
        present[name] = v
    lost_window = 0.0
    for n, v in required.items():
        assert n in present, f"{n}: durable version {v} was lost"
        assert present[n] >= v, f"{n}: has version {present[n]}, durable {v}"
    for n, closes in closed_late.items():
        for v, t in closes:
            if present.get(n, 0) < v:
                lost_window = max(lost_window, killed_at - t)
    floor.clear()
    floor.update(present)
    return {"required": n_required, "lost_window_s": lost_window}


@pytest.mark.parametrize("durability", ["fsync", "close"])
def test_kill_9_during_writes_loses_nothing_durable(make_mount, pool_config, tmp_path, durability):
    cfg = pool_config(size="512MiB", dram="32MiB", durability=durability)
    log_path = tmp_path / "versions.log"
    m = make_mount(cfg)
    assert m.durability == durability
    rng = random.Random(7)
    floor: dict[str, int] = {}
    for cycle in range(5):
        writer = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.mounted.crash_writer",
                str(m.mountpoint),
                str(log_path),
                str(cycle),
            ],
            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
            stderr=subprocess.DEVNULL,
        )
        # let it make something durable, then kill -9 at an arbitrary moment
        wait_until(
            lambda: any(c == cycle and k == "fsync" for _, _, k, _, c in read_log(log_path)),
            30,
            "a first fsync",
        )
        time.sleep(rng.uniform(0.2, 1.5))
        killed_at = time.time()
        m.kill()
        try:
            writer.wait(30)
        finally:
            if writer.poll() is None:
                writer.kill()
        m.start()
        got = verify(m.mountpoint, log_path, cycle, killed_at, durability, floor)
        assert got["required"] > 0
        if durability == "close":
            assert got["lost_window_s"] == 0.0


_HOLDER = """
import os, sys, threading, time
def write():
    os.write(os.open(sys.argv[1], os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644), b"n" * 300_000)
if sys.argv[2] == "thread-kill":   # another thread opens and writes, and has ended
    t = threading.Thread(target=write)
    t.start()
    t.join()
else:
    write()
print("written", flush=True)
if sys.argv[2] == "exit":
    os._exit(0)             # exits without close(): the kernel closes the file (a close)
time.sleep(600)             # killed here, the file still open
"""


def _run_holder(path, how: str) -> None:
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path), how], stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"written\n"
        if how.endswith("kill"):
            p.kill()
        p.wait(30)
    finally:
        p.stdout.close()
        if p.poll() is None:
            p.kill()
            p.wait()


def test_a_writer_killed_before_close_leaves_no_partial_file(mnt):
    """A writer killed (kill -9, a crash) with its file open has not closed it: the kernel's
    closing of its files must not commit what it had written (the README's promise: absent or
    the previous version, never partial), also after a daemon crash. A writer that exits
    normally without calling close() has closed it (exit closes files): that commits."""
    old = mnt.mountpoint / "old"
    old.write_bytes(b"o" * 5000)
    _run_holder(mnt.mountpoint / "new", "kill")
    _run_holder(old, "kill")
    # the file opened and written by a thread that ended before the process was killed:
    # what the kernel's close tells is who closes it (the last thread, killed), not who
    # opened it (that thread is gone)
    _run_holder(mnt.mountpoint / "by-thread", "thread-kill")
    wait_until(lambda: mnt.stats()["files"]["open_handles"] == 0, 30, "the releases")
    assert not (mnt.mountpoint / "new").exists()
    assert not (mnt.mountpoint / "by-thread").exists()
    assert old.read_bytes() == b"o" * 5000
    _run_holder(mnt.mountpoint / "exited", "exit")
    wait_until(lambda: mnt.stats()["files"]["open_handles"] == 0, 30, "the release")
    assert (mnt.mountpoint / "exited").read_bytes() == b"n" * 300_000
    mnt.sync()  # (closed is not durable in "fsync" mode: syncfs makes it so)
    mnt.kill()
    mnt.start()
    assert not (mnt.mountpoint / "new").exists()
    assert not (mnt.mountpoint / "by-thread").exists()
    assert old.read_bytes() == b"o" * 5000
    assert (mnt.mountpoint / "exited").read_bytes() == b"n" * 300_000
