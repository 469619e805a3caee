"""Bad input at start-up gets a one-line error and a non-zero exit, and creates nothing."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvfs import config, daemon
from kvfs.errors import StartupError
from tests.helpers import ROOT, can_mount, is_mounted

pytestmark = pytest.mark.skipif(can_mount() is not None, reason=str(can_mount()))


def kvfs(*args: str, user: int | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "kvfs", *args]
    if user is not None:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=60)


def assert_one_line_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode != 0
    err = r.stderr.strip()
    assert err.count("\n") == 0, err
    assert err.startswith("kvfs: ")
    for n in needles:
        assert n in err, err


def nothing_created(tmp_path: Path) -> None:
    assert not (tmp_path / "state").exists()
    assert not list(tmp_path.glob("ns*.img"))


def test_malformed_config(tmp_path):
    (tmp_path / "mnt").mkdir()
    bad = tmp_path / "bad.toml"
    bad.write_text(f'state_dir = "{tmp_path}/state"\n[pool]\nevict = "sometimes"\n')
    r = kvfs("mount", str(tmp_path / "mnt"), "--config", str(bad))
    assert_one_line_error(r, "pool.evict")
    nothing_created(tmp_path)


def test_missing_and_busy_mountpoint(tmp_path, pool_config):
    cfg = pool_config()
    r = kvfs("mount", str(tmp_path / "nope"), "--config", str(cfg))
    assert_one_line_error(r, "does not exist")
    busy = tmp_path / "busy"
    busy.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(busy)], check=True)
    try:
        r = kvfs("mount", str(busy), "--config", str(cfg))
        assert_one_line_error(r, "busy")
    finally:
        subprocess.run(["umount", str(busy)], check=True)
    nothing_created(tmp_path)


def test_unwritable_state_dir(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    (tmp_path / "mnt").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(ro)], check=True)
    try:
        cfg = tmp_path / "k.toml"
        cfg.write_text(
            f'state_dir = "{ro}/state"\n[[pool.namespace]]\npath = "{tmp_path}/ns0.img"\n'
            f'size = "64MiB"\n'
        )
        r = kvfs("mount", str(tmp_path / "mnt"), "--config", str(cfg))
        assert_one_line_error(r, "state_dir", "not writable")
    finally:
        subprocess.run(["umount", str(ro)], check=True)
    assert not list(tmp_path.glob("ns*.img"))


def test_not_root(tmp_path, pool_config):
    cfg = pool_config()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    os.chmod(tmp_path, 0o755)
    r = kvfs("mount", str(mnt), "--config", str(cfg), "--foreground", user=65534)
    assert_one_line_error(r, "must run as root")
    nothing_created(tmp_path)


def test_no_dev_fuse(tmp_path, pool_config, monkeypatch):
    # /dev/fuse cannot be removed from under the test run: check the same code path in-process
    cfg = config.load(pool_config())
    (tmp_path / "mnt").mkdir()
    monkeypatch.setattr(daemon, "FUSE_DEVICE", str(tmp_path / "no-fuse"))
    with pytest.raises(StartupError) as e:
        daemon.preflight(cfg, tmp_path / "mnt")
    assert "no FUSE" in str(e.value) and e.value.errno == errno.ENODEV
    nothing_created(tmp_path)


def test_stale_mount_is_explained(make_mount, pool_config, tmp_path):
    m = make_mount(pool_config())
    m.proc.kill()
    m.proc.wait()
    try:
        r = kvfs("mount", str(m.mountpoint), "--config", str(m.config))
        assert_one_line_error(r, "stale mount", "umount")
    finally:
        m.kill()


def test_second_daemon_on_the_same_state_dir(make_mount, pool_config, tmp_path):
    cfg = pool_config()
    make_mount(cfg)
    other = tmp_path / "other"
    other.mkdir()
    r = kvfs("mount", str(other), "--config", str(cfg))
    assert_one_line_error(r, "in use by another kvfs daemon")
    assert not is_mounted(other)


def test_a_detached_loop_namespace_is_a_one_line_error(tmp_path, make_mount):
    """losetup -d while kvfs holds the device only takes effect at unmount (the kernel defers
    it); the next mount then finds a device node with no device (ENXIO): one line naming the
    namespace, not a traceback. Attaching the same file again brings everything back."""
    from testing.emulate import Emulation, available

    if available(throttle=False):
        pytest.skip(available(throttle=False))
    from kvfs.cli import main as kvfs_main
    from tests.helpers import write_config

    with Emulation("512m") as emu:
        devs = [emu.loop(f"d{i}", 64 << 20) for i in range(2)]
        cfg = write_config(
            tmp_path / "k.toml", tmp_path / "state", [{"path": d.path} for d in devs]
        )
        assert kvfs_main(["format", "--config", str(cfg)]) == 0
        m = make_mount(cfg)
        (m.mountpoint / "f").write_bytes(b"x" * (3 << 20))
        devs[1].detach()
        assert (m.mountpoint / "f").read_bytes() == b"x" * (3 << 20)  # still attached here
        assert m.stop() == 0
        (tmp_path / "mnt2").mkdir()
        r = kvfs("mount", str(tmp_path / "mnt2"), "--config", str(cfg))
        assert_one_line_error(r, f"namespace {devs[1].path}", "is it attached?")
        subprocess.run(["losetup", devs[1].path, str(devs[1].backing)], check=True)
        m.start()
        assert (m.mountpoint / "f").read_bytes() == b"x" * (3 << 20)
