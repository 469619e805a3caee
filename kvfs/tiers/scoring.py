"""The pool's eviction policy: a score per file (`pool.evict = "prefix"`, the default).

`PrefixScore` is the prefix-aware policy as a rule over two numbers per file (its uses and its
priority), so that a pool keeps the policy's state in its catalog rather than in the daemon's
memory: the spaces score each file by it at commit, read and rename (`Space.score_*`,
kvfs/space/base.py), and the catalog persists the scores and the ghosts (SQLite:
kvfs/catalog/sqlite_order.py; Redis: docs/cluster.md). `ScorePolicy` is the same rule as an
in-memory `EvictionPolicy` (the `score` policy of kvfs/tiers/policy.py's `make_policy`), for
trace replays (bench/trace_replay.py) and for the rule's own miniature simulations.
"""

from __future__ import annotations

import heapq

from kvfs.tiers.index import Evictable, Ghost, Key, TierIndex, sign_test


class PrefixScore:
    """The prefix-aware policy as a rule over two numbers per file, so that a pool of millions
    of files keeps its policy's state in its catalog (a column beside the file's atime, an
    index to evict by) rather than in the daemon's memory, and keeps it across restarts.

    A file has `uses` (stores and reads of its name, remembered for a while after it was
    evicted) and a priority; the pool evicts the file of lowest priority first. The rule is
    GreedyDual-Frequency with a probation credit:

    * a file read or stored again gets priority `floor + uses`;
    * a new name gets `floor + credit`: with a small credit (0.01) new files leave first, in
      the order they came, unless read again soon (a probation FIFO in front: most KV blocks
      are never read again); with credit 1 it is plain GreedyDual-Frequency;
    * a name stored again after its eviction comes back with its old uses plus one (the
      catalog's ghosts: the names evicted last, five pool capacities of them) — a
      conversation's prefix comes back after its next turn's think time;
    * `floor` is the priority of the last file evicted: a file not used ages as files are
      evicted past it (units of one use).

    Which mode suits a workload is not fixed: credit 0.01 doubles LRU's prefix hits on the
    conversation trace at small capacities; at large ones credit 1 (GreedyDual-Frequency)
    does better; on workloads whose blocks come back soon or never, plain recency does (every
    access gets `floor + 1`: LRU, ties broken by inode in the catalog). Miniature simulations
    of the rule in each mode run on a hash-sampled subset of the accesses (at most `SAMPLE`
    blocks' worth of capacity, so their memory is bounded whatever the pool holds: SHARDS,
    Waldspurger et al., ATC '17), and the rule follows the one that hits most, once a sign
    test on the accesses where exactly one of two hit says so beyond chance (Z standard
    deviations over a decayed window of about 8 of their capacities).
    """

    # (credit of a new name, whether uses count): probation, GreedyDual-Frequency, LRU
    MODES = ((0.01, True), (1.0, True), (1.0, False))
    SAMPLE = 2048  # blocks in each miniature simulation, at most
    Z = 3.0

    def __init__(self, capacity: int, typical_size: int = 1, adaptive: bool = True, mode: int = 0):
        self.floor = 0.0
        self.mode = mode
        self.credit, self.frequency = self.MODES[mode]
        self.shadows: list[TierIndex] = []
        self.typical = max(1, typical_size)
        self.lead = mode
        if adaptive:
            self.resize(capacity)

    def resize(self, capacity: int) -> None:
        """A new capacity (bytes): the miniature simulations start again at its scale."""
        blocks = max(1.0, capacity / self.typical)
        self.rate = min(1.0, self.SAMPLE / blocks)
        self._threshold = int(self.rate * (1 << 64))
        mini = max(self.typical, int(capacity * self.rate))
        self.shadows = [
            TierIndex(mini, ScorePolicy(mini, adaptive=False, mode=m))
            for m in range(len(self.MODES))
        ]
        n = len(self.MODES)
        self.beats = [[0.0] * n for _ in range(n)]
        self._decay = 1.0 - 1.0 / (8.0 * max(1.0, mini / self.typical))

    def retune(self, capacity: int, typical_size: int) -> bool:
        """The blocks turned out `typical_size` bytes: if that is 2x or more off the size
        the simulations sample by, they start again at it (whether they did)."""
        typical = max(1, typical_size)
        if self.typical // 2 < typical < 2 * self.typical:
            return False
        self.typical = typical
        self.resize(capacity)
        return True

    @property
    def mode_name(self) -> str:
        return f"credit {self.credit:g}" if self.frequency else "lru"

    def priority(self, uses: int) -> float:
        if uses <= 1:
            return self.floor + self.credit
        return self.floor + (float(uses) if self.frequency else 1.0)

    def evicted(self, priority: float) -> None:
        if priority > self.floor:
            self.floor = priority

    def observe(self, key: Key, size: int) -> None:
        """An access (a store or a read) of `key`: fed to the miniature simulations if the key
        is in the sample; the rule may change its credit."""
        if (
            not self.shadows
            or (hash(key) * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF >= self._threshold
        ):
            return
        status = []
        for t in self.shadows:
            hit = t.lookup(key)
            if not hit:
                t.make_room(size)
                if t.fits(size):
                    t.add(key, size)
            status.append(hit)
        new = sign_test(self.beats, status, self._decay, self.lead, self.Z)
        if new is not None:
            self.lead = self.mode = new
            self.credit, self.frequency = self.MODES[new]


class ScorePolicy:
    """`PrefixScore` as an in-memory `EvictionPolicy` (the `score` policy): what a pool with
    `evict = "prefix"` does, for trace replays (bench/trace_replay.py) and as the rule's own
    miniature simulations (`adaptive=False`, one fixed mode). Its ghosts remember the uses
    of the names evicted last (five capacities of them, as the pool's catalog does)."""

    name = "score"
    GHOSTS = 5.0

    def __init__(self, capacity: int, typical_size: int = 1, adaptive: bool = True, mode: int = 0):
        self.rule = PrefixScore(capacity, typical_size, adaptive, mode)
        self.prio: dict[Key, float] = {}
        self.uses: dict[Key, int] = {}
        self.at: dict[Key, int] = {}  # the sequence number of a key's live heap entry
        self.heap: list[tuple[float, int, Key]] = []
        self.ghost = Ghost(int(self.GHOSTS * max(1, capacity)))
        self.sizes: dict[Key, int] = {}
        self._seq = 0

    def __contains__(self, key: Key) -> bool:
        return key in self.prio

    def __len__(self) -> int:
        return len(self.prio)

    @property
    def mode_name(self) -> str:
        return self.rule.mode_name

    def _set(self, key: Key, uses: int) -> None:
        p = self.rule.priority(uses)
        self.uses[key] = uses
        self.prio[key] = p
        self._seq += 1
        self.at[key] = self._seq
        heapq.heappush(self.heap, (p, self._seq, key))
        if len(self.heap) > 2 * len(self.prio) + 1024:
            self._compact()

    def _compact(self) -> None:
        """Drop the heap's stale entries (each touch leaves one behind, and only evictions
        pop them): at most twice as many entries as keys, for O(1) amortised work per access
        (one O(n) rebuild per n accesses at least)."""
        self.heap = [(self.prio[k], seq, k) for k, seq in self.at.items()]
        heapq.heapify(self.heap)

    def insert(self, key: Key, size: int, parent: Key | None = None) -> None:
        self.rule.observe(key, size)
        if key in self.prio:
            self._set(key, self.uses[key] + 1)
            return
        self.sizes[key] = size
        self._set(key, (self.ghost.take(key) or 0) + 1)

    def touch(self, key: Key, parent: Key | None = None) -> None:
        if key in self.prio:
            self.rule.observe(key, self.sizes[key])
            self._set(key, self.uses[key] + 1)

    def remove(self, key: Key) -> None:
        if self.prio.pop(key, None) is not None:
            self.uses.pop(key)
            self.sizes.pop(key)
            self.at.pop(key)

    def end_chain(self, key: Key) -> None:
        """Not used: a pool does not know where a reader's chain walk ended (and on traces
        whose chains are read again whole, sending their last block out first loses)."""

    def is_hot(self, key: Key) -> bool:
        return self.uses.get(key, 0) > 1

    def resize(self, capacity: int) -> None:
        self.rule.resize(capacity)
        self.ghost.capacity = int(self.GHOSTS * max(1, capacity))

    def victim(self, evictable: Evictable, cold_only: bool = False) -> Key | None:
        held = []
        try:
            while self.heap:
                p, seq, key = heapq.heappop(self.heap)
                if self.at.get(key) != seq:
                    continue  # stale heap entry
                if not evictable(key) or (cold_only and self.uses[key] > 1):
                    held.append((p, seq, key))
                    continue
                self.rule.evicted(p)
                self.ghost.add(key, self.uses[key], self.sizes[key])
                self.remove(key)
                return key
        finally:
            for item in held:
                heapq.heappush(self.heap, item)
        return None
