"""A pool whose catalog is spread over three Redis shards, through real mounts: the shards
bench (bench/redis_shards.py) at a tiny scale, whose figures must be plausible (every shard
carries a share of the work, the total per file about what one shard carries), and what a
shell user meets: a rename between directories of different shards is EXDEV, and `mv` then
copies and removes."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys

import pytest

from bench import ROOT
from kvfs.catalog.redis.shards import shard_of
from testing.mount import MountedKvfs, wait_until, write_config
from testing.redis_server import RedisServer
from tests.helpers import can_mount

pytestmark = [
    pytest.mark.mounted,
    pytest.mark.slow,
    pytest.mark.skipif(can_mount() is not None, reason=str(can_mount())),
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
]


def test_the_shards_bench_spreads_the_work():
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "redis_shards.py"),
            *(
                "--nodes",
                "2",
                "--files",
                "60",
                "--dirs",
                "12",
                "--idle",
                "1",
                "--ns-size",
                "64MiB",
                "--json",
            ),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    one, three = out["rounds"]
    assert one["shards"] == 1 and three["shards"] == 3
    assert one["command_share"] == [1.0]
    assert len(three["command_share"]) == 3 and min(three["command_share"]) > 0.1, three
    assert 0.5 < out["commands_ratio_3_vs_1"] < 2.0, out
    assert three["redis_cpu_ms_per_stored_file"] > 0


def test_a_rename_across_shards_through_the_mount_is_exdev_and_mv_copies(tmp_path):
    servers = [RedisServer(tmp_path / f"redis{k}").start() for k in range(3)]
    nss = [{"path": str(tmp_path / "shared" / f"ns{i}.img"), "size": "32MiB"} for i in range(2)]
    (tmp_path / "shared").mkdir()
    more = ", ".join(f'"{s.url}"' for s in servers[1:])
    cfg = write_config(
        tmp_path / "n.toml",
        tmp_path / "state",
        nss,
        extra=f'[cluster]\nredis = "{servers[0].url}"\nshards = [{more}]\nnode_id = "n"\n',
    )
    m = MountedKvfs(tmp_path / "mnt", cfg, tmp_path / "n.log")
    try:
        m.start(timeout=120)
        by: dict[int, list] = {0: [], 1: [], 2: []}
        k = 0
        while min(len(v) for v in by.values()) < 1:
            d = m.mountpoint / f"d{k}"
            d.mkdir()
            by[shard_of(os.stat(d).st_ino, 3)].append(d)
            k += 1
        a, b = by[0][0], by[1][0]
        (a / "f").write_bytes(b"x" * 10_000)
        os.sync()  # published (durability "fsync": the write-back, then the catalog)
        fd = os.open(a / "f", os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        with pytest.raises(OSError) as e:
            os.rename(a / "f", b / "f")
        assert e.value.errno == errno.EXDEV
        subprocess.run(["mv", str(a / "f"), str(b / "g")], check=True)
        assert (b / "g").read_bytes() == b"x" * 10_000 and not (a / "f").exists()
        wait_until(lambda: not (a / "f").exists(), 5, "the source gone")
    finally:
        m.stop()
        for s in servers:
            s.stop()
