"""Nothing committed is ever lost: kill -9 the daemon during writes, remount, verify."""

import os
import random
import subprocess
import sys
import time

import pytest

from tests.helpers import wait_until
from tests.mounted.crash_writer import content, parse

pytestmark = pytest.mark.slow


def verify(mountpoint, log_path) -> int:
    logged: dict[str, int] = {}
    if log_path.exists():
        for line in log_path.read_text().splitlines():
            n, v = line.split()
            logged[n] = max(logged.get(n, 0), int(v))
    present = {}
    for name in os.listdir(mountpoint):
        data = (mountpoint / name).read_bytes()
        if ".tmp" in name:       # a tmp file whose close returned but rename did not happen
            n, v = parse(data)
            assert data == content(n, v), f"{name}: partial or garbled tmp file"
            continue
        n, v = parse(data)
        assert n == name
        assert data == content(n, v), f"{name}: version {v} is partial or garbled"
        present[name] = v
    for n, v in logged.items():
        assert n in present, f"{n}: committed version {v} was lost"
        assert present[n] >= v, f"{n}: has version {present[n]}, committed {v}"
    return len(logged)


def test_kill_9_during_writes_loses_nothing_committed(make_mount, pool_config, tmp_path):
    cfg = pool_config(size="512MiB", dram="32MiB")
    log_path = tmp_path / "committed.log"
    m = make_mount(cfg)
    rng = random.Random(7)
    for cycle in range(5):
        writer = subprocess.Popen([sys.executable, "-m", "tests.mounted.crash_writer",
                                   str(m.mountpoint), str(log_path), str(cycle)],
                                  cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
                                  stderr=subprocess.DEVNULL)
        # let it commit something, then kill -9 at an arbitrary moment
        wait_until(lambda: log_path.exists() and log_path.stat().st_size > 0, 30, "first commit")
        time.sleep(rng.uniform(0.2, 1.5))
        m.kill()
        try:
            writer.wait(30)
        finally:
            if writer.poll() is None:
                writer.kill()
        m.start()
        n = verify(m.mountpoint, log_path)
        assert n > 0


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
    mnt.kill()
    mnt.start()
    assert not (mnt.mountpoint / "new").exists()
    assert not (mnt.mountpoint / "by-thread").exists()
    assert old.read_bytes() == b"o" * 5000
    assert (mnt.mountpoint / "exited").read_bytes() == b"n" * 300_000
