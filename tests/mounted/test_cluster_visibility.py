"""The close-to-visible bench (bench/cluster_visibility.py) at a tiny scale: two real kvfs
nodes sharing a pool, in both durability modes; every file closed on one is seen whole on the
other (figures are the bench's to report, not asserted here)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.helpers import ROOT, can_mount

pytestmark = [
    pytest.mark.mounted,
    pytest.mark.skipif(can_mount() is not None, reason=str(can_mount())),
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
]


def test_every_file_closed_on_one_node_is_seen_on_the_other_in_both_modes():
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "cluster_visibility.py"),
            *("--files", "20", "--interval", "2", "--ns-size", "64MiB", "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["commit"] and set(out["modes"]) == {"fsync", "close"}
    for mode, m in out["modes"].items():
        assert m["files"] == 20 and m["never_seen"] == 0, (mode, m)
        v = m["close_to_visible_ms"]
        assert 0 <= v["p50"] <= v["p99"] <= v["max"], (mode, v)
    # the write-back's own figure: closes became durable (published) in the fsync run
    assert out["modes"]["fsync"]["writer"]["writeback"]["p50"] > 0
