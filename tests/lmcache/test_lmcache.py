"""The real LMCache 0.5.6 (CPU-only) against a kvfs mount: local_disk and the fs:// connector."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT, requires_throttle, wait_until

MiB = 1 << 20

pytestmark = [pytest.mark.lmcache, pytest.mark.slow]  # each drives LMCache in a subprocess
pytest.importorskip("lmcache", reason="install with `make install` (torch CPU + lmcache==0.5.6)")


def drive(mode: str, directory, *extra: str) -> dict:
    r = subprocess.run(
        [sys.executable, "-m", "tests.lmcache.lmc_driver", mode, str(directory), *extra],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, (
        f"driver failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    )
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.fixture
def lmc_mount(make_mount, pool_config):
    return make_mount(pool_config(size="512MiB", dram="32MiB"))


@pytest.mark.parametrize("odirect", [0, 1])
def test_local_disk_backend_round_trips_through_kvfs(lmc_mount, odirect):
    d = lmc_mount.mountpoint / "lmcache"
    d.mkdir()
    out = drive("local_disk", d, "--odirect", str(odirect), "--chunks", "12")
    assert out["f_bsize"] == 4096
    assert out["use_odirect"] == bool(odirect)
    assert len(out["files"]) == 12
    assert all(
        f.endswith("@bfloat16.pt") and f.startswith("meta-llama-Llama-3.1-8B@1@0@")
        for f in out["files"]
    )
    assert any("@-" in f for f in out["files"])  # negative chunk hashes keep their sign
    assert all(out["get_blocking"]), out
    assert all(out["batched_get_blocking"]), out
    assert all(out["batched_get_non_blocking"]), out
    # the chunks are durable: after a restart of kvfs they are still there, bit-exact
    before = {f: hashlib.sha256((d / f).read_bytes()).hexdigest() for f in out["files"]}
    assert all(os.path.getsize(d / f) == 2 << 20 for f in out["files"])
    lmc_mount.restart()
    assert sorted(os.listdir(d)) == out["files"]
    after = {f: hashlib.sha256((d / f).read_bytes()).hexdigest() for f in out["files"]}
    assert after == before


def test_local_disk_eviction_unlinks_through_kvfs(lmc_mount):
    d = lmc_mount.mountpoint / "lmcache"
    d.mkdir()
    free_before = os.statvfs(lmc_mount.mountpoint).f_bfree
    out = drive("evict", d, "--chunks", "12")
    kept = sum(out["contained"])
    assert 0 < kept < 12, out
    assert out["contained"][-1] and not out["contained"][0]  # the oldest went first
    assert all(out["kept_ok"])
    assert len(out["files"]) == kept and sorted(os.listdir(d)) == out["files"]
    # the unlinked chunks' space went back to the pool
    used_pages = free_before - os.statvfs(lmc_mount.mountpoint).f_bfree
    assert used_pages == kept * (2 << 20) // 4096


def test_fs_connector_persists_and_shares_across_processes(lmc_mount):
    d = lmc_mount.mountpoint / "remote"
    d.mkdir()
    put = drive("fs_put", d, "--chunks", "12")
    assert len([f for f in put["files"] if f.endswith(".data")]) == 12
    assert not [f for f in put["files"] if ".tmp" in f]
    # a second engine, in a new process, after the first is gone
    got = drive("fs_get", d, "--chunks", "12")
    assert all(got["contained"]) and all(got["get_blocking"]), got
    assert got["contains_missing"] is False
    # and after kvfs itself restarted
    lmc_mount.restart()
    got = drive("fs_get", d, "--chunks", "12")
    assert all(got["contained"]) and all(got["get_blocking"]), got


def test_kvfs_storage_plugin_reads_hits_directly(lmc_mount):
    d = lmc_mount.mountpoint / "plugin"
    d.mkdir()
    put = drive("plugin_put", d, "--chunks", "12")
    assert put["backend"] == "KvfsBackend"
    assert len(put["files"]) == 12 and not [f for f in put["files"] if ".tmp" in f]
    for k in ("contained", "get_blocking", "batched_get_blocking", "batched_get_non_blocking"):
        assert all(put[k]), (k, put[k])
    assert put["prefix_hits"] == 12
    st = lmc_mount.stats()
    assert st["files"]["direct_reads"] >= 36  # the reads bypassed FUSE
    assert st["files"]["stale_releases"] == 0
    # each batch is one request each way to the daemon: 6 chunks put one by one and 6 in a
    # batch; 12 chunks got one by one, then twice 12 in a batch (their attributes, leases and
    # releases)
    want = {"alloc": 7, "commit": 7, "inspect": 14, "lease": 14, "release": 14}
    assert st["direct"]["requests"] == want, st["direct"]
    # a new engine process, and after a kvfs restart: the chunks are there (no local index)
    lmc_mount.restart()
    got = drive("plugin_get", d, "--chunks", "12")
    assert all(got["contained"]) and all(got["get_blocking"]) and all(got["batched_get_blocking"])


def test_fs_connector_shares_chunks_between_two_cluster_nodes(cluster_nodes):
    """Two inference nodes with their own kvfs mounts over one pool: what LMCache stores through
    node A's mount, a LMCache on node B finds and reads bit-exact through its own mount."""
    a, b = cluster_nodes(2, size="96MiB", regions=16)
    (a.mountpoint / "remote").mkdir()
    put = drive("fs_put", a.mountpoint / "remote", "--chunks", "12")
    assert len([f for f in put["files"] if f.endswith(".data")]) == 12
    a.sync()  # (with durability "fsync" A's write-back publishes them)
    wait_until(lambda: len(os.listdir(b.mountpoint / "remote")) >= 12, 10, "B to see them")
    got = drive("fs_get", b.mountpoint / "remote", "--chunks", "12")
    assert all(got["contained"]) and all(got["get_blocking"]), got
    assert got["contains_missing"] is False
    # B read every chunk out of the shared pool (directly or by prefetching along the chain
    # that A's LMCache left in the shared catalog): it had no copy of its own
    st = b.stats()
    assert st["tiers"]["pool"]["bytes_out"] >= 12 * (2 << 20), st["tiers"]
    assert st["tiers"]["pool"]["bytes_in"] == 0


