"""Eviction and admission policies: behaviour on small cases, and hit rates on traces."""

from __future__ import annotations

import os
import random

import pytest

from bench.synthetic_traces import TRACES
from bench.trace_replay import load, replay, serve
from kvfs.tiers.index import TierIndex
from kvfs.tiers.policy import (
    LRUPolicy,
    PrefixPolicy,
    ProbationFrequencyPolicy,
    SecondAccessAdmit,
    make_policy,
)
from kvfs.tiers.scoring import PrefixScore, ScorePolicy

TRACE = os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "shared", "traces", "conversation_trace.jsonl"
)


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
        t.lookup(f"hot{i}")  # read again: they will go to main
    fill(t, [f"scan{i}" for i in range(50)])  # a scan of blocks read once
    assert all(f"hot{i}" in t for i in range(5))


def test_probation_ghost_readmits_returning_blocks_to_main():
    p = ProbationFrequencyPolicy(4, small=0.25)
    t = TierIndex(4, p)
    fill(t, ["x", "a", "b", "c", "d", "e"])  # x leaves through probation into the ghost
    assert "x" not in t
    fill(t, ["x"])  # back: it is a reused block
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
    assert v == "new"  # never a block that was read again


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
        self.keys: list = []  # the blocks held, in no order, for a draw in O(1)
        self.at: dict = {}  # block -> its place in `keys`

    def insert(self, key, size: int, parent=None) -> None:
        if key not in self.at:
            self.at[key] = len(self.keys)
            self.keys.append(key)
        super().insert(key, size, parent)

    def remove(self, key) -> None:
        i = self.at.pop(key, None)
        if i is not None:
            last = self.keys.pop()
            if i < len(self.keys):
                self.keys[i] = last
                self.at[last] = i
        super().remove(key)

    def victim(self, evictable, cold_only: bool = False):
        for _ in range(8):  # a few draws, then every evictable block
            if not self.keys:
                return None
            k = self.keys[self.rng.randrange(len(self.keys))]
            if evictable(k):
                break
        else:
            ks = [k for k in self.keys if evictable(k)]
            if not ks:
                return None
            k = self.rng.choice(ks)
        self.remove(k)
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
@pytest.mark.parametrize("policy", ["prefix", "score"])
@pytest.mark.parametrize("name", OTHER_TRACES)
def test_prefix_policy_does_not_fall_below_lru_on_other_traces(name, policy):
    """README: on these traces the DRAM tier's default policy stays within 0.1% of LRU or
    above, the pool's ("score", which starts in its probation mode and must learn that LRU
    wins there) within 1% (issue 22's bound; measured: 0.6% at most); and the comparison can
    fail: a random policy falls below LRU at the smallest capacity."""
    within = {"prefix": 0.999, "score": 0.99}[policy]
    reqs = TRACES[name]()
    nblocks = len({h for r in reqs for h in r})
    for frac in CAPACITY_FRACTIONS:
        cap = max(50, int(nblocks * frac))
        ours = replay(reqs, cap, policy)["hit_rate"]
        lru = replay(reqs, cap, "lru")["hit_rate"]
        assert lru > 0, ("a comparison that cannot fail", name, cap)
        assert ours >= lru * within, (name, cap, ours, lru)
        if frac == CAPACITY_FRACTIONS[0]:
            rnd = replay_policy(reqs, cap, RandomPolicy(cap))
            assert rnd < lru * 0.999, ("random passes this comparison", name, cap, rnd, lru)


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="issue 22: the prefix policy keeps nothing of a cyclic "
    "scan larger than the tier (nor does LRU; a random "
    "policy keeps ~2.5% of its prefix hits)",
)
def test_prefix_policy_keeps_part_of_a_scan_larger_than_the_tier():
    reqs = TRACES["loop"]()
    cap = len({h for r in reqs for h in r}) // 2
    assert replay_policy(reqs, cap, RandomPolicy(cap)) > 0.02  # something can be kept
    assert replay(reqs, cap, "prefix")["hit_rate"] > 0.2  # half fits: keep a part


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(TRACE), reason="the production trace is in ../shared")
def test_prefix_policy_on_the_production_trace():
    reqs = load(TRACE)
    for cap, factor in ((2000, 1.5), (20000, 1.0)):
        lru = replay(reqs, cap, "lru")["hit_rate"]
        for policy in ("prefix", "score"):
            ours = replay(reqs, cap, policy)["hit_rate"]
            assert ours >= lru * factor, (policy, cap, ours, lru)


