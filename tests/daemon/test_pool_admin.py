"""Namespaces removed and added while mounted (kvfs/fs/pool_admin.py, kvfs/pool/members.py),
driven on the daemon's objects: refusals, a commit that races the removal, and a removal a
crash interrupted finished at the next start. tests/mounted/test_pool_admin.py runs the same
through a mount on loop devices."""

from __future__ import annotations

import errno
import os
import sqlite3

import pytest
import trio

from kvfs import config
from kvfs.errors import KvfsError
from kvfs.pool.members import Members
from tests.daemon.harness import eventually, known, run_service

STRIPED = 'stripe_unit = "256KiB"'


async def _fill(fs, n: int = 9) -> dict[str, bytes]:
    blocks = {f"/f{i}": os.urandom(200_000 if i % 3 else 700_000) for i in range(n)}
    for p, data in blocks.items():
        await fs.write(p, data)
    await fs.sync()
    return blocks


def _on(fs, j: int, blocks) -> set[str]:
    return {p for p in blocks if j in fs.files.catalog.get(fs.ino(p)).blob.layout.ns}


def test_refusals_name_the_problem_and_change_nothing(pool_config):
    cfg = pool_config(n=2, size="64MiB", pool=STRIPED)

    async def body(fs):
        admin = fs.svc.pool_admin
        blocks = await _fill(fs)
        for j, code, words in [(2, errno.EINVAL, "no namespace 2"), (-1, errno.EINVAL, "")]:
            with pytest.raises(KvfsError) as e:
                await admin.remove(j)
            assert e.value.errno == code and words in str(e.value)
        with pytest.raises(KvfsError) as e:  # healthy, holding blocks
            await admin.remove(1)
        assert e.value.errno == errno.EBUSY and "still reads" in str(e.value)
        # failed for reads, but its blocks are whole in DRAM: still refused
        for p in _on(fs, 1, blocks):
            assert await fs.read(p) == blocks[p]
        fs.svc.pool.namespaces[1].health.fail("a test says so")
        with pytest.raises(KvfsError) as e:
            await admin.remove(1)
        assert e.value.errno == errno.EBUSY and "DRAM or the local tier" in str(e.value)
        assert [ns.removed for ns in fs.svc.pool.namespaces] == [False, False]
        for p, data in blocks.items():
            assert await fs.read(p) == data
        await admin.remove(1, drop=True)
        # the largest block follows what the pool holds now: past it is EFBIG, not ENOSPC
        capacity = fs.svc.pool.capacity
        assert fs.svc.pool.max_block_size == capacity < 70 << 20
        await fs.write("/big", b"x")
        with pytest.raises(KvfsError) as e:
            await fs.files.setattr(fs.ino("/big"), None, size=capacity + 4096)
        assert e.value.errno == errno.EFBIG and "largest block" in str(e.value)
        with pytest.raises(KvfsError) as e:
            await admin.remove(0, drop=True)
        assert e.value.errno == errno.EBUSY and "last" in str(e.value)
        with pytest.raises(KvfsError) as e:
            await admin.add("relative.img", 64 << 20)
        assert e.value.errno == errno.EINVAL
        with pytest.raises(KvfsError) as e:
            await admin.add(str(fs.svc.pool.namespaces[0].path))
        assert e.value.errno == errno.EEXIST and "in the pool already" in str(e.value)

    run_service(cfg, body)


def test_a_block_written_to_a_namespace_removed_meanwhile_is_refused_at_its_commit(pool_config):
    """Its units were placed before the removal and its commit comes after the scan that
    dropped the namespace's files: the commit fails (EIO), nothing points at the space."""
    cfg = pool_config(n=2, size="64MiB", pool=STRIPED)

    async def body(fs):
        await fs.write("/a", os.urandom(100))
        await fs.sync()
        node = fs.files.catalog.get(fs.ino("/a"))
        pool = fs.svc.pool
        ns, offsets = pool.allocate(700_000)  # (3 units: both namespaces)
        assert 1 in ns
        await fs.svc.pool_admin.remove(1, drop=True)
        from kvfs.pool.layout import Layout

        layout = Layout(700_000, pool.unit, ns, offsets, (0,) * len(ns))
        (got,) = await fs.files.sessions.publisher.publish([(node, layout)])
        assert isinstance(got, KvfsError) and got.errno == errno.EIO
        assert "removed from the pool" in str(got)
        assert fs.files.catalog.get(node.ino).blob.layout.ns != ns  # the old version stays

    run_service(cfg, body)


