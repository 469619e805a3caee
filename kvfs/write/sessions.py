"""Write sessions: a file's new content between the first write and the commit.

A session's buffer starts empty (create, O_TRUNC) or as a copy of the committed version, takes
writes at any offset, and is committed when a writer calls close() (FUSE flush), fsync(), or
releases the last writable handle: the buffer is written to the pool (durable), then the catalog
records the new version in one transaction; the old version is retired and freed once no reader
holds it. A committed session is frozen (its buffer is now the block's resident copy); a later
write starts a new session from its bytes.

Pool space is reserved as a session grows (kvfs/space/), so a full pool is reported by write()
itself. Write-behind (kvfs/write/behind.py): once a sequential writer has completely written a
stripe unit and moved past it, the unit is written to the pool in the background.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass

import trio
import xxhash

from kvfs.catalog.interface import Catalog
from kvfs.catalog.records import BlobRec, Node
from kvfs.errors import Dropped, KvfsError
from kvfs.pool.buffer import Buffer
from kvfs.pool.layout import Layout
from kvfs.pool.pool import Pool
from kvfs.space import Space
from kvfs.tiers.store import BlockStore
from kvfs.write.durability import NothingPending, Pending
from kvfs.write.handles import NodeState
from kvfs.write.publish import Publisher
from kvfs.write.session import Session

log = logging.getLogger("kvfs.fs.files")

PIN_XATTR = b"user.kvfs.pin"


ROOM_TRIES = 64  # a commit that met ENOSPC makes room and tries again at most this often
# ... for at most this long beyond two waits for room: deleting the files that make room for a
# large block in a fragmented pool takes a catalog transaction each (measured on 2 busy vCPUs,
# 16 writers: up to 1.5 s, which a 1 s bound turned into ENOSPC with room being made)
ROOM_SECONDS = 5.0


@dataclass
class SessionStats:
    commits: int = 0
    commit_errors: int = 0
    bytes_written: int = 0
    placed_again: int = 0  # commits written again elsewhere after a namespace failed


class Sessions:
    """Write sessions and their commit pipeline. A commit at close (`commit_locked`) and the
    write-back flusher (kvfs/write/writeback.py) run the same public steps: `committable` (a failed
    or unlinked session is not written), `write_block` (to the pool: room made, a failed
    namespace written around), `publisher.publish` (kvfs/write/publish.py) or the catalog's
    batch then `publisher.published`, and
    `committed` (the buffer becomes the version's resident copy); `drop` when a step failed
    (the file keeps its previous version), `free_alloc` / `abandon_writer` for what a session
    that is not written held."""

    def __init__(
        self,
        catalog: Catalog,
        store: BlockStore,
        pool: Pool,
        space: Space,
        *,
        pending: Pending | None = None,
        write_behind: bool = True,
    ):
        """`pending`: closed files waiting for write-back (kvfs/write/durability.py; none when
        close is a commit). `write_behind`: a sequential writer's full units go to the pool
        while it writes (only where close commits: a close then has less to write)."""
        self.catalog = catalog
        self.store = store
        self.pool = pool
        self.space = space
        self.stats = SessionStats()
        self.publisher = Publisher(catalog, store, pool, space, self.stats)
        self.writing = 0  # commits writing their block to the pool now
        self.pending = pending if pending is not None else NothingPending()
        self.write_behind = write_behind
        self._written: trio.Event | None = None  # set when `writing` drops to 0

    async def writes_settled(self, timeout: float) -> None:
        """Return once no commit is writing its block to the pool (they are about to ask the
        catalog to record them), or after `timeout` seconds (the catalog's group commit
        waits for them: kvfs/catalog/groupcommit.py)."""
        if self.writing == 0:
            return
        if self._written is None:
            self._written = trio.Event()
        with trio.move_on_after(timeout):
            await self._written.wait()

    def new(self, st: NodeState) -> Session:
        """An empty session for a file just created (pending until its first commit)."""
        s = st.session = Session(Buffer(self.pool.chunk), dirty=True)
        return s

    def too_big(self, end: int, what: str = "a write to byte") -> KvfsError:
        return KvfsError(
            errno.EFBIG,
            f"{what} {end} is past the largest block kvfs can hold ({self.pool.max_block_size})",
        )

    # --- changing the content ---------------------------------------------------------------------
    async def writable(self, node: Node, st: NodeState, keep: int | None = None) -> Session:
        """The node's open session, or a new one holding a copy of its current content
        (only the first `keep` bytes are needed when given). Call with st.lock held."""
        s = st.session
        if s is not None and not s.frozen:
            return s
        st.cache_version = None
        if s is not None:
            base = s.buffer
        elif node.blob is not None and keep != 0:
            base = await self._content(node.blob)
        else:
            base = None
        buf = base.copy() if base is not None else Buffer(self.pool.chunk)
        if keep is not None and keep < buf.size:
            buf.resize(keep)
        new = Session(buf, dirty=False)
        st.session = new
        await self._reserve(node, new, buf.size)
        self._charge(new)
        return new

    async def write(self, node: Node, st: NodeState, offset: int, data) -> int:
        end = offset + len(data)
        async with st.lock:
            try:
                if end > self.pool.max_block_size:
                    raise self.too_big(end)
                s = await self.writable(node, st)
                if end > s.buffer.size:
                    await self._reserve(node, s, end)
            except KvfsError as e:
                # The session now lacks bytes its writer meant it to have: committing it at
                # close would publish a partial file (see commit_locked).
                if st.session is not None and not st.session.frozen:
                    st.session.failed = e
                raise
            s.buffer.write(offset, data)
            self._charge(s)
            s.dirty = True
            s.edits += 1
            self._write_behind(s, offset, end)
        self.stats.bytes_written += len(data)
        return len(data)

    async def extend(self, node: Node, st: NodeState, end: int) -> bool:
        """fallocate mode 0: grow the file to at least `end` bytes (zeros) and reserve its pool
        space now; False if it is that long already."""
        if end > self.pool.max_block_size:
            raise self.too_big(end, "a size of")
        if st.session is None and end <= node.committed_size:
            return False
        async with st.lock:
            s = await self.writable(node, st)
            if end <= s.size:
                return False
            await self._reserve(node, s, end)
            s.buffer.resize(end)
            self._charge(s)
            s.dirty = True
            s.edits += 1
        return True

    async def truncate(self, node: Node, st: NodeState, size: int) -> None:
        """Set the size (truncate(2), ftruncate(2), O_TRUNC). Call with st.lock held."""
        if size > self.pool.max_block_size:
            raise self.too_big(size, "a size of")
        s = await self.writable(node, st, keep=size)
        await self._reserve(node, s, size)
        unit = self.pool.unit
        s.buffer.resize(size)
        if size == 0:
            s.failed = s.unreadable = None  # whatever failed before is gone with its bytes
        s.contig = min(s.contig, size)
        s.next_early = min(s.next_early, size // unit)
        if size == 0:
            self.abandon_writer(s)
        elif s.writer is not None:
            s.writer.touch(size // unit, max(size // unit, max(s.writer.units, default=0)))
        self._charge(s)
        s.dirty = True
        s.edits += 1

    def _write_behind(self, s: Session, offset: int, end: int) -> None:
        """Start writing the units a sequential writer has completed and moved past, so its
        transfer overlaps the namespaces' I/O; close() then only has the rest to write."""
        if s.failed is not None or not self.write_behind:
            # never committed: nothing to write ahead for; or close is not a commit, so a
            # close waits for no I/O to overlap (and the write-back batches the units)
            return
        unit = self.pool.unit
        if s.writer is not None and end > offset:
            s.writer.touch(offset // unit, (end - 1) // unit)
        if offset <= s.contig:
            s.contig = max(s.contig, end)
        full = s.contig // unit
        nursery = self.store.nursery
        if full <= s.next_early or nursery is None:
            return
        if s.writer is None:
            from kvfs.write.behind import BlockWriter

            s.writer = BlockWriter(self.pool)
        for k in range(s.next_early, full):
            if not s.writer.started(k):
                moved = s.writer.write_early(k, s.buffer, nursery)
                if not moved:
                    break  # no room now: commit writes it
                # the unit's space now comes out of the pool's free space, not the reservation
                take = min(moved, s.reserved)
                s.reserved -= take
                self.space.unreserve(take)
            s.next_early = k + 1

    def abandon_writer(self, s: Session) -> None:
        """A session that will not be committed (or was truncated) gives back what it wrote
        behind, and the extents its close allocated."""
        self.free_alloc(s)
        w, s.writer = s.writer, None
        if w is not None and self.store.nursery is not None:
            self.store.nursery.start_soon(w.abort)

    def free_alloc(self, s: Session) -> None:
        if s.alloc is not None:
            self.pool.release(s.alloc)
            s.alloc = None

    def charge(self, s: Session) -> None:
        """Account the session's memory (its buffer's pages) in the DRAM tier."""
        self._charge(s)

    def _charge(self, s: Session, nbytes: int | None = None) -> None:
        delta = (s.buffer.nbytes if nbytes is None else nbytes) - s.charged
        if delta:
            s.charged += delta
            self.store.charge(delta)

    def end(self, st: NodeState) -> None:
        """The last writer is gone (or the inode is forgotten): drop an uncommitted session's
        buffer, reservation and early writes."""
        s = st.session
        if s is None or s.writeback is not None:  # (waiting for write-back: the content)
            return
        st.session = None
        self.abandon_writer(s)
        self.space.unreserve(s.reserved)
        s.reserved = 0
        if not s.frozen:
            self.store.charge(-s.charged)
            s.charged = 0

    async def _reserve(self, node: Node, s: Session, size: int) -> None:
        need = self.pool.stored_size(size) - s.reserved - s.early
        if need <= 0:
            return
        if size > self.pool.max_block_size:
            raise self.too_big(size, "a size of")
        if self.pool.writable - self.space.reserved < need:
            await self._released_first()
        try:
            await self.space.reserve(need, exclude=node.ino)
        except KvfsError as e:
            # closed files waiting for write-back cannot be evicted, and the space of files
            # deleted is free once their deletion is durable: after a write-back of both, it
            # may fit (a writer filling the pool must not see ENOSPC for files it closed)
            if e.errno != errno.ENOSPC or not self.pending.pending():
                raise
            await self.pending.drain()
            await self.space.reserve(need, exclude=node.ino)
        s.reserved += need

    # --- commit -----------------------------------------------------------------------------------
    async def commit_if_dirty(self, node: Node, st: NodeState | None) -> None:
        if st is None or st.session is None:
            return
        if st.session.writeback is not None:  # closed: the flusher commits it now
            err = await self.pending.settle(st.session)
            if err is not None:
                raise err
            return
        if not st.session.changed():
            return
        async with st.lock:
            await self.commit_locked(node, st)

    async def finish(self, node: Node, st: NodeState, hand_off) -> None:
        """The last writable handle is gone: what changed since the last commit goes to
        `hand_off(node, st, session, size, signature, memory)` (the durability's: a commit,
        or `queue` for the write-back), with st.lock held; an unchanged passthrough session
        becomes the committed version's resident copy."""
        s = st.session
        if s is None:
            return
        async with st.lock:
            changed, size, sig, nbytes = self._look(s)
            if not changed and await self._written_through_a_mapping(node, s):
                s.dirty = changed = True
            if not changed:
                if s.passthrough and not s.frozen and s.rec is not None and node.blob is s.rec:
                    self._adopt(node, s)
            else:
                await hand_off(node, st, s, size, sig, nbytes)

    async def _written_through_a_mapping(self, node: Node, s: Session) -> bool:
        """Whether a passthrough session a read-write handle may have mapped (`rdwr`) was written
        through a shared mapping since its last commit (no signature shows it: every byte is
        compared with what was committed)."""
        if not (s.passthrough and s.rdwr and s.rec is not None and node.blob is s.rec):
            return False
        return not await trio.to_thread.run_sync(matches, s.buffer, s.rec.layout, limiter=_HASHING)

    def _look(self, s: Session):
        """(changed since the last commit, size, signature, memory) of a session, with one
        stat of a passthrough session's file."""
        if s.passthrough and not s.frozen:
            size, sig, nbytes = self._measure(s)
            return s.dirty or sig != s.sig, size, sig, nbytes
        return s.changed(), s.buffer.size, None, None

    # --- durability = "fsync": close is not a commit (kvfs/write/writeback.py) --------------------
    async def prepare(self, node: Node, st: NodeState | None) -> None:
        """A writer's close() when close is not a commit: what a commit would report now is
        reported now (an earlier write that failed, a file past max_block_size, a pool with
        no room: the session is dropped, as a failed commit's is), and the file's pool space
        is reserved, so its write-back cannot run short; its bytes stay in memory."""
        s = st.session if st is not None else None
        if s is None or s.frozen or s.writeback is not None:
            return
        async with st.lock:
            changed, size, sig, _ = self._look(s)
            if not changed or not await self.committable(node, st, s):
                return
            await self._allocate_or_drop(node, st, s, size)
            s.flushed = s.mark(sig)  # closed with this content: `closed_at_stop`

    async def _released_first(self) -> bool:
        """Before deleting files to make room: space that unlinks, replaces and evictions
        freed is free once their changes are durable ("fsync" mode: the write-back delay);
        sync them now rather than delete more (a client that evicts its own files, as
        LMCache and SGLang do, must not see kvfs evict too). Whether that freed anything."""
        if not self.space.releasing:
            return False
        await self.catalog.sync()
        return True

    async def _allocate_or_drop(self, node: Node, st: NodeState, s: Session, size: int) -> None:
        """A closed session's size check and allocation for its write-back (at close in
        `prepare`, again at release in `queue`): a file past max_block_size or a pool with no
        room fails it as a failed commit would (counted, the session failed and dropped; the
        error is raised)."""
        try:
            if size > self.pool.max_block_size:
                raise self.too_big(size, "a file of")
            await self._allocate(node, s, size)
        except KvfsError as e:
            self.stats.commit_errors += 1
            s.failed = e
            raise await self.drop(node, st, e) from None

    async def _allocate(self, node: Node, s: Session, size: int) -> None:
        """Give a closed session the pool extents its write-back will write (`Session.alloc`),
        making room as a commit would (a full pool is told at close: ENOSPC). Space reserved
        for it goes back at once. A session written behind through the daemon (`writer`)
        allocates unit by unit: it keeps a reservation instead."""
        if s.writer is not None:
            await self._reserve(node, s, size)
            return
        if s.alloc is not None:
            if s.alloc.size == size:
                return
            self.free_alloc(s)  # written again since (another handle, a mapping)
        self.space.unreserve(s.reserved)
        s.reserved = 0
        tries, give_up = 0, None
        while True:
            try:
                ns_of, offsets = self.pool.allocate(size)
            except KvfsError as e:
                now = trio.current_time()
                if give_up is None:
                    give_up = now + 2 * self.space.room_wait + ROOM_SECONDS
                if e.errno != errno.ENOSPC or tries >= ROOM_TRIES or now >= give_up:
                    raise
                tries += 1
                if await self._released_first():
                    continue
                # (a file waiting for write-back cannot be evicted yet: none ranked after it is)
                if await self.space.make_room(node.ino, size, self.pending.first_in_order()):
                    continue
                # closed files not yet written back cannot be evicted, and the space of
                # deleted ones is free once their deletion is durable: after both, it may fit
                if not self.pending.pending():
                    raise
                await self.pending.drain()
                continue
            s.alloc = Layout(size, self.pool.unit, ns_of, offsets, (0,) * len(ns_of))
            return

    async def queue(
        self, node: Node, st: NodeState, s: Session, size: int, sig, nbytes: int | None
    ) -> None:
        """Hand a session its last writer closed to the write-back queue (`pending`, a
        WriteQueue; see `prepare` for the checks, made again: it may have been written
        through a mapping since)."""
        if not await self.committable(node, st, s):
            return
        await self._allocate_or_drop(node, st, s, size)
        self._charge(s, nbytes)
        if sig is not None:  # the kernel wrote it (passthrough): its memory file's time
            node.mtime_ns = node.ctime_ns = sig[1]
        # The file takes its place in the pool's order now, at its close (as a commit at close
        # would), not at its write-back: reads before that move it on (Space.score_read),
        # and the batch records the score as it stands then (WriteBack._commit_shielded).
        score = await self.space.score_stored(node, size) if node.linked else None
        if score is not None:
            node.prio, node.uses = score
        self.pending.add(node, st, s, size, sig, scored=score is not None)

    def closed_at_stop(self, st: NodeState | None) -> bool:
        """At a stop (unmount, SIGTERM): was the inode's content accepted by a close (FLUSH)
        and not changed since, although its RELEASE has not come (the kernel sends it after
        close() returns, asynchronously)? Then it is written back as if released."""
        s = st.session if st is not None else None
        return (
            s is not None
            and not s.frozen
            and s.writeback is None
            and s.failed is None
            and s.flushed is not None
            and s.changed()
            and s.flushed == s.mark()
        )

    async def settle(self, st: NodeState | None) -> None:
        """Return once the inode has no session waiting for write-back (it is written back
        now if it was): before a writer changes the file, or its extents are handed out."""
        s = st.session if st is not None else None
        if s is not None and s.writeback is not None:
            await self.pending.settle(s)

    async def sync_file(self, node: Node, st: NodeState | None) -> None:
        """fsync(): the file's content durable (its session committed now, or its write-back
        done now). Raises the error of a write-back of it that failed."""
        s = st.session if st is not None else None
        if s is not None:
            if s.writeback is not None:
                err = await self.pending.settle(s)
                if err is not None:
                    raise err
            else:
                async with st.lock:
                    # (a write through a shared mapping: durable by an fsync too, not only at
                    # the release of the file's last writable handle)
                    if not s.changed() and await self._written_through_a_mapping(node, s):
                        s.dirty = True
                    if s.changed():
                        await self.commit_locked(node, st)

    async def committable(self, node: Node, st: NodeState, s: Session) -> bool:
        """Checks before a session's bytes go to the pool: a session whose write failed (or
        whose writer was killed) is dropped with that error; one whose file was unlinked
        meanwhile is not committed (False); after a catalog failure: EIO."""
        if s.failed is not None:
            raise await self.drop(
                node,
                st,
                KvfsError(
                    s.failed.errno,
                    f"{self.catalog.path_of(node)}: not committed, an earlier "
                    f"write or commit failed: {s.failed}",
                ),
            )
        if not node.linked:  # unlinked before its first/next commit: nothing to keep
            s.dirty = False
            self.abandon_writer(s)
            if node.removed_elsewhere:
                s.failed = self.publisher.removed_elsewhere(node)
                raise s.failed
            return False
        if self.catalog.failure:  # it could not be recorded: do not write it to the pool
            self.stats.commit_errors += 1
            s.failed = KvfsError(errno.EIO, self.catalog.failure)
            raise s.failed
        return True

    def _measure(self, s: Session):
        """(size, signature, memory) of the session's content now: one stat of a passthrough
        session's file (the kernel wrote it), which also gives the signature before a read."""
        if s.passthrough:
            fst = s.buffer.refresh()
            return fst.st_size, (fst.st_size, fst.st_mtime_ns, fst.st_ctime_ns), fst.st_blocks * 512
        return s.buffer.size, None, None

    async def commit_locked(self, node: Node, st: NodeState) -> None:
        """Make the session durable and the file's current version (see the module doc)."""
        s = st.session
        if s is None or not s.changed():
            return
        if not await self.committable(node, st, s):
            return
        size, sig, nbytes = self._measure(s)
        if size > self.pool.max_block_size:
            self.stats.commit_errors += 1
            raise self.too_big(size, "a file of")
        self.space.unreserve(s.reserved)  # the allocation below takes its place at once
        s.reserved = 0
        self.free_alloc(s)
        self._charge(s, nbytes)
        self.writing += 1
        try:
            layout = await self.write_block(node, s, size)
        except KvfsError as e:
            layout, failed = None, e
        finally:
            self.writing -= 1
            if self.writing == 0 and self._written is not None:
                self._written.set()
                self._written = None
        if layout is None:  # (dropped once `writing` no longer waits for it: see above)
            raise await self.drop(node, st, failed) from None
        # (no checkpoint from here to the catalog's statements: `writing` says when it joins)
        try:
            (rec,) = await self.publisher.publish([(node, layout)])
            if isinstance(rec, KvfsError):
                raise rec
        except KvfsError as e:
            s.failed = e  # its closer is told; a later release must not commit it
            raise await self.drop(node, st, e) from None
        await self.committed(node, st, s, rec, sig)

    async def committed(
        self, node: Node, st: NodeState, s: Session, rec: BlobRec, sig: tuple | None
    ) -> None:
        """The session is the file's committed version `rec` now."""
        s.dirty = False
        s.sig, s.rec = sig, rec
        # The buffer becomes the version's resident copy, unless passthrough writers may still
        # write into it (then at their release, see `finish`).
        if node.linked and not (s.passthrough and st.writers > 0):
            self._adopt(node, s)
        await self.keep_pinned(node, rec)

    async def write_block(self, node: Node, s: Session, size: int):
        """Write the session's block to the pool (its units written behind so far included);
        the layout. A full pool makes room and tries again, a bounded number of times for a
        bounded time: room that still does not fit (free bytes fragmented below a unit) would
        loop for ever, and other writers racing for the room just made may take it (so
        "nothing changed" is no sign to stop). The writer waits meanwhile, in a request the
        kernel does not let even SIGKILL interrupt: past about two waits for room and
        ROOM_SECONDS, ENOSPC."""
        tries, give_up, placed_again = 0, None, False
        while True:
            writer, s.writer = s.writer, None
            try:
                # (bounded by the namespaces' I/O deadline: an fsync, a close in "close" mode
                # or a write-back waits no longer for a hung namespace)
                if writer is None:
                    return await self.store.write(s.buffer, size)
                layout = await writer.finish(s.buffer, size)  # (what it wrote behind, finished)
                self.store.wrote(size)
                return layout
            except KvfsError as e:
                now = trio.current_time()
                if give_up is None:
                    give_up = now + 2 * self.space.room_wait + ROOM_SECONDS
                if (
                    e.errno == errno.ENOSPC
                    and tries < ROOM_TRIES
                    and now < give_up
                    and await self.space.make_room(node.ino, size)
                ):
                    tries += 1
                    continue
                if not placed_again and self.pool.can_place_elsewhere(e):
                    # a namespace failed under it: once more, placed on the healthy ones
                    log.warning("%s: %s; writing it again elsewhere", self.catalog.path_of(node), e)
                    placed_again = True
                    self.stats.placed_again += 1
                    continue
                self.stats.commit_errors += 1
                s.failed = e  # its closer is told; a later release must not commit it
                raise

    async def drop(self, node: Node, st: NodeState, err: KvfsError) -> Dropped:
        """A write into this session failed, or its commit did, or its writer was killed: it
        holds less than its writer wrote, and is never committed (`failed` stays set until a
        truncate to 0). Drop it now, as its closer (or fsync, or rename) is told: from here on
        the file reads as its previous version. Handles still open on the inode read the
        session (the writer; readers that opened while it was written; with passthrough,
        every handle until the writer's release arrives, which the kernel sends after the
        close returns: they share its memfd), so its bytes are rolled back to that version
        in place; a file never committed loses its name too, rather than stay an empty file.
        Returns the error for the caller to raise: `Dropped`, `err`'s errno and message with
        the inode (the kernel may cache the size the writes made) and, when the name went,
        (parent, name, ino) (the kernel may cache it)."""
        s = st.session
        s.dirty = False
        self.abandon_writer(s)
        removed = None
        # the writer hears of it; the log says it too, for whoever runs the node (a full pool;
        # a catalog failure is logged once, where it happened)
        log.log(
            logging.DEBUG if self.catalog.failure else logging.WARNING,
            "%s: what was written is dropped: %s",
            self.catalog.path_of(node),
            err,
        )
        if (
            node.linked and not node.persisted and node.blob is None and not node.removed_elsewhere
        ):  # (else its removal is under way)
            # never committed: the name goes too, rather than stay an empty file here
            parent, name = node.parent, node.name
            await self.catalog.remove(node)
            removed = (parent, name, node.ino)
        if st.opens > 0:
            await self._roll_back(node, s)
        s.sig = s.buffer.signature() if s.passthrough else None
        return Dropped(err, node.ino, removed)

    async def _content(self, rec: BlobRec) -> Buffer:
        """A committed version's whole content (the block held while it is read)."""
        self.store.hold(rec)
        try:
            return await self.store.read_all(rec)
        finally:
            self.store.unhold(rec)

    async def _roll_back(self, node: Node, s: Session) -> None:
        """The session takes the file's committed content again (none for a file never
        committed), and its reservation shrinks to what that needs. Daemon-served readers
        that opened it before read EIO from now on (`rollbacks`); passthrough readers share
        its memory file with the kernel and see the previous version."""
        s.rollbacks += 1
        old = None
        if node.blob is not None:
            try:
                old = await self._content(node.blob)
            except KvfsError as e:
                # the previous version cannot be read here now: handles on the session read
                # that error instead of bytes that were never committed (kvfs/fs/files.py)
                log.error(
                    "%s: the previous version could not be read back after a failed write: %s",
                    self.catalog.path_of(node),
                    e,
                )
                s.unreadable = e
        if s.passthrough:
            # the kernel reads and writes this very memfd for every handle on the inode: it
            # changes in place (no daemon I/O uses it: write-behind serves daemon writes only)
            if old is not None:
                s.buffer.become(old)
            else:
                s.buffer.resize(0)
        else:
            # write-behind units the abandoned writer still has in flight read the old buffer
            # in worker threads: it stays as it is (shrinking it under them would fault)
            s.buffer = old.copy() if old is not None else Buffer(self.pool.chunk)
        keep = self.pool.stored_size(s.buffer.size)
        if s.reserved > keep:
            self.space.unreserve(s.reserved - keep)
            s.reserved = keep
        self._charge(s)

    async def keep_pinned(self, node: Node, rec: BlobRec) -> None:
        """A pinned file's new version stays pinned."""
        if node.linked and node.xattrs.get(PIN_XATTR) == b"1":
            try:
                await self.store.pin(rec)
            except KvfsError as e:
                log.warning("%s: new version not pinned: %s", self.catalog.path_of(node), e)

    def _adopt(self, node: Node, s: Session) -> None:
        """A committed session is frozen; its buffer is now the block's resident copy. (One
        written back was measured at its last release and not written since: no stat.)"""
        s.frozen = True
        s.buffer.seal()
        if s.writeback is None:
            self._charge(s)
        self.store.adopt(
            s.rec,
            s.buffer,
            node.ino,
            charged=s.charged,
            parent=self.chain_parent(node),
            nbytes=s.charged if s.writeback is not None else None,
        )
        s.charged = 0

    def chain_parent(self, node: Node) -> int | None:
        """The current block of the file before `node`'s in its prefix chain, if known."""
        pred = self.catalog.parent_of(node.ino)
        pnode = self.catalog.find(pred) if pred is not None else None
        return pnode.blob.id if pnode is not None and pnode.blob else None


def matches(buf: Buffer, layout) -> bool:
    """In a worker thread: does the buffer hold exactly the content `layout` describes?"""
    if buf.size != layout.size:
        return False
    for k in range(layout.nunits):
        start, length = layout.unit_span(k)
        if xxhash.xxh3_64_intdigest(os.pread(buf.fd, length, start)) != layout.sums[k]:
            return False
    return True


_HASHING = trio.CapacityLimiter(1)
