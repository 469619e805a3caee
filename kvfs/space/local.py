"""The space of a pool used by this node alone."""

from __future__ import annotations

import trio

from kvfs.layout import Layout
from kvfs.policy import PoolOrder, make_policy
from kvfs.space.base import Space

REBUILD_BATCH = 1024     # files added to a pool order between checkpoints while it is rebuilt


class LocalSpace(Space):
    """Retired blocks are free at once (nobody else can read them). A full pool deletes this
    node's closed, unpinned, unread files: with `pool.evict = "lru"` the least recently used
    (the catalog's order of last read or write), with "prefix" in the order of the prefix-aware
    policy the DRAM tier uses (kvfs/policy.py, `PoolOrder`: reused chains stay, blocks read
    once and chain tails go first)."""

    kind = "local"
    # Wired by the composer (kvfs/service.py) from the catalog:
    # lru() -> (block id, inode) from least to most recently used;
    # files() -> (block id, inode, bytes stored, parent block id or None), in the same order;
    # evictable(inode, exclude, block id) -> whether Files.evict would delete it now.
    lru = None
    files = None
    evictable = None

    def retired(self, layout: Layout) -> None:
        self.pool.release(layout)

    async def make_room(self, exclude: int, need: int) -> bool:
        """Delete files, in the policy's order, until `need` bytes beyond what writers reserved
        are free, or nothing more may go; whether any went. For a need of a stripe unit or
        more, free in whole units: small files leave free pieces below a unit that a large
        block's units cannot use (then one more file freed is often not enough, and a commit
        that tried again after each one ran out of time under load: "free space is
        fragmented")."""
        evicted = False
        if self.knobs.pool_evict == "lru":
            went = True
            while went and not (evicted and self._roomy(need)):
                went = False
                for bid, ino in self.lru():      # (from the start again: the order changed)
                    if not self.store.is_held(bid) and await self._evict(ino, exclude, bid):
                        evicted = went = True
                        break
        elif self.knobs.pool_evict == "prefix":
            order = await self._order()
            while not (evicted and self._roomy(need)):
                v = order.victim(lambda b, ino: self.evictable(ino, exclude, b))
                if v is None:
                    break
                bid, ino, _ = v
                if await self._evict(ino, exclude, bid):
                    evicted = True
                # else changed meanwhile (rewritten, opened, removed): its new state is told anew
        return evicted

    def _roomy(self, need: int) -> bool:
        free = self.pool.unit_free if need >= self.pool.unit else self.pool.writable
        return free - self.reserved >= need

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        if self.knobs.pool_evict == "prefix":
            await self._order()           # from the start: it then hears every access

    async def _order(self) -> PoolOrder:
        """The pool's order: built from the catalog (files in order of last use, each read
        again as often as it was since the mount) when the daemon starts with "prefix", or at
        the first eviction after the knob was set to it; from then on the store tells it of
        every commit, read and removal. What the policy learnt before a restart (which blocks
        were reused, how often) is not kept: a restart starts it from the order of last use."""
        if self.store.pool_order is None:
            order = PoolOrder(make_policy("prefix", self.pool.capacity, self.pool.unit))
            self.store.pool_order = order     # hears the accesses made while it is built
            for i, (bid, ino, size, name, parent, reads) in enumerate(self.files()):
                if bid not in order.names:    # (else committed or read since: told already)
                    order.added(bid, ino, size, name, parent)
                    for _ in range(min(reads, 2)):
                        order.used(bid)
                if i % REBUILD_BATCH == REBUILD_BATCH - 1:
                    await trio.lowlevel.checkpoint()   # a million files: let requests through
        return self.store.pool_order
