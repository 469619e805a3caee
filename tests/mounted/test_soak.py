"""The soak (bench/soak.py) in short: 16 client threads for a minute over a pool that keeps
evicting. No error but the documented ENOENT, every read bit-exact, and once the clients are
done nothing stays held: handles, passthrough backing ids, leases, allocations, held blocks,
write buffers, reservations; and once the DRAM tier is dropped, no descriptor beyond the
mount's own."""

from __future__ import annotations

import pytest

from bench import soak

pytestmark = pytest.mark.slow


def test_a_short_soak_leaks_nothing(tmp_path, make_mount):  # make_mount: root and FUSE
    r = soak.soak(minutes=1, threads=16, pool_mib=768, dram_mib=128, sample=5, workdir=tmp_path)
    assert r["unexpected_errors"] == {}, r["errors"]
    assert r["wrong_read_count"] == 0, (r["wrong_reads"], r["wrong_log"])
    assert r["evictions"] > 0 and r["ops"]["read"] > 0 and r["ops"]["write"] > 0
    held = r["held_after_clients"]
    for k in soak.RELEASED:
        assert held[k] == 0, (k, held)
    fds = r["fds"]  # with the DRAM tier dropped, the mount's own descriptors
    assert fds["after_drop_dram"]["memory_fds"] == 0, fds
    assert r["backing_ids_after_drop_dram"] == 0, r["backing_ids_after_drop_dram"]
    assert fds["after_drop_dram"]["fds"] <= fds["mounted"]["fds"] + 2, fds
    assert r["daemon_exit_status"] == 0
