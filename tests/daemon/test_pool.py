"""The pool on real files: formats, refusals, striped round trips, fragmentation, balance."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
from pathlib import Path

import pytest
import trio

from kvfs import config
from kvfs.cli import main as kvfs_main
from kvfs.errors import StartupError
from kvfs.knobs import Knobs
from kvfs.pool.layout import Layout
from kvfs.pool.pool import Pool
from kvfs.service import open_layers
from tests.daemon.harness import run_service
from tests.helpers import write_config

MiB = 1 << 20


def cfg_for(
    tmp_path: Path,
    names: list[str],
    *,
    unit: str = "1MiB",
    size: str = "64MiB",
    state: str = "state",
    name: str = "k.toml",
    extra_pool: str = "",
) -> Path:
    ns = [{"path": str(tmp_path / n), "size": size} for n in names]
    return write_config(
        tmp_path / name, tmp_path / state, ns, pool=f'stripe_unit = "{unit}"\n{extra_pool}'
    )


def open_layers_now(cfg: Path) -> None:
    """Open the layers of `cfg` (and close them again) as the daemon does at start-up."""

    async def main():
        async with contextlib.AsyncExitStack() as stack:
            await open_layers(config.load(cfg), Knobs(), stack)

    trio.run(main)


def open_fails(cfg: Path, *needles: str) -> None:
    with pytest.raises(StartupError) as e:
        open_layers_now(cfg)
    for n in needles:
        assert n in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "n, unit, io",
    [
        (1, "1MiB", "auto"),
        (3, "64KiB", "auto"),
        (3, "1MiB", "auto"),
        (4, "256KiB", "auto"),
        (4, "4MiB", "auto"),
        (3, "1MiB", "threads"),
    ],
)
def test_round_trip_across_restarts(tmp_path, n, unit, io):
    """Files of every size written, then read back by two later daemons (the small ones by
    Linux AIO, or with io_engine "threads" by worker threads)."""
    cfg = cfg_for(
        tmp_path, [f"ns{i}.img" for i in range(n)], unit=unit, extra_pool=f'io_engine = "{io}"'
    )
    files = {
        f"/b{i}": os.urandom(s)
        for i, s in enumerate([0, 1, 4095, 4096, 65537, MiB, 5 * MiB + 7, 13 * MiB])
    }

    async def write(fs):
        for p, d in files.items():
            await fs.write(p, d)

    async def check(fs):
        for p, d in files.items():
            assert await fs.read(p) == d, p
        used = {j for node in fs.files.catalog.files() for j in node.blob.layout.ns}
        assert used == set(range(n))  # every namespace holds units

    run_service(cfg, write)
    run_service(cfg, check)
    run_service(cfg, check)


def test_small_blocks_spread_across_namespaces(tmp_path):
    cfg = cfg_for(tmp_path, [f"ns{i}.img" for i in range(4)])

    async def body(fs):
        for i in range(8):
            await fs.write(f"/s{i}", b"x" * 100)  # one unit each
        await fs.sync()
        firsts = [fs.files.catalog.get(fs.ino(f"/s{i}")).blob.layout.ns[0] for i in range(8)]
        assert sorted(set(firsts)) == [0, 1, 2, 3]  # the start namespace rotates

    run_service(cfg, body)


def test_fragmented_space_gives_several_extents_per_namespace(tmp_path):
    cfg = cfg_for(tmp_path, ["ns0.img", "ns1.img"], size="40MiB", extra_pool='evict = "never"')

    async def body(fs):
        for i in range(38):
            await fs.write(f"/f{i}", os.urandom(2 * MiB))  # one unit on each namespace
        await fs.sync()
        for i in range(0, 38, 2):
            p, n = fs.resolve(f"/f{i}")
            await fs.files.unlink(p, n)  # holes of 1 MiB everywhere
        data = os.urandom(12 * MiB)
        await fs.write("/big", data)
        await fs.sync()
        lay = fs.files.catalog.get(fs.ino("/big")).blob.layout
        per_ns = {}
        for e in lay.extents():
            per_ns[e.ns] = per_ns.get(e.ns, 0) + 1
        assert max(per_ns.values()) > 1, lay.extents()
        assert await fs.read("/big") == data
        kept.update({f"/f{i}": await fs.read(f"/f{i}") for i in range(1, 38, 2)}, big=data)

    async def after_restart(fs):
        # the block of many extents, and the blocks between its extents, come back bit-exact
        assert await fs.read("/big") == kept.pop("big")
        for path, want in kept.items():
            assert await fs.read(path) == want, path

    kept: dict = {}
    run_service(cfg, body)
    run_service(cfg, after_restart)


def test_a_config_asking_for_the_removed_uring_engine_is_refused(tmp_path):
    from kvfs.errors import ConfigError

    with pytest.raises(ConfigError, match=r"pool\.io: removed"):
        config.from_dict({"pool": {"io": "uring"}}, base=tmp_path)


def test_refusals(tmp_path):
    names = ["ns0.img", "ns1.img", "ns2.img"]
    cfg = cfg_for(tmp_path, names)
    run_service(cfg, _noop)  # creates pool A
    # a namespace from another pool
    other = cfg_for(tmp_path, ["o0.img", "o1.img", "o2.img"], state="state-b", name="b.toml")
    run_service(other, _noop)
    swapped = write_config(
        tmp_path / "x.toml",
        tmp_path / "state",
        [{"path": str(tmp_path / n)} for n in ["ns0.img", "o1.img", "ns2.img"]],
    )
    open_fails(swapped, "o1.img", "belongs to pool")
    # reordered
    reordered = write_config(
        tmp_path / "r.toml",
        tmp_path / "state",
        [{"path": str(tmp_path / n)} for n in ["ns1.img", "ns0.img", "ns2.img"]],
    )
    open_fails(reordered, "is number 1", "listed as number 0", "reordered")
    # missing
    missing = write_config(
        tmp_path / "m.toml",
        tmp_path / "state",
        [{"path": str(tmp_path / n)} for n in ["ns0.img", "ns1.img"]],
    )
    open_fails(missing, "has 3 namespaces", "lists 2")
    gone = cfg_for(tmp_path, ["ns0.img", "nsX.img", "ns2.img"], name="g.toml")
    open_fails(gone, "nsX.img", "does not exist")
    # changed geometry
    open_fails(
        cfg_for(tmp_path, names, unit="256KiB", name="u.toml"), "stripe_unit", "changed geometry"
    )
    open_fails(cfg_for(tmp_path, names, size="128MiB", name="s.toml"), "changed geometry")
    # a catalog lost: the pool is not silently reused with an empty index
    shutil.move(tmp_path / "state", tmp_path / "state.saved")
    open_fails(cfg, "no catalog for it")
    assert not (tmp_path / "state").exists()  # refusing created nothing
    shutil.move(tmp_path / "state.saved", tmp_path / "state")
    # an unformatted device-like file that kvfs did not create
    (tmp_path / "blank.img").write_bytes(bytes(8 * MiB))
    blank = write_config(
        tmp_path / "bl.toml", tmp_path / "state-c", [{"path": str(tmp_path / "blank.img")}]
    )
    open_fails(blank, "not a kvfs namespace", "kvfs format")
    run_service(cfg, _noop)  # the right config still opens


async def _noop(fs):
    return None


def test_format_then_mount_then_refuse_reformat(tmp_path):
    cfg = cfg_for(tmp_path, ["ns0.img", "ns1.img"])
    with contextlib.redirect_stdout(io.StringIO()):
        assert kvfs_main(["format", "--config", str(cfg)]) == 0
    data = os.urandom(3 * MiB)

    async def write(fs):
        await fs.write("/x", data)

    run_service(cfg, write)
    with contextlib.redirect_stderr(io.StringIO()) as err:
        assert kvfs_main(["format", "--config", str(cfg)]) == 1
    assert "already holds a catalog" in err.getvalue()
    run_service(cfg, lambda fs: _expect(fs, "/x", data))


async def _expect(fs, path, data):
    assert await fs.read(path) == data


class _FakeNs:
    def __init__(self, i: int, weight: float = 1.0):
        from kvfs.pool.namespace import NamespaceStats

        self.index, self.weight, self.stats = i, weight, NamespaceStats()


def _placement_only(n: int) -> Pool:
    """A Pool with only what its placement (`observe`, `placement_weights`) uses: `n` equal
    namespaces, no devices, the balance and its observations as Pool.__init__ sets them."""
    pool = Pool.__new__(Pool)
    pool.namespaces = [_FakeNs(i) for i in range(n)]
    pool.adaptive = True
    pool.balance = [1.0] * n
    pool._obs_units, pool._obs_seconds, pool._busy_until = [0] * n, [0.0] * n, [0.0] * n
    pool._obs_since = 0.0
    return pool


def test_placement_learns_a_slow_namespace():
    speeds = [100.0, 100.0, 100.0, 50.0]  # units per second
    pool = _placement_only(4)
    for t in range(40):
        w = pool.placement_weights()
        units = {j: max(1, round(32 * w[j] / sum(w))) for j in range(4)}
        pool.observe(units, float(t), {j: units[j] / speeds[j] for j in range(4)})
    w = pool.placement_weights()
    assert abs(w[3] / w[0] - 0.5) < 0.1, w
    assert min(w[:3]) > 0.9


def test_placement_learns_from_busy_time_not_from_queued_latency():
    """Units written behind are observed one by one, each from its start: a namespace with
    several queued finishes them one after the other, so their latencies grow with the
    queue. Counted as busy time (the spans' union) the pool still learns the true ratio;
    summed as latencies it would learn the one with more units as slower per unit."""
    service = [0.01, 0.01, 0.01, 0.02]  # seconds per unit: namespace 3 at half the speed
    pool = _placement_only(4)
    t = 0.0
    for _ in range(60):
        w = pool.placement_weights()
        units = [max(1, round(32 * w[j] / sum(w))) for j in range(4)]
        for j in range(4):  # all queued at t, finished one after the other
            for i in range(1, units[j] + 1):
                pool.observe({j: 1}, t, {j: i * service[j]})
        t += 10.0
    w = pool.placement_weights()
    assert abs(w[3] / min(w[:3]) - 0.5) < 0.06, w


def test_placement_stays_even_on_equal_namespaces_with_noisy_service_times():
    """Four equal namespaces behind a cgroup throttle, which lets I/O through in 100 ms
    slices: each namespace's speed in a slice varies (here x0.7-1.4), the same for every
    transfer in it. The balance must not follow that noise: a block whose units go mostly to
    one namespace is loaded at that namespace's pace (bench/clients.py saw one namespace given
    3x another's units, loads at 0.62x the RAID-0). Over two minutes of back-to-back
    transfers of 32 units, no namespace's weight is below 0.75 of another's."""
    import math
    import random

    rng = random.Random(3)
    pool = _placement_only(4)
    speed = 400.0  # units per second, each
    noise: dict[tuple[int, int], float] = {}
    t, worst = 0.0, 1.0
    while t < 120.0:
        w = pool.placement_weights()
        units = {j: max(1, round(32 * w[j] / sum(w))) for j in range(4)}
        slice_ = int(t / 0.1)
        seconds = {}
        for j in range(4):
            f = noise.setdefault((j, slice_), math.exp(rng.uniform(-0.35, 0.35)))
            seconds[j] = units[j] / speed * f
        pool.observe(units, t, seconds)
        t += max(seconds.values())
        if t > 5.0:
            w = pool.placement_weights()
            worst = min(worst, min(w) / max(w))
    assert worst >= 0.75, worst


def _tear(path: Path, offset: int, nbytes: int) -> None:
    """Overwrite bytes of a namespace's superblock, as a torn write would."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes(b ^ 0xA5 for b in f.read(nbytes)))
        f.seek(offset)


@pytest.mark.parametrize("n", [1, 3])
def test_a_torn_superblock_is_rebuilt_when_nothing_is_in_doubt(tmp_path, n):
    """A superblock whose checksum fails but which still names the catalog's pool (the others
    agreeing) is rewritten at start-up with one log line; the data is all there. One that
    no longer names the pool (its pool id torn) or a torn magic is refused, as before."""
    from kvfs.pool.superblock import SB_SIZE, decode

    names = [f"ns{i}.img" for i in range(n)]
    cfg = cfg_for(tmp_path, names)
    data = os.urandom(5 * MiB)
    run_service(cfg, lambda fs: fs.write("/f", data))
    victim = tmp_path / names[-1]
    raw = victim.read_bytes()[:SB_SIZE]
    at = raw.index(b'"stripe_unit"')  # not the pool id
    _tear(victim, at, 6)
    with pytest.raises(ValueError):
        decode(victim.read_bytes()[:SB_SIZE])

    async def check(fs):
        assert await fs.read("/f") == data
        rebuilt = fs.svc.statistics()["tiers"]["pool"]["rebuilt_superblocks"]
        assert len(rebuilt) == 1 and str(victim) in rebuilt[0], rebuilt

    run_service(cfg, check)
    assert decode(victim.read_bytes()[:SB_SIZE]) is not None  # written back
    run_service(cfg, lambda fs: _read_back(fs, data))
    _tear(victim, raw.index(b'"pool_id"') + 12, 8)  # the pool id itself
    open_fails(cfg, str(victim), "superblock checksum mismatch", "cannot be rebuilt safely")
    _tear(victim, raw.index(b'"pool_id"') + 12, 8)  # undone
    _tear(victim, 0, 4)  # the magic: not kvfs's now
    open_fails(cfg, str(victim), "not a kvfs namespace")


async def _read_back(fs, data):
    assert await fs.read("/f") == data
    assert fs.svc.statistics()["tiers"]["pool"]["rebuilt_superblocks"] == []


@pytest.mark.parametrize("end", ["committed", "release"])
def test_a_shared_pool_counts_a_published_or_released_block_out_of_its_regions(tmp_path, end):
    """A shared pool must not give back a region while one of its blocks is being written there
    (another node would allocate over it): `inflight` drops back to exactly zero once the
    block is published or released, however allocate() cut it into extents (it takes one
    extent for all the units a namespace gets; the layout lists them unit by unit)."""
    from kvfs.cluster.space import Regions
    from kvfs.pool.layout import Layout

    async def main():
        cfg = config.load(cfg_for(tmp_path, ["ns0.img", "ns1.img"], unit="256KiB", size="64MiB"))
        pool = Pool.open(cfg.pool, expect_pool_id=None, create_new=True)
        try:
            regions = Regions(pool.namespaces[0].size, 4, pool.unit)
            pool.area = regions
            for r in range(regions.count):
                regions.deadline[r] = trio.current_time() + 600  # this node holds every lease
            size = 8 * 256 * 1024 + 100  # 9 units, 4-5 per namespace
            ns, offsets = pool.allocate(size)
            assert max(sum(1 for j in ns if j == k) for k in (0, 1)) > 1
            assert sum(regions.inflight.values()) > 0  # being written: not given back
            layout = Layout(size, pool.unit, ns, offsets, (0,) * len(ns))
            getattr(pool, end)(layout)
            assert all(v == 0 for v in regions.inflight.values()), dict(regions.inflight)
        finally:
            pool.close()

    trio.run(main)


def test_a_unit_that_does_not_fit_on_its_fragmented_namespace_goes_to_another(tmp_path):
    """Free bytes on a namespace may be fragmented below a stripe unit (small files freed
    between others): the unit is placed where it fits, not refused with ENOSPC."""
    cfg = config.load(cfg_for(tmp_path, ["ns0.img", "ns1.img"], unit="256KiB", size="16MiB"))
    pool = Pool.open(cfg.pool, expect_pool_id=None, create_new=True)
    try:
        a = pool.allocators[0]
        page = 4096
        # namespace 0: every other page used, so half of it is free but no unit fits
        for off in range(0, pool.namespaces[0].size, 2 * page):
            a.take_free(off, page)
        assert a.largest() < pool.unit and a.free_bytes > 4 * pool.unit
        ns, offsets = pool.allocate(4 * pool.unit)
        assert set(ns) == {1}, ns
        layout = Layout(4 * pool.unit, pool.unit, ns, offsets, (0,) * len(ns))
        pool.release(layout)
    finally:
        pool.close()


def test_small_durable_writes_share_a_worker_job_and_a_sync(tmp_path, monkeypatch):
    """Small writes that must be durable on return, issued together on one namespace, are
    written by fewer worker jobs with fewer fdatasyncs than writes (a group: kvfs/pool/namespace.py
    `_write_grouped`); each gets its own checksums, a write that fails fails alone with EIO,
    and the others' bytes are on the namespace."""
    import errno
    import mmap

    import xxhash

    from kvfs.errors import KvfsError
    from kvfs.pool import namespace as device
    from kvfs.pool.namespace import Namespace

    ns = Namespace.open(0, tmp_path / "ns.img", create_size=64 * MiB)
    jobs = []
    real_job = Namespace._write_group_sync
    monkeypatch.setattr(
        Namespace,
        "_write_group_sync",
        lambda self, batch, lead: jobs.append(len(batch)) or real_job(self, batch, lead),
    )
    bad_offset = 8 * MiB + 5 * 8192
    real_pwritev = os.pwritev

    def pwritev(fd, views, offset):
        if offset == bad_offset:
            raise OSError(errno.EIO, "injected")
        return real_pwritev(fd, views, offset)

    monkeypatch.setattr(device.os, "pwritev", pwritev)
    data = [os.urandom(8192) for _ in range(16)]
    results: dict[int, object] = {}

    async def one(i: int) -> None:
        buf = mmap.mmap(-1, 8192)
        buf[:] = data[i]
        try:
            results[i] = await ns.write_units(
                [[memoryview(buf)]], 8 * MiB + i * 8192, [8192], sync=True
            )
        except KvfsError as e:
            results[i] = e

    async def main() -> None:
        async with trio.open_nursery() as n:
            for i in range(16):
                n.start_soon(one, i)

    trio.run(main)
    assert ns._groups_running == 0 and not ns._group  # every group's slot given back
    assert sum(jobs) == 16 and len(jobs) < 16, jobs
    assert ns.syncs <= len(jobs) < 16
    assert isinstance(results[5], KvfsError) and results[5].errno == errno.EIO
    monkeypatch.setattr(device.os, "pwritev", real_pwritev)
    ns.close()
    on_disk = (tmp_path / "ns.img").read_bytes()
    for i in range(16):
        if i == 5:
            continue
        assert results[i] == [xxhash.xxh3_64_intdigest(data[i])]
        assert on_disk[8 * MiB + i * 8192 : 8 * MiB + (i + 1) * 8192] == data[i]


def test_grouped_writes_keep_no_view_of_the_blocks_they_wrote(tmp_path):
    """A group's requests let go of the block memory they wrote once they are done. The
    request that leads the next group held that group's list, itself in it: a reference
    cycle that kept every member's views (and so its block's mapping and file, deleted,
    with a descriptor open) until Python's cyclic collector ran, which on a quiet daemon
    may be never (the soak test saw block descriptors left after the DRAM tier was
    dropped). With the collector off, every mapping can be closed as soon as its write
    returns."""
    import gc
    import mmap

    from kvfs.pool.namespace import Namespace
    from kvfs.pool.requests import WriteRequest

    ns = Namespace.open(0, tmp_path / "ns.img", create_size=64 * MiB)
    maps = [mmap.mmap(-1, 8192) for _ in range(16)]

    async def one(i: int) -> None:
        await ns.write_units([[memoryview(maps[i])]], 8 * MiB + i * 8192, [8192], sync=True)

    async def main() -> None:
        async with trio.open_nursery() as n:
            for i in range(16):
                n.start_soon(one, i)

    gc.collect()  # what earlier tests left in cycles
    gc.disable()
    try:
        trio.run(main)
        left = [o for o in gc.get_objects() if type(o) is WriteRequest]  # (isinstance would
        # touch every object's __class__: deprecated attributes of torch warn)
        assert not left, f"{len(left)} group requests still alive"
        for m in maps:
            m.close()  # BufferError while a view of it is still held
    finally:
        gc.enable()
        ns.close()


def test_a_contested_block_unclaimed_first_frees_only_what_it_took(tmp_path, caplog):
    """Shared pool bookkeeping: a node that has not applied X's purge yet claims Y, published
    by another node in X's space (contested). If Y is purged first, its unclaim must leave X's
    space used here: freeing it let this node allocate there again, and X's purge, applied
    later, then freed that new block's space (the cluster torture found two current blocks of
    one node sharing an extent)."""
    from kvfs.pool.layout import DATA_START

    cfg = cfg_for(tmp_path, ["ns0.img"], size="16MiB")

    async def body(fs):
        pool = fs.svc.pool
        a = pool.allocators[0]
        u = pool.unit
        off = DATA_START + 8 * u  # space no block of this test uses
        x = Layout(u, u, (0,), (off,), (1,))
        y = Layout(u + 4096, u, (0, 0), (off, off + u), (2, 3))  # X's unit and the next
        assert pool.claim(x)
        assert not pool.claim(y)  # X's unit: contested
        pool.unclaim(y)  # Y purged before X, here
        assert a.free_in(off, off + u)[0] == 0  # still X's
        assert a.free_in(off + u, off + 2 * u)[0] == u  # what Y took is free again
        pool.unclaim(x)
        assert a.free_in(off, off + u)[0] == u
        assert "twice" not in caplog.text

    run_service(cfg, body)


def test_small_block_io_a_file_system_would_block_for_goes_to_a_worker_thread(
    tmp_path, monkeypatch
):
    """On a namespace file, small blocks' AIO asks for RWF_NOWAIT: an I/O the file system
    would block for (EAGAIN) is done by a worker thread instead, and one that does not take
    RWF_NOWAIT at all (EOPNOTSUPP) turns AIO off for that namespace; the bytes are right
    either way, and the fallbacks are counted."""
    import errno

    from kvfs.pool import linux_aio

    cfg = cfg_for(tmp_path, ["ns0.img"])
    files = {f"/s{i}": os.urandom(100_000 + i) for i in range(6)}
    calls = {"preadv": 0, "pwritev": 0}

    def refusing(name, err, every):
        real = getattr(linux_aio.Engine, name)

        async def op(self, fd, views, offset, nowait=False):
            assert nowait  # (a file: RWF_NOWAIT asked for)
            calls[name] += 1
            if calls[name] % every == 1:
                raise OSError(err, os.strerror(err))
            return await real(self, fd, views, offset, nowait)

        monkeypatch.setattr(linux_aio.Engine, name, op)

    async def write(fs):
        ns = fs.svc.pool.namespaces[0]
        assert ns.aio and ns.nowait
        for p, d in files.items():
            await fs.write(p, d)
        await fs.sync()
        assert ns.stats.aio_fallbacks >= 1 and ns.aio  # EAGAIN: this I/O only

    async def read(fs):
        ns = fs.svc.pool.namespaces[0]
        for p, d in files.items():
            assert await fs.read(p) == d, p
        assert ns.stats.aio_fallbacks == 1 and not ns.aio  # EOPNOTSUPP: no more AIO

    refusing("pwritev", errno.EAGAIN, 2)
    run_service(cfg, write)
    refusing("preadv", errno.EOPNOTSUPP, 1000)
    run_service(cfg, read)
    assert calls["pwritev"] >= len(files) and calls["preadv"] == 1


def test_small_blocks_spread_by_weight_when_the_weights_differ(tmp_path):
    """One-unit blocks go to every namespace in proportion to its weight: the round robin's
    credit carries from block to block (with a fresh start per block, the heaviest namespace
    took all of them: a single writer's small files on one device of four)."""
    weights = [1.0, 0.5, 1.0, 0.9]
    ns = [
        {"path": str(tmp_path / f"ns{i}.img"), "size": "64MiB", "weight": w}
        for i, w in enumerate(weights)
    ]
    cfg = write_config(
        tmp_path / "k.toml", tmp_path / "state", ns, pool="adaptive_placement = false"
    )

    async def body(fs):
        for i in range(68):
            await fs.write(f"/s{i}", b"x" * 100)
        await fs.sync()
        firsts = [fs.files.catalog.get(fs.ino(f"/s{i}")).blob.layout.ns[0] for i in range(68)]
        counts = [firsts.count(j) for j in range(4)]
        assert counts == [20, 10, 20, 18], counts

    run_service(cfg, body)


def test_a_full_aio_context_sends_small_block_io_to_a_worker_thread(tmp_path, monkeypatch):
    """io_submit refuses I/Os past the context's size with EAGAIN, on a block device too (no
    RWF_NOWAIT there): the I/O goes to a worker thread, never fails the read or write."""
    import errno

    from kvfs.pool import linux_aio

    cfg = cfg_for(tmp_path, ["ns0.img"])
    data = os.urandom(200_000)

    async def full(self, fd, views, offset, nowait=False):
        raise OSError(errno.EAGAIN, "io_submit: " + os.strerror(errno.EAGAIN))

    async def body(fs):
        ns = fs.svc.pool.namespaces[0]
        ns.nowait = False  # as on a block device
        monkeypatch.setattr(linux_aio.Engine, "pwritev", full)
        monkeypatch.setattr(linux_aio.Engine, "preadv", full)
        await fs.write("/a", data)
        await fs.sync()
        fs.svc.store.drop_dram()
        assert await fs.read("/a") == data
        assert ns.stats.aio_fallbacks == 2 and ns.aio  # the write and the read

    run_service(cfg, body)


def test_a_batchs_small_blocks_back_to_back_go_as_one_aio_write(tmp_path, monkeypatch):
    """A write-back batch's small blocks are allocated one after the other on a namespace:
    they go as one AIO write of many views (one io_submit, not one per block). A merged
    write that fails is tried again block by block, so each block gets its own result;
    every block reads back bit-exact from the device."""
    import errno

    from kvfs.pool import linux_aio

    cfg = cfg_for(tmp_path, ["ns0.img"])
    files = {f"/s{i}": os.urandom(100_000 + i) for i in range(8)}
    calls: list[int] = []
    fail_merged = [False]
    real = linux_aio.Engine.pwritev

    async def pwritev(self, fd, views, offset, nowait=False):
        calls.append(len(views))
        if fail_merged[0] and len(views) > 1:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return await real(self, fd, views, offset, nowait)

    monkeypatch.setattr(linux_aio.Engine, "pwritev", pwritev)

    async def body(fs):
        for p, d in files.items():
            await fs.write(p, d)
        await fs.sync()
        assert calls == [len(files)], calls  # one write, a view each
        calls.clear()
        fail_merged[0] = True
        for p, d in files.items():
            await fs.write(p + "x", d)
        await fs.sync()
        assert calls == [len(files)] + [1] * len(files), calls  # merged, then one by one
        fs.svc.store.drop_dram()
        for p, d in files.items():
            assert await fs.read(p) == d, p
            assert await fs.read(p + "x") == d, p

    run_service(cfg, body)


@pytest.mark.parametrize("huge", [True, False])
def test_fetches_of_large_blocks_go_to_the_io_workers_and_land_bit_exact(
    tmp_path, monkeypatch, huge
):
    """A cold read of a block of 2 MiB or more is read by an I/O worker process straight into
    the block's own memory, verified there, where block memory has huge pages (the daemon's
    private tmpfs; here memfds stand in for it); smaller blocks, and every block where memory
    has 4 KiB pages, stay on the daemon's own path."""
    from kvfs.pool.buffer import MEMORY
    from kvfs.pool.pool import WORKER_MIN_BLOCK

    if huge:
        monkeypatch.setattr(MEMORY, "kind", "tmpfs, huge pages")
    assert MEMORY.huge == huge

    cfg = cfg_for(
        tmp_path, [f"ns{i}.img" for i in range(3)], unit="1MiB", extra_pool="io_workers = 1"
    )
    small = {f"/s{i}": os.urandom(n) for i, n in enumerate([1, 4097, 256 << 10, MiB + 3])}
    large = {f"/l{i}": os.urandom(n) for i, n in enumerate([2 * MiB, 3 * MiB + 5, 9 * MiB])}

    async def write(fs):
        for p, d in {**small, **large}.items():
            await fs.write(p, d)

    async def check(fs):
        workers = fs.files.store.pool.workers
        namespaces = fs.files.store.pool.namespaces
        assert workers.ready and len(workers.live) == 1

        def reads():
            return workers.reads, sum(ns.stats.reads for ns in namespaces)

        w0, n0 = reads()
        for p, d in large.items():
            assert await fs.read(p) == d, p
        w1, n1 = reads()
        if huge:
            assert w1 - w0 >= len(large) and n1 - n0 == w1 - w0  # every read a worker's
        else:
            assert w1 == w0 and n1 - n0 >= len(large)  # none a worker's
        for p, d in small.items():
            assert len(d) < WORKER_MIN_BLOCK
            assert await fs.read(p) == d, p
        w2, n2 = reads()
        assert w2 == w1 and n2 - n1 >= len(small)  # none a worker's
        assert workers.lost == 0

    run_service(cfg, write)
    run_service(cfg, check)


def test_a_killed_io_worker_loses_no_read_and_is_replaced(tmp_path, monkeypatch):
    """Reads in flight in a worker that is killed (SIGKILL, mid-batch) are read again by the
    daemon, bit-exact; a new worker takes the next reads."""
    import signal

    from kvfs.pool.buffer import MEMORY

    monkeypatch.setattr(MEMORY, "kind", "tmpfs, huge pages")  # (memfds stand in for it)

    cfg = cfg_for(
        tmp_path, [f"ns{i}.img" for i in range(2)], unit="1MiB", extra_pool="io_workers = 1"
    )
    files = {f"/b{i}": os.urandom(2 * MiB + (64 << 10) * i) for i in range(12)}

    async def write(fs):
        for p, d in files.items():
            await fs.write(p, d)

    async def check(fs):
        workers = fs.files.store.pool.workers
        (first,) = workers.live
        os.kill(first.pid, signal.SIGSTOP)  # it takes the batch but answers nothing
        got: dict[str, bytes] = {}

        async def one(p):
            got[p] = await fs.read(p)

        async with trio.open_nursery() as nursery:
            for p in files:
                nursery.start_soon(one, p)
            with trio.fail_after(10):
                while len(first.waiting) < len(files):  # (each file's first unit at least)
                    await trio.sleep(0.01)
            os.kill(first.pid, signal.SIGKILL)
        assert got == files
        lost = workers.lost
        assert lost >= len(files) and workers.restarts == 1
        with trio.fail_after(20):
            while not workers.ready:
                await trio.sleep(0.05)
        (second,) = workers.live
        assert second.pid != first.pid
        fs.files.store.drop_dram()
        before = workers.reads
        for p, d in files.items():
            assert await fs.read(p) == d
        assert workers.reads > before and workers.lost == lost

    run_service(cfg, write)
    run_service(cfg, check)


def test_a_batch_the_daemon_cannot_send_to_its_io_worker_is_read_here(tmp_path, monkeypatch):
    """A batch whose message fails to go out (here: EBADF, once) is read on the daemon's own
    path, bit-exact; the worker takes the next ones."""
    import errno
    import socket

    from kvfs.pool import io_workers
    from kvfs.pool.buffer import MEMORY

    monkeypatch.setattr(MEMORY, "kind", "tmpfs, huge pages")  # (memfds stand in for it)
    cfg = cfg_for(
        tmp_path, [f"ns{i}.img" for i in range(2)], unit="1MiB", extra_pool="io_workers = 1"
    )
    files = {f"/b{i}": os.urandom(3 * MiB + i) for i in range(3)}
    real = socket.send_fds
    failures = []

    def send_fds(sock, buffers, fds, *args):
        if not failures:
            failures.append(len(fds))
            raise OSError(errno.EBADF, "Bad file descriptor")
        return real(sock, buffers, fds, *args)

    async def write(fs):
        for p, d in files.items():
            await fs.write(p, d)

    async def check(fs):
        monkeypatch.setattr(io_workers.socket, "send_fds", send_fds)
        workers = fs.files.store.pool.workers
        for p, d in files.items():
            assert await fs.read(p) == d, p
        assert failures and workers.lost == failures[0] and workers.restarts == 0
        assert workers.reads > workers.lost  # the others were the worker's

    run_service(cfg, write)
    run_service(cfg, check)