@pytest.mark.parametrize("j", [0, 1])
def test_a_removal_a_crash_interrupted_is_finished_at_the_next_start(pool_config, j):
    """The record (namespace j removed, its files being dropped) was durable, the drop was
    not: the next start opens the pool without namespace j (its file may be gone), drops the
    files with units there, and says the drop is done; reads keep their deadline (it once
    came from namespace 0's slot, which a removed one's has not)."""
    cfg_path = pool_config(n=3, size="64MiB", pool=STRIPED)
    cfg = config.load(cfg_path)
    kept: dict = {}

    async def before(fs):
        blocks = await _fill(fs, 12)
        kept["blocks"] = blocks
        kept["on"] = _on(fs, j, blocks)
        assert 0 < len(kept["on"]) < len(blocks)

    run_service(cfg_path, before)
    path = cfg.pool.namespaces[j].path
    members = Members({j: (str(path), os.path.getsize(path))}, {}, {j})
    with sqlite3.connect(cfg.catalog_path) as db:
        db.execute("INSERT INTO meta VALUES ('pool_members', ?)", (members.encode(),))
    os.unlink(path)  # gone for good

    async def after(fs):
        blocks, gone = kept["blocks"], kept["on"]
        await eventually(lambda: not any(known(fs, p) for p in gone), 10, "the drop")
        states = ["ok", "ok", "ok"]
        states[j] = "removed"
        assert [ns.stats.state for ns in fs.svc.pool.namespaces] == states
        assert fs.svc.pool.read_limit(4096) is not None
        for p in set(blocks) - gone:
            assert await fs.read(p) == blocks[p]
        await eventually(lambda: not fs.svc.pool_admin.members.dropping, 10, "the record")
        assert Members.decode(fs.svc.catalog.members).dropping == set()
        await fs.write("/new", os.urandom(700_000))
        await fs.sync()
        assert j not in fs.files.catalog.get(fs.ino("/new")).blob.layout.ns

    run_service(cfg_path, after)


def test_a_restart_reads_the_config_however_it_lists_the_namespaces(tmp_path):
    """After a removal and an add, the pool starts from a config that still lists the
    removed namespace or not, lists the added one or not, in any order (device names change
    across reboots): each namespace is known by the number its superblock holds. Refused in
    one line: a number missing, two paths with one number, another pool's namespace."""
    from testing.mount import write_config
    from tests.daemon.test_pool import open_fails

    ns = [tmp_path / f"ns{i}.img" for i in range(4)]

    def cfg(paths, name="k.toml"):
        nss = [
            {"path": str(p), "size": "64MiB"} if not p.exists() else {"path": str(p)} for p in paths
        ]
        return write_config(tmp_path / name, tmp_path / "state", nss, pool=STRIPED)

    first = cfg(ns[:3])
    kept: dict = {}

    async def change(fs):
        kept["blocks"] = await _fill(fs, 12)
        kept["gone"] = _on(fs, 1, kept["blocks"])
        await fs.svc.pool_admin.remove(1, drop=True)
        await fs.svc.pool_admin.add(str(ns[3]), 64 << 20)
        await fs.write("/after", os.urandom(700_000))
        await fs.sync()
        assert 3 in fs.files.catalog.get(fs.ino("/after")).blob.layout.ns

    run_service(first, change)
    blocks = kept["blocks"]
    blocks["/after"] = None

    async def check(fs):
        assert [n.stats.state for n in fs.svc.pool.namespaces] == ["ok", "removed", "ok", "ok"]
        assert [str(n.path) for n in fs.svc.pool.namespaces] == [str(p) for p in ns]
        for p, data in blocks.items():
            assert known(fs, p) != (p in kept["gone"])
            if data is not None and p not in kept["gone"]:
                assert await fs.read(p) == data

    run_service(first, check)  # unchanged
    os.unlink(ns[1])
    run_service(first, check)  # the removed one's file gone, still listed
    run_service(cfg([ns[2], ns[0]], "b.toml"), check)  # its line dropped, reordered
    run_service(cfg([ns[3], ns[0], ns[2]], "c.toml"), check)  # the added one listed
    (tmp_path / "copy.img").write_bytes(ns[2].read_bytes())
    open_fails(cfg([ns[0], ns[2], tmp_path / "copy.img"], "d.toml"), "both hold number 2")
    os.rename(ns[3], tmp_path / "elsewhere.img")
    open_fails(cfg([ns[0], ns[2]], "e.toml"), "namespace 3 of pool", "is missing")
    os.rename(tmp_path / "elsewhere.img", ns[3])
    other = write_config(
        tmp_path / "o.toml",
        tmp_path / "ostate",
        [{"path": str(tmp_path / "o.img"), "size": "64MiB"}],
    )
    run_service(other, lambda fs: trio.sleep(0))
    open_fails(cfg([ns[0], ns[2], tmp_path / "o.img"], "f.toml"), "o.img: belongs to pool")


def test_the_membership_record_round_trips():
    m = Members({1: ("/b", 1 << 30)}, {3: "/d"}, {1})
    assert Members.decode(m.encode()) == m
    assert m.changed and not Members.decode(None).changed
