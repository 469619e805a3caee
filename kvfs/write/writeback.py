"""Write-back: with `[mount] durability = "fsync"` close() is not a commit; a flusher commits
closed files in batches.

POSIX, ext4 and every engine kvfs serves treat close the same way: close is not durable, fsync
is. A file whose last writer closed it is *closed*: its bytes are in its session's buffer
(DRAM), which readers read, and it is queued (`WriteQueue`, which the session layer sees as
its `Pending`: kvfs/write/durability.py). The flusher (`serve`) takes what
is queued as one batch when `BATCH_FILES` files or `BATCH_BYTES` bytes wait, when the oldest
has waited `delay` seconds (`[mount] writeback_ms`), or at once when someone waits for it:

1. data: every block of the batch is allocated, then each namespace gets one worker-thread job
   for all the runs placed on it (a checksum and a pwritev per run) and one fdatasync
   (`Pool.write_batch`); a block that did not fit, or that a sequential writer wrote behind
   through the daemon, takes the one-file path (`Sessions.write_block`: room is made);
2. metadata: one catalog transaction records every block as its file's version, each
   statement run once with every file's parameters (`SqliteCatalog.commit_batch`); the
   transaction's WAL sync runs while the next batch writes its data (at most
   `COMMITS_IN_FLIGHT` batches wait for theirs). In a shared pool the commit is a publish,
   one script call per Redis shard that each pays for whatever its size: a written batch of
   fewer than GROUP_FILES files per shard (a few large files, started early by their bytes;
   files spread over shards) waits for the batches after it, and they are published
   together (`_commit_grouped`; at most `delay` after the oldest file's close);
3. once durable, each file's buffer becomes its version's resident copy, the old version is
   retired (its space freed: kvfs/space/), and whoever waits for the file is woken.

Data before metadata, as a close's commit: a crash loses the files closed within the window
(queued, or in a batch whose transaction is not durable), and every such file has its previous
version or, never committed, no name; never a partial or mixed one. What waits for the flusher:
fsync and fdatasync of a file (`settle`), a writer opening a closed file and a truncate
(`settle`: a queued buffer is never written again), a rename of such a file over another or of
a file that has a row already (kvfs/fs/files.py), `user.kvfs.layout` and `kvfs.client.direct`
leases (they hand out the extents), fsyncdir, `kvfs flush`, unmount and SIGTERM (`sync_all`).
Writers that open or create files wait while more than `dirty_limit` bytes are closed and not yet
durable (`throttle`; counted in the statistics). Changes to the tree (mkdir, unlink, rename...)
return once applied in the catalog's open transaction; the flusher also commits that transaction
within `delay` (kvfs/catalog/groupcommit.py).

A block whose namespace failed under it (an I/O error, or no answer within the namespace's
deadline: `Namespace.bounded`) is written again on the healthy ones. A write-back that still
fails (no namespace takes it, a full pool with nothing to evict) drops the file's new
content, as a failed commit at close would (it reads as its previous version, or has no
name), logs it, reports it to an fsync waiting for it and tells the files layer, which
reports it to the fsyncs to come as Linux does (`WriteErrors`, kvfs/write/handles.py).

`WriteBack` is the durability seam's "fsync" implementation (kvfs/write/durability.py): it drives
the session layer's public pipeline (kvfs/write/sessions.py) and nothing below calls it.
"""

from __future__ import annotations

import collections
import errno
import logging
from dataclasses import dataclass

import trio

from kvfs.catalog.interface import Catalog
from kvfs.errors import KvfsError, Unsure
from kvfs.tasks import run_all
from kvfs.write.durability import Durability, Listener, Pending
from kvfs.write.handles import NodeState
from kvfs.write.session import Session
from kvfs.write.sessions import Sessions

log = logging.getLogger("kvfs.write.writeback")

