"""KV events of a mounted daemon (kvfs/events): a kill -9 between a change made durable and
its announcement (a store's, an eviction's: KVFS_TEST_EVENTS_STALL holds the daemon there)
loses the announcement, and the restart's stream (AllBlocksCleared, then the inventory) is
again exactly what the pool holds; `kvfs events` prints the stream.
tests/clients/test_kv_events.py checks the events against vLLM's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request

import pytest

from kvfs.events.subscriber import Subscriber
from testing.mount import wait_until
from testing.redis_server import free_port

MiB = 1 << 20
BASE = "m_0123456789ab_r0"


def block(root, i: int):
    """Block i's path in vLLM's fs-tier layout, and the 64-bit hash announced for it."""
    h = f"{i:064x}"
    return root / BASE / h[:3] / f"{h[3:5]}_g0" / f"{h}.bin", i


def store(root, i: int, size: int) -> None:
    """As vLLM's fs tier stores: a .tmp file written, then renamed."""
    path, _ = block(root, i)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + "_x.tmp")
    tmp.write_bytes(os.urandom(size))
    os.rename(tmp, path)


def held(root) -> set[int]:
    out = set()
    for _, _, names in os.walk(root):
        out |= {int(n[:-4], 16) for n in names if n.endswith(".bin")}
    return out


def events_cli(mountpoint, *args: str) -> subprocess.CompletedProcess:
    """`kvfs events --mount MOUNTPOINT ARGS...`, run to its end."""
    return subprocess.run(
        [sys.executable, "-m", "kvfs", "events", "--mount", str(mountpoint), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def events_config(tmp_path) -> str:
    return (
        f'[events]\nenabled = true\nendpoint = "ipc://{tmp_path}/ev"\n'
        f'replay_endpoint = "ipc://{tmp_path}/replay"\n'
    )


@pytest.mark.parametrize("kind", ["stored", "removed"])
def test_a_kill_9_between_a_change_and_its_announcement_is_repaired_by_the_restart(
    make_mount, pool_config, tmp_path, monkeypatch, kind
):
    cfg = pool_config(size="16MiB", pool='evict = "lru"', extra=events_config(tmp_path))
    monkeypatch.setenv("KVFS_TEST_EVENTS_STALL", f"{kind}:120")
    m = make_mount(cfg)
    root = m.mountpoint

    def writer() -> None:
        try:
            for i in range(1, 40):  # 1 MiB blocks in 16 MiB: the pool evicts from ~14 on
                store(root, i, MiB)
                m.sync()
        except OSError:
            pass  # the daemon was killed

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    wait_until(lambda: "stalling" in m.log_text(), 60, "a change durable, not announced")
    m.kill()
    t.join(30)
    monkeypatch.delenv("KVFS_TEST_EVENTS_STALL")
    m.start()
    sub = Subscriber(f"ipc://{tmp_path}/ev", b"", f"ipc://{tmp_path}/replay")
    got = sub.replay(0)
    sub.close()
    events = [e for _, _, b in got for e in b.events]
    assert type(events[0]).__name__ == "AllBlocksCleared"
    assert {type(e).__name__ for e in events[1:]} == {"BlockStored"}
    stored = [h for e in events[1:] for h in e.block_hashes]
    assert len(stored) == len(set(stored))
    assert set(stored) == held(root)
    assert [seq for _, seq, _ in got] == list(range(len(got)))
    if kind == "removed":  # the block whose eviction was durable is gone, and not announced
        assert m.stats()["tiers"]["pool"]["blocks"] == len(stored)
        assert not held(root) >= set(range(1, 14))


def test_kvfs_events_prints_the_stream_and_prometheus_counts_it(make_mount, pool_config, tmp_path):
    port = free_port()
    m = make_mount(pool_config(extra=f"metrics_port = {port}\n" + events_config(tmp_path)))
    for i in (1, 2):
        store(m.mountpoint, i, 4096)
    m.sync()
    out = events_cli(m.mountpoint, "--from", "0", "--timeout", "1", "--json")
    docs = [json.loads(line) for line in out.stdout.splitlines()]
    assert docs[0]["seq"] == 0 and docs[0]["events"] == [{"type": "AllBlocksCleared"}]
    hashes = [h for d in docs[1:] for e in d["events"] for h in e["block_hashes"]]
    assert sorted(hashes) == [1, 2]
    assert "missed in 0 gap(s)" in out.stderr
    human = events_cli(m.mountpoint, "--from", "1", "--timeout", "1")
    assert f"BlockStored medium=STORAGE group_idx=0 {1:016x}" in human.stdout
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert (
        "\nkvfs_events_stored_total 2" in body and "\nkvfs_events_dropped_batches_total 0" in body
    )
