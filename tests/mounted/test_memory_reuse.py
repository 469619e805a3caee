"""The DRAM tier reuses the memory of evicted blocks for the next fetches (kvfs/pool/buffer.py
`Spares`), and never memory someone can still see: a reader's mmap of an evicted block,
made through a passthrough open and kept after close(), keeps its bytes."""

from __future__ import annotations

import errno
import mmap
import os
import random

import pytest

from testing.mount import wait_until

MiB = 1 << 20


def content(name: str, size: int) -> bytes:
    return random.Random(name).randbytes(size)


@pytest.fixture
def mounted(make_mount, pool_config):
    m = make_mount(pool_config(n=2, dram="64MiB"))
    if not m.stats()["data_path"]["memory"].startswith("tmpfs"):
        pytest.skip("block memory is not on the private tmpfs (only its files are reused)")
    return m


@pytest.fixture
def pt(mounted):
    if not mounted.passthrough:
        pytest.skip("FUSE passthrough is not in use (the kernel maps no block memory itself)")
    return mounted


def store_stats(m) -> dict:
    st = m.stats()
    return {**st["store"], "spare": st["tiers"]["dram"]["spare"]}


def test_fetches_reuse_the_memory_of_dropped_blocks(mounted):
    pt = mounted
    d = pt.mountpoint
    names = [f"b{i}" for i in range(6)]
    for n in names:
        (d / n).write_bytes(content(n, 4 * MiB))
    pt.control("drop_dram")
    before = store_stats(pt)
    assert before["spares_kept"] >= len(names) and before["spare"] >= len(names) * 4 * MiB
    for n in names:  # cold: fetched into the spares
        assert (d / n).read_bytes() == content(n, 4 * MiB)
    after = store_stats(pt)
    assert after["spares_reused"] - before["spares_reused"] == len(names)
    assert after["spare"] == before["spare"] - len(names) * 4 * MiB
    # and the memory stays within the tier's capacity
    dram = pt.stats()["tiers"]["dram"]
    assert dram["used"] + dram["spare"] <= dram["capacity"]
    # an operator (or a benchmark that wants fresh memory) gives it all back
    out = pt.control("drop_dram", {"memory": True})
    assert out["result"]["spare_bytes_freed"] >= len(names) * 4 * MiB
    assert store_stats(pt)["spare"] == 0
    with pytest.raises(OSError) as e:
        pt.control("drop_dram", {"memory": "yes"})
    assert e.value.errno == errno.EINVAL
    for n in names:  # cold again, into fresh memory
        assert (d / n).read_bytes() == content(n, 4 * MiB)


def test_an_mmap_kept_after_close_keeps_its_bytes_when_the_block_is_evicted(pt):
    d = pt.mountpoint
    (d / "mapped").write_bytes(content("mapped", 4 * MiB))
    others = [f"o{i}" for i in range(8)]
    for n in others:
        (d / n).write_bytes(content(n, 4 * MiB))
    pt.control("drop_dram")
    fd = os.open(d / "mapped", os.O_RDONLY)
    m = mmap.mmap(fd, 4 * MiB, prot=mmap.PROT_READ)  # passthrough: the kernel maps the
    os.close(fd)  # block's memory file itself
    assert m[:] == content("mapped", 4 * MiB)
    pt.control("drop_dram")  # its buffer leaves the tier, still mapped
    for n in others:  # cold fetches that take every spare there is
        assert (d / n).read_bytes() == content(n, 4 * MiB)
    assert m[:] == content("mapped", 4 * MiB)
    m.close()
    # unmapped: the kernel lets go of the file (release), and its memory may be reused
    wait_until(lambda: pt.stats()["data_path"]["backing_ids_in_use"] == 0, what="the release")
    kept = store_stats(pt)["spares_kept"]
    pt.control("drop_dram")
    assert store_stats(pt)["spares_kept"] == kept + len(others)
    # the dropped buffers' backing ids went with them (the kernel's reference to their
    # memory with them): an idle resident block keeps its id only while it lives
    wait_until(lambda: pt.stats()["data_path"]["backing_ids"] == 0, what="the ids' close")
    assert (d / "mapped").read_bytes() == content("mapped", 4 * MiB)


def test_a_resident_block_read_again_reuses_its_backing_id(pt):
    """One backing id per resident buffer, not per open: reading a block again while it is
    in DRAM (a prefix hit) registers nothing with the kernel, and its release closes nothing."""
    d = pt.mountpoint
    (d / "hot").write_bytes(content("hot", MiB))
    assert (d / "hot").read_bytes() == content("hot", MiB)
    wait_until(lambda: pt.stats()["data_path"]["backing_ids_in_use"] == 0, what="the release")
    before = pt.stats()["data_path"]
    for _ in range(5):
        assert (d / "hot").read_bytes() == content("hot", MiB)
    wait_until(lambda: pt.stats()["data_path"]["backing_ids_in_use"] == 0, what="the releases")
    after = pt.stats()["data_path"]
    assert after["backing_ids_opened"] == before["backing_ids_opened"]
    assert after["backing_ids"] == before["backing_ids"] >= 1