def test_kvfs_storage_plugin_finds_chunks_another_node_stored(cluster_nodes):
    """kvfs's LMCache plugin on node B reads, straight from the shared namespaces, the chunks
    that node A's engine stored."""
    a, b = cluster_nodes(2, size="96MiB", regions=16)
    (a.mountpoint / "plugin").mkdir()
    put = drive("plugin_put", a.mountpoint / "plugin", "--chunks", "12")
    assert len(put["files"]) == 12
    a.sync()
    wait_until(lambda: len(os.listdir(b.mountpoint / "plugin")) >= 12, 10, "B to see them")
    got = drive("plugin_get", b.mountpoint / "plugin", "--chunks", "12")
    assert all(got["contained"]) and all(got["get_blocking"]) and all(got["batched_get_blocking"])
    assert b.stats()["files"]["direct_reads"] >= 12


def test_local_disk_index_larger_than_the_pool_lists_chunks_kvfs_deleted(make_mount, pool_config):
    """LMCache local_disk keeps its index in memory and never looks at the filesystem: with a
    max_local_disk_size above what the pool holds, kvfs's LRU deletes chunks LMCache still
    lists, and reading one raises KeyError. kvfs doctor warns; the README's recipe (a size
    under 90% of the pool) keeps both in step: LMCache evicts first, kvfs never has to."""
    m = make_mount(pool_config(size="40MiB", dram="16MiB"))
    d = m.mountpoint / "lmcache"
    d.mkdir()
    out = drive("overfill", d, "--chunks", "24", "--max-gb", "1.0")
    assert all(out["contained"])  # LMCache lists all 24...
    gone = [i for i, there in enumerate(out["on_disk"]) if not there]
    evictions = m.stats()["files"]["pool_evictions"]
    assert gone and evictions >= len(gone)  # ...kvfs deleted some
    assert {out["get_blocking"][i] for i in gone} == {"KeyError"}, out
    # every other chunk reads back whole, unless it was the name of an eviction the kernel had
    # not yet been told of when the driver looked (kvfs/fs/kernel.py tells it asynchronously):
    # then it is gone by the time it was read, and stays gone
    for i in range(24):
        want = "ok" if out["on_disk_after"][i] else "KeyError"
        assert out["get_blocking"][i] == want, (i, out)
    assert out["get_blocking"].count("KeyError") <= evictions, out
    r = subprocess.run(
        [sys.executable, "-m", "kvfs", "doctor", str(m.mountpoint), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    warn = [
        f
        for f in json.loads(r.stdout)["findings"]
        if f["check"] == "clients" and f["detail"].startswith(str(d))
    ]
    assert warn and warn[0]["status"] == "warn" and "max_local_disk_size" in warn[0]["fix"]
    cap_gb = float(warn[0]["fix"].split("at most ")[1].split()[0])
    # the recipe: max_local_disk_size at most what doctor says; LMCache then evicts first
    for f in os.listdir(d):
        os.unlink(d / f)
    evictions = m.stats()["files"]["pool_evictions"]
    d2 = m.mountpoint / "lmcache2"
    d2.mkdir()
    out = drive("overfill", d2, "--chunks", "24", "--max-gb", str(cap_gb))
    assert out["contained"] == out["on_disk"] and 0 < sum(out["contained"]) < 24
    assert all(g == "ok" for g, c in zip(out["get_blocking"], out["contained"]) if c)
    assert m.stats()["files"]["pool_evictions"] == evictions


@requires_throttle
@pytest.mark.parametrize("backend", ["local_disk", "fs", "plugin"])
def test_a_stalled_namespace_is_a_miss_to_lmcache(make_mount, tmp_path, backend):
    """Issue 58: namespace 1 stalls (4 KiB/s) while LMCache loads chunks kvfs holds cold.
    kvfs waits the read deadline once (an open it cannot serve answers ENOENT; the plugin's
    direct read gives up at the deadline), then refuses at once. What LMCache makes of it:
    its fs connector and kvfs's plugin miss, no exception; `local_disk` misses in a batch,
    but its single-chunk get (`get_blocking`) raises KeyError: LMCache 0.5.6 drops the key
    on FileNotFoundError and then reads it from its index anyway (any other error escapes
    there too: without passthrough the read's EIO, as OSError), which no answer of a
    filesystem can avoid. Healed, the chunks load again
    (`local_disk` forgot the ones it missed: it recomputes and stores them again). Removed from
    the pool while mounted (`kvfs pool remove --drop`), its chunks are misses, the others load
    (`local_disk` raises KeyError for them, as for chunks kvfs evicted)."""
    from bench.faults import formatted
    from testing.emulate import Emulation

    with Emulation("1g") as emu:
        devs = [emu.loop(f"l{i}", 128 * MiB) for i in range(2)]
        m = make_mount(formatted(tmp_path, [d.path for d in devs], pool='stripe_unit = "256KiB"'))
        d = m.mountpoint / "lmc"
        d.mkdir()
        p = subprocess.Popen(
            [sys.executable, "-m", "tests.lmcache.lmc_driver", "stall", str(d)]
            + ["--backend", backend, "--chunks", "6"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        group = emu.cgroup("kvfs-lmc-stall")
        try:

            def ready() -> None:  # (the driver waits for a line on stdin)
                while (line := p.stdout.readline()) and line.strip() != "READY":
                    pass
                assert line, p.stderr.read()[-3000:]

            ready()  # (stored)
            m.sync()
            m.drop_caches()
            group.limit(devs[1], read_bps=4096)
            group.add(m.pid)
            group.add(p.pid)  # (the plugin reads the namespaces itself)
            p.stdin.write("go\n")
            p.stdin.flush()
            ready()  # (the first load has run: heal)
            group.limit(devs[1])
            group.remove()
            wait_until(lambda: m.stats()["namespaces"][1]["read_state"] == "ok", 30, "the heal")
            m.drop_caches()
            p.stdin.write("go\n")
            p.stdin.flush()
            ready()  # (loaded healed: take namespace 1 out, `kvfs pool remove --drop`)
            removed = m.control("pool_remove", {"namespace": 1, "drop": True})["result"]
            m.drop_caches()
            p.stdin.write("go\n")
            p.stdin.flush()
            out, err = p.communicate(timeout=120)
        finally:
            group.remove()
            if p.poll() is None:
                p.kill()
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert p.returncode == 0 and lines, err[-3000:]
        r = json.loads(lines[-1][len("RESULT ") :])
    during, after = r["during"], r["after"]
    if backend == "local_disk":
        # (LMCache's own bug, above: KeyError after ENOENT at a passthrough open; without
        # passthrough the open succeeds and the read's EIO escapes its get as OSError)
        assert during["single"] in ("miss", "KeyError", "OSError"), r
    else:
        assert during["single"] == "miss", r
    assert during["batched"] == ["miss"] * 5, r
    assert during["single_s"] <= 2.0 + 2 * MiB / 64e6 + 1.0, r  # one deadline
    # (the plugin's second read may meet a second deadline while the daemon checks)
    assert during["batched_s"] <= (2.0 + 2 * MiB / 64e6 + 1.0 if backend == "plugin" else 1.0), r
    if backend == "local_disk":  # (it forgot the chunks it missed; the others load)
        assert all(x in ("ok", "miss") for x in [after["single"], *after["batched"]]), r
    else:
        assert after["single"] == "ok" and after["batched"] == ["ok"] * 5, r
    # removed: the chunks with a unit on namespace 1 are gone, as if kvfs had evicted them:
    # misses, the others load, nothing wrong; `local_disk` still lists them and raises
    # KeyError for its get, single or batched (LMCache's bug above; docs/configuration.md,
    # "Who evicts")
    gone = r["removed"]
    assert removed["dropped_files"] >= 1, removed
    if backend == "local_disk":
        assert gone["single"] in ("ok", "miss", "KeyError"), r
        assert gone["batched"] == "KeyError" or set(gone["batched"]) <= {"ok", "miss"}, r
    else:
        assert gone["single"] in ("ok", "miss"), r
        assert set(gone["batched"]) <= {"ok", "miss"}, r
        assert "miss" in [gone["single"], *gone["batched"]], r
