"""What both kinds of space share: reservations against the pool's writable space."""

from __future__ import annotations

import logging
from typing import Protocol

import trio

from kvfs.errors import KvfsError, no_space
from kvfs.knobs import Knobs
from kvfs.pool.layout import Layout
from kvfs.pool.pool import Pool
from kvfs.tiers.scoring import PrefixScore

log = logging.getLogger("kvfs.space")

RETUNE_EVERY = 1024  # accesses between checks of the eviction rule's typical block size
RETUNE_FILES = 64  # files stored since the last check, at least, for their mean size to count


class Evictor(Protocol):
    """The space layer's one call upward: whether a file may be deleted to make room is the
    file layer's to say (it knows open files, pins, what is read here and the kernel's caches);
    kvfs/fs/files.py `Files` answers, through a seam the factory binds (kvfs/service.py)."""

    def evictable(self, ino: int, exclude: int, bid: int | None = None) -> bool:
        """Would `evict` delete this file now (closed, unpinned, unread, still that block)?"""

    async def evict(self, ino: int, exclude: int, bid: int | None = None) -> int:
        """Delete the file; the bytes freed, 0 if it may not (or no longer) go."""

    def held(self, bid: int) -> bool:
        """Is the block read (or fetched, or pinned in DRAM) here now?"""