def test_the_yardsticks_bracket_lru_on_a_trace_of_one_hit_wonders():
    """The admission oracle (LRU told whether a block comes back) keeps what returns where LRU
    lets one-hit wonders push it out, and the offline bound does at least as well."""
    from bench.trace_replay import replay_admission_oracle, replay_bound

    reqs, fresh = [], 1000
    for turn in range(200):
        reqs.append([turn % 4])  # 4 blocks that always come back
        reqs.append(list(range(fresh, fresh + 6)))  # 6 blocks never seen again
        fresh += 6
    lru = replay(reqs, 5, "lru")["hit_rate"]
    oracle = replay_admission_oracle(reqs, 5)["hit_rate"]
    bound = replay_bound(reqs, 5)["hit_rate"]
    assert lru < 0.01 and oracle > 0.13, (lru, oracle)  # 4 of 7 blocks a turn, 199 turns
    assert bound >= oracle, (bound, oracle)


def test_the_timed_oracle_keeps_what_returns_soonest_where_the_admission_oracle_cannot():
    """A block that comes back every other request, and blocks that each come back once, 40
    requests later: both oracles know all of them come back, but only the timed one knows
    the first comes back soon (its class's reuse distances), so in a tier of one block it
    keeps that one; the admission oracle lets each newcomer push it out. The bound does at
    least as well as either."""
    from bench.trace_replay import replay_admission_oracle, replay_bound, replay_timed_oracle

    reqs = []
    for turn in range(400):
        reqs.append([0])
        reqs.append([1000 + turn])  # comes back once, 40 requests later
        if turn >= 20:
            reqs.append([1000 + turn - 20])
    oracle = replay_admission_oracle(reqs, 1)["hit_rate"]
    timed = replay_timed_oracle(reqs, 1)["hit_rate"]
    bound = replay_bound(reqs, 1)["hit_rate"]
    assert oracle < 0.05 and timed > 0.3, (oracle, timed)  # block 0: 399 of 1,180 reads
    assert bound >= timed, (bound, timed)


def test_make_policy_names():
    assert isinstance(make_policy("prefix", 10), PrefixPolicy)
    assert isinstance(make_policy("score", 10), ScorePolicy)
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
    victims = t.make_room(3, lambda k: k != "c")  # c may not go: only 2 of 3 freed
    assert sorted(victims) == ["a", "b"] and not t.fits(3) and t.fits(2)
    assert set(t.keys()) == {"c"} and t.used == 1


def test_score_policy_sends_new_names_first_and_keeps_reused_ones():
    """Probation mode: a block stored once leaves before blocks read again, however recent."""
    p = ScorePolicy(100, adaptive=False, mode=0)
    for k in ("old", "hot", "new"):
        p.insert(k, 1)
    p.touch("hot")
    assert p.victim(lambda k: True) == "old"
    assert p.victim(lambda k: True) == "new"
    assert p.victim(lambda k: True) == "hot"
    assert p.victim(lambda k: True) is None


