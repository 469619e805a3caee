"""The crash torture in its short form (bench/torture.py has the long one): writer processes,
kill -9 of the daemon at random and at chosen moments (a big file's commit, a rename, an LRU
eviction, a `kvfs format`, an unmount), remount, and every file checked against what its
writer's close(), fsync() and rename() calls returned."""

from __future__ import annotations

import shutil

import pytest

from bench.torture import CLUSTER_SCENARIOS, FAILING, SINGLE_SCENARIOS, Torture
from tests.helpers import can_mount

pytestmark = [
    pytest.mark.mounted,
    pytest.mark.slow,
    pytest.mark.skipif(can_mount() is not None, reason=str(can_mount())),
]


def _check(report: dict, aimed: tuple[str, ...]) -> None:
    assert report["cycles"] > 0 and report["commits"] > 0, report
    # lost, partial, resurrected, stray, broken, hung; divergent views, evictions and writer
    # errors the scenario does not explain, stale views, a change seen later than the bound
    bad = {k: report[k] for k in FAILING}
    assert not any(bad.values()), f"{bad}: {report['problems']}"
    # each of these cycles killed at the moment it aims at, so it tested what it says
    missed = {s: report["scenarios"][s]["unaimed"] for s in aimed}
    assert not any(missed.values()), missed


@pytest.mark.parametrize("durability", ["fsync", "close"])
def test_single_node_loses_nothing_durable_and_shows_nothing_partial(tmp_path, durability):
    t = Torture(tmp_path, writers=3, seed=5, scenarios=SINGLE_SCENARIOS, durability=durability)
    report = t.run(len(SINGLE_SCENARIOS))
    assert report["durability"] == durability
    _check(report, ("commit", "rename", "evict", "writer"))  # evict: killed amid evictions
    if durability == "close":
        assert report["lost_in_window"] == 0, report


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
@pytest.mark.parametrize("durability", ["fsync", "close"])
def test_cluster_loses_nothing_committed_and_shows_nothing_partial(tmp_path, durability):
    t = Torture(
        tmp_path,
        writers=3,
        seed=5,
        cluster=True,
        scenarios=CLUSTER_SCENARIOS,
        durability=durability,
    )
    report = t.run(len(CLUSTER_SCENARIOS))
    assert report["durability"] == durability
    _check(report, ("commit", "publish", "rename", "evict", "writer"))


@pytest.mark.skipif(shutil.which("redis-sentinel") is None, reason="needs redis-sentinel")
@pytest.mark.parametrize("durability", ["fsync", "close"])
def test_a_failover_of_the_redis_master_loses_nothing_acknowledged(tmp_path, durability):
    """Three kills of the Sentinel-watched master while two nodes write: nothing acknowledged
    (whose fsync() returned; or close() with "close") is lost, no stripe unit is claimed
    twice, and the nodes publish again."""
    t = Torture(tmp_path, writers=3, seed=7, failover=True, durability=durability)
    report = t.run(3)
    _check(report, ())
    fo = report["failover"]
    assert fo["cycles"] == 3 and fo["first_publish_ms"]["n"] == 3, fo
    assert report["shared_extents"] == 0
