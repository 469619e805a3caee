"""Eviction and admission policies for the cache tiers, behind two small interfaces.

An `EvictionPolicy` orders the keys resident in one tier; it is told about every insert, hit
and removal, may get hints (a key's parent in its prefix chain, "this key ended a chain walk"),
and chooses victims among the keys its caller says are evictable. An `AdmissionPolicy` decides
whether a block that was just read from a slower tier is worth keeping in a faster one.

Policies (`make_policy(name, capacity)`):

* ``lru``: least recently used. The baseline.
* ``prefix`` (default): designed for KV-prefix workloads, where
  - most blocks are never read again, and the last block of a chain walk (a request's partial
    last chunk) almost never is: new blocks go through a small probation FIFO, chain tails first
    out of it, and only blocks read again there (or remembered by a ghost list of recently
    evicted keys when they come back) enter the main part;
  - multi-turn sessions come back, more surely the more often they came back already: the main
    part is ordered by GreedyDual-Frequency (H = L + hits/size; evict the lowest H; L rises to
    the H of each victim), so frequent chains stay and stale ones age out;
  - how big the probation part should be, or whether plain recency wins on this workload, is
    not fixed: key-only simulations of the alternatives (a small and a large probation part,
    LRU) run on the same accesses and the tier follows the leader; a challenger takes the lead
    once a sign test (`sign_test`) on the accesses only one of the two hit puts it Z = 3
    standard deviations ahead over a decayed window, so noise does not flip the leader but a
    consistent advantage, however small, does: where LRU is better, it behaves as LRU.
* ``probation``: one of prefix's alternatives alone; ``score``: the pool's rule
  (`PrefixScore`, `pool.evict = "prefix"`) as an in-memory policy, for trace replays
  (`ScorePolicy`, kvfs/tiers/scoring.py).

Keys are any hashable ids; sizes are bytes (or 1 per block for trace replays). The tiers'
index, the ghost list and the sign test are in kvfs/tiers/index.py.
"""

from __future__ import annotations

import collections
import heapq
from typing import Protocol

from kvfs.tiers.index import Evictable, Ghost, Key, always, sign_test
from kvfs.tiers.scoring import ScorePolicy


class EvictionPolicy(Protocol):
    name: str

    def insert(self, key: Key, size: int, parent: Key | None = None) -> None: ...
    def touch(self, key: Key, parent: Key | None = None) -> None: ...
    def remove(self, key: Key) -> None: ...
    def end_chain(self, key: Key) -> None: ...
    def victim(self, evictable: Evictable, cold_only: bool = False) -> Key | None: ...
    def is_hot(self, key: Key) -> bool: ...
    def resize(self, capacity: int) -> None: ...
    def __contains__(self, key: Key) -> bool: ...


class LRUPolicy:
    """Least recently used."""

    name = "lru"

    def __init__(self, capacity: int = 0):
        self.order: collections.OrderedDict[Key, int] = collections.OrderedDict()

    def __contains__(self, key: Key) -> bool:
        return key in self.order

    def __len__(self) -> int:
        return len(self.order)

    def insert(self, key: Key, size: int, parent: Key | None = None) -> None:
        self.order[key] = size
        self.order.move_to_end(key)

    def touch(self, key: Key, parent: Key | None = None) -> None:
        if key in self.order:
            self.order.move_to_end(key)

    def remove(self, key: Key) -> None:
        self.order.pop(key, None)

    def end_chain(self, key: Key) -> None:
        pass

    def is_hot(self, key: Key) -> bool:
        return False

    def resize(self, capacity: int) -> None:
        pass

    def victim(self, evictable: Evictable, cold_only: bool = False) -> Key | None:
        for key in self.order:
            if evictable(key):
                del self.order[key]
                return key
        return None