def test_score_policy_remembers_evicted_names_and_their_uses():
    """A name evicted and stored again comes back with its uses (the ghosts), so it outlives
    names stored once since."""
    p = ScorePolicy(4, adaptive=False, mode=0)
    p.insert("x", 1)
    p.touch("x")
    p.touch("x")
    assert p.victim(lambda k: k == "x") == "x" and p.rule.floor == 3.0
    for k in ("a", "b"):
        p.insert(k, 1)
    p.insert("x", 1)  # stored again under its name
    assert p.uses["x"] == 4 and p.is_hot("x") and not p.is_hot("a")
    assert [p.victim(lambda k: True) for _ in range(3)] == ["a", "b", "x"]


def test_score_policy_in_lru_mode_is_lru():
    p = ScorePolicy(10, adaptive=False, mode=2)
    t = TierIndex(3, p)
    fill(t, ["a", "b", "c"])
    t.lookup("a")
    fill(t, ["d"])
    assert set(t.keys()) == {"a", "c", "d"}
    fill(t, ["c", "e"])
    assert set(t.keys()) == {"c", "d", "e"}


def test_the_score_rule_follows_the_mode_that_hits_most():
    """Miniature simulations pick the mode: on a stream of one-time blocks with a few blocks
    that come back (probation wins) it leaves LRU for probation; on blocks that all come back
    once, soon (LRU wins), it leaves probation for LRU."""
    rule = PrefixScore(capacity=200, typical_size=1, mode=2)
    assert rule.mode_name == "lru"
    fresh = 10_000
    for turn in range(3000):
        rule.observe(turn % 40, 1)  # 40 blocks that always come back
        for _ in range(6):  # and a scan of blocks never seen again
            rule.observe(fresh, 1)
            fresh += 1
    assert rule.mode_name == "credit 0.01", rule.mode_name
    rule = PrefixScore(capacity=200, typical_size=1)
    assert rule.mode_name == "credit 0.01"  # the default: most KV blocks come back never
    for i in range(20_000):
        rule.observe(i, 1)
        rule.observe(i - 90, 1)  # each block once more, 90 blocks later
    assert rule.mode_name == "lru", rule.mode_name


def test_the_score_rules_simulations_are_bounded_whatever_the_capacity():
    rule = PrefixScore(capacity=10_000_000, typical_size=1)
    for i in range(200_000):
        rule.observe(i, 1)
    assert all(len(t.sizes) <= PrefixScore.SAMPLE for t in rule.shadows)
    assert sum(len(t.sizes) for t in rule.shadows) > 0  # it sampled something


def test_score_policy_memory_stays_bounded_without_evictions():
    """A tier that holds its whole working set never evicts, and each access leaves a stale
    entry in the score policy's heap: those are dropped so that its memory stays proportional
    to the keys it holds (issue 22: bounded memory per block), and the order is unchanged."""
    policy = ScorePolicy(1000)
    tier = TierIndex(1000, policy)
    for k in range(100):
        tier.add(k, 1, None)
    for _ in range(500):
        for k in range(100):
            tier.lookup(k, None)
    assert len(policy.heap) <= 2 * len(policy) + 1024, len(policy.heap)
    uses = policy.uses
    tier.add(1000, 1, None)  # one use: the first to go, then the others least recent first
    order = [policy.victim(lambda k: True) for _ in range(3)]
    assert order == [1000, 0, 1], (order, uses[0])


def test_prefix_score_retunes_its_sample_to_the_blocks_it_sees():
    """The miniature simulations sample SAMPLE blocks' worth of the pool: a rule that assumed
    1 MiB blocks on a 2 GiB pool simulates every access; told the blocks are 4 KiB it samples
    one in 256, and a size within 2x of the one it samples by changes nothing."""
    gib = 1 << 30
    r = PrefixScore(2 * gib, 1 << 20)
    assert r.rate == 1.0
    assert r.retune(2 * gib, 4096)
    assert r.rate == PrefixScore.SAMPLE / (2 * gib / 4096) and r.typical == 4096
    assert not r.retune(2 * gib, 6000) and r.typical == 4096
    assert r.retune(2 * gib, 1 << 20) and r.rate == 1.0
