"""Eviction and admission policies: behaviour on small cases, and hit rates on traces."""

from __future__ import annotations

import os
import random

import pytest

from bench.synthetic_traces import TRACES
from bench.trace_replay import load, replay, serve
from kvfs.policy import (LRUPolicy, PrefixPolicy, ProbationFrequencyPolicy, SecondAccessAdmit,
                         TierIndex, make_policy)

TRACE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "traces",
                     "conversation_trace.jsonl")


def fill(tier: TierIndex, keys, parent_chain: bool = False) -> None:
    parent = None
    for k in keys:
        if not tier.lookup(k, parent):
            tier.make_room(1)
            tier.add(k, 1, parent if parent_chain else None)
        parent = k


def test_lru_evicts_least_recently_used():
    t = TierIndex(3, LRUPolicy())
    fill(t, ["a", "b", "c"])
    t.lookup("a")
    fill(t, ["d"])
    assert set(t.keys()) == {"a", "c", "d"}


def test_probation_keeps_reused_blocks_over_one_hit_wonders():
    t = TierIndex(10, ProbationFrequencyPolicy(10, small=0.2))
    fill(t, [f"hot{i}" for i in range(5)])
    for i in range(5):
        t.lookup(f"hot{i}")                      # read again: they will go to main
    fill(t, [f"scan{i}" for i in range(50)])     # a scan of blocks read once
    assert all(f"hot{i}" in t for i in range(5))


def test_probation_ghost_readmits_returning_blocks_to_main():
    p = ProbationFrequencyPolicy(4, small=0.25)
    t = TierIndex(4, p)
    fill(t, ["x", "a", "b", "c", "d", "e"])        # x leaves through probation into the ghost
    assert "x" not in t
    fill(t, ["x"])                                 # back: it is a reused block
    assert p.is_hot("x")


def test_chain_tails_leave_first_and_unevictable_blocks_stay():
    p = ProbationFrequencyPolicy(100, small=0.5)
    for k in ("a", "b", "tail"):
        p.insert(k, 1)
    p.end_chain("tail")
    assert p.victim(lambda k: True) == "tail"
    assert p.victim(lambda k: k != "a") == "b"
    assert p.victim(lambda k: False) is None
    assert "a" in p


def test_cold_only_victims_are_never_hot():
    p = ProbationFrequencyPolicy(100, small=0.5)
    for k in ("h", "c"):
        p.insert(k, 1)
    p.touch("h")
    while p.victim(lambda k: k == "c") is None:
        pass
    p.insert("h2", 1)
    p.touch("h2")
    p.insert("new", 1)
    v = p.victim(lambda k: True, cold_only=True)
    assert v == "new"                              # never a block that was read again


def test_second_access_admission():
    a = SecondAccessAdmit(window=10)
    assert not a.admit("k", 1)
    assert a.admit("k", 1)


class RandomPolicy(LRUPolicy):
    """Evicts a random evictable block: what a comparison must be able to tell apart."""

    name = "random"

    def __init__(self, capacity: int = 0, seed: int = 7):
        super().__init__(capacity)
        self.rng = random.Random(seed)

    def victim(self, evictable, cold_only: bool = False):
        keys = [k for k in self.order if evictable(k)]
        if not keys:
            return None
        k = self.rng.choice(keys)
        del self.order[k]
        return k


def replay_policy(reqs, capacity: int, policy) -> float:
    tier = TierIndex(capacity, policy)
    hits = total = 0
    for ids in reqs:
        hits += serve(tier, ids)
        total += len(ids)
    return hits / total


# Capacities (fractions of a trace's distinct blocks) where the policies differ; the cyclic
# scan (`loop`) is compared apart below: there LRU scores 0 below the working set, so "not below
# LRU" holds for any policy, and at or above it every policy scores the same.
CAPACITY_FRACTIONS = (0.02, 0.1, 0.3)
OTHER_TRACES = sorted(set(TRACES) - {"loop"})


@pytest.mark.slow
@pytest.mark.parametrize("name", OTHER_TRACES)
def test_prefix_policy_does_not_fall_below_lru_on_other_traces(name):
    """README: on these traces the default policy "stays within 0.1% of LRU or above"; and the
    comparison can fail: a random policy falls below LRU at the smallest capacity."""
    reqs = TRACES[name]()
    nblocks = len({h for r in reqs for h in r})
    for frac in CAPACITY_FRACTIONS:
        cap = max(50, int(nblocks * frac))
        ours = replay(reqs, cap, "prefix")["hit_rate"]
        lru = replay(reqs, cap, "lru")["hit_rate"]
        assert lru > 0, ("a comparison that cannot fail", name, cap)
        assert ours >= lru * 0.999, (name, cap, ours, lru)
        if frac == CAPACITY_FRACTIONS[0]:
            rnd = replay_policy(reqs, cap, RandomPolicy(cap))
            assert rnd < lru * 0.999, ("random passes this comparison", name, cap, rnd, lru)


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="issue 22: the prefix policy keeps nothing of a cyclic "
                                       "scan larger than the tier (nor does LRU; a random "
                                       "policy keeps ~2.5% of its prefix hits)")
