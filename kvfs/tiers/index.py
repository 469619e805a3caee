"""A tier's index and what the eviction policies are built on.

`TierIndex` says which keys a tier holds within its byte capacity, counts hits, misses and
evictions, and asks its policy for victims: the DRAM tier (kvfs/tiers/store.py), the node-local
tier (kvfs/tiers/local.py), bench/trace_replay.py (so a replay runs kvfs's own placement code)
and the pool's score's miniature simulations (kvfs/tiers/scoring.py) each keep one. Below it
are the pieces the policies of kvfs/tiers/policy.py and kvfs/tiers/scoring.py share: the key
types, the ghost list of recently evicted keys (`Ghost`) and the sign test by which an
adaptive policy chooses which of its simulated alternatives to follow (`sign_test`).

Keys are any hashable ids; sizes are bytes (or 1 per block for trace replays).
"""

from __future__ import annotations

import collections
import math
from typing import Callable, Hashable, Iterable

Key = Hashable
Evictable = Callable[[Key], bool]


def always(key: Key) -> bool:
    """Every key may be evicted (the default `Evictable`)."""
    return True


class Ghost:
    """Recently evicted keys with their hit counts, bounded by total bytes (five capacities by
    default: a returning multi-turn session is often away for several capacities of traffic)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.entries: collections.OrderedDict[Key, tuple[int, int]] = collections.OrderedDict()
        self.bytes = 0

    def add(self, key: Key, count: int, size: int) -> None:
        old = self.entries.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        self.entries[key] = (count, size)
        self.bytes += size
        while self.bytes > self.capacity and self.entries:
            _, (_, s) = self.entries.popitem(last=False)
            self.bytes -= s

    def take(self, key: Key) -> int | None:
        e = self.entries.pop(key, None)
        if e is None:
            return None
        self.bytes -= e[1]
        return e[0]


def sign_test(
    beats: list[list[float]], status: list[bool], decay: float, lead: int, z: float
) -> int | None:
    """Which of several simulated policies to follow: `status[i]` says whether policy i hit
    this access. A sign test per challenger on decayed counts of the accesses that only it hit
    (wins) against those that only the leader hit: a challenger takes the lead once its
    surplus of wins is `z` standard deviations above chance, so noise does not flip the leader
    but a consistent advantage, however small, does. The counts are kept for every pair
    (`beats`, updated here), so a new leader has to keep its record against the old one (no
    flapping). Returns the new leader, or None."""
    n = len(status)
    for i in range(n):
        row = beats[i]
        for j in range(n):
            if i != j:
                row[j] *= decay
                if status[i] and not status[j]:
                    row[j] += 1.0
    for i in range(n):
        if i != lead:
            won, lost = beats[i][lead], beats[lead][i]
            if won - lost > z * math.sqrt(won + lost) + 1.0:
                return i
    return None


class TierIndex:
    """Which keys a tier holds, within a byte capacity; its eviction policy chooses the victims."""

    def __init__(self, capacity: int, policy):
        self.capacity = capacity
        self.policy = policy
        self.sizes: dict[Key, int] = {}
        self.used = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __contains__(self, key: Key) -> bool:
        return key in self.sizes

    def lookup(self, key: Key, parent: Key | None = None) -> bool:
        """Count an access (`parent`: the block read before it in the same chain walk, if any):
        a hit (the policy hears of it) or a miss."""
        if key in self.sizes:
            self.hits += 1
            self.policy.touch(key, parent)
            return True
        self.misses += 1
        return False

    def make_room(
        self, need: int, evictable: Evictable = always, cold_only: bool = False
    ) -> list[Key]:
        """Evict until `need` more bytes fit, or nothing evictable is left; returns the victims
        (they are out of the index: the caller drops them), also when that was not enough:
        `fits(need)` says whether it was."""
        out: list[Key] = []
        while self.used + need > self.capacity:
            key = self.policy.victim(evictable, cold_only)
            if key is None:
                break
            out.append(key)
            self.used -= self.sizes.pop(key)
            self.evictions += 1
        return out

    def fits(self, need: int) -> bool:
        return self.used + need <= self.capacity

    def add(self, key: Key, size: int, parent: Key | None = None) -> None:
        if key in self.sizes:
            return
        self.sizes[key] = size
        self.used += size
        self.policy.insert(key, size, parent)

    def remove(self, key: Key) -> None:
        size = self.sizes.pop(key, None)
        if size is not None:
            self.used -= size
            self.policy.remove(key)

    def keys(self) -> Iterable[Key]:
        return self.sizes.keys()
