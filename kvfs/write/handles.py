"""Open handles and the per-inode state that lives while the kernel or a handle uses an inode.

`Handles` hands out file handles, keeps the kernel's lookup counts (a node that was unlinked
is forgotten only when the kernel and every handle are done with it) and owns each inode's
`NodeState`: its open handles, its write session (kvfs/write/session.py), its lock, and which
version the kernel's page cache may hold.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field

from kvfs.catalog.records import BlobRec, Node
from kvfs.errors import KvfsError
from kvfs.tasks import Lock
from kvfs.write.session import Session


@dataclass
class Attr:
    ino: int
    mode: int
    nlink: int
    uid: int
    gid: int
    size: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int

    @property
    def blocks(self) -> int:
        """512-byte blocks the content occupies (the pool stores it in 4 KiB pages)."""
        return (self.size + 4095) // 4096 * 8


@dataclass
class OpenResult:
    fh: int
    keep_cache: bool  # the kernel may keep page-cache pages from an earlier open
    direct_io: bool  # bypass the page cache for this handle
    backing: object = None  # passthrough: the Buffer whose file the kernel reads and writes
    noflush: bool = False  # its close needs no FLUSH request (read-only: nothing to commit)


def killed_while_exiting(pid: int) -> bool:
    """Whether process (thread) `pid` is exiting because a signal killed it: its task flags
    have PF_EXITING and its exit code is a signal's (/proc/PID/stat fields 9 and 52). About
    3.5 us a close here; a descriptor kept per thread (2.2 us) was tried and not kept: it
    holds a descriptor per writer thread, alive or gone, against the daemon's limit."""
    if pid <= 0:
        return False
    try:  # (os.open and one read: a third of the cost of open() with its buffering)
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            fields = os.read(fd, 4096).rsplit(b")", 1)[1].split()
        finally:
            os.close(fd)
        flags, code = int(fields[6]), int(fields[49])
    except (OSError, IndexError, ValueError):
        return False
    return bool(flags & 0x4) and code & 0x7F != 0  # PF_EXITING, WIFSIGNALED


@dataclass(eq=False)
class Handle:
    fh: int
    node: Node
    readable: bool
    writable: bool
    version: Session | BlobRec | None = None  # read-only handles: what they read
    backing: object = None  # passthrough: the Buffer it is bound to
    pid: int = 0  # the process that opened it (0: unknown)
    wb_seen: int = 0  # the file's write errors it has seen
    # (WriteErrors.sample, then its fsyncs)
    rollbacks: int = 0  # its session's, when it pinned it


class WriteErrors:
    """Write-back errors as Linux reports them (errseq, since 4.13 for files and 4.16 for
    file systems): a failed write-back of a file (its content dropped after close() had
    returned) is reported by the next fsync or fdatasync of every descriptor open when it
    happened, and by the first fsync of a later opener if nobody has seen it yet; each
    descriptor hears of one error once. The mount keeps the same for its directories'
    fsync (fsyncdir: any file's write-back error since the directory was opened, or unseen).

    A number per error (`seq`, growing) and whether anyone has seen it: a handle samples at
    open (`sample`: the last error if it was seen, else 0, so an unseen one is reported to
    the new opener) and reports an error whose number differs from its sample (`check`).
    At most MAX_FILES files' errors are kept, the oldest dropped first (Linux keeps one per
    cached inode, and loses it with the inode)."""

    MAX_FILES = 65536

    def __init__(self) -> None:
        self.seq = 0
        self.files: dict[int, list] = {}  # ino -> [seq, message, seen]
        self.mount: list | None = None  # the mount's last error, the same way
        self.recorded = 0  # errors recorded since the mount (statistics)

    def record(self, ino: int, err: KvfsError) -> None:
        # (its message only: the exception's traceback would keep the failed batch's frames,
        # and with them its blocks' memory, alive as long as the record)
        self.seq += 1
        self.recorded += 1
        self.files.pop(ino, None)
        self.files[ino] = [self.seq, str(err), False]
        self.mount = [self.seq, str(err), False]
        while len(self.files) > self.MAX_FILES:
            del self.files[next(iter(self.files))]

    def sample(self, ino: int | None = None) -> int:
        """What a new descriptor (of file `ino`, or of a directory: the mount) starts from."""
        rec = self.mount if ino is None else self.files.get(ino)
        return rec[0] if rec is not None and rec[2] else 0

    def check(self, seen: int, ino: int | None = None) -> tuple[KvfsError | None, int]:
        """(the error to report to a descriptor that has seen up to `seen`, or None; what it
        has seen from now on)."""
        rec = self.mount if ino is None else self.files.get(ino)
        if rec is None or rec[0] == seen:
            return None, seen
        rec[2] = True
        err = rec[1]
        return KvfsError(errno.EIO, f"an earlier write-back failed: {err}"), rec[0]

    def unseen(self) -> int:
        """Files whose last write-back error no descriptor has been told of."""
        return sum(1 for rec in self.files.values() if not rec[2])

    def forget(self, ino: int) -> None:
        """The file is gone for good (unlinked, and no descriptor or kernel reference)."""
        self.files.pop(ino, None)


