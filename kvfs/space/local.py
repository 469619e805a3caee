"""The space of a pool used by this node alone."""

from __future__ import annotations

from kvfs.layout import Layout
from kvfs.space.base import Space


class LocalSpace(Space):
    """Retired blocks are free at once (nobody else can read them); a full pool deletes this
    node's least recently used closed files (the catalog's order of last read or write,
    `lru`, skipping blocks the store holds) when `pool.evict` is "lru"."""

    kind = "local"
    # lru() -> (block id, inode) from least to most recently used: wired by the composer
    # (the catalog's `lru_files`)
    lru = None

    def retired(self, layout: Layout) -> None:
        self.pool.release(layout)

    async def make_room(self, exclude: int, need: int) -> bool:
        if self.knobs.pool_evict != "lru":
            return False
        for bid, ino in self.lru():
            if self.store.is_held(bid):
                continue
            if await self._evict(ino, exclude, bid):
                return True
        return False
