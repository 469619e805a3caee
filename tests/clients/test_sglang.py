"""SGLang's HiCacheFile L3 storage (sglang 0.5.23) against a real kvfs mount.

What it does to the filesystem: one flat directory (SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR);
`set` stats `<key>_<model>_<tp_rank>_<tp_size>.bin` (skips existing pages), writes
`.<uuid>.tmp` (numpy tofile: open O_TRUNC, write, close) and renames it into place; `get` opens
the page and readinto()s it. With `max_size` / `min_free_space` its LRUFileEvictor scans the
directory at start (oldest mtime first), calls statvfs (f_bavail) before every write and
unlinks the least recently used pages.
"""

from __future__ import annotations

import os
import threading

import pytest

from tests.clients.conftest import engine_pair

pytestmark = [pytest.mark.clients, pytest.mark.mounted, pytest.mark.slow]

MiB = 1 << 20
PAGE = 2 * MiB


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    a, b = engine_pair("sglang", tmp_path_factory)
    yield a, b
    a.close()
    b.close()


def pages(engine, d) -> list[str]:
    return [f for f in engine.call("files", dir=str(d)) if f.endswith(".bin")]


def test_set_lookup_get_bit_exact_and_after_restarts(engines, make_mount, pool_config):
    a, _ = engines
    m = make_mount(pool_config(size="256MiB", dram="32MiB"))
    d = m.mountpoint / "hicache"
    info = a.call("open", dir=str(d))
    assert info["class"] == "HiCacheFile" and info["dir"] == str(d) and not info["evicts"]
    keys = list(range(1, 21))
    assert all(a.call("set", keys=keys))
    assert all(a.call("set", keys=keys[:4]))                  # already there: skipped
    files = a.call("files", dir=str(d))
    assert sorted(files) == sorted(a.call("names", keys=keys))  # no .tmp left behind
    assert a.call("exists", keys=[1, 20, 999]) == [True, True, False]
    assert a.call("batch_exists", keys=keys + [999, 5]) == {"v1": 20, "v2": 20}
    assert a.call("get", keys=keys + [999]) == [True] * 20 + [None]
    # SGLang restarts, and so does kvfs (its DRAM is cold): every page is found, bit-exact
    a.call("close")
    m.restart()
    assert a.call("open", dir=str(d))["indexed"] == 0
    assert a.call("batch_exists", keys=keys) == {"v1": 20, "v2": 20}
    assert a.call("get", keys=keys) == [True] * 20
    assert m.stats()["tiers"]["pool"]["bytes_out"] >= 20 * PAGE