BATCH_FILES = 64  # a batch starts once this many closed files wait...
BATCH_BYTES = 64 << 20  # ... or this many bytes
COMMITS_IN_FLIGHT = 2  # batches waiting for their WAL sync while the next writes its data
# A shared pool (`group_shards`): a written batch waits for the next ones, to be published
# with them in one script call per shard, until GROUP_FILES files per shard or GROUP_SLOTS
# batches wait, or the oldest has waited `delay` since its close, or someone waits for one
# (fsync, the dirty limit, unmount). The publish script costs Redis about 86 µs of CPU per
# file at 2 files a call, 26 at 16, 21 at 32 and 18 at 64 (one run of a replay, appendfsync
# always; docs/cluster.md): a batch of 64 files spread over 3 shards would make each shard's
# call a third as large.
GROUP_FILES = 64
GROUP_SLOTS = 32
AGES_KEPT = 4096  # closes whose time to durability the statistics keep


class Item:
    """One closed file waiting for write-back (`Session.writeback` while it waits)."""

    __slots__ = ("node", "st", "session", "size", "sig", "queued_at", "done", "error", "scored")

    def __init__(
        self,
        node,
        st: NodeState,
        session: Session,
        size: int,
        sig,
        now: float,
        scored: bool = False,
    ):
        self.node, self.st, self.session = node, st, session
        self.size, self.sig, self.queued_at = size, sig, now
        self.scored = scored  # its place in the pool's order was given at close
        self.done = trio.Event()
        self.error: KvfsError | None = None


@dataclass
class WriteBackStats:
    batches: int = 0
    files: int = 0  # files made durable by write-back
    bytes: int = 0
    errors: int = 0  # files whose write-back failed (content dropped)
    placed_again: int = 0  # files written again elsewhere after a namespace failed
    largest_batch: int = 0
    early_batches: int = 0  # batches started early: someone waited for them
    catalog_syncs: int = 0  # syncs of tree changes alone (no file waited)
    dirty_waits: int = 0  # writers that waited for the dirty limit
    dirty_wait_seconds: float = 0.0
    dirty_wait_timeouts: int = 0  # writers that stopped waiting (`dirty_wait_max`)
    publishes: int = 0  # catalog commits of written batches (a shared pool: script calls)
    grouped_batches: int = 0  # batches published with an earlier one (`group_shards`)


