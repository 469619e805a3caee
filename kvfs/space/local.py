"""The space of a pool used by this node alone."""

from __future__ import annotations

import logging
from typing import Callable, Iterator, Protocol

import trio

from kvfs.knobs import Knobs
from kvfs.pool.layout import Layout
from kvfs.pool.pool import Pool
from kvfs.space.base import Evictor, Space

log = logging.getLogger("kvfs.space")


class LocalOrder(Protocol):
    """What a pool used by one node learns of its files' order from the catalog (its rows:
    kvfs/catalog/sqlite.py)."""

    file_count: int  # files in the pool

    def lru_files(self) -> Iterator[tuple[int, int]]:
        """(block id, inode), least recently used first."""

    def scored_files(self) -> Iterator[tuple[int, int, float]]:
        """(block id, inode, priority), lowest priority first."""

    def lowest_priority(self) -> float | None:
        """The lowest priority of a file, None if none has one."""

    async def score_unscored(self) -> int:
        """Give files stored under "lru" a priority; how many."""

    def last_use(self, ino: int) -> int:
        """When the file was last read or written (ns), 0 if unknown."""

    def take_ghost(self, parent: int, name: bytes) -> int | None:
        """The uses an evicted name had, forgotten once taken."""


class LocalSpace(Space):
    """Retired blocks are free at once (nobody else can read them). A full pool deletes this
    node's closed, unpinned, unread files: with `pool.evict = "prefix"` (the default) in the
    order of the prefix-aware policy (kvfs/tiers/scoring.py `PrefixScore`: files stored or
    read again stay, files stored once go first; each file's priority and uses are columns of
    its catalog row, so the policy costs the daemon no memory per file and survives a
    restart); with "lru" the least recently used first (the catalog's order of last read or
    write)."""

    kind = "local"

    def __init__(
        self,
        pool: Pool,
        knobs: Knobs,
        evictor: Evictor,
        order: LocalOrder,
        after_release: Callable[[Callable[[], None]], None] | None = None,
    ):
        """`order`: the pool's order of files, kept by the catalog (its rows). `after_release`:
        after_release(fn) calls fn() once the catalog change that stopped referencing a block
        is durable (kvfs/catalog/groupcommit.py); None: retired blocks are free at once."""
        super().__init__(pool, knobs, evictor)
        self.order = order
        self.after_release = after_release
        self._scored_all = False  # files stored under "lru" have a priority too
        self.releasing = 0  # bytes of retired blocks waiting for their change's sync

    def file_count(self) -> int:
        return self.order.file_count

    async def take_ghost(self, node, at_publish: bool = False) -> int | None:
        return self.order.take_ghost(node.parent, node.name)

    def retired(self, layout: Layout) -> None:
        """A block no file refers to any more, and nobody here reads: its space is free
        once the change that removed it from the catalog is durable (until then a crash
        would find the catalog pointing at it: its bytes must still be there)."""
        if self.after_release is None:
            self.pool.release(layout)
            return
        nbytes = sum(e.length for e in layout.unit_extents())
        self.releasing += nbytes

        def release() -> None:
            self.releasing -= nbytes
            self.pool.release(layout)

        self.after_release(release)

    @property
    def free(self) -> int:
        """Bytes writers may still claim, counting retired blocks whose removal is not yet
        durable: they are free within the write-back delay, and an allocation that needs
        them sooner waits for that sync (Sessions._allocate). So statvfs shows an unlink's
        space at once, as clients that evict by free space (SGLang's min_free_space) expect."""
        return max(0, self.pool.free + self.releasing - self.reserved)

    def _start_floor(self) -> float:
        return self.order.lowest_priority() or 0.0

    # --- making room ----------------------------------------------------------------------------
    async def make_room(self, exclude: int, need: int, upto: tuple | None = None) -> bool:
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
            order = self.order.lru_files if rule is None else self.order.scored_files
            went = True
            while went and not (evicted and self._roomy(need)):
                went = False
                for bid, ino, *prio in order():  # (from the start again: the order changed)
                    if upto is not None and self._after(ino, prio, upto):
                        break  # a file waiting for write-back goes first
                    if not self.evictor.held(bid) and await self._evict(ino, exclude, bid):
                        if rule is not None:
                            rule.evicted(prio[0])
                        evicted = went = True
                        break
        return evicted

    def _after(self, ino: int, prio: list, upto: tuple) -> bool:
        """Whether the file comes after `upto` ((priority or None, last use) of a file
        waiting for write-back) in the pool's order: by priority under "prefix", by last use
        (read or written) under "lru"."""
        used = self.order.last_use(ino)
        if prio and upto[0] is not None:
            return (prio[0], used) > upto
        return used > upto[1]

    async def _score_unscored(self) -> None:
        self._scored_all = True
        n = await self.order.score_unscored()
        if n:
            log.info("pool order: %d files stored without a priority go first, oldest first", n)

    def _roomy(self, need: int) -> bool:
        free = self.pool.unit_free if need >= self.pool.unit else self.pool.writable
        return free - self.reserved >= need

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        if self._rule() is not None:
            await self._score_unscored()
        task_status.started()
