"""Integrity and capacity through a real mount: flipped bytes give EIO, a full pool behaves."""

from __future__ import annotations

import errno
import os

import pytest

MiB = 1 << 20


def layout_of(mnt, path) -> dict:
    """Where a file's units are, from the catalog of the stopped daemon."""
    import sqlite3

    from kvfs.pool.layout import Layout

    db = sqlite3.connect(mnt.config.parent / "state" / "catalog.sqlite")
    row = db.execute(
        "SELECT size, unit, ns, offsets, sums FROM nodes WHERE name = ?", (path.name.encode(),)
    ).fetchone()
    db.close()
    return Layout.unpack(*row)


def test_flipped_bytes_in_the_pool_give_eio_not_garbage(mnt, tmp_path):
    good, bad = mnt.mountpoint / "good.pt", mnt.mountpoint / "bad.pt"
    kept = os.urandom(3 * MiB)
    good.write_bytes(kept)
    data = os.urandom(3 * MiB)
    bad.write_bytes(data)
    mnt.stop()
    lay = layout_of(mnt, bad)
    with open(tmp_path / f"ns{lay.ns[2]}.img", "r+b") as f:  # a byte in the third unit
        f.seek(lay.offsets[2] + 12345)
        b = f.read(1)
        f.seek(lay.offsets[2] + 12345)
        f.write(bytes([b[0] ^ 0x40]))
    mnt.start()
    if mnt.passthrough:
        # a passthrough open fetches (and verifies) the whole block before it returns
        with pytest.raises(OSError) as e:
            open(bad, "rb", buffering=0)
        assert e.value.errno == errno.EIO
    else:
        with open(bad, "rb", buffering=0) as f:
            assert f.read(MiB) == data[:MiB]  # intact units read fine
            with pytest.raises(OSError) as e:
                f.read()
            assert e.value.errno == errno.EIO
    with pytest.raises(OSError) as e:
        bad.read_bytes()
    assert e.value.errno == errno.EIO
    assert good.read_bytes() == kept  # the rest of the pool is served
    assert "checksum mismatch" in mnt.log_text()
    assert mnt.stats()["namespaces"][0]["errors"] >= 1


def test_full_pool_with_evict_never_fails_writes_with_enospc(make_mount, pool_config):
    m = make_mount(pool_config(size="32MiB", pool='evict = "never"'))
    cap = m.stats()["tiers"]["pool"]["capacity"]
    a = os.urandom(cap - 4 * MiB)
    (m.mountpoint / "a").write_bytes(a)
    with pytest.raises(OSError) as e:
        (m.mountpoint / "b").write_bytes(os.urandom(8 * MiB))
    assert e.value.errno == errno.ENOSPC
    assert (m.mountpoint / "a").read_bytes() == a  # nothing was lost
    # b's first commit failed: a file that never had content is gone, on both data paths
    # (through passthrough its open once failed with EIO and a traceback in the log)
    assert not (m.mountpoint / "b").exists()
    assert "Traceback" not in m.log_text()
    with pytest.raises(OSError) as e:  # larger than the whole pool: refused at once
        with open(m.mountpoint / "huge", "wb") as f:
            f.truncate(cap + MiB)
    assert e.value.errno == errno.EFBIG


@pytest.mark.parametrize("evict,order", [("lru", "bdae"), ("prefix", "bdea")])
def test_full_pool_with_lru_drops_the_least_recently_used_files(
    make_mount, pool_config, evict, order
):
    """A full pool deletes closed files in its order: the least recently used first ("lru"),
    files used once before files used again, then the least recently used ("prefix"), also
    while closed files still wait for write-back (none outlives a file ranked before it)."""
    m = make_mount(pool_config(size="32MiB", pool=f'evict = "{evict}"'))
    cap = m.stats()["tiers"]["pool"]["capacity"]
    size = cap // 4 - 4096
    for name in "abcd":
        (m.mountpoint / name).write_bytes(os.urandom(size))
    (m.mountpoint / "a").read_bytes()  # a is used again: b is now the oldest
    with open(m.mountpoint / "c", "rb"):  # c is open: it must not be evicted
        (m.mountpoint / "e").write_bytes(os.urandom(size))
        (m.mountpoint / "f").write_bytes(os.urandom(size))
    # How many go depends on how the freed space lies (whole stripe units); which go does
    # not: the least recently used first (c is open, f just written)
    present = sorted(os.listdir(m.mountpoint))
    gone = {"a", "b", "d", "e"} - set(present)
    assert "c" in present and "f" in present
    assert len(gone) >= 2 and gone == set(order[: len(gone)]), present
    assert m.stats()["files"]["pool_evictions"] == len(gone)
    with pytest.raises(OSError) as e:
        (m.mountpoint / "huge").write_bytes(os.urandom(cap + MiB))
    assert e.value.errno in (errno.EFBIG, errno.ENOSPC)
