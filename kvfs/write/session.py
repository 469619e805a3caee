"""A write session: one file's content between its first write and its commit.

The type alone, apart from what runs sessions (kvfs/write/sessions.py): an inode's state
(kvfs/write/handles.py) holds its session and read-only handles hold the one they read, so handles
imports this module, and sessions imports both without either importing the other back.
"""

from __future__ import annotations

from kvfs.errors import KvfsError
from kvfs.pool.buffer import Buffer


class Session:
    """The mutable content of a file between writes and commit."""

    __slots__ = (
        "buffer",
        "dirty",
        "frozen",
        "reserved",
        "charged",
        "writer",
        "contig",
        "next_early",
        "passthrough",
        "rdwr",
        "sig",
        "rec",
        "failed",
        "unreadable",
        "writeback",
        "alloc",
        "edits",
        "flushed",
        "rollbacks",
    )

    def __init__(self, buffer: Buffer, dirty: bool):
        self.buffer = buffer
        self.dirty = dirty  # has bytes (or existence) not yet committed
        self.frozen = False  # committed: the buffer is now a resident clean copy
        self.reserved = 0  # pool bytes set aside for it
        self.charged = 0  # DRAM bytes accounted for its buffer
        self.writer = None  # BlockWriter: units written behind the writer (write-behind)
        self.contig = 0  # bytes written contiguously from offset 0
        self.next_early = 0  # next unit write-behind may start
        self.failed: KvfsError | None = None  # a write or commit of it failed: never commit it
        # rolled back after `failed`, but the previous version could not be read: its readers
        # get this error (kvfs/write/sessions.py, Sessions._roll_back)
        self.unreadable: KvfsError | None = None
        # passthrough: the kernel writes into the buffer's memfd itself; the daemon learns of
        # writes from the memfd's (size, mtime, ctime) `sig` at the last commit, and of writes
        # through a shared mapping (possible when a handle was opened read-write, `rdwr`) by
        # comparing the content with the checksums of the last commit (`rec`)
        self.passthrough = False
        self.rdwr = False
        self.sig: tuple | None = None
        self.rec = None
        # durability = "fsync": closed by its last writer and waiting for the write-back
        # flusher (its `writeback.Item`); the file's content until then, never written again
        self.writeback = None
        # ... and the pool extents its close allocated for its size (a Layout without
        # checksums), so that its write-back cannot run short of room
        self.alloc = None
        # changes the daemon made (writes, truncates), and `mark()` when a close (FLUSH) last
        # accepted the content: what a stop writes back when the RELEASE never came
        self.edits = 0
        self.flushed: tuple | None = None
        # times its content was rolled back after a failed commit or write-back: a handle
        # that read it before reads EIO after, never two versions (kvfs/fs/files.py)
        self.rollbacks = 0

    @property
    def early(self) -> int:
        """Pool bytes already allocated for units written behind."""
        return self.writer.early_bytes if self.writer is not None else 0

    @property
    def size(self) -> int:
        return self.buffer.sync_size() if self.passthrough else self.buffer.size

    def mark(self, sig: tuple | None = None) -> tuple:
        """What the content is now, as far as the daemon can tell: its changes through the
        daemon, and a passthrough file's (size, mtime, ctime) (`sig`, if just taken)."""
        if self.passthrough and sig is None:
            sig = self.buffer.signature()
        return self.edits, sig

    def changed(self) -> bool:
        """Bytes (or existence) not yet committed, as far as a signature tells."""
        return self.dirty or (self.passthrough and self.buffer.signature() != self.sig)