@dataclass(eq=False)
class NodeState:
    """Per-inode state that only matters while a handle uses the inode (or the kernel's page
    cache may hold a version of it)."""

    opens: int = 0
    writers: int = 0
    readers: dict[int, int] = field(default_factory=dict)  # blob id -> read-only handles
    session: Session | None = None
    lock: Lock = field(default_factory=Lock)  # (kvfs/tasks.py: no yield when free)
    cache_version: int | None = None  # blob id the kernel's page cache may hold
    backing: object = None  # passthrough: the Buffer every open handle is bound to
    backing_version: object = None  # ... and what it holds (BlobRec or Session)
    passthrough: int = 0  # handles opened with passthrough (bound to `backing`)
    plain: int = 0  # handles opened without passthrough
    held: BlobRec | None = None  # unlinked under open writers: held until they are done


class Handles:
    def __init__(self) -> None:
        self.handles: dict[int, Handle] = {}
        self.states: dict[int, NodeState] = {}
        # the kernel's references (lookup counts) per inode: a plain int per inode the kernel
        # caches (millions after a walk of the tree), apart from the heavier NodeState
        self.lookups: dict[int, int] = {}
        self._next_fh = 1

    def __len__(self) -> int:
        return len(self.handles)

    def state(self, ino: int) -> NodeState:
        st = self.states.get(ino)
        if st is None:
            st = self.states[ino] = NodeState()
        return st

    def get(self, fh: int) -> Handle:
        try:
            return self.handles[fh]
        except KeyError:
            raise KvfsError(errno.EBADF, f"bad file handle {fh}") from None

    def new(self, node: Node, flags: int, pid: int = 0) -> Handle:
        acc = flags & os.O_ACCMODE
        h = Handle(
            self._next_fh,
            node,
            readable=acc in (os.O_RDONLY, os.O_RDWR),
            writable=acc in (os.O_WRONLY, os.O_RDWR),
            pid=pid,
        )
        self._next_fh += 1
        self.handles[h.fh] = h
        st = self.state(node.ino)
        st.opens += 1
        if h.writable:
            st.writers += 1
        return h

    def pop(self, fh: int) -> Handle | None:
        """Remove a handle; its inode's open count drops (writers too)."""
        h = self.handles.pop(fh, None)
        if h is not None:
            st = self.state(h.node.ino)
            st.opens -= 1
            if h.writable:
                st.writers -= 1
        return h

    def idle(self, ino: int, st: NodeState) -> bool:
        """The inode's state may go: no handle, no lock holder, no session waiting for
        write-back, and no kernel reference to a version whose pages the kernel may keep
        (`cache_version`)."""
        if st.opens > 0 or st.lock.locked():
            return False
        if st.session is not None and st.session.writeback is not None:
            return False  # closed, not yet written back: the file's content
        return st.cache_version is None or not self.lookups.get(ino)
