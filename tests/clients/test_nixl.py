"""LMCache 0.5.6's NIXL storage backend, NIXL POSIX plugin (nixl-cu12 1.5.1), against a real mount.

What it does to the filesystem (nixl_backend: POSIX, nixl_buffer_device: cpu):
  nixl_pool_size 0 (dynamic): per chunk open(<model>_<ws>_<worker>_<hash>_<dtype>,
    O_CREAT|O_RDWR[|O_DIRECT]) with no O_TRUNC and no temporary name, one libaio (io_submit) or
    io_uring write at offset 0, close; lookups stat the name; reads open O_RDONLY[|O_DIRECT]
    and read through the same queue. No index, no eviction: chunks outlive the engine.
  nixl_pool_size N (static): N files obj_<i>_<rand>.bin opened O_CREAT|O_RDWR[|O_DIRECT] at
    start and kept open; chunks are written in place into free slots, LMCache's LRU over the
    slots picks the one to overwrite; the index is in memory only.
"""

from __future__ import annotations

import os
import threading

import pytest

from tests.clients.conftest import engine_pair

pytestmark = [pytest.mark.clients, pytest.mark.mounted, pytest.mark.slow]

MiB = 1 << 20
CHUNK = 2 * MiB


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    a, b = engine_pair("nixl", tmp_path_factory)
    yield a, b
    a.close()
    b.close()


@pytest.mark.parametrize("engine,direct", [("aio", True), ("uring", True), ("aio", False)])
def test_dynamic_put_lookup_get_bit_exact_and_after_restarts(engines, make_mount, pool_config,
                                                              engine, direct):
    a, _ = engines
    m = make_mount(pool_config(size="256MiB", dram="32MiB"))
    d = str(m.mountpoint / "nixl")
    assert a.call("open", dir=d, engine=engine, direct=direct)["class"] == \
        "NixlDynamicStorageBackend"
    keys = list(range(1, 17))
    a.call("put", keys=keys)
    files = a.call("files", dir=d)
    assert len(files) == 16 and set(files.values()) == {CHUNK}
    assert all("@" not in f and f.endswith("_bfloat16") for f in files)
    assert a.call("contains", keys=keys + [999]) == [True] * 16 + [False]
    assert a.call("get", keys=keys) == [True] * 16
    assert a.call("batched_get", keys=keys[:8]) == [True] * 8
    # the engine restarts and so does kvfs: the chunks are found (by name) and bit-exact
    a.call("close")
    m.restart()
    a.call("open", dir=d, engine=engine, direct=direct)
    assert a.call("contains", keys=keys) == [True] * 16
    assert a.call("get", keys=keys) == [True] * 16
    assert m.stats()["tiers"]["pool"]["bytes_out"] >= 16 * CHUNK


def test_static_pool_writes_slots_in_place_and_evicts_with_its_own_lru(engines, make_mount,
                                                                       pool_config):
    a, _ = engines
    m = make_mount(pool_config(size="256MiB", dram="32MiB"))
    d = str(m.mountpoint / "slots")
    assert a.call("open", dir=d, pool_size=4, engine="uring")["class"] == \
        "NixlStaticStorageBackend"
    assert len(a.call("files", dir=d)) == 4                     # opened up front, kept open
    a.call("put", keys=[1, 2, 3, 4])
    assert a.call("get", keys=[1, 2, 3, 4]) == [True] * 4
    a.call("put", keys=[5, 6], batch=2)                          # LMCache evicts two slots
    assert a.call("contains", keys=[1, 2, 3, 4, 5, 6]) == [False, False, True, True, True, True]
    assert a.call("get", keys=[3, 4, 5, 6]) == [True] * 4        # overwritten in place
    files = a.call("files", dir=d)
    assert len(files) == 4 and set(files.values()) == {CHUNK}
    # its index is in memory and its slot names are new each time: a restarted engine finds
    # nothing, and the old slots stay behind (closed now, so kvfs's LRU may delete them)
    a.call("close")
    a.call("open", dir=d, pool_size=4, engine="uring")
    assert a.call("contains", keys=[3, 4, 5, 6]) == [False] * 4
    assert len(a.call("files", dir=d)) == 8
    a.call("close")


def test_two_instances_share_one_directory(engines, make_mount, pool_config):
    a, b = engines
    m = make_mount(pool_config(size="256MiB", dram="32MiB"))
    d = str(m.mountpoint / "nixl")
    a.call("open", dir=d, engine="aio")
    b.call("open", dir=d, engine="uring")
    a.call("put", keys=list(range(1, 9)))
    assert b.call("contains", keys=list(range(1, 9))) == [True] * 8
    assert b.call("get", keys=list(range(1, 9))) == [True] * 8
    out = {}                                       # both put the same new chunks at once
    ts = [threading.Thread(target=lambda e=e: out.__setitem__(e, e.call(
        "put", keys=list(range(20, 32))))) for e in (a, b)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert out == {a: 12, b: 12}
    for e in (a, b):
        assert e.call("get", keys=list(range(20, 32))) == [True] * 12
    assert len(os.listdir(d)) == 8 + 12


def test_two_nodes_share_one_pool(engines, cluster_nodes):
    a, b = engines
    n0, n1 = cluster_nodes(2, size="96MiB", regions=16)
    a.call("open", dir=str(n0.mountpoint / "nixl"), engine="uring")
    b.call("open", dir=str(n1.mountpoint / "nixl"), engine="aio")
    keys = list(range(100, 112))
    a.call("put", keys=keys)
    assert b.call("contains", keys=keys) == [True] * 12
    assert b.call("get", keys=keys) == [True] * 12
    assert n1.stats()["tiers"]["pool"]["bytes_out"] >= 12 * CHUNK


def test_chunks_kvfs_evicted_are_clean_misses(engines, make_mount, pool_config):
    """The dynamic backend has no eviction of its own: kvfs's LRU is its eviction, and since it
    looks chunks up by name (stat), an evicted chunk is simply not contained."""
    a, b = engines
    m = make_mount(pool_config(size="40MiB", dram="16MiB"))
    d = str(m.mountpoint / "nixl")
    a.call("open", dir=d, engine="uring")
    b.call("open", dir=d, engine="aio")
    keys = list(range(1, 41))                                  # 80 MiB through a 40 MiB pool
    a.call("put", keys=keys)
    assert m.stats()["files"]["pool_evictions"] > 0
    there = a.call("contains", keys=keys)
    assert not there[0] and there[-1] and 8 <= sum(there) < 20
    assert len(os.listdir(d)) == sum(there)
    assert a.call("get", keys=[k for k, t in zip(keys, there) if t]) == [True] * sum(there)
    # looked up, then evicted by another engine's puts before the read: no wrong bytes
    late = [k for k, t in zip(keys, there) if t][-4:]
    assert a.call("contains", keys=late) == [True] * 4
    b.call("put", keys=list(range(200, 220)))
    got = a.call("get", keys=late)
    assert all(g is None for g in got), got
