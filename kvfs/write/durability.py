"""When a file's bytes become durable: one seam, two implementations, chosen once where the
layers are built (kvfs/service.py).

`[mount] durability` picks one:

* `CommitAtClose` ("close", and always with a shared pool): close() commits (the session's
  block written to the pool and recorded in the catalog before close returns);
* `WriteBack` ("fsync", the default on one node: kvfs/write/writeback.py): close() only allocates
  and queues the file; a flusher commits closed files in batches, fsync waits for its file.

The files layer (kvfs/fs/files.py) calls the seam at each point where the two differ: a writer's
close (`closing`), the release of the last writable handle (`released`), fsync (`sync_file`),
fsyncdir and `kvfs flush` (`sync_all`), an open for writing (`throttle`), an unlink of a
closed file (`unlinked`); the service runs it (`serve`, `stop`) and reports it
(`statistics`). Both drive the same public pipeline of the session layer (kvfs/write/sessions.py);
neither the files layer, the session layer nor the service tests which one runs. What the
session layer needs to know of closed files still waiting (to make room, to settle a file
before it is written again) it asks a `Pending` object passed to it at construction: the
write-back's queue, or `NothingPending`.
"""

from __future__ import annotations

from typing import Protocol

import trio

from kvfs.catalog.records import Node
from kvfs.errors import KvfsError
from kvfs.write.handles import NodeState
from kvfs.write.session import Session


class Pending:
    """Closed files not yet durable, as the session layer sees them (kvfs/write/writeback.py's
    `WriteQueue`; this base is the nothing-pending of "close" mode)."""

    dirty_bytes = 0

    def pending(self) -> bool:
        """Is there anything whose write-back would free or make room (closed files, or
        tree changes not yet durable)?"""
        return False

    async def drain(self) -> None:
        """Return once everything closed so far (and every change to the tree) is durable."""

    async def settle(self, s: Session) -> KvfsError | None:
        """Wait until the session is written back; the error that dropped it, if any."""
        return None

    def first_in_order(self) -> tuple | None:
        """(priority or None, last use) of the waiting file first in the pool's order."""
        return None


NothingPending = Pending


class Listener(Protocol):
    """What a durability tells the layer above (the files layer, which passes itself at
    construction): a file left write-back (its inode's state may go), or its write-back
    failed and dropped its content (fsyncs to come report it; the kernel may cache its size
    or name)."""

    def settled(self, ino: int) -> None: ...

    def write_back_failed(self, ino: int, error: KvfsError) -> None: ...


class Durability:
    """The seam (see the module doc). `mode` names it in statistics; `defers_commit`: a closed
    file may be renamed before it is committed (its first commit inserts it under its final
    name: kvfs/fs/files.py)."""

    mode = ""
    defers_commit = False

    async def closing(self, node: Node, st: NodeState | None) -> None:
        """A writer's close() (FUSE flush)."""
        raise NotImplementedError

    async def released(self, node: Node, st: NodeState) -> None:
        """The last writable handle is gone."""
        raise NotImplementedError

    async def sync_file(self, node: Node, st: NodeState | None) -> None:
        """fsync()/fdatasync() of the file."""
        raise NotImplementedError

    async def sync_all(self) -> None:
        """fsyncdir, `kvfs flush`: every closed file and every change durable."""

    async def throttle(self) -> None:
        """A writer opens or creates a file."""

    def unlinked(self, s: Session) -> None:
        """The file of a closed session lost its name."""

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Background work, until cancelled."""
        task_status.started()

    async def stop(self) -> int:
        """Unmounting: what is closed made durable; the number of files that could not be."""
        return 0

    async def flush(self) -> dict:
        """`kvfs flush`'s part: what was made durable."""
        await self.sync_all()
        return {}

    def statistics(self) -> dict | None:
        return None


class CommitAtClose(Durability):
    """durability = "close": close() is a commit (`Sessions.commit_locked`), and so is the
    release of the last writer (for writes through a mapping after the last close), and an
    fsync of a file open for writing. Nothing is ever pending."""

    mode = "close"

    def __init__(self, sessions) -> None:
        self.sessions = sessions

    async def closing(self, node: Node, st: NodeState | None) -> None:
        await self.sessions.commit_if_dirty(node, st)

    async def released(self, node: Node, st: NodeState) -> None:
        await self.sessions.finish(node, st, self._commit)

    async def _commit(
        self, node: Node, st: NodeState, s: Session, size: int, sig, nbytes: int | None
    ) -> None:
        await self.sessions.commit_locked(node, st)

    async def sync_file(self, node: Node, st: NodeState | None) -> None:
        await self.sessions.sync_file(node, st)