class WriteQueue(Pending):
    """Closed files waiting for write-back, and whoever waits for them: what the session
    layer sees of the write-back (it queues closed files here, settles a file before it is
    written again, drains the queue to make room); the flusher (`WriteBack`) takes batches
    from it. Below the session layer: it calls nothing above."""

    def __init__(
        self, catalog: Catalog, *, delay: float, dirty_limit: int, dirty_wait_max: float = 10.0
    ):
        self.catalog = catalog
        self.delay = delay
        self.dirty_limit = dirty_limit
        self.dirty_wait_max = dirty_wait_max  # seconds a writer waits for the dirty limit
        self.queue: dict[Session, Item] = {}  # in the order they were closed
        self.queued_bytes = 0
        self.inflight: dict[Item, None] = {}  # taken by a batch, not yet durable
        self.inflight_bytes = 0
        self.stats = WriteBackStats()
        self.ages: collections.deque[float] = collections.deque(maxlen=AGES_KEPT)
        self.max_age = 0.0
        self.wake = trio.Event()
        self.drained = trio.Event()  # set (and replaced) when a batch ends
        self.urgent = 0  # waiters for what is queued now
        self.hurry = trio.Event()  # set (and replaced by its reader) when someone waits
        self.flusher_running = False

    def kick(self) -> None:
        self.wake.set()

    @property
    def dirty_bytes(self) -> int:
        """Bytes of closed files not yet durable."""
        return self.queued_bytes + self.inflight_bytes

    def pending(self) -> bool:
        return bool(self.dirty_bytes or self.catalog.unsynced)

    def first_in_order(self) -> tuple | None:
        """(priority or None, last use) of the file waiting for write-back that comes first
        in the pool's order (None if none waits): making room deletes no committed file that
        comes after it (Space.make_room), so the pool's order holds while closed files wait
        (they are written back first, then deleted in turn)."""
        keys = [
            ((i.node.prio if i.scored else None), max(i.node.atime_ns, i.node.mtime_ns))
            for i in (*self.queue.values(), *self.inflight)
        ]
        if not keys:
            return None
        scored = [k for k in keys if k[0] is not None]
        return min(scored) if scored else (None, min(k[1] for k in keys))

    def add(self, node, st: NodeState, s: Session, size: int, sig, scored: bool = False) -> None:
        """A session its last writer closed (see Sessions.queue): durable within `delay`.
        `scored`: the file's place in the pool's order was set at close (node.prio, uses)."""
        item = Item(node, st, s, size, sig, trio.current_time(), scored)
        s.writeback = item
        self.queue[s] = item
        self.queued_bytes += size
        if (
            len(self.queue) == 1
            or len(self.queue) >= BATCH_FILES
            or self.queued_bytes >= BATCH_BYTES
        ):
            self.wake.set()  # (a first file arms the timer; a full batch starts now)

    def remove(self, s: Session) -> Item | None:
        """Take a session out of the queue before any batch took it (None if one did)."""
        item = s.writeback
        if item is None or s not in self.queue:
            return None
        del self.queue[s]
        self.queued_bytes -= item.size
        return item

    async def settle(self, s: Session) -> KvfsError | None:
        """Wait until the session is written back (started now if it is still queued); the
        error that dropped it, if its write-back failed."""
        item = s.writeback
        if item is None:
            return None
        await self.wait_for([item])
        return item.error

    async def drain(self) -> None:
        """Everything closed so far durable, and every change to the tree: by the flusher
        (this waits); with the flusher stopped, `WriteBack.sync_all` writes it."""
        items = list(self.queue.values()) + list(self.inflight)
        if items and self.flusher_running:
            await self.wait_for(items)
        await self.catalog.sync()

    async def throttle(self) -> None:
        """A writer opens or creates a file: wait while more than `dirty_limit` bytes of
        closed files are not durable yet (the flusher is asked to start at once)."""
        if self.dirty_bytes <= self.dirty_limit:
            return
        t0 = trio.current_time()
        self.stats.dirty_waits += 1
        self.urgent += 1
        self.hurry.set()
        try:
            # bounded: batches end within the namespaces' deadline (Namespace.bounded), and
            # a writer never waits longer than `dirty_wait_max` whatever holds them up
            with trio.move_on_after(self.dirty_wait_max) as scope:
                while self.dirty_bytes > self.dirty_limit:
                    drained = self.drained
                    self.wake.set()
                    await drained.wait()
            if scope.cancelled_caught:
                self.stats.dirty_wait_timeouts += 1
        finally:
            self.urgent -= 1
            self.stats.dirty_wait_seconds += trio.current_time() - t0

    async def wait_for(self, items: list[Item]) -> None:
        self.urgent += 1
        self.hurry.set()
        try:
            for item in items:
                if not item.done.is_set():
                    self.wake.set()
                    await item.done.wait()
        finally:
            self.urgent -= 1

    async def due(self) -> None:
        """Return once a batch is due (or the open transaction has waited `delay`)."""
        while True:
            q = self.queue
            if q and (
                self.urgent
                or len(q) >= BATCH_FILES
                or self.queued_bytes >= BATCH_BYTES
                or self.dirty_bytes > self.dirty_limit
            ):
                return
            deadline = float("inf")
            if q:
                deadline = next(iter(q.values())).queued_at + self.delay
            since = self.catalog.open_since
            if since is not None:
                deadline = min(deadline, since + self.delay)
            if trio.current_time() >= deadline:
                return
            with trio.move_on_at(deadline):
                await self.wake.wait()
            self.wake = trio.Event()

    def take(self) -> list[Item]:
        batch = list(self.queue.values())
        self.queue = {}
        self.queued_bytes = 0
        for item in batch:
            self.inflight[item] = None
            self.inflight_bytes += item.size
        return batch

    def finished(self, item: Item, error: KvfsError | None) -> None:
        """The item leaves the queue (durable, dropped, or failed with `error`)."""
        item.error = error
        s = item.session
        if s.writeback is item:
            s.writeback = None
        self.queue.pop(s, None)
        if item in self.inflight:
            del self.inflight[item]
            self.inflight_bytes -= item.size
        age = trio.current_time() - item.queued_at
        self.ages.append(age)
        self.max_age = max(self.max_age, age)
        item.done.set()

    def batch_ended(self, batch_size: int) -> None:
        self.stats.batches += 1
        self.stats.largest_batch = max(self.stats.largest_batch, batch_size)
        drained, self.drained = self.drained, trio.Event()
        drained.set()

    def statistics(self) -> dict:
        ages = sorted(self.ages)

        def pct(q: float) -> float:
            return round(ages[min(len(ages) - 1, int(q * len(ages)))] * 1000, 2) if ages else 0.0

        return {
            **vars(self.stats),
            "dirty_wait_seconds": round(self.stats.dirty_wait_seconds, 4),
            "queued": len(self.queue),
            "inflight": len(self.inflight),
            "dirty_bytes": self.dirty_bytes,
            "dirty_limit": self.dirty_limit,
            "delay_ms": round(self.delay * 1000, 3),
            "close_to_durable_ms": {
                "p50": pct(0.5),
                "p99": pct(0.99),
                "max": round(self.max_age * 1000, 2),
            },
        }