class ProbationFrequencyPolicy:
    """A small probation FIFO in front of a GreedyDual-Frequency main part (one fixed split).

    `prefix` uses this as its engine and as its shadows; on its own it is the policy
    ``probation`` with the probation part at `small` of the capacity.
    """

    name = "probation"

    def __init__(self, capacity: int, small: float = 0.03, ghost: float = 5.0):
        self.capacity = max(1, capacity)
        self.small = small
        self.probation: collections.OrderedDict[Key, None] = collections.OrderedDict()
        self.main: dict[Key, float] = {}
        self.heap: list[tuple[float, int, Key]] = []
        self.size: dict[Key, int] = {}
        self.count: dict[Key, int] = {}
        self.inflation = 0.0
        self.probation_bytes = 0
        self.main_bytes = 0
        self.ghost_share = ghost
        self.ghost = Ghost(int(ghost * self.capacity))
        self._seq = 0

    def resize(self, capacity: int) -> None:
        """A new byte capacity (the tier was resized); the parts' shares stay the same."""
        self.capacity = max(1, capacity)
        self.ghost.capacity = int(self.ghost_share * self.capacity)

    def __contains__(self, key: Key) -> bool:
        return key in self.size

    def __len__(self) -> int:
        return len(self.size)

    @property
    def used(self) -> int:
        return self.probation_bytes + self.main_bytes

    def _to_main(self, key: Key, h: float | None = None) -> None:
        if h is None:
            h = self.inflation + self.count[key] * (1 << 20) / max(self.size[key], 4096)
        if key not in self.main:
            self.main_bytes += self.size[key]
        self.main[key] = h
        self._seq += 1
        heapq.heappush(self.heap, (h, self._seq, key))

    def insert(self, key: Key, size: int, parent: Key | None = None) -> None:
        if key in self.size:
            self.touch(key)
            return
        self.size[key] = size
        remembered = self.ghost.take(key)
        if remembered is not None:  # evicted recently and back: it is reused
            self.count[key] = remembered + 1
            self._to_main(key)
        else:
            self.count[key] = 1
            self.probation[key] = None
            self.probation_bytes += size

    def touch(self, key: Key, parent: Key | None = None) -> None:
        if key not in self.size:
            return
        self.count[key] += 1
        if key in self.main:
            self._to_main(key)

    def end_chain(self, key: Key) -> None:
        """The key ended a chain walk: as a chain's last block it is the least likely to be
        read again, so it leaves first."""
        if key in self.probation:
            self.probation.move_to_end(key, last=False)
        elif key in self.main:
            self._to_main(key, self.inflation)

    def remove(self, key: Key) -> None:
        size = self.size.pop(key, None)
        if size is None:
            return
        self.count.pop(key, None)
        if key in self.probation:
            del self.probation[key]
            self.probation_bytes -= size
        elif self.main.pop(key, None) is not None:
            self.main_bytes -= size

    def _evict(self, key: Key) -> Key:
        size = self.size[key]
        count = self.count[key]
        self.remove(key)
        self.ghost.add(key, count, size)
        return key

    def is_hot(self, key: Key) -> bool:
        return key in self.main

    def victim(self, evictable: Evictable, cold_only: bool = False) -> Key | None:
        """Choose, remove (to the ghost list) and return a victim among evictable keys.

        With `cold_only` only probation keys not read again qualify (prefetching may displace
        those, never hotter blocks)."""
        key = self._probation_victim(evictable, cold_only)
        if key is not None or cold_only:
            return key
        held = []
        try:
            while self.heap:
                h, seq, key = heapq.heappop(self.heap)
                if self.main.get(key) != h:
                    continue  # stale heap entry
                if not evictable(key):
                    held.append((h, seq, key))
                    continue
                self.inflation = max(self.inflation, h)
                return self._evict(key)
        finally:
            for item in held:
                heapq.heappush(self.heap, item)
        for key in self.probation:  # main is empty or all held
            if evictable(key):
                return self._evict(key)
        return None

    def _probation_victim(self, evictable: Evictable, cold_only: bool) -> Key | None:
        """Oldest evictable probation key while probation is over its share (or when main has
        nothing); keys read again on probation move to main instead."""
        skipped: list[Key] = []
        found = None
        while self.probation and (
            cold_only or not self.main or self.probation_bytes > self.small * self.capacity
        ):
            key = next(iter(self.probation))
            self.probation.move_to_end(key)  # out of the way while we look
            if not evictable(key) or (cold_only and self.count[key] > 1):
                skipped.append(key)
                if len(skipped) >= len(self.probation):
                    break
                continue
            if self.count[key] > 1:  # read again while on probation
                del self.probation[key]
                self.probation_bytes -= self.size[key]
                self._to_main(key)
                continue
            found = self._evict(key)
            break
        for key in reversed(skipped):  # skipped keys keep their place
            if key in self.probation:
                self.probation.move_to_end(key, last=False)
        return found