def test_prefix_policy_keeps_part_of_a_scan_larger_than_the_tier():
    reqs = TRACES["loop"]()
    cap = len({h for r in reqs for h in r}) // 2
    assert replay_policy(reqs, cap, RandomPolicy(cap)) > 0.02      # something can be kept
    assert replay(reqs, cap, "prefix")["hit_rate"] > 0.2           # half fits: keep a part


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(TRACE), reason="the production trace is in ../shared")
def test_prefix_policy_on_the_production_trace():
    reqs = load(TRACE)
    for cap, factor in ((2000, 1.5), (20000, 1.0)):
        ours = replay(reqs, cap, "prefix")["hit_rate"]
        lru = replay(reqs, cap, "lru")["hit_rate"]
        assert ours >= lru * factor, (cap, ours, lru)


def test_the_yardsticks_bracket_lru_on_a_trace_of_one_hit_wonders():
    """The admission oracle (LRU told whether a block comes back) keeps what returns where LRU
    lets one-hit wonders push it out, and the offline bound does at least as well."""
    from bench.trace_replay import replay_admission_oracle, replay_bound
    reqs, fresh = [], 1000
    for turn in range(200):
        reqs.append([turn % 4])                       # 4 blocks that always come back
        reqs.append(list(range(fresh, fresh + 6)))    # 6 blocks never seen again
        fresh += 6
    lru = replay(reqs, 5, "lru")["hit_rate"]
    oracle = replay_admission_oracle(reqs, 5)["hit_rate"]
    bound = replay_bound(reqs, 5)["hit_rate"]
    assert lru < 0.01 and oracle > 0.13, (lru, oracle)   # 4 of 7 blocks a turn, 199 turns
    assert bound >= oracle, (bound, oracle)


def test_make_policy_names():
    assert isinstance(make_policy("prefix", 10), PrefixPolicy)
    with pytest.raises(ValueError, match="unknown eviction policy"):
        make_policy("mru", 10)


def test_a_pool_shared_by_nodes_against_node_local_caches():
    from bench.trace_replay import replay_nodes
    # 40 conversations, each asked 4 times in a row with a growing prefix; round-robin over 4
    # nodes sends each repetition to another node, so only a shared pool sees the prefix again
    reqs = [[c * 100 + k for k in range(3 + turn)] for c in range(40) for turn in range(4)]
    one = replay_nodes(reqs, 64, "lru", 1)
    assert one["pooled_hit_rate"] == one["node_local_hit_rate"]
    four = replay_nodes(reqs, 64, "lru", 4)
    assert four["node_local_hit_rate"] == 0.0
    assert four["pooled_hit_rate"] > 0.5


def test_make_room_that_falls_short_still_returns_what_it_evicted():
    t = TierIndex(3, LRUPolicy())
    fill(t, ["a", "b", "c"])
    victims = t.make_room(3, lambda k: k != "c")     # c may not go: only 2 of 3 freed
    assert sorted(victims) == ["a", "b"] and not t.fits(3) and t.fits(2)
    assert set(t.keys()) == {"c"} and t.used == 1


def test_pool_order_knows_blocks_by_name_across_versions_renames_and_evictions():
    from kvfs.policy import PoolOrder
    o = PoolOrder(LRUPolicy())
    o.added(1, 10, 4096, ("d", "a"))
    o.added(2, 11, 4096, ("d", "tmp"))
    o.renamed(2, ("d", "b"))                        # written as tmp, renamed into place
    assert o.files == {("d", "a"): 1, ("d", "b"): 2}
    o.added(3, 10, 4096, ("d", "a"))                # a new version of a: a use, not a new name
    assert o.files[("d", "a")] == 3 and 1 not in o.names
    o.removed(1)                                    # the old version retired: nothing changes
    assert len(o) == 2
    o.renamed(2, ("d", "a"))                        # b replaces a
    assert o.files == {("d", "a"): 2} and 3 not in o.names
    o.added(4, 12, 4096, ("d", "c"))
    o.renamed(4, ("d", "a"), exchange=True)         # c and a exchange names
    o.renamed(2, ("d", "c"), exchange=True)
    assert o.files == {("d", "a"): 4, ("d", "c"): 2}
    assert o.victim(lambda bid, ino: bid != 4) == (2, 11, 4096)
    assert o.files == {("d", "a"): 4} and o.victim(lambda bid, ino: False) is None


def test_pool_order_recognises_a_chunk_stored_again_after_its_eviction():
    """The policy's ghosts bring a name evicted and stored again to its main part; with block
    ids as keys every new version looked new."""
    from kvfs.policy import PoolOrder, ProbationFrequencyPolicy
    p = ProbationFrequencyPolicy(4, small=0.25)
    o = PoolOrder(p)
    bid = iter(range(100))
    for name in ("x", "a", "b", "c", "d", "e"):
        while sum(o.meta[b][1] for b in o.files.values()) + 1 > 4:
            o.victim(lambda b, ino: True)
        o.added(next(bid), 0, 1, name)
    assert "x" not in o.files
    o.victim(lambda b, ino: True)
    o.added(next(bid), 0, 1, "x")                   # stored again under its name
    assert p.is_hot("x")
