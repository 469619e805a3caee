"""The space of a pool used by this node alone."""

from __future__ import annotations

from kvfs.layout import Layout
from kvfs.space.base import Space


class LocalSpace(Space):
    """Retired blocks are free at once (nobody else can read them); a full pool deletes this
    node's least recently used closed files (the store's LRU order of blocks) when `pool.evict`
    is "lru"."""

    kind = "local"

    def retired(self, layout: Layout) -> None:
        self.pool.release(layout)

    async def make_room(self, exclude: int, need: int) -> bool:
        if self.knobs.pool_evict != "lru":
            return False
        for bid, ino in self.store.pool_victims():
            if await self._evict(ino, exclude, bid):
                return True
        return False