class _ExpertLRU:
    """Key-only LRU of a byte capacity: what LRU would hold."""

    name = "lru"

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.order: collections.OrderedDict[Key, int] = collections.OrderedDict()
        self.bytes = 0

    def __contains__(self, key: Key) -> bool:
        return key in self.order

    def access(self, key: Key, size: int, parent: Key | None, evicted: list) -> bool:
        if key in self.order:
            self.order.move_to_end(key)
            return True
        self.order[key] = size
        self.bytes += size
        while self.bytes > self.capacity and len(self.order) > 1:
            k, s = self.order.popitem(last=False)
            self.bytes -= s
            evicted.append(k)
        return False

    def end_chain(self, key: Key) -> None:
        pass

    def is_hot(self, key: Key) -> bool:
        return False

    def resize(self, capacity: int) -> None:
        self.capacity = capacity


class _ExpertProbation:
    """Key-only run of ProbationFrequencyPolicy with a fixed probation share."""

    def __init__(self, capacity: int, small: float):
        self.policy = ProbationFrequencyPolicy(capacity, small)
        self.name = f"probation {small:g}"

    def __contains__(self, key: Key) -> bool:
        return key in self.policy

    def access(self, key: Key, size: int, parent: Key | None, evicted: list) -> bool:
        p = self.policy
        if key in p:
            p.touch(key)
            return True
        p.insert(key, size, parent)
        while p.used > p.capacity:
            k = p.victim(always)
            if k is None:
                break
            evicted.append(k)
        return False

    def end_chain(self, key: Key) -> None:
        self.policy.end_chain(key)

    def is_hot(self, key: Key) -> bool:
        return self.policy.is_hot(key)

    def resize(self, capacity: int) -> None:
        self.policy.resize(capacity)


