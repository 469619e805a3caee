"""A pool shared by several mounted nodes: real kvfs daemons with their own mountpoints and
state directories over the same namespace files, a real redis-server holding the catalog."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from testing.redis_server import RedisServer
from tests.helpers import MiB, wait_until, write_config

pytestmark = pytest.mark.mounted

WRITER = """
import os, sys, time
mnt, prefix, count, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
for i in range(count):
    seed = int.from_bytes(f"{prefix}{i}".encode()[:8].ljust(8, b"."), "little")
    data = (seed.to_bytes(8, "little") * (size // 8 + 1))[:size]
    with open(os.path.join(mnt, f"{prefix}{i}"), "wb") as f:
        f.write(data)
        os.fsync(f.fileno())  # (durable and published before it is counted)
    print(i, flush=True)
"""


def content(name: str, size: int) -> bytes:
    seed = int.from_bytes(name.encode()[:8].ljust(8, b"."), "little")
    return (seed.to_bytes(8, "little") * (size // 8 + 1))[:size]


def layout(path: Path) -> dict:
    return json.loads(os.getxattr(path, "user.kvfs.layout"))


def test_written_on_one_node_read_bit_exact_on_another(cluster_nodes):
    a, b = cluster_nodes(2)
    blobs = {f"k{i}": os.urandom((i + 1) * MiB + 777 * i) for i in range(4)}
    os.mkdir(a.mountpoint / "chunks")
    for name, payload in blobs.items():
        (a.mountpoint / "chunks" / name).write_bytes(payload)
    a.sync()  # (with durability "fsync" closed files are published by the write-back)
    b.drop_caches()
    wait_until(
        lambda: sorted(os.listdir(b.mountpoint / "chunks")) == sorted(blobs), 10, "b to see them"
    )
    for name, payload in blobs.items():
        assert (b.mountpoint / "chunks" / name).read_bytes() == payload
    # b rewrites one; a sees the new content (not its cached pages) and the new size
    (b.mountpoint / "chunks" / "k0").write_bytes(b"rewritten" * 1000)
    wait_until(
        lambda: (a.mountpoint / "chunks" / "k0").stat().st_size == 9000, 10, "the new size on a"
    )
    assert (a.mountpoint / "chunks" / "k0").read_bytes() == b"rewritten" * 1000
    os.unlink(a.mountpoint / "chunks" / "k1")
    wait_until(lambda: not (b.mountpoint / "chunks" / "k1").exists(), 10, "the unlink on b")
    st = b.stats()
    assert st["catalog"]["kind"] == "redis" and st["cluster"]["node_id"] == "node1"


def test_concurrent_writers_on_three_nodes_never_collide(cluster_nodes):
    ms = cluster_nodes(3, size="64MiB", regions=16)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WRITER,
                str(m.mountpoint),
                f"n{i}-",
                "14",
                str(2 * MiB + 4096 * i),
            ],
            stdout=subprocess.DEVNULL,
        )
        for i, m in enumerate(ms)
    ]
    for p in procs:
        assert p.wait(120) == 0
    names = [f"n{i}-{j}" for i in range(3) for j in range(14)]
    # (a file fsync'd on another node is published when fsync returns; node 0 sees it once
    # its follower has read the entry: a full run read n2-13 before it had)
    wait_until(
        lambda: all((ms[0].mountpoint / n).exists() for n in names), 10, "every file on node 0"
    )
    extents = []
    for name in names:
        lay = layout(ms[0].mountpoint / name)
        extents += [(ns, off, off + length, name) for ns, off, length in lay["extents"]]
    extents.sort()
    for x, y in zip(extents, extents[1:]):
        assert not (x[0] == y[0] and y[1] < x[2]), f"{x[3]} and {y[3]} share namespace space"
    for m in ms:  # every block's checksums, read through every node
        m.drop_caches()
    for m in ms:
        for name in names:  # a bad checksum would be EIO here
            assert (m.mountpoint / name).read_bytes() == content(
                name, 2 * MiB + 4096 * int(name[1])
            )


@pytest.mark.slow
def test_eviction_on_one_node_while_another_reads(cluster_nodes):
    a, b = cluster_nodes(2, size="24MiB", grace=2.0)
    cap = b.stats()["tiers"]["pool"]["capacity"]
    n = int(cap * 0.7) // (2 * MiB)
    for i in range(n):
        (a.mountpoint / f"old{i}").write_bytes(content(f"old{i}", 2 * MiB))
    errors, reads = [], [0]
    stop = threading.Event()

    def reader():
        # a reads its newest files over and over; whatever b evicts, a's reads are bit-exact
        # or the name is gone, never garbage
        while not stop.is_set():
            for i in range(n // 2, n):
                try:
                    with open(a.mountpoint / f"old{i}", "rb") as f:
                        data = f.read()
                    if data != content(f"old{i}", 2 * MiB):
                        errors.append(f"old{i}: wrong bytes")
                    reads[0] += 1
                except FileNotFoundError:
                    pass
                except OSError as e:
                    errors.append(f"old{i}: {e}")
            a.drop_caches()

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(n):  # b writes as much again: the pool must evict
            (b.mountpoint / f"new{i}").write_bytes(content(f"new{i}", 2 * MiB))
    finally:
        stop.set()
        t.join(60)
    assert not errors, errors[:5]
    assert reads[0] > 0
    assert b.stats()["files"]["pool_evictions"] > 0
    # (a kept reading its files, so in the cluster's LRU order they may outrank b's older ones)
    assert (b.mountpoint / f"new{n - 1}").exists()
    for i in range(n):
        try:
            assert (b.mountpoint / f"new{i}").read_bytes() == content(f"new{i}", 2 * MiB)
        except FileNotFoundError:
            pass


@pytest.mark.slow
def test_a_node_killed_mid_write_leaves_nothing_and_its_space_returns(cluster_nodes, redis):
    a, b = cluster_nodes(2, size="24MiB", lease=2.0, grace=1.0, regions=8)
    w = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(a.mountpoint), "a", "1000", str(3 * MiB)],
        stdout=subprocess.PIPE,
        text=True,
    )
    for _ in range(3):  # a has committed three blocks and is writing
        assert w.stdout.readline()  # the fourth when it dies
    a.kill()
    w.wait(30)
    w.stdout.close()
    # b keeps serving: every file it lists is complete (a's unfinished write never published)
    names = sorted(os.listdir(b.mountpoint))
    assert names
    for name in names:
        assert (b.mountpoint / name).read_bytes() == content(name, 3 * MiB)
    # a's leases expire (lease_seconds); b can then fill the pool, the regions a held included
    wait_until(lambda: not _lease_holders(redis) & {"node0"}, 10, "a's leases to expire")
    for name in names:
        os.unlink(b.mountpoint / name)
    cap = b.stats()["tiers"]["pool"]["capacity"]
    # the removed blocks wait out their grace period, then any node purges them
    wait_until(lambda: b.stats()["cluster"]["grave_blocks"] == 0, 10, "the grave to empty")
    written = 0
    while written < cap * 0.9:
        (b.mountpoint / f"b{written}").write_bytes(b"b" * MiB)
        written += MiB
    st = b.stats()
    assert st["cluster"]["regions_held"] >= 1
    assert st["tiers"]["pool"]["free"] < cap * 0.12


def _lease_holders(redis: RedisServer) -> set[str]:
    """The node ids that hold allocation leases now (tokens are node/epoch/nonce)."""

    def cli(*args: str) -> list[str]:
        return subprocess.run(
            ["redis-cli", "-p", str(redis.port), *args], check=True, capture_output=True, text=True
        ).stdout.split()

    holders = set()
    for key in cli("--scan", "--pattern", "kvfs:*:lease:*"):
        token = cli("GET", key)  # (empty if the lease expired meanwhile)
        if token:
            holders.add(token[0].split("/")[0])
    return holders


def test_redis_stopped_and_restarted_during_a_workload(cluster_nodes, redis, tmp_path):
    a, b = cluster_nodes(2)
    (a.mountpoint / "resident").write_bytes(b"r" * MiB)
    (a.mountpoint / "before").write_bytes(b"1" * MiB)
    a.sync()
    wait_until(lambda: _present(b.mountpoint / "before"), 10, "b to see a's file")
    assert (b.mountpoint / "before").read_bytes() == b"1" * MiB
    with open(a.mountpoint / "resident", "rb") as held:
        redis.stop()  # a clean stop: the AOF has everything
        # once a node has seen Redis go (its follower's connection closed: a clear line in
        # the log), writes and unknown names fail with EIO. (Before it has, a new name is
        # answered by its mirror and the file's publish fails later, as a write-back error:
        # the make test run of 2909f3c created /during in that instant.)
        for m in (a, b):
            wait_until(lambda m=m: "is unreachable" in m.log_text(), 10, "Redis seen down")
        with pytest.raises(OSError) as e:
            (a.mountpoint / "during").write_bytes(b"2" * 1000)
        assert e.value.errno == errno.EIO
        with pytest.raises(OSError) as e:
            (b.mountpoint / "unknown").stat()
        assert e.value.errno == errno.EIO
        # an open file and a DRAM-resident one keep being served
        assert held.read() == b"r" * MiB
        assert (a.mountpoint / "before").read_bytes() == b"1" * MiB
        # kvfs doctor says what is wrong and what to do
        doc = _kvfs("doctor", str(a.mountpoint))
        assert doc.returncode == 1 and "FAIL" in doc.stdout and "unreachable" in doc.stdout
        redis.start()
    assert "Redis at" in a.log_text() and "unreachable" in a.log_text()
    # everything recovers by itself
    wait_until(lambda: _writes(a.mountpoint / "after"), 20, "writes to work again")
    # (b may still answer EIO for a moment: it retries Redis every 0.5 s)
    wait_until(lambda: _present(b.mountpoint / "after"), 10, "b to see a's new file")
    assert (b.mountpoint / "after").read_bytes() == b"3" * 1000
    assert (b.mountpoint / "before").read_bytes() == b"1" * MiB
    assert "reachable again" in a.log_text()
    # the operator sees the node's view of the cluster
    df = subprocess.run(
        [sys.executable, "-m", "kvfs", "df", str(b.mountpoint)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert df.returncode == 0, df.stderr
    assert f"cluster: node node1, Redis 127.0.0.1:{redis.port} online" in df.stdout
    assert "stores that waited for room 0 (0.0 s)" in df.stdout  # it had room
    wait_until(lambda: b.stats()["cluster"]["fresh"], 10, "b's follower to catch up")
    doc = json.loads(_kvfs("doctor", str(b.mountpoint), "--json").stdout)
    cluster = [f for f in doc["findings"] if f["check"] == "cluster"]
    assert [f["status"] for f in cluster] == ["ok"], cluster


def _present(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:
        return False


def _writes(path: Path) -> bool:
    try:
        path.write_bytes(b"3" * 1000)
        return True
    except OSError:
        return False


def test_redis_unreachable_at_start_is_a_clear_error(tmp_path):
    from testing.redis_server import free_port

    cfg = write_config(
        tmp_path / "k.toml",
        tmp_path / "state",
        [{"path": str(tmp_path / "ns0.img"), "size": "64MiB"}],
        extra=f'[cluster]\nredis = "redis://127.0.0.1:{free_port()}/0"\n',
    )
    (tmp_path / "mnt").mkdir()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvfs",
            "mount",
            str(tmp_path / "mnt"),
            "--config",
            str(cfg),
            "--foreground",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0
    assert "cluster.redis" in r.stderr and "cannot reach Redis" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def _kvfs(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvfs", *args], capture_output=True, text=True, timeout=120
    )


def test_format_creates_the_shared_pool_and_refuses_to_discard_a_live_one(
    tmp_path, redis, make_mount
):
    nss = [{"path": str(tmp_path / "shared" / f"ns{i}.img"), "size": "32MiB"} for i in range(2)]
    (tmp_path / "shared").mkdir()
    cfg = write_config(
        tmp_path / "k.toml",
        tmp_path / "state",
        nss,
        extra=f'[cluster]\nredis = "{redis.url}"\nnode_id = "a"\n',
    )
    r = _kvfs("format", "--config", str(cfg))
    assert r.returncode == 0, r.stderr
    assert "formatted pool" in r.stdout and f"127.0.0.1:{redis.port}" in r.stdout
    pool_id = r.stdout.split()[2].rstrip(":")
    m = make_mount(cfg)
    (m.mountpoint / "kept").write_bytes(b"k" * 5000)
    assert m.stats()["tiers"]["pool"]["pool_id"] == pool_id
    # a second format (from another node) must not silently wipe the pool; not even --force
    # while a node uses it
    other = write_config(
        tmp_path / "b.toml",
        tmp_path / "state-b",
        nss,
        extra=f'[cluster]\nredis = "{redis.url}"\nnode_id = "b"\n',
    )
    r = _kvfs("format", "--config", str(other))
    assert r.returncode != 0 and "already holds the catalog" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = _kvfs("format", "--config", str(other), "--force")
    assert r.returncode != 0 and "node(s) a hold leases" in r.stderr
    assert (m.mountpoint / "kept").read_bytes() == b"k" * 5000
    m.stop()
    r = _kvfs("format", "--config", str(cfg), "--force")
    assert r.returncode == 0, r.stderr
    m.start()
    assert not (m.mountpoint / "kept").exists()
    assert m.stats()["tiers"]["pool"]["pool_id"] != pool_id
