"""Files: the POSIX behaviour FUSE needs, on top of the catalog (names, durable versions), the
store (block bytes) and the space (room in the pool). No pyfuse3 here, so tests drive it
directly.

Handles opened read-only pin the version current at open (the write session, if a writer is
active, or the committed block), so a reader that opened the old version keeps reading it.
Writes go through a write session (kvfs/write/sessions.py), committed at close, fsync or the release
of the last writable handle. A file whose pool space is needed by a writer may be deleted
(`evict`, called by the space layer) when it is closed, unpinned and not read.

Changes another node of a shared pool made arrive through `changed_elsewhere` (the catalog's
mirror calls it): files it removed are unlinked here, replaced contents retired, and the
kernel's caches told through the callbacks the FUSE layer registers.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import stat
import time
from dataclasses import dataclass

from kvfs.catalog.interface import Catalog
from kvfs.catalog.records import BlobRec, Node
from kvfs.catalog.tree import RENAME_EXCHANGE
from kvfs.errors import DeviceError, KvfsError, Unreadable
from kvfs.fs.eviction import Eviction
from kvfs.fs.kernel import NO_KERNEL, NoKernel
from kvfs.fs.leases import Allocations, Leases
from kvfs.fs.syncing import Syncing
from kvfs.fs.xattrs import Attributes
from kvfs.pool.buffer import Buffer
from kvfs.space import Space
from kvfs.tiers.store import BlockStore
from kvfs.write.durability import Durability
from kvfs.write.handles import (
    Attr,
    Handle,
    Handles,
    NodeState,
    OpenResult,
    WriteErrors,
    killed_while_exiting,
)
from kvfs.write.session import Session
from kvfs.write.sessions import PIN_XATTR, Sessions

log = logging.getLogger("kvfs.fs.files")
# what an open of a block that cannot be brought in answers with ENOENT: the block is absent
# for it, which the engines turn into a miss (docs/configuration.md, "Reads under faults");
# a checksum mismatch stays EIO (the bytes are there, and wrong)
UNAVAILABLE = (DeviceError, Unreadable)


__all__ = ["Attr", "Files", "OpenResult", "PIN_XATTR"]


@dataclass
class FilesStats:
    opens: int = 0
    creates: int = 0
    passthrough_opens: int = 0  # answered with a memfd the kernel reads and writes itself
    plain_opens: int = 0  # served by the daemon (no passthrough, or the fallback)


class Files(Syncing, Eviction):
    """The POSIX behaviour FUSE needs (the module doc). Parts of their own: what fsync and
    write-back report (kvfs/fs/syncing.py), eviction (kvfs/fs/eviction.py), extended
    attributes and pins (kvfs/fs/xattrs.py)."""

    def __init__(
        self,
        catalog: Catalog,
        store: BlockStore,
        space: Space,
        sessions: Sessions,
        leases: Leases,
        allocations: Allocations,
        *,
        durability: Durability,
        readahead=None,
        kernel: NoKernel = NO_KERNEL,
        misses_cacheable: bool = True,
    ):
        """`durability` says when bytes are durable (kvfs/write/durability.py), with this layer
        as its listener (a seam the factory binds): the factory chooses which (kvfs/service.py).
        `kernel`: what to tell the kernel's caches when a file changes behind its back
        (kvfs/fs/kernel.py). `misses_cacheable`: may the kernel cache that a name does not
        exist? Only where every name is made through this mount (one node: with a shared
        pool another node may make it any moment, and a miss then asks Redis)."""
        self.misses_cacheable = misses_cacheable
        self.catalog = catalog
        self.store = store
        self.space = space
        self.sessions = sessions
        self.leases = leases
        self.allocations = allocations
        self.readahead = readahead
        self.kernel = kernel
        self.handles = Handles()
        self._passthrough = False
        self.hits: collections.Counter[int] = collections.Counter()  # reads per file, since mount
        # unlinked files whose uncommitted content went with their session (a closed file
        # removed before its write-back): the size it had, for the kernel's GETATTRs until
        # it forgets the inode (a stat racing with the unlink), as ext4 would answer
        self._gone_sizes: dict[int, int] = {}
        # write-back errors, reported to fsync as Linux does (errseq: kvfs/write/handles.py)
        self.write_errors = WriteErrors()
        self.stats = FilesStats()
        self.durability = durability
        # extended attributes and pins (kvfs/fs/xattrs.py): an object of its own
        self.xattrs = Attributes(catalog, store, self.settle)

    @property
    def passthrough(self) -> bool:
        """The kernel agreed to FUSE passthrough (set by the FUSE layer after INIT)."""
        return self._passthrough

    @passthrough.setter
    def passthrough(self, on: bool) -> None:
        self._passthrough = self.store.passthrough = on

    # --- bookkeeping ---------------------------------------------------------------------------
    def _release_state(self, node: Node) -> None:
        self._release(node.ino)

    def _release(self, ino: int) -> None:
        """Forget the inode's state once nothing uses it (ending an unlinked file's session that
        its last readers read, giving back a block held for writers), and an unlinked node once
        the kernel has forgotten it too (`catalog.drop` forgets unlinked nodes only)."""
        handles = self.handles
        st = handles.states.get(ino)
        if st is not None:
            if not handles.idle(ino, st):
                return
            if st.session is not None:
                if ino in self._gone_sizes:  # unlinked: its last size
                    self._gone_sizes[ino] = st.session.size
                self.sessions.end(st)
            if st.held is not None:
                self.store.unhold(st.held)
            del handles.states[ino]
        if ino not in handles.lookups:
            self._gone_sizes.pop(ino, None)
            if ino in self.write_errors.files:
                node = self.catalog.find(ino)  # (an unlinked node is still known)
                if node is not None and not node.linked:
                    self.write_errors.forget(ino)
            self.catalog.drop(ino)

    def attr(self, node: Node) -> Attr:
        st = self.handles.states.get(node.ino)
        if st and st.session:
            size = st.session.size
        elif node.linked:
            size = node.committed_size
        else:
            size = self._gone_sizes.get(node.ino, node.committed_size)
        return Attr(
            node.ino,
            node.mode,
            node.nlink,
            node.uid,
            node.gid,
            size,
            node.atime_ns,
            node.mtime_ns,
            node.ctime_ns,
        )

    def counted(self, node: Node) -> Attr:
        """attr() for a reply that gives the kernel a reference (lookup, create, mkdir...)."""
        lookups = self.handles.lookups
        lookups[node.ino] = lookups.get(node.ino, 0) + 1
        return self.attr(node)

    def held_here(self, node: Node) -> bool:
        """Is the node's content served by this node without asking a shared catalog (open
        here, or resident in DRAM or the local tier)?"""
        st = self.handles.states.get(node.ino)
        return (st is not None and st.opens > 0) or (
            node.blob is not None and self.store.tier_of(node.blob) != "pool"
        )

    async def lookup(self, parent: int, name: bytes) -> Attr:
        return self.counted(await self.catalog.lookup_fresh(parent, name, self.held_here))

    def forget(self, ino: int, nlookup: int) -> None:
        lookups = self.handles.lookups
        left = lookups.get(ino, 0) - nlookup
        if left > 0:
            lookups[ino] = left
            return
        lookups.pop(ino, None)
        self._release(ino)

    def getattr(self, ino: int) -> Attr:
        return self.attr(self.catalog.get(ino))

    def changed_elsewhere(
        self, kind: str, node: Node, old: BlobRec | None, parent: int, name: bytes
    ) -> None:
        """Another node changed the shared catalog (the mirror's `on_change`)."""
        if kind == "gone":
            node.removed_elsewhere = True  # a writer here must not take its close for a commit
            self._unlinked(node)
            self.kernel.evicted(parent, name, node.ino)
        elif kind == "content":
            if old is not None:
                self.store.retire(old)
            self.kernel.new_content(node.ino)
        else:
            self.kernel.new_name(node.parent, node.name)
            if kind == "moved":
                self.kernel.evicted(parent, name, 0)

    # --- directories and names -----------------------------------------------------------------
    @staticmethod
    def owner_of(parent: Node, gid: int, mode: int, is_dir: bool) -> tuple[int, int]:
        if parent.mode & stat.S_ISGID:  # BSD group semantics on setgid directories
            gid = parent.gid
            if is_dir:
                mode |= stat.S_ISGID
        return gid, mode

    @staticmethod
    def refuse_setid(mode: int) -> None:
        """Block files keep no set-user-ID or set-group-ID bit: the mount negotiates
        FUSE_HANDLE_KILLPRIV_V2 (kvfs/fs/operations.py), which leaves clearing them on write to
        the file system, and passthrough writes never reach the daemon. Directories keep theirs."""
        if mode & (stat.S_ISUID | stat.S_ISGID):
            why = f"kvfs keeps no set-user-ID or set-group-ID bit on files (mode {mode:o})"
            raise KvfsError(errno.EPERM, why)

    async def mkdir(self, parent: int, name: bytes, mode: int, uid: int, gid: int) -> Attr:
        gid, mode = self.owner_of(self.catalog.dir(parent), gid, mode, True)
        return self.counted(await self.catalog.mkdir(parent, name, mode, uid, gid))

    async def symlink(self, parent: int, name: bytes, target: bytes, uid: int, gid: int) -> Attr:
        gid, _ = self.owner_of(self.catalog.dir(parent), gid, 0, False)
        return self.counted(await self.catalog.symlink(parent, name, target, uid, gid))

    def readlink(self, ino: int) -> bytes:
        node = self.catalog.get(ino)
        if not node.is_symlink:
            raise KvfsError(errno.EINVAL, "not a symbolic link")
        return node.target

    def listing(self, ino: int):
        """A directory's entries for readdir, by offset (`catalog.listing`)."""
        return self.catalog.listing(ino)

    def _unlinked(self, node: Node) -> None:
        """A node lost its name: retire its content unless someone still uses the node (a
        closed content waiting for write-back is dropped: kvfs/write/writeback.py)."""
        self.hits.pop(node.ino, None)  # (reads per file since mount: only while it exists)
        st = self.handles.states.get(node.ino)
        if st is not None and st.session is not None:
            self._gone_sizes[node.ino] = st.session.size  # (see attr)
            if st.session.writeback is not None:
                self.durability.unlinked(st.session)
        if node.blob is not None:
            st = self.handles.states.get(node.ino)
            if st is not None and st.writers > 0 and st.held is None:
                # writers that have not written yet copy this version at their first write
                # (readers pinned theirs at open): keep its space until they are done
                st.held = node.blob
                self.store.hold(node.blob, node.ino)
            self.store.retire(node.blob)
        self._release(node.ino)

    async def unlink(self, parent: int, name: bytes) -> None:
        self._unlinked(await self.catalog.unlink(parent, name))

    async def rmdir(self, parent: int, name: bytes) -> None:
        self._unlinked(await self.catalog.rmdir(parent, name))

    async def rename(
        self, parent_old: int, name_old: bytes, parent_new: int, name_new: bytes, flags: int
    ) -> None:
        src = self.catalog.lookup(parent_old, name_old)
        if src.is_file and self._commit_before_rename(src, parent_new, name_new):
            # Like ext4's auto_da_alloc: a file renamed into place (write tmp, rename) has its
            # content committed first, so the rename never exposes an uncommitted file.
            try:
                await self.sessions.commit_if_dirty(src, self.handles.states.get(src.ino))
            except KvfsError as e:
                self._tell_removed(e)
                raise
            if src.parent != parent_old or src.name != name_old or not src.linked:
                raise KvfsError(errno.ENOENT, "file was renamed or removed meanwhile")
        replaced = await self.catalog.rename(parent_old, name_old, parent_new, name_new, flags)
        if not flags & RENAME_EXCHANGE and await self.space.score_renamed(src, replaced):
            self.catalog.rescore(src)
        if replaced is not None:
            self._unlinked(replaced)

    def _commit_before_rename(self, src: Node, parent_new: int, name_new: bytes) -> bool:
        """Must a rename of `src` wait for its content to be committed? When close is a
        commit, always (what a rename exposes is durable). When it is not ("fsync"), a file
        that never had a row (created, written, closed: vLLM's tmp-then-rename) is renamed
        in memory, and its first commit inserts it under its final name, all or nothing;
        but a file with a row has its old content there, which the renamed name must never
        show after a crash, and a replaced file's row must not go before the content that
        replaces it is durable: those commit first. So does a file still open for writing
        (its writer has not closed it: what it wrote so far becomes a version here, as in
        "close" mode; after the rename a directory fsync makes it durable under its name)."""
        if not self.durability.defers_commit or src.persisted:
            return True
        st = self.handles.states.get(src.ino)
        if st is not None and st.writers > 0:
            return True
        try:
            target = self.catalog.lookup(parent_new, name_new)
        except KvfsError:
            return False
        return target.persisted

    async def setattr(
        self,
        ino: int,
        fh: int | None,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        size: int | None = None,
        atime_ns: int | None = None,
        mtime_ns: int | None = None,
    ) -> Attr:
        node = self.catalog.get(ino)
        if mode is not None and node.is_file:
            self.refuse_setid(mode)
        if size is not None:
            if not node.is_file:
                raise KvfsError(
                    errno.EISDIR if node.is_dir else errno.EINVAL, "can only truncate regular files"
                )
            await self.settle(ino)  # (the inode's state may go: looked up after)
            st = self.handles.state(ino)
            if st.passthrough > 0 and not (
                st.session is not None and not st.session.frozen and st.backing is st.session.buffer
            ):
                # the kernel serves readers here another version's memory: as for a rewrite
                raise KvfsError(
                    errno.ETXTBSY,
                    f"{self.catalog.path_of(node)}: open for "
                    f"reading on this node; truncate a new file and "
                    f"rename it over this one instead",
                )
            async with st.lock:
                await self.sessions.truncate(node, st, size)
                if st.writers == 0:  # truncate(2) by path: nobody will close it, commit now
                    await self.sessions.commit_locked(node, st)
                    self.sessions.end(st)
            self._release_state(node)
        if any(v is not None for v in (mode, uid, gid, atime_ns, mtime_ns)):
            await self.catalog.setattr(
                node, mode=mode, uid=uid, gid=gid, atime_ns=atime_ns, mtime_ns=mtime_ns
            )
        return self.attr(node)

    # --- opening -------------------------------------------------------------------------------
    # With FUSE passthrough (`self.passthrough`, set once the kernel agreed at INIT) an open is
    # answered with the memfd that holds the version it reads or writes (a `Buffer`): the kernel
    # then serves read(), write() and mmap from that file without asking the daemon. The kernel
    # wants every handle open on an inode at once to use the same backing file, and passthrough
    # and page-cached handles never to mix, so an inode stays on the path its first handle took
    # until its last handle closes (NodeState.backing / passthrough / plain).

    @staticmethod
    def _open_result(h: Handle, st: NodeState) -> OpenResult:
        node = h.node
        noflush = not h.writable  # closing a read-only handle commits nothing
        if h.backing is not None:
            st.cache_version = None
            return OpenResult(
                h.fh, keep_cache=False, direct_io=False, backing=h.backing, noflush=noflush
            )
        # A writer opened while read-only handles pin a committed version bypasses the page
        # cache, so its new bytes never reach those readers through cached pages.
        direct = h.writable and bool(st.readers)
        if st.session is not None or node.blob is None:
            st.cache_version = None
            return OpenResult(h.fh, keep_cache=False, direct_io=direct, noflush=noflush)
        keep = st.cache_version == node.blob.id
        st.cache_version = node.blob.id
        return OpenResult(h.fh, keep_cache=keep, direct_io=direct, noflush=noflush)

    @staticmethod
    def _regular(node: Node) -> None:
        if node.is_dir:
            raise KvfsError(errno.EISDIR, "is a directory")
        if not node.is_file:
            raise KvfsError(errno.EINVAL, "not a regular file")

    def _use_passthrough(self, node: Node, st: NodeState, writable: bool) -> bool:
        """Should a new handle of this inode use passthrough? ETXTBSY for a writer while
        readers here read another version of the file through passthrough (the kernel would
        refuse a second backing file, and those readers must keep their version)."""
        if not self.passthrough or st.plain > 0:
            return False
        if st.passthrough > 0:
            s = st.session
            if writable and not (
                s is not None and s.passthrough and not s.frozen and st.backing is s.buffer
            ):
                raise KvfsError(
                    errno.ETXTBSY,
                    f"{self.catalog.path_of(node)}: open for "
                    f"reading on this node; write a new file and "
                    f"rename it over this one instead",
                )
            return True
        if writable or st.session is not None:
            return True
        # a block larger than the DRAM tier is streamed through the daemon instead
        return node.blob is None or node.blob.size <= self.store.capacity

    async def open(self, ino: int, flags: int, pid: int = 0) -> OpenResult:
        node = self.catalog.get(ino)
        self._regular(node)
        self.stats.opens += 1
        if not node.linked and self.handles.states.get(ino, NodeState()).opens == 0:
            # No handle keeps it: the kernel opened a name it still caches for a file deleted
            # behind its back (eviction; it is told asynchronously). Its space may be reused.
            raise KvfsError(
                errno.ENOENT, f"{node.name.decode(errors='replace')}: deleted (evicted)"
            )
        writable = flags & os.O_ACCMODE != os.O_RDONLY
        if writable:
            # a closed file's buffer waiting for write-back is never written again (once
            # written back, the inode's state may have gone: it is looked up after)
            await self.durability.throttle()
            await self.settle(ino)
        st = self.handles.state(ino)
        passthrough = self._use_passthrough(node, st, writable)
        h = self.handles.new(node, flags, pid)
        h.wb_seen = self.write_errors.sample(ino)
        try:
            if h.writable and flags & os.O_TRUNC:
                async with st.lock:
                    await self.sessions.truncate(node, st, 0)
            if not h.writable:
                self._pin_version(h, st, pid, access=not flags & os.O_NOATIME)
            await self._serve(h, st, passthrough)
        except BaseException:
            await self.release(h.fh)
            raise
        return self._open_result(h, st)

    async def _serve(self, h: Handle, st: NodeState, passthrough: bool) -> None:
        """Put the handle on its data path."""
        if passthrough:
            await self._bind(h, st)
        else:
            if isinstance(h.version, BlobRec):
                try:  # a block the pool cannot give now is absent for this open
                    self.store.check_readable(h.version)
                except UNAVAILABLE as e:
                    raise e.as_missing() from None
            st.plain += 1
            self.stats.plain_opens += 1

    async def _bind(self, h: Handle, st: NodeState) -> None:
        """Answer this handle with passthrough: find (or make) the memfd it uses."""
        node = h.node
        if st.passthrough > 0:
            buf = st.backing
            if not h.writable and h.version is not st.backing_version:
                # another node replaced the content meanwhile: while handles here read the old
                # version through passthrough, new ones read it too (the kernel allows one
                # backing file per inode at a time)
                self._unpin(h, st)
                h.version = st.backing_version
                if isinstance(h.version, BlobRec):
                    self.store.hold(h.version)
                    st.readers[h.version.id] = st.readers.get(h.version.id, 0) + 1
        elif h.writable:
            async with st.lock:
                s = await self.sessions.writable(node, st)
                if not s.passthrough:
                    s.passthrough = True
                    if not s.dirty:  # a copy of the committed version: unchanged so far
                        s.sig, s.rec = s.buffer.signature(), node.blob
            buf, st.backing_version = s.buffer, s
        elif isinstance(h.version, BlobRec):
            try:
                buf = await self.store.materialize(h.version)
            except UNAVAILABLE as e:  # a device error, not in time, or a namespace failed for
                raise e.as_missing() from None  # reads: absent for this open (an engine's miss)
            st.backing_version = h.version
        else:  # the write session (or an empty session) it pinned
            if h.version is None:  # a new file whose first commit failed: no content yet
                h.version = Session(Buffer(self.sessions.pool.chunk), dirty=False)
            buf, st.backing_version = h.version.buffer, h.version
        if h.writable:
            st.session.rdwr |= h.readable  # may be mmap'd for writing
            buf.shared = True  # the kernel writes into it itself
        h.backing = st.backing = buf
        st.passthrough += 1
        self.stats.passthrough_opens += 1

    def _pin_version(self, h: Handle, st: NodeState, pid: int, access: bool = True) -> None:
        node = h.node
        s = st.session
        if s is not None:
            if s.unreadable is not None:
                raise s.unreadable
            h.version = s
            h.rollbacks = s.rollbacks
            if s.writeback is not None and access:
                # a closed file not yet written back is the file's content: its reads count
                # as reads of it (readahead's order, the pool's uses), as once it is written
                if self.readahead is not None:
                    self.readahead.opened(node, pid)
                self.space.score_read(node, s.writeback.size)
                self.catalog.touch(node)
                self.hits[node.ino] += 1
        elif node.blob is not None:
            h.version = node.blob
            self.store.hold(node.blob, node.ino)
            st.readers[node.blob.id] = st.readers.get(node.blob.id, 0) + 1
            if not access:
                return  # O_NOATIME (a scan, a checksum run): no atime, hit or LRU move
            # one access per open (not per read request): tiers count it, the policy hears it
            # with the block this reader read before it in the chain, readahead looks ahead
            parent = self.readahead.opened(node, pid) if self.readahead else None
            self.store.access(node.blob, parent)
            self.space.score_read(node)
            self.catalog.touch(node)
            self.hits[node.ino] += 1

    def _unpin(self, h: Handle, st: NodeState) -> None:
        if isinstance(h.version, BlobRec):
            self.store.unhold(h.version)
            n = st.readers.get(h.version.id, 0) - 1
            if n > 0:
                st.readers[h.version.id] = n
            else:
                st.readers.pop(h.version.id, None)
        h.version = None

    async def create(
        self, parent: int, name: bytes, mode: int, flags: int, uid: int, gid: int, pid: int = 0
    ) -> tuple[OpenResult, Attr]:
        self.refuse_setid(mode)
        gid, mode = self.owner_of(self.catalog.dir(parent), gid, mode, False)
        await self.durability.throttle()
        node = self.catalog.create_file(parent, name, mode, uid, gid)
        self.stats.creates += 1
        if self.readahead is not None:
            self.readahead.created(node, pid)
        st = self.handles.state(node.ino)
        s = self.sessions.new(st)
        h = self.handles.new(node, flags, pid)
        try:
            if not h.writable:  # O_CREAT|O_RDONLY: the empty file exists once create returns
                h.version = s
                await self.sessions.commit_if_dirty(node, st)
            await self._serve(h, st, self.passthrough)
        except BaseException:
            await self.release(h.fh)
            raise
        # (the attributes stat the new memory file, although it is empty: a stat makes the
        # kernel give the file fine-grained times from then on (multigrain timestamps), so
        # files written within one clock tick still get distinct, ordered mtimes, which SGLang
        # seeds its LRU from; without it they were 4 ms apart)
        return self._open_result(h, st), self.counted(node)

    # --- reading and writing -------------------------------------------------------------------
    async def read(self, fh: int, offset: int, length: int):
        h = self.handles.handles.get(fh)
        if h is None or not h.readable:
            raise KvfsError(errno.EBADF, "file is not open for reading")
        version = h.version
        if h.writable:
            st = self.handles.state(h.node.ino)
            version = st.session if st.session is not None else h.node.blob
            if isinstance(version, BlobRec):
                # no pin for read-write handles: hold the block only for this read
                self.store.hold(version)
                try:
                    return await self.store.read(version, offset, length)
                finally:
                    self.store.unhold(version)
        if version is None:
            return b""
        if isinstance(version, Session):
            if version.unreadable is not None:
                raise version.unreadable
            if version.rollbacks != h.rollbacks and not h.writable:
                # what it read was dropped (a failed write-back or commit): one version per
                # open, the rest of it is EIO rather than the previous version's bytes
                raise KvfsError(
                    errno.EIO,
                    f"{self.catalog.path_of(h.node)}: its content was "
                    f"rolled back under this open (not written)",
                )
            return version.buffer.view(offset, length)
        return await self.store.read(version, offset, length)

    async def write(self, fh: int, offset: int, data) -> int:
        h = self.handles.get(fh)
        if not h.writable:
            raise KvfsError(errno.EBADF, "file is not open for writing")
        node = h.node
        n = await self.sessions.write(node, self.handles.state(node.ino), offset, data)
        node.mtime_ns = node.ctime_ns = time.time_ns()
        return n

    async def fallocate(self, fh: int, mode: int, offset: int, length: int) -> None:
        """fallocate(2) mode 0: bytes up to offset+length become part of the file (zeros where
        nothing was written) and their pool space is reserved now, so later writes there
        cannot fail with ENOSPC. Other modes (KEEP_SIZE, PUNCH_HOLE...): EOPNOTSUPP."""
        if mode != 0:
            raise KvfsError(errno.EOPNOTSUPP, f"fallocate mode {mode:#x} is not supported")
        if offset < 0 or length <= 0:
            raise KvfsError(errno.EINVAL, "fallocate: bad offset or length")
        h = self.handles.get(fh)
        if not h.writable:
            raise KvfsError(errno.EBADF, "file is not open for writing")
        node = h.node
        if await self.sessions.extend(node, self.handles.state(node.ino), offset + length):
            node.mtime_ns = node.ctime_ns = time.time_ns()

    async def flush(self, fh: int, pid: int | None = None) -> None:
        """A close of a descriptor of `fh` (or an fsync) by thread `pid` (None: unknown, the
        opener is asked instead): commits what was written."""
        h = self.handles.get(fh)
        if not h.writable:
            return
        st = self.handles.states.get(h.node.ino)
        closer = pid if pid else h.pid
        if killed_while_exiting(closer):
            # The kernel is closing the files of a process a signal killed (kill -9, a crash)
            # before it closed this one: it never closed it, so what it wrote is dropped
            # (absent, or the previous version; never partial), not committed now or at the
            # release. A process that exits normally without close() has closed its files.
            # The closing thread is asked: the killed process's last thread closes its files,
            # and the thread that opened the file may have ended before (then the opener's
            # pid tells nothing).
            s = st.session if st is not None else None
            if s is not None and not s.frozen and s.failed is None and s.changed():
                s.failed = KvfsError(
                    errno.EIO, f"process {closer} was killed before it closed the file"
                )
            return
        # A failed commit raises an error that says what the kernel may cache wrongly now
        # (`dropped`, `removed`: see Sessions.drop); the FUSE layer tells the kernel before
        # the closer hears of it.
        await self.durability.closing(h.node, st)

    async def release(self, fh: int) -> None:
        h = self.handles.pop(fh)
        if h is None:
            return
        node = h.node
        st = self.handles.state(node.ino)
        self._unpin(h, st)
        if h.backing is not None:
            st.passthrough -= 1
            if st.passthrough == 0:
                st.backing = st.backing_version = None
        else:
            st.plain = max(0, st.plain - 1)
        if h.writable and st.writers == 0:
            # (an error known before: a write that failed, a writer killed, were told or
            # are no error of the file's content; a new one nobody waits for is recorded)
            known = st.session is not None and st.session.failed is not None
            try:
                # mmap(MAP_SHARED) and passthrough writers may write after the last flush
                try:
                    await self.durability.released(node, st)
                except KvfsError as e:
                    self._tell_removed(e)
                    raise
            except KvfsError as e:
                # (after a catalog failure, logged once where it happened, only at debug level)
                log.log(
                    logging.DEBUG if self.catalog.failure else logging.ERROR,
                    "%s: commit at release failed, content dropped: %s",
                    self.catalog.path_of(node),
                    e,
                )
                if not known:  # nobody waits for a release: the fsyncs to come
                    self.write_errors.record(node.ino, e)
            if node.linked or st.opens == 0:
                self.sessions.end(st)
            # else: an unlinked file (never committed again) whose readers may read this
            # session: it stays its content (and size) until they are gone (_release_state)
        self._release_state(node)

    def recharge(self) -> None:
        """Account the memory of sessions the kernel writes into by passthrough (their growth
        reaches no daemon request), so the DRAM tier makes room for it in time. Only a file
        open for writing can grow (a shared mapping keeps its handle open): the open handles
        are walked, not every inode's state (closed files waiting for write-back were measured
        at their release; walking them all, an fstat each, four times a second, was 3.6% of
        the daemon's CPU while 8 writers created 4 KiB files)."""
        seen: set[int] = set()
        states = self.handles.states
        for h in self.handles.handles.values():
            if not h.writable or h.node.ino in seen:
                continue
            seen.add(h.node.ino)
            st = states.get(h.node.ino)
            s = st.session if st is not None else None
            if s is not None and s.passthrough and not s.frozen:
                self.sessions.charge(s)

    # --- the file system -----------------------------------------------------------------------
    def statfs(self) -> dict:
        free = self.space.free
        return {
            "bsize": 4096,
            "frsize": 4096,
            "blocks": self.space.pool.capacity // 4096,
            "bfree": free // 4096,
            "bavail": free // 4096,
            "files": self.catalog.node_count,
            "ffree": 1 << 32,
            "namemax": 255,
        }

    def statistics(self) -> dict:
        s = self.sessions.stats
        return {
            "opens": self.stats.opens,
            "creates": self.stats.creates,
            "passthrough_opens": self.stats.passthrough_opens,
            "plain_opens": self.stats.plain_opens,
            "commits": s.commits,
            "commit_errors": s.commit_errors,
            "bytes_written": s.bytes_written,
            "pool_evictions": self.space.evictions,
            "durability": self.durability.mode,
            **vars(self.leases.stats),
            **vars(self.allocations.stats),
            "open_handles": len(self.handles),
            "nodes": self.catalog.node_count,
            "kernel_refs": len(self.handles.lookups),
            "node_states": len(self.handles.states),
            # what is held now (a leak shows here once clients are done)
            "inode_states": len(self.handles.states),
            "leases_held": len(self.leases.held),
            "allocations_pending": len(self.allocations.pending),
        }