class PrefixPolicy:
    """The default: follow the best of a few expert policies, simulated on the same accesses.

    Experts: probation + GreedyDual-Frequency with a small probation share (SPLITS[0]) and with a
    large one (SPLITS[1]), and LRU. Each is a key-only simulation of the tier at the same
    capacity, scored on prefix hits (a hit counts when the block starts a chain walk or its
    parent was a prefix hit in that expert too). The tier follows the leading expert: its
    victims are the resident blocks that expert has already evicted (oldest first), so the
    tier's content converges to the leader's. A challenger takes the lead when a sign test on
    the accesses where exactly one of the two hit says it is better beyond chance (Z standard
    deviations, over a decayed window of about 8 capacities of accesses). On a workload where
    LRU is better, the tier thus ends up holding what LRU would.
    """

    name = "prefix"
    SPLITS = (0.03, 0.5)
    Z = 3.0

    def __init__(self, capacity: int, typical_size: int = 1):
        self.capacity = max(1, capacity)
        self.experts: list = [_ExpertProbation(self.capacity, s) for s in self.SPLITS]
        self.experts.append(_ExpertLRU(self.capacity))
        self.beats = [[0.0] * len(self.experts) for _ in self.experts]
        self.lead = 0
        self.sizes: dict[Key, int] = {}
        self.recency: collections.OrderedDict[Key, None] = collections.OrderedDict()
        self.doomed: collections.OrderedDict[Key, None] = collections.OrderedDict()
        self._walks: collections.OrderedDict[Key, tuple[bool, ...]] = collections.OrderedDict()
        self.typical = max(1, typical_size)
        self._decay = 1.0 - 1.0 / (8.0 * self.capacity / self.typical)

    def resize(self, capacity: int) -> None:
        """A new byte capacity: every expert simulates the tier at the new size from now on."""
        self.capacity = max(1, capacity)
        for e in self.experts:
            e.resize(self.capacity)
        self._decay = 1.0 - 1.0 / (8.0 * self.capacity / self.typical)

    def __contains__(self, key: Key) -> bool:
        return key in self.sizes

    def __len__(self) -> int:
        return len(self.sizes)

    @property
    def mode_name(self) -> str:
        return self.experts[self.lead].name

    def _observe(self, key: Key, size: int, parent: Key | None) -> None:
        d = self._decay
        before = self._walks.get(parent) if parent is not None else None
        status = []
        for i, ex in enumerate(self.experts):
            evicted: list = []
            prefix_hit = ex.access(key, size, parent, evicted) and (before is None or before[i])
            status.append(prefix_hit)
            if i == self.lead:
                for k in evicted:
                    if k in self.sizes:
                        self.doomed[k] = None
        self._walks[key] = tuple(status)
        self._walks.move_to_end(key)
        if len(self._walks) > 4096:
            self._walks.popitem(last=False)
        new = sign_test(self.beats, status, d, self.lead, self.Z)
        if new is not None:
            self._follow(new)

    def _follow(self, i: int) -> None:
        self.lead = i
        leader = self.experts[i]
        self.doomed = collections.OrderedDict((k, None) for k in self.recency if k not in leader)

    def insert(self, key: Key, size: int, parent: Key | None = None) -> None:
        self._observe(key, size, parent)
        self.sizes[key] = size
        self.recency[key] = None
        self.recency.move_to_end(key)
        if key not in self.experts[self.lead]:
            self.doomed[key] = None

    def touch(self, key: Key, parent: Key | None = None) -> None:
        if key not in self.sizes:
            return
        self._observe(key, self.sizes[key], parent)
        self.recency.move_to_end(key)

    def remove(self, key: Key) -> None:
        if self.sizes.pop(key, None) is not None:
            self.recency.pop(key, None)
            self.doomed.pop(key, None)

    def end_chain(self, key: Key) -> None:
        for ex in self.experts:
            ex.end_chain(key)

    def is_hot(self, key: Key) -> bool:
        return self.experts[self.lead].is_hot(key)

    def victim(self, evictable: Evictable, cold_only: bool = False) -> Key | None:
        """A resident block the leading expert has already evicted (prefetching may displace only
        those: `cold_only`); otherwise the least recently used evictable block."""
        for key in self.doomed:
            if evictable(key):
                self.remove(key)
                return key
        if cold_only:
            return None
        for key in self.recency:
            if evictable(key):
                self.remove(key)
                return key
        return None


POLICIES = ("prefix", "lru", "probation", "score")


def make_policy(name: str, capacity: int, typical_size: int = 1 << 20):
    if name == "lru":
        return LRUPolicy(capacity)
    if name == "prefix":
        return PrefixPolicy(capacity, typical_size)
    if name == "probation":
        return ProbationFrequencyPolicy(capacity)
    if name == "score":
        return ScorePolicy(capacity, typical_size)
    raise ValueError(f"unknown eviction policy {name!r} (known: {', '.join(POLICIES)})")


# --------------------------------------------------------------------------------------------
# Admission


class AdmissionPolicy(Protocol):
    name: str

    def admit(self, key: Key, size: int) -> bool: ...


class AlwaysAdmit:
    """Keep every block that passes through."""

    name = "always"

    def admit(self, key: Key, size: int) -> bool:
        return True


class SecondAccessAdmit:
    """Keep a block the second time it is seen within a window of recently seen keys (a block
    read once is usually never read again; writing it to a tier costs that tier bandwidth)."""

    name = "second-access"

    def __init__(self, window: int = 100_000):
        self.seen: collections.OrderedDict[Key, None] = collections.OrderedDict()
        self.window = window

    def admit(self, key: Key, size: int) -> bool:
        if key in self.seen:
            del self.seen[key]
            return True
        self.seen[key] = None
        if len(self.seen) > self.window:
            self.seen.popitem(last=False)
        return False


def make_admission(name: str):
    if name == "always":
        return AlwaysAdmit()
    if name == "second-access":
        return SecondAccessAdmit()
    raise ValueError(f"unknown admission policy {name!r} (known: always, second-access)")
