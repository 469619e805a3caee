"""What both kinds of space share: reservations against the pool's writable space."""

from __future__ import annotations

from typing import Awaitable, Callable

import trio

from kvfs.errors import no_space
from kvfs.knobs import Knobs
from kvfs.layout import Layout
from kvfs.pool import Pool

# evict(ino, exclude, blob_id) -> bytes freed, 0 if the file may not (or no longer) be deleted:
# set by the layer above (Files), which knows open files, pins and the kernel's caches.
Evictor = Callable[[int, int, "int | None"], Awaitable[int]]


class Space:
    """Reservations and room-making over a `Pool`; subclasses say how room is made."""

    kind = "?"
    # the longest one `make_room` may wait for room to appear (space in its grace period, or
    # in regions other nodes give back); a writer that met ENOSPC waits about twice that at
    # most (kvfs/sessions.py), so a full pool answers ENOSPC instead of holding it
    room_wait = 0.0

    def __init__(self, pool: Pool, knobs: Knobs):
        self.pool = pool
        self.knobs = knobs
        self.reserved = 0             # bytes set aside for write sessions, not yet allocated
        self.evictions = 0            # files deleted to make room
        # Wired by the composer (kvfs/service.py): who deletes files (Files.evict) and the
        # store, which knows what is read here and the local LRU order.
        self.evictor: Evictor | None = None
        self.store = None

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
                raise no_space(f"pool is full: {nbytes} more bytes needed, "
                               f"{max(0, self.pool.writable - self.reserved)} free")

    def unreserve(self, nbytes: int) -> None:
        self.reserved = max(0, self.reserved - nbytes)

    # --- what the layers tell the space ---------------------------------------------------------
    def committed(self, layout: Layout) -> None:
        """A block this node wrote is now a file's version (its extents are no longer in
        flight)."""
        self.pool.committed(layout)

    # The pool's policy hears of every store, read and rename of a file (`pool.evict =
    # "prefix"`: LocalSpace scores them; a shared pool evicts in the cluster's LRU order).
    def score_stored(self, node, size: int) -> tuple[float, int] | None:
        """(priority, uses) a file about to be committed gets, or None if the pool keeps no
        score."""
        return None

    def score_read(self, node) -> None:
        """A file was opened for reading (or read directly): its score changes, in memory
        (the caller records it in the catalog)."""

    def score_renamed(self, node, replaced=None) -> bool:
        """A file took a new name (`replaced`: the file that had it); whether its score
        changed."""
        return False

    def ghosts(self) -> int:
        """How many evicted names the catalog remembers the uses of (0: none)."""
        return 0

    def retired(self, layout: Layout) -> None:
        """A block that is no longer any file's version and that nobody here reads any more."""
        raise NotImplementedError

    async def make_room(self, exclude: int, need: int) -> bool:
        """Find `need` more writable bytes (delete files, lease space...); False if nothing
        helps. Never deletes inode `exclude`."""
        raise NotImplementedError

    async def _evict(self, ino: int, exclude: int, blob_id: int | None = None) -> int:
        if self.evictor is None:
            return 0
        freed = await self.evictor(ino, exclude, blob_id)
        if freed:
            self.evictions += 1
        return freed

    # --- background work and reports -------------------------------------------------------------
    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()

    async def stop(self) -> None:
        """Unmounting."""

    def statistics(self) -> dict:
        return {"kind": self.kind, "reserved": self.reserved, "evictions": self.evictions,
                "evict": self.knobs.pool_evict}