class WriteBack(Durability):
    """durability = "fsync" (see the module doc): a close allocates and queues the file
    (`Sessions.prepare`, `Sessions.queue`), the flusher commits batches."""

    mode = "fsync"
    defers_commit = True

    def __init__(
        self,
        queue: WriteQueue,
        sessions: Sessions,
        listener: Listener,
        *,
        group_shards: int = 0,
    ):
        self.q = queue
        self.sessions = sessions
        self.listener = listener
        self.catalog = sessions.catalog
        self.pool = sessions.pool
        self.space = sessions.space
        self.stats = queue.stats
        # (a shared pool of `group_shards` Redis shards) each catalog commit is a publish: a
        # script call each shard pays for whatever its size, so written batches are grouped
        # (`_commit_grouped`) until GROUP_FILES files per shard wait; 0: no groups (SQLite's
        # commits)
        self.group_shards = group_shards
        self._slots = trio.Semaphore(GROUP_SLOTS if group_shards else COMMITS_IN_FLIGHT)
        # written batches waiting for the group's publish (the first one's task waits for the
        # group to be due while this is not empty)
        self._gathered: list[list] = []
        self._group_done = trio.Event()  # set once the gathering group is committed

    @property
    def dirty_bytes(self) -> int:
        return self.q.dirty_bytes

    # --- the seam ---------------------------------------------------------------------------------
    async def closing(self, node, st: NodeState | None) -> None:
        await self.sessions.prepare(node, st)

    async def released(self, node, st: NodeState) -> None:
        await self.sessions.finish(node, st, self.sessions.queue)

    async def sync_file(self, node, st: NodeState | None) -> None:
        """The file durable, and (close not being a commit) every change to the tree."""
        await self.sessions.sync_file(node, st)
        await self.catalog.sync()

    async def throttle(self) -> None:
        await self.q.throttle()

    def unlinked(self, s: Session) -> None:
        """The file of a session waiting for write-back lost its name (a temporary file
        removed, a file replaced by a rename): if no batch has taken it yet, it is never
        written, and its memory and reserved space go now."""
        item = self.q.remove(s)
        if item is None:
            return
        s.dirty = False
        self.sessions.abandon_writer(s)
        self._done(item)

    async def sync_all(self) -> None:
        """Make every file closed so far durable, and every change to the tree (fsyncdir,
        `kvfs flush`, unmount). Works whether or not the flusher runs (at unmount it has
        stopped): what is still queued is then written back here."""
        q = self.q
        items = list(q.queue.values()) + list(q.inflight)
        if items and q.flusher_running:
            await q.wait_for(items)
        while q.queue:
            await self._write(q.take(), None)
        await q.wait_for(list(q.inflight))
        await self.catalog.sync()

    async def stop(self) -> int:
        """Unmounting: every closed file written back; the number that could not be."""
        before = self.stats.errors
        try:
            await self.sync_all()
        except KvfsError as e:
            log.error("writing back closed files at unmount failed: %s", e)
            return 1 + self.stats.errors - before
        return self.stats.errors - before

    async def flush(self) -> dict:
        before = self.stats.files
        await self.sync_all()
        return {"written_back": self.stats.files - before}

    def statistics(self) -> dict:
        return self.q.statistics()

    # --- the flusher ------------------------------------------------------------------------------
    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The flusher, until cancelled (a batch under way is finished first)."""
        q = self.q
        q.flusher_running = True
        try:
            async with trio.open_nursery() as nursery:
                task_status.started()
                while True:
                    await q.due()
                    if q.queue:
                        if q.urgent:
                            self.stats.early_batches += 1
                        with trio.CancelScope(shield=True):
                            # (no name keeps the batch while the loop waits: its items keep
                            # their nodes, which the catalog forgets only once unused)
                            await self._write(q.take(), nursery)
                    elif self.catalog.open_since is not None:
                        self.stats.catalog_syncs += 1
                        with trio.CancelScope(shield=True):
                            try:
                                await self.catalog.sync()
                            except KvfsError:
                                pass  # logged once by the catalog; changes refused now
        finally:
            q.flusher_running = False
            q.hurry.set()  # (a group waiting to be published goes now)

    async def _write(self, batch: list[Item], nursery: trio.Nursery | None) -> None:
        """A batch's data, then (in `nursery`, or here) its catalog transaction."""
        sessions = self.sessions
        fast, slow, ready = [], [], []
        for item in batch:
            s, st, node = item.session, item.st, item.node
            if st.session is not s or s.writeback is not item:
                self._done(item)  # (dropped meanwhile: nothing to write)
                continue
            try:
                if not await sessions.committable(node, st, s):
                    self._done(item)  # unlinked meanwhile
                    continue
            except KvfsError as e:  # a catalog failure
                await self._fail(item, e)
                continue
            sessions.space.unreserve(s.reserved)  # (written behind: it allocates now)
            s.reserved = 0
            (slow if s.writer is not None else fast).append(item)
        if fast:
            blocks = []
            for i in fast:  # the extents its close allocated (Sessions._allocate)
                blocks.append((i.session.buffer, i.size, i.session.alloc))
                i.session.alloc = None
            results = await self.pool.write_batch(blocks)
            for item, r in zip(fast, results):
                if not isinstance(r, KvfsError):
                    ready.append((item, r))
                elif r.errno == errno.ENOSPC:
                    slow.append(item)  # room is made on the one-file path
                elif self.pool.can_place_elsewhere(r):
                    # a namespace failed: placed again on the healthy ones (placement
                    # avoids a failed namespace), on the one-file path
                    self.stats.placed_again += 1
                    slow.append(item)
                else:
                    await self._fail(item, r)
            sessions.store.wrote(sum(i.size for i, _ in ready), len(ready))
        if slow:

            async def one(item: Item) -> None:
                try:
                    ready.append(
                        (item, await sessions.write_block(item.node, item.session, item.size))
                    )
                except KvfsError as e:
                    await self._fail(item, e)

            await run_all((lambda i=i: one(i)) for i in slow)
        await self._slots.acquire()
        if nursery is not None:
            nursery.start_soon(self._commit, ready, len(batch))
        else:
            await self._commit(ready, len(batch))

    async def _commit(self, ready: list, batch_size: int) -> None:
        """One catalog transaction for the batch's written blocks; then each file is its new
        version (or, if the transaction failed, its new content is dropped)."""
        try:
            with trio.CancelScope(shield=True):
                if self.group_shards and ready:
                    await self._commit_grouped(ready)
                else:
                    await self._commit_shielded(ready)
        finally:
            self._slots.release()
            self.q.batch_ended(batch_size)

    async def _commit_grouped(self, ready: list) -> None:
        """A written batch's commit in a shared pool: the first batch to come waits for the
        group to be due (`_group_due`), the ones written meanwhile join it and wait for it,
        and the group is one catalog commit (one publish per shard, up to PUBLISH_FILES
        files a call), in the order the batches were written. At low rates of large files
        (LMCache's chunks: two to a batch) a publish is then several batches' files, where
        each batch had paid Redis its own call. No file waits longer than the write-back
        promised (`delay` from its close), and none that someone waits for."""
        done = self._group_done
        if self._gathered:  # a group is gathering: this batch is in it
            self._gathered.append(ready)
            self.q.hurry.set()  # (the group may be full now)
            await done.wait()
            return
        self._gathered.append(ready)
        try:
            await self._group_due()
        finally:
            group, self._gathered = self._gathered, []
            self._group_done = trio.Event()
        self.stats.grouped_batches += len(group) - 1
        try:
            await self._commit_shielded([x for batch in group for x in batch])
        finally:
            done.set()

    async def _group_due(self) -> None:
        """Return once the gathering group is due (see GROUP_FILES)."""
        q = self.q
        while True:
            files = sum(len(batch) for batch in self._gathered)
            if (
                files >= GROUP_FILES * self.group_shards
                or len(self._gathered) >= GROUP_SLOTS  # (the flusher waits for a slot)
                or q.urgent
                or not q.flusher_running
                or q.dirty_bytes > q.dirty_limit
            ):
                return
            oldest = min(item.queued_at for batch in self._gathered for item, _ in batch)
            if trio.current_time() >= oldest + q.delay:
                return
            with trio.move_on_at(oldest + q.delay):
                await q.hurry.wait()
            q.hurry = trio.Event()

    async def _commit_shielded(self, ready: list) -> None:
        sessions = self.sessions
        items, linked = [], []
        gone = [(i, lay) for i, lay in ready if not i.node.linked]
        if gone:
            # unlinked while its data was written (the unlink retired the old version; readers
            # still open read the session): nothing to record, the new extents go back
            ready = [(i, lay) for i, lay in ready if i.node.linked]
            for item, layout in gone:
                self.pool.release(layout)
                self._done(item)
        lost = [(i, lay, why) for i, lay in ready if (why := self.pool.removed_in(lay))]
        if lost:
            # written to a namespace that left the pool meanwhile (kvfs/fs/pool_admin.py)
            ready = [(i, lay) for i, lay in ready if not self.pool.removed_in(lay)]
            for item, layout, why in lost:
                self.pool.release(layout)
                sessions.stats.commit_errors += 1
                await self._fail(item, KvfsError(errno.EIO, why))
        for item, layout in ready:
            linked.append(item.node.linked)  # the catalog publishes exactly these
            node = item.node
            score = (
                (node.prio, node.uses)
                if item.scored and node.linked
                else await sessions.publisher.score(node, layout)
            )
            items.append((node, layout, score))
        try:
            # (the files keep their modification times: of their last write, or a later
            # utime; not the write-back's)
            if items:
                self.stats.publishes += 1
            results = (
                await self.catalog.commit_batch(items, [i.node.mtime_ns for i, _ in ready])
                if items
                else []
            )
        except KvfsError as e:
            results = [e] * len(ready)
        for (item, layout), published, got in zip(ready, linked, results):
            if isinstance(got, KvfsError):
                if not (
                    isinstance(got, Unsure) and got.maybe_published
                ):  # else another node may read it
                    self.pool.release(layout)
                sessions.stats.commit_errors += 1
                await self._fail(item, got)
                continue
            rec, old = got
            node = item.node
            sessions.publisher.published(node, rec, old, published)
            await sessions.committed(node, item.st, item.session, rec, item.sig)
            self.stats.files += 1
            self.stats.bytes += layout.size
            self._done(item)

    async def _fail(self, item: Item, e: KvfsError) -> None:
        """The file's write-back failed: its new content is dropped (Sessions.drop)."""
        s, st, node = item.session, item.st, item.node
        self.stats.errors += 1
        log.error(
            "%s: write-back failed, the file keeps its previous version: %s",
            self.catalog.path_of(node),
            e,
        )
        if s.failed is None:
            s.failed = e
        if st.session is s and s.changed():  # (else dropped already: committable)
            e = await self.sessions.drop(node, st, e)
        self.listener.write_back_failed(node.ino, e)
        self._done(item, e)

    def _done(self, item: Item, error: KvfsError | None = None) -> None:
        """The item leaves write-back (durable, dropped, or failed with `error`)."""
        s, st = item.session, item.st
        self.sessions.free_alloc(s)  # (not written: its close's extents go back)
        self.q.finished(item, error)
        if st.session is s and st.writers == 0 and (item.node.linked or st.opens == 0):
            self.sessions.end(st)
        # (an unlinked file's readers read the session: it stays its content until they
        # are gone, as after a writer's release: kvfs/fs/files.py)
        self.listener.settled(item.node.ino)
