"""The catalog scale benchmark in its short form (bench/catalog_scale.py): files created by
several writers and one, a remount, a cold stat of every file, every file read back bit-exact,
and a flat directory listed and looked up in.

5,000 files (and a flat directory of 5,000): on the 2-core development machine creates run at
about 500 per second through the mount, so the contract's 100,000-file smoke run takes several
minutes here (`python bench/catalog_scale.py --files 100000`); this keeps the test near a
minute."""

import pytest

from bench import catalog_scale
from tests.helpers import can_mount

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(can_mount() is not None, reason=str(can_mount())),
]

FILES = 5000


def test_catalog_scale_smoke(tmp_path):
    class Args:
        files = FILES
        writers = 8
        flat = FILES
        lookups = 2000

    out = catalog_scale.single(tmp_path, Args)
    assert out["bit_exact"], out["bad_examples"]
    assert out["flat_entries"] == FILES
    assert out["warm_mount_s"] < 10
    end = out["stats_end"]
    # after the remount: a cold stat of every file reached the daemon (a LOOKUP each), every
    # file was read back through an open, and the flat directory's files were created here
    assert end["latency"]["lookup"]["count"] >= FILES, end["latency"]
    assert end["files"]["opens"] >= FILES and end["files"]["creates"] >= FILES, end["files"]
    assert end["tiers"]["pool"]["blocks"] >= FILES
    st = end["catalog"]
    # the catalog holds at most its cache of nodes (and what is in use), not every file
    assert st["cached_nodes"] <= st["cache_limit"]
    assert st["live_nodes"] <= st["cache_limit"] + 64