def test_two_instances_share_one_directory(engines, make_mount, pool_config):
    a, b = engines
    m = make_mount(pool_config(size="256MiB", dram="32MiB"))
    d = str(m.mountpoint / "hicache")
    a.call("open", dir=d)
    b.call("open", dir=d)
    assert all(a.call("set", keys=list(range(1, 9))))
    assert b.call("get", keys=list(range(1, 9))) == [True] * 8
    out = {}                                                   # the same new pages at once
    ts = [threading.Thread(target=lambda e=e: out.__setitem__(e, e.call(
        "set", keys=list(range(20, 36))))) for e in (a, b)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert all(out[a]) and all(out[b])
    assert len(pages(a, d)) == 8 + 16 and not [f for f in os.listdir(d) if f.endswith(".tmp")]
    for e in (a, b):
        assert e.call("get", keys=list(range(20, 36))) == [True] * 16


def test_two_nodes_share_one_pool(engines, cluster_nodes):
    a, b = engines
    n0, n1 = cluster_nodes(2, size="96MiB", regions=16)
    a.call("open", dir=str(n0.mountpoint / "hicache"))
    b.call("open", dir=str(n1.mountpoint / "hicache"))
    keys = list(range(100, 112))
    assert all(a.call("set", keys=keys))
    assert b.call("batch_exists", keys=keys)["v1"] == 12
    assert b.call("get", keys=keys) == [True] * 12
    assert n1.stats()["tiers"]["pool"]["bytes_out"] >= 12 * PAGE


def test_its_own_lru_eviction_by_size_and_by_the_pools_free_space(engines, make_mount,
                                                                    pool_config):
    a, b = engines
    m = make_mount(pool_config(size="64MiB", dram="16MiB"))
    d = m.mountpoint / "hicache"
    # max_size: SGLang keeps its pages under 12 MiB (down to 90% when it evicts)
    info = a.call("open", dir=str(d), extra={"max_size": "12M"})
    assert info["evicts"] and info["max_size"] == 12 * 10**6
    assert all(a.call("set", keys=list(range(1, 11))))
    got = a.call("exists", keys=list(range(1, 11)))
    assert got[-1] and not got[0] and 3 <= sum(got) <= 5
    assert len(pages(a, d)) == sum(got)
    assert a.call("get", keys=list(range(1, 11))) == [True if g else None for g in got]
    assert m.stats()["files"]["pool_evictions"] == 0
    # after a restart it rebuilds its LRU from the files' mtimes (kvfs keeps them): the pages
    # written first are still the first to go
    a.call("close")
    m.restart()
    survivors = [k for k, g in zip(range(1, 11), got) if g]
    assert a.call("open", dir=str(d), extra={"max_size": "12M"})["indexed"] == len(survivors)
    assert all(a.call("set", keys=[50, 51]))
    now = a.call("exists", keys=survivors)
    assert now == sorted(now) and not now[0] and now[-1]     # oldest gone, newest kept
    # min_free_space: SGLang evicts by statvfs(f_bavail) before the pool is full, so kvfs
    # never has to evict behind its back
    for f in pages(a, d):
        os.unlink(d / f)
    b.call("open", dir=str(d), extra={"min_free_space": "24M"})
    assert all(b.call("set", keys=list(range(200, 240))))     # 80 MiB into a 64 MiB pool
    assert os.statvfs(d).f_bavail * 4096 >= 24 * 10**6 - PAGE
    assert m.stats()["files"]["pool_evictions"] == 0
    assert b.call("get", keys=list(range(230, 240))) == [True] * 10


def test_pages_kvfs_evicted_are_clean_misses(engines, make_mount, pool_config):
    """With no eviction configured (SGLang's default) or a cap larger than the pool, kvfs's LRU
    deletes pages underneath: `exists` and the prefix lookups stat the files, so those are
    misses, and a read of one returns None (SGLang recomputes it). Even with SGLang's positive
    metadata cache, a stale 'exists' only leads to a clean miss at read."""
    a, b = engines
    m = make_mount(pool_config(size="40MiB", dram="16MiB"))
    d = str(m.mountpoint / "hicache")
    a.call("open", dir=d)
    b.call("open", dir=d, extra={"enable_metadata_cache": True, "metadata_ttl": 600,
                                 "max_size": "100M"})
    keys = list(range(1, 41))                                  # 80 MiB through a 40 MiB pool
    assert all(a.call("set", keys=keys))
    st = m.stats()["files"]
    assert st["pool_evictions"] > 0
    there = a.call("exists", keys=keys)
    assert not there[0] and there[-1] and 8 <= sum(there) < 20
    assert a.call("batch_exists", keys=keys)["v1"] == 0         # the prefix starts with a miss
    assert a.call("get", keys=keys) == [True if t else None for t in there]
    # b cached 'exists' for pages that kvfs then evicts: still a clean miss when read
    late = list(range(100, 104))
    assert all(b.call("set", keys=late))
    assert b.call("exists", keys=late) == [True] * 4
    assert all(a.call("set", keys=list(range(300, 320))))     # pushes them out of the pool
    assert not any(a.call("exists", keys=late))
    assert b.call("exists", keys=late) == [True] * 4            # b's cache is stale...
    assert b.call("get", keys=late) == [None] * 4               # ...its reads are clean misses
    # and b's own eviction, whose index lists pages that are gone, keeps working
    assert all(b.call("set", keys=list(range(400, 410))))
    assert b.call("get", keys=list(range(400, 410))) == [True] * 10


def test_kvfs_backend_reads_pages_directly(engines, make_mount, pool_config):
    """kvfs's own backend (kvfs.client.sglang_backend, SGLang's "dynamic" loader) reads
    the pages SGLang's file backend wrote straight from the namespaces, and stores its own the
    same way."""
    a, b = engines
    m = make_mount(pool_config(n=2, size="128MiB", dram="32MiB"))
    d = str(m.mountpoint / "hicache")
    a.call("open", dir=d)
    assert all(a.call("set", keys=list(range(1, 13))))
    info = b.call("open", dir=d, backend="kvfs", extra={"kvfs_verify": True})
    assert info["class"] == "KvfsHiCacheStorage"
    assert b.call("batch_exists", keys=list(range(1, 14))) == {"v1": 12, "v2": 12}
    m.drop_caches()
    before = m.stats()["files"]["direct_reads"]
    assert b.call("get", keys=list(range(1, 13)) + [999]) == [True] * 12 + [None]
    assert m.stats()["files"]["direct_reads"] - before == 12
    writes = m.stats()["files"]["direct_writes"]
    assert all(b.call("set", keys=[50, 51]))                  # writes: kvfs.client.direct
    assert m.stats()["files"]["direct_writes"] - writes == 2
    assert a.call("get", keys=[50, 51]) == [True, True]       # SGLang's own backend reads them
    os.unlink(os.path.join(d, a.call("names", keys=[3])[0]))   # as kvfs's eviction would
    assert b.call("get", keys=[2, 3, 4]) == [True, None, True]
    b.call("close")
    m.restart()
    b.call("open", dir=d, backend="kvfs")
    assert b.call("get", keys=[1, 2, 50]) == [True] * 3
