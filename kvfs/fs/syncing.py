"""Durability as the file layer answers for it: fsync, fsyncdir and syncfs, Linux's error
semantics for write-back (a failed write-back is reported to the fsyncs to come: `WriteErrors`,
kvfs/write/handles.py), the `Listener` side of the durability seam (kvfs/write/durability.py:
a closed file settled, or its write-back failed), and closed files handed to write-back at the
stop. A part of `Files` (kvfs/fs/files.py), whose handles, sessions, durability and kernel
caches it uses."""

from __future__ import annotations

import logging

from kvfs.errors import Dropped, KvfsError

log = logging.getLogger("kvfs.fs.files")


class Syncing:
    def settled(self, ino: int) -> None:
        """A closed file left write-back (kvfs/write/durability.py's Listener)."""
        self._release(ino)

    def write_back_failed(self, ino: int, e: KvfsError) -> None:
        """A closed file's write-back failed and dropped its content: reported to the fsyncs
        to come (`write_errors`); the kernel may cache its size, or its name (never
        committed)."""
        self.write_errors.record(ino, e)
        self._tell_removed(e)
        if isinstance(e, Dropped):
            self.kernel.new_content(e.dropped)

    def _tell_removed(self, e: KvfsError) -> None:
        """A commit that dropped a never-committed file's name (see Sessions.drop) tells the
        kernel, which may cache the name (asynchronously: a rename holds the directory's
        lock, and a release has nobody waiting for it)."""
        if isinstance(e, Dropped) and e.removed is not None:
            self.kernel.evicted(*e.removed)

    async def fsync(self, fh: int) -> None:
        """fsync/fdatasync of any handle of the file: its content (and, when close is not a
        commit, every change to the tree so far) durable on return. EIO if a write-back of
        the file failed since this handle last heard of one (`WriteErrors`): never 0 while
        the file silently holds less than was written before the call."""
        h = self.handles.get(fh)
        ino = h.node.ino
        try:
            await self.durability.sync_file(h.node, self.handles.states.get(ino))
        except KvfsError:
            _, h.wb_seen = self.write_errors.check(h.wb_seen, ino)  # told now
            raise
        err, h.wb_seen = self.write_errors.check(h.wb_seen, ino)
        if err is not None:
            raise err

    async def sync_all(self) -> None:
        """`kvfs flush`, unmount: every closed file and every change durable."""
        await self.durability.sync_all()

    async def closed_at_stop(self) -> int:
        """Unmount, SIGTERM: hand to write-back every file whose last close (FLUSH) saw its
        content but whose RELEASE never came (`Sessions.closed_at_stop`), so a clean stop
        loses no closed file. Returns how many."""
        n = 0
        for h in list(self.handles.handles.values()):
            st = self.handles.states.get(h.node.ino)
            if not h.writable or not self.sessions.closed_at_stop(st):
                continue
            n += 1
            try:
                await self.durability.released(h.node, st)
            except KvfsError as e:
                log.error(
                    "%s: closed, not written back at the stop: %s", self.catalog.path_of(h.node), e
                )
                self.write_errors.record(h.node.ino, e)
        return n

    async def fsyncdir(self, seen: int) -> int:
        """fsync of a directory: `sync_all`, then EIO if any file's write-back failed since
        that directory handle (which has seen up to `seen`) last heard of one. Returns what
        it has seen from now on."""
        await self.sync_all()
        err, seen = self.write_errors.check(seen)
        if err is not None:
            raise err
        return seen

    async def settle(self, ino: int) -> None:
        """Before a file's extents are handed out (`user.kvfs.layout`, kvfs.client.direct leases and
        commits): its closed content waiting for write-back is written back now."""
        await self.sessions.settle(self.handles.states.get(ino))

    def dirty(self, ino: int) -> bool:
        """Has the file content not committed yet (open for writing, or closed and waiting
        for write-back)?"""
        st = self.handles.states.get(ino)
        return (
            st is not None
            and st.session is not None
            and not st.session.frozen
            and (st.session.writeback is not None or st.session.changed())
        )
