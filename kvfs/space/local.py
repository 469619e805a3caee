"""The space of a pool used by this node alone."""

from __future__ import annotations

import logging

import trio

from kvfs.layout import Layout
from kvfs.policy import PrefixScore
from kvfs.space.base import Space

log = logging.getLogger("kvfs.space")


class LocalSpace(Space):
    """Retired blocks are free at once (nobody else can read them). A full pool deletes this
    node's closed, unpinned, unread files: with `pool.evict = "prefix"` (the default) in the
    order of the prefix-aware policy (kvfs/policy.py `PrefixScore`: files stored or read again
    stay, files stored once go first; each file's priority and uses are columns of its catalog
    row, so the policy costs the daemon no memory per file and survives a restart); with
    "lru" the least recently used first (the catalog's order of last read or write)."""

    kind = "local"
    GHOSTS = 5               # evicted names remembered, in pool capacities
    # Wired by the composer (kvfs/service.py) from the catalog:
    # lru() -> (block id, inode) from least to most recently used;
    # scored() -> (block id, inode, priority), lowest priority first;
    # lowest() -> the lowest priority of a file, or None; unscored() -> (async) give files
    # stored under "lru" a priority; take_ghost(parent, name) -> uses of an evicted name;
    # file_count() -> files in the pool;
    # evictable(inode, exclude, block id) -> whether Files.evict would delete it now.
    lru = scored = lowest = unscored = take_ghost = file_count = evictable = None

    def __init__(self, pool, knobs):
        super().__init__(pool, knobs)
        self.rule: PrefixScore | None = None
        self._scored_all = False     # files stored under "lru" have a priority too

    def retired(self, layout: Layout) -> None:
        self.pool.release(layout)

    # --- the policy's score -------------------------------------------------------------------
    def _typical(self) -> int:
        n = self.file_count() if self.file_count else 0
        used = self.pool.capacity - self.pool.free
        return max(4096, used // n) if n else self.pool.unit

    def _rule(self) -> PrefixScore | None:
        if self.knobs.pool_evict != "prefix" or self.scored is None:
            return None
        if self.rule is None:
            self.rule = PrefixScore(self.pool.capacity, self._typical())
            low = self.lowest()
            self.rule.floor = max(0.0, low or 0.0)
        return self.rule

    def score_stored(self, node, size: int) -> tuple[float, int] | None:
        rule = self._rule()
        if rule is None:
            return None
        if node.blob is None and node.uses == 0:          # a new name: remembered?
            uses = (self.take_ghost(node.parent, node.name) or 0) + 1
        else:                                             # a new version: a use of the name
            uses = node.uses + 1
        rule.observe((node.parent, node.name), size)
        return rule.priority(uses), uses

    def score_read(self, node) -> None:
        rule = self._rule()
        if rule is None or node.blob is None:
            return
        node.uses += 1
        node.prio = rule.priority(node.uses)
        rule.observe((node.parent, node.name), node.blob.size)

    def score_renamed(self, node, replaced=None) -> bool:
        """Written under a temporary name and renamed into place (as many engines do): the
        file is its new name's next version, with the uses the name had (the file it
        replaced, or the name's ghost)."""
        rule = self._rule()
        if rule is None or node.blob is None:
            return False
        had = replaced.uses if replaced is not None and replaced.blob is not None else \
            (self.take_ghost(node.parent, node.name) or 0)
        if not had:
            return False
        node.uses = max(node.uses, had + 1)
        node.prio = rule.priority(node.uses)
        return True

    def ghosts(self) -> int:
        if self._rule() is None:
            return 0
        return self.GHOSTS * max(1, self.pool.capacity // self._typical())

    # --- making room ----------------------------------------------------------------------------
    async def make_room(self, exclude: int, need: int) -> bool:
        """Delete files, in the policy's order, until `need` bytes beyond what writers reserved
        are free, or nothing more may go; whether any went. For a need of a stripe unit or
        more, free in whole units: small files leave free pieces below a unit that a large
        block's units cannot use (then one more file freed is often not enough, and a commit
        that tried again after each one ran out of time under load: "free space is
        fragmented")."""
        evicted = False
        rule = self._rule()
        if rule is not None and not self._scored_all:
            await self._score_unscored()
        if self.knobs.pool_evict in ("lru", "prefix"):
            order = self.lru if rule is None else self.scored
            went = True
            while went and not (evicted and self._roomy(need)):
                went = False
                for bid, ino, *prio in order():     # (from the start again: the order changed)
                    if not self.store.is_held(bid) and await self._evict(ino, exclude, bid):
                        if rule is not None:
                            rule.evicted(prio[0])
                        evicted = went = True
                        break
        return evicted

    async def _score_unscored(self) -> None:
        self._scored_all = True
        n = await self.unscored()
        if n:
            log.info("pool order: %d files stored without a priority go first, oldest first", n)

    def _roomy(self, need: int) -> bool:
        free = self.pool.unit_free if need >= self.pool.unit else self.pool.writable
        return free - self.reserved >= need

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        if self._rule() is not None:
            await self._score_unscored()
        task_status.started()

    def statistics(self) -> dict:
        out = super().statistics()
        if self.rule is not None and self.knobs.pool_evict == "prefix":
            out["evict_mode"] = self.rule.mode_name
            out["evict_floor"] = round(self.rule.floor, 3)
        return out
