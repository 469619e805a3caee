"""A namespace removed from the pool, and one added, while mounted (`kvfs pool`: issue 58),
on loop devices, through a real mount: what goes, what stays bit-exact, what a restart
finds."""

from __future__ import annotations

import errno
import json
import os
import time

import pytest

from bench.faults import formatted, namespaces_of, start
from kvfs.cli import main as kvfs_main
from testing.emulate import Emulation
from tests.helpers import requires_loops

pytestmark = pytest.mark.slow

KiB, MiB = 1 << 10, 1 << 20


def _blocks() -> dict[str, bytes]:
    out = {f"s{i}": os.urandom(200 * KiB + i) for i in range(9)}  # one unit: one namespace
    out.update({f"b{i}": os.urandom(1 * MiB + 4096 * i) for i in range(3)})  # striped
    return out


def _pool(capsys, *argv: str) -> tuple[int, str, str]:
    code = kvfs_main(["pool", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _exact(mnt, blocks: dict[str, bytes], names) -> list[str]:
    return [n for n in names if (mnt / n).read_bytes() != blocks[n]]


@requires_loops
def test_a_lost_namespace_is_removed_and_the_pool_goes_on(tmp_path, capsys):
    """Namespace 1 of 3 ends (I/O past 1 MiB fails, as on a path that is gone): once reads
    there have failed, `kvfs pool remove` takes it out without --drop, its files are
    misses (ENOENT) at once, the others read bit-exact, new files avoid it, and a restart
    with the device gone entirely (still listed in the config) serves the same."""
    with Emulation("1g") as emu:
        devs = [emu.loop(f"ns{i}", 64 * MiB) for i in range(3)]
        cfg = formatted(tmp_path, [d.path for d in devs], pool='stripe_unit = "256KiB"')
        m = start(tmp_path, cfg)
        try:
            mnt = m.mountpoint
            blocks = _blocks()
            for name, data in blocks.items():
                (mnt / name).write_bytes(data)
            m.sync()
            on1 = {n for n in blocks if 1 in namespaces_of(mnt / n)}
            assert on1 and len(on1) < len(blocks)
            # healthy and holding blocks: refused, one line, nothing changed
            code, _, err = _pool(capsys, "remove", str(mnt), "1")
            assert code == 1 and err.count("\n") == 1 and "still reads" in err, err
            assert "--drop" in err and m.stats()["namespaces"][1]["state"] == "ok"

            devs[1].end_at(1 * MiB)
            m.drop_caches()
            for n in sorted(on1):  # the engine's loads find out: misses
                with pytest.raises(OSError) as e:
                    (mnt / n).read_bytes()
                assert e.value.errno in (errno.ENOENT, errno.EIO)
            assert m.stats()["namespaces"][1]["read_state"] == "failed"

            code, out, err = _pool(capsys, "remove", "--json", str(mnt), "1")
            assert code == 0, err
            res = json.loads(out)
            assert res["removed"] == 1 and res["dropped_files"] == len(on1), res
            t = time.monotonic()
            for n in on1:
                assert not (mnt / n).exists()
            assert time.monotonic() - t < 1.0
            rest = sorted(set(blocks) - on1)
            m.drop_caches()
            assert _exact(mnt, blocks, rest) == []
            code, out, _ = _pool(capsys, "show", "--json", str(mnt))
            assert [ns["state"] for ns in json.loads(out)] == ["ok", "removed", "ok"]
            code, out, _ = _pool(capsys, "show", str(mnt))
            assert "removed" in out.splitlines()[2]
            for i in range(6):  # new blocks: on the other two only
                (mnt / f"new{i}").write_bytes(os.urandom(1 * MiB))
                assert 1 not in namespaces_of(mnt / f"new{i}")
            m.sync()
            # again: refused, the namespace is not there to remove
            code, _, err = _pool(capsys, "remove", str(mnt), "1")
            assert code == 1 and "removed already" in err
        finally:
            m.stop()
        devs[1].detach()  # gone for good; the config still lists it
        m = start(tmp_path, cfg)
        try:
            mnt = m.mountpoint
            assert sorted(os.listdir(mnt)) == sorted([*rest, *(f"new{i}" for i in range(6))])
            assert _exact(mnt, blocks, rest) == []
            assert [ns["state"] for ns in m.stats()["namespaces"]] == ["ok", "removed", "ok"]
            (mnt / "after").write_bytes(os.urandom(1 * MiB))
            assert 1 not in namespaces_of(mnt / "after")
        finally:
            m.stop()


@requires_loops
def test_a_namespace_added_while_mounted_takes_new_blocks_and_stays(tmp_path, capsys):
    """`kvfs pool add` formats a new device as namespace 2 and placement uses it at once; a
    device with a file system on it is refused unless --force; a restart with the config
    unchanged opens it from the catalog's record; a healthy namespace removed with --drop
    loses exactly its files."""
    with Emulation("1g") as emu:
        devs = [emu.loop(f"ns{i}", 64 * MiB) for i in range(3)]
        cfg = formatted(tmp_path, [d.path for d in devs[:2]], pool='stripe_unit = "256KiB"')
        m = start(tmp_path, cfg)
        try:
            mnt = m.mountpoint
            blocks = _blocks()
            for name, data in list(blocks.items())[:6]:
                (mnt / name).write_bytes(data)
            code, _, err = _pool(capsys, "add", str(mnt), "relative/path")
            assert code == 1 and "absolute path" in err
            os.system(f"mkfs.ext4 -q -F {devs[2].path} >/dev/null 2>&1")
            code, _, err = _pool(capsys, "add", str(mnt), devs[2].path)
            assert code == 1 and "ext2/3/4" in err and err.count("\n") == 1, err
            code, out, err = _pool(capsys, "add", "--json", "--force", str(mnt), devs[2].path)
            assert code == 0, err
            assert json.loads(out)["added"] == 2
            for name, data in list(blocks.items())[6:]:
                (mnt / name).write_bytes(data)
            m.sync()
            assert any(2 in namespaces_of(mnt / n) for n in list(blocks)[6:])
            m.drop_caches()
            assert _exact(mnt, blocks, blocks) == []
        finally:
            m.stop()
        m = start(tmp_path, cfg)  # the config still lists two
        try:
            mnt = m.mountpoint
            assert len(m.stats()["namespaces"]) == 3
            assert _exact(mnt, blocks, blocks) == []
            on0 = {n for n in blocks if 0 in namespaces_of(mnt / n)}
            code, out, err = _pool(capsys, "remove", "--drop", "--json", str(mnt), "0")
            assert code == 0, err
            assert json.loads(out)["dropped_files"] == len(on0)
            assert sorted(os.listdir(mnt)) == sorted(set(blocks) - on0)
            m.drop_caches()
            assert _exact(mnt, blocks, set(blocks) - on0) == []
        finally:
            m.stop()


def test_a_direct_client_connected_before_an_add_reads_and_writes_the_new_namespace(
    make_mount, pool_config, tmp_path, capsys
):
    """kvfs.client.direct learns the namespaces' paths when it connects; a namespace added
    after that is learned when a block first names it (one short-lived connection), for
    reads and for writes, without reconnecting its own."""
    import numpy as np

    import kvfs.client.direct as kd

    m = make_mount(pool_config(n=2, size="64MiB", pool='stripe_unit = "256KiB"'))
    mnt = m.mountpoint
    with kd.Direct(str(mnt), verify=True) as d:
        (mnt / "before").write_bytes(os.urandom(1 * MiB))
        buf = np.empty(1 * MiB, dtype=np.uint8)
        d.read_many([str(mnt / "before")], [buf])  # (connected: two namespaces)
        code, _, err = _pool(capsys, "add", str(mnt), str(tmp_path / "ns2.img"), "--size", "64MiB")
        assert code == 0, err
        data = {f"w{i}": os.urandom(1 * MiB + 4096 * i) for i in range(4)}
        d.write_many(
            [str(mnt / n) for n in data], [np.frombuffer(v, np.uint8) for v in data.values()]
        )
        assert any(2 in namespaces_of(mnt / n) for n in data)  # written there by the client
        for n, v in data.items():
            assert (mnt / n).read_bytes() == v
        more = {f"m{i}": os.urandom(1 * MiB + i) for i in range(4)}
        for n, v in more.items():
            (mnt / n).write_bytes(v)
        m.sync()
        assert any(2 in namespaces_of(mnt / n) for n in more)
        bufs = [np.empty(len(v), dtype=np.uint8) for v in more.values()]
        d.read_many([str(mnt / n) for n in more], bufs)
        assert [b.tobytes() for b in bufs] == list(more.values())