class Space:
    """Reservations and room-making over a `Pool`; subclasses say how room is made."""

    kind = "?"
    # the longest one `make_room` may wait for room to appear (space in its grace period, or
    # in regions other nodes give back); a writer that met ENOSPC waits about twice that at
    # most (kvfs/write/sessions.py), so a full pool answers ENOSPC instead of holding it
    room_wait = 0.0

    # bytes of retired blocks whose release waits for a catalog change to be durable
    releasing = 0

    def __init__(self, pool: Pool, knobs: Knobs, evictor: Evictor):
        self.pool = pool
        self.knobs = knobs
        self.evictor = evictor  # deletes files to make room (the file layer decides)
        self.reserved = 0  # bytes set aside for write sessions, not yet allocated
        self.evictions = 0  # files deleted to make room
        self.rule: PrefixScore | None = None
        self._until_retune = RETUNE_EVERY  # accesses before the rule's block size is checked
        self._stored = [0, 0]  # files and bytes scored at their store since the last check

    # --- reservations --------------------------------------------------------------------------
    @property
    def free(self) -> int:
        """Bytes writers may still claim (what statfs reports as free)."""
        return max(0, self.pool.free - self.reserved)

    def try_reserve(self, nbytes: int) -> bool:
        if nbytes <= 0:
            return True
        if self.pool.writable - self.reserved < nbytes:
            return False
        self.reserved += nbytes
        return True

    async def reserve(self, nbytes: int, exclude: int) -> None:
        """Set aside `nbytes` for a write session of inode `exclude` (never evicted for it),
        making room as needed; raises ENOSPC when nothing helps."""
        while not self.try_reserve(nbytes):
            if not await self.make_room(exclude, nbytes):
                raise no_space(
                    f"pool is full: {nbytes} more bytes needed, "
                    f"{max(0, self.pool.writable - self.reserved)} free"
                )

    def unreserve(self, nbytes: int) -> None:
        self.reserved = max(0, self.reserved - nbytes)

    # --- what the layers tell the space ---------------------------------------------------------
    def committed(self, layout: Layout) -> None:
        """A block this node wrote is now a file's version (its extents are no longer in
        flight)."""
        self.pool.committed(layout)

    # --- the pool's policy (pool.evict = "prefix") ------------------------------------------------
    # It hears of every store, read and rename of a file and keeps each file's priority and uses
    # on its node (the catalog persists them: its rows on one node, Redis for a shared pool).
    GHOSTS = 5  # evicted names remembered, in pool capacities

    def file_count(self) -> int:
        """Files in the pool (the catalog's count)."""
        raise NotImplementedError

    async def take_ghost(self, node, at_publish: bool = False) -> int | None:
        """The uses the node's name had when it was evicted (forgotten once taken), None if
        none are known. `at_publish`: the file is about to be published; a shared pool may
        then take the ghost in the same script (None now; `revived` after)."""
        raise NotImplementedError

    def _typical(self) -> int:
        n = self.file_count()
        used = self.pool.capacity - self.pool.free
        return max(4096, used // n) if n else self.pool.unit

    def _start_floor(self) -> float:
        """Where a new rule's floor starts (the lowest priority left, on one node)."""
        return 0.0

    def _rule(self) -> PrefixScore | None:
        if self.knobs.pool_evict != "prefix":
            return None
        rule = self.rule
        if rule is None:
            rule = self.rule = PrefixScore(self.pool.capacity, self._typical())
            rule.floor = max(0.0, self._start_floor())
        else:
            self._until_retune -= 1
            if self._until_retune <= 0:
                # The rule's miniature simulations sample the accesses at SAMPLE over the
                # blocks the pool holds, a number it knows from the typical block size. A new
                # pool starts from its stripe unit; once the files stored show their real
                # size, a size off by 2x or more restarts the simulations at it (a pool of
                # small files would otherwise simulate every access: tens of us per store
                # and read)
                self._until_retune = RETUNE_EVERY
                files, nbytes = self._stored
                if files >= RETUNE_FILES:
                    self._stored = [0, 0]
                    rule.retune(self.pool.capacity, max(4096, nbytes // files))
        return rule

    async def score_stored(self, node, size: int) -> tuple[float, int] | None:
        """(priority, uses) a file about to be committed gets, or None if the pool keeps no
        score: a new name takes the uses it had when it was evicted (its ghost), a new version
        of a name is a use."""
        rule = self._rule()
        if rule is None:
            return None
        self._stored[0] += 1
        self._stored[1] += size
        if node.blob is None and node.uses == 0:
            uses = (await self._ghost(node, at_publish=True) or 0) + 1
        else:
            uses = node.uses + 1
        rule.observe((node.parent, node.name), size)
        return rule.priority(uses), uses

    def score_read(self, node, size: int | None = None) -> None:
        """A file was opened for reading (or read directly): a use, in memory (the caller
        records it in the catalog). `size`: of the content read, if it is not the committed
        block's (a closed file waiting for write-back)."""
        rule = self._rule()
        if rule is None or (node.blob is None and size is None):
            return
        node.uses += 1
        node.prio = rule.priority(node.uses)
        rule.observe((node.parent, node.name), node.blob.size if size is None else size)

    async def score_renamed(self, node, replaced=None) -> bool:
        """Written under a temporary name and renamed into place (as many engines do): the
        file is its new name's next version, with the uses the name had (the file it
        replaced, or the name's ghost); whether its score changed."""
        rule = self._rule()
        if rule is None or node.blob is None:
            return False
        had = (
            replaced.uses
            if replaced is not None and replaced.blob is not None
            else (await self._ghost(node) or 0)
        )
        if not had:
            return False
        node.uses = max(node.uses, had + 1)
        node.prio = rule.priority(node.uses)
        return True

    def revived(self, node, had: int) -> None:
        """The name of a file just published had been evicted with `had` uses (a ghost the
        catalog took at publish: `take_ghost(at_publish=True)`): the file carries them."""
        rule = self._rule()
        if rule is not None and had + 1 > node.uses:
            node.uses = had + 1
            node.prio = rule.priority(node.uses)

    async def _ghost(self, node, at_publish: bool = False) -> int | None:
        """The uses the node's name had when it was evicted (see `take_ghost`)."""
        try:
            return await self.take_ghost(node, at_publish)
        except KvfsError as e:  # a hint: the file is scored as new
            log.debug("pool order: the ghost of %r: %s", node.name, e)
            return None

    def ghosts(self) -> int:
        """How many evicted names the catalog remembers the uses of (0: none)."""
        if self._rule() is None:
            return 0
        return self.GHOSTS * max(1, self.pool.capacity // self._typical())

    def retired(self, layout: Layout) -> None:
        """A block that is no longer any file's version and that nobody here reads any more."""
        raise NotImplementedError

    async def make_room(self, exclude: int, need: int, upto: tuple | None = None) -> bool:
        """Find `need` more writable bytes (delete files, lease space...); False if nothing
        helps. Never deletes inode `exclude`. `upto`: delete no file that comes after it in the
        pool's order ((priority or None, last use) of the first file waiting for write-back:
        those cannot be deleted yet, and must not be outlived by files ranked after them)."""
        raise NotImplementedError

    async def _evict(self, ino: int, exclude: int, blob_id: int | None = None) -> int:
        freed = await self.evictor.evict(ino, exclude, blob_id)
        if freed:
            self.evictions += 1
        return freed

    # --- background work and reports -------------------------------------------------------------
    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()

    async def stop(self) -> None:
        """Unmounting."""

    def statistics(self) -> dict:
        out = {
            "kind": self.kind,
            "reserved": self.reserved,
            "evictions": self.evictions,
            "evict": self.knobs.pool_evict,
        }
        if self.rule is not None and self.knobs.pool_evict == "prefix":
            out["evict_mode"] = self.rule.mode_name
            out["evict_floor"] = round(self.rule.floor, 3)
        return out
