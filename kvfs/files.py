"""Open files: handles, write sessions, and commit on close or fsync.

This layer gives the POSIX behaviour that FUSE needs on top of the catalog (names, durable
versions) and the store (block bytes). It has no pyfuse3 in it, so tests drive it directly.

A file's content changes through a *write session*: an in-memory buffer that starts empty
(create, O_TRUNC) or as a copy of the committed version, takes writes at any offset, and is
committed when a writer calls close() (FUSE flush), fsync(), or releases the last writable
handle. Commit writes the buffer to the pool (durable), then records the new version in the
catalog in one transaction; the old version is retired and freed once no reader holds it.
A session that was committed is frozen; a later write starts a new session from its bytes.

Handles opened read-only pin the version current at open (the session, if a writer is active,
or the committed block), so a reader that opened the old version keeps reading it.

Pool space is reserved as a session grows, so a full pool is reported by write() itself. With
`evict = "lru"` the least recently used closed files are deleted to make room (as in a cache);
with `evict = "never"` the write fails with ENOSPC. A write past `max_block_size` (default: the
pool's capacity) fails with EFBIG.

In a pool shared by several nodes (`catalog.shared`, kvfs/catalog/redis.py) the same rules hold
cluster-wide: a writer first leases more of the pool (`catalog.grow`), eviction follows the
cluster's LRU order, and evicted space is free only after the grace period, so a background
cleaner keeps `free_target` of the pool free ahead of writers. Changes made by other nodes
arrive through `catalog.on_change`: files they removed are unlinked here, replaced contents
retired, and the kernel's caches told.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import stat
import time
from dataclasses import dataclass, field
from typing import Callable

import trio

from kvfs.buffer import Buffer
from kvfs.catalog.base import ROOT_INO, BlobRec, Node
from kvfs.errors import KvfsError, no_space
from kvfs.pool import Pool
from kvfs.store import BlockStore

log = logging.getLogger("kvfs.files")

XATTR_NAME_MAX = 255
PIN_XATTR = b"user.kvfs.pin"
XATTR_SIZE_MAX = 64 * 1024


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
    keep_cache: bool      # the kernel may keep page-cache pages from an earlier open
    direct_io: bool       # bypass the page cache for this handle


class Session:
    """The mutable content of a file between writes and commit."""

    __slots__ = ("buffer", "dirty", "frozen", "reserved", "charged", "writer", "contig",
                 "next_early")

    def __init__(self, buffer: Buffer, dirty: bool):
        self.buffer = buffer
        self.dirty = dirty        # has bytes (or existence) not yet committed
        self.frozen = False       # committed: the buffer is now a resident clean copy
        self.reserved = 0         # pool bytes set aside for it
        self.charged = 0          # DRAM bytes accounted for its buffer
        self.writer = None        # BlockWriter: units written behind the writer (write-behind)
        self.contig = 0           # bytes written contiguously from offset 0
        self.next_early = 0       # next unit write-behind may start

    @property
    def early(self) -> int:
        """Pool bytes already allocated for units written behind."""
        return self.writer.early_bytes if self.writer is not None else 0


@dataclass(eq=False)
class Handle:
    fh: int
    node: Node
    readable: bool
    writable: bool
    version: Session | BlobRec | None = None   # read-only handles: what they read


@dataclass(eq=False)
class NodeState:
    """Per-inode state that only matters while the kernel or a handle uses the inode."""
    lookups: int = 0
    opens: int = 0
    writers: int = 0
    readers: dict[int, int] = field(default_factory=dict)   # blob id -> read-only handles
    session: Session | None = None
    lock: trio.Lock = field(default_factory=trio.Lock)
    cache_version: int | None = None     # blob id the kernel's page cache may hold


@dataclass
class FilesStats:
    opens: int = 0
    creates: int = 0
    commits: int = 0
    commit_errors: int = 0
    bytes_written: int = 0
    pool_evictions: int = 0
    leases: int = 0
    expired_leases: int = 0
    stale_releases: int = 0
    direct_reads: int = 0


class Files:
    def __init__(self, catalog, store: BlockStore, pool: Pool, *, evict: str = "lru",
                 max_block_size: int | None = None, readahead=None):
        self.catalog = catalog
        self.store = store
        self.pool = pool
        self.readahead = readahead
        self.evict = evict
        self.max_block_size = max_block_size or pool.capacity
        self.handles: dict[int, Handle] = {}
        self.states: dict[int, NodeState] = {}
        self.hits: collections.Counter[int] = collections.Counter()   # reads per file, since mount
        self.leases: dict[int, list] = {}     # generation -> [(expiry, BlobRec, ino)]
        self.stats = FilesStats()
        self._next_fh = 1
        # Called as on_evict(parent_ino, name, ino) after a file was deleted to free pool space,
        # so the FUSE layer can tell the kernel. Set by the layer above; never calls back down.
        self.on_evict: Callable[[int, bytes, int], None] | None = None
        # Called as on_new_name(parent_ino, name) when another node created or moved a file
        # here (the kernel may cache that the name does not exist), and on_new_content(ino)
        # when another node rewrote a file (the kernel caches its size). Set by the FUSE layer.
        self.on_new_name: Callable[[int, bytes], None] | None = None
        self.on_new_content: Callable[[int], None] | None = None
        self.shared = getattr(catalog, "shared", False)
        if self.shared:
            catalog.on_change = self._changed_elsewhere
        self._seed_recency()

    def _seed_recency(self) -> None:
        """Order the pool's LRU by the access times persisted in the catalog."""
        for node in sorted(self.catalog.files(), key=lambda n: n.atime_ns):
            self.store.track(node.blob, node.ino)

    # --- bookkeeping ---------------------------------------------------------------------------
    def _state(self, ino: int) -> NodeState:
        st = self.states.get(ino)
        if st is None:
            st = self.states[ino] = NodeState()
        return st

    def _maybe_release_state(self, node: Node) -> None:
        st = self.states.get(node.ino)
        if st is None or st.lookups > 0 or st.opens > 0 or st.lock.locked():
            return
        if st.session is not None:
            self._end_session(st)
        del self.states[node.ino]
        if not node.linked:
            self.catalog.drop(node.ino)

    def _lock(self, node: Node) -> trio.Lock:
        return self._state(node.ino).lock

    def attr(self, node: Node) -> Attr:
        st = self.states.get(node.ino)
        size = st.session.buffer.size if st and st.session else node.committed_size
        return Attr(node.ino, node.mode, node.nlink, node.uid, node.gid, size,
                    node.atime_ns, node.mtime_ns, node.ctime_ns)

    def counted(self, node: Node) -> Attr:
        """attr() for a reply that gives the kernel a reference (lookup, create, mkdir...)."""
        self._state(node.ino).lookups += 1
        return self.attr(node)

    async def lookup(self, parent: int, name: bytes) -> Attr:
        node = await self.catalog.lookup_fresh(parent, name)
        if self.shared and node.is_file and node.blob is not None and not self.catalog.fresh:
            st = self.states.get(node.ino)
            if (st is None or st.opens == 0) and self.store.tier_of(node.blob) == "pool":
                # the mirror may be behind: read this one name's record from Redis first
                try:
                    node = await self.catalog.confirm(parent, name)
                except KvfsError as e:
                    if e.errno != errno.EIO:
                        raise
                    raise KvfsError(errno.EIO, f"{self.catalog.path_of(node)}: the cluster "
                                               f"catalog is unreachable and this block is not "
                                               f"held here") from None
        return self.counted(node)

    def _changed_elsewhere(self, kind: str, node: Node, old: BlobRec | None, parent: int,
                           name: bytes) -> None:
        """Another node changed the shared catalog (see RedisCatalog.on_change)."""
        if kind == "gone":
            self._unlinked(node)
            if self.on_evict is not None:
                self.on_evict(parent, name, node.ino)
        elif kind == "content":
            if old is not None:
                self.store.retire(old)
            if self.on_new_content is not None:
                self.on_new_content(node.ino)
        elif self.on_new_name is not None:
            self.on_new_name(node.parent, node.name)
            if kind == "moved" and self.on_evict is not None:
                self.on_evict(parent, name, 0)

    def forget(self, ino: int, nlookup: int) -> None:
        st = self.states.get(ino)
        if st is None:
            return
        st.lookups = max(0, st.lookups - nlookup)
        node = self.catalog.nodes.get(ino)
        if node is not None:
            self._maybe_release_state(node)

    def getattr(self, ino: int) -> Attr:
        return self.attr(self.catalog.get(ino))

    # --- directories and names -----------------------------------------------------------------
    def _owner(self, parent: Node, uid: int, gid: int, mode: int, is_dir: bool) -> tuple[int, int]:
        if parent.mode & stat.S_ISGID:     # BSD group semantics on setgid directories
            gid = parent.gid
            if is_dir:
                mode |= stat.S_ISGID
        return gid, mode

    async def mkdir(self, parent: int, name: bytes, mode: int, uid: int, gid: int) -> Attr:
        p = self.catalog.dir(parent)
        gid, mode = self._owner(p, uid, gid, mode, True)
        return self.counted(await self.catalog.mkdir(parent, name, mode, uid, gid))

    async def symlink(self, parent: int, name: bytes, target: bytes, uid: int, gid: int) -> Attr:
        p = self.catalog.dir(parent)
        gid, _ = self._owner(p, uid, gid, 0, False)
        return self.counted(await self.catalog.symlink(parent, name, target, uid, gid))

    def readlink(self, ino: int) -> bytes:
        node = self.catalog.get(ino)
        if not node.is_symlink:
            raise KvfsError(errno.EINVAL, "not a symbolic link")
        return node.target

    def _unlinked(self, node: Node) -> None:
        """A node lost its name: retire its content unless someone still uses the node."""
        st = self.states.get(node.ino)
        if node.blob is not None:
            self.store.retire(node.blob)
        if st is None:
            self.catalog.drop(node.ino)
        else:
            self._maybe_release_state(node)

    async def unlink(self, parent: int, name: bytes) -> None:
        node = await self.catalog.unlink(parent, name)
        self._unlinked(node)

    async def rmdir(self, parent: int, name: bytes) -> None:
        node = await self.catalog.rmdir(parent, name)
        self._unlinked(node)

    async def rename(self, parent_old: int, name_old: bytes, parent_new: int, name_new: bytes,
                     flags: int) -> None:
        src = self.catalog.lookup(parent_old, name_old)
        if src.is_file:
            # Like ext4's auto_da_alloc: a file renamed into place (write tmp, rename) has its
            # content committed first, so the rename never exposes an uncommitted file.
            await self._commit_if_dirty(src)
            if src.parent != parent_old or src.name != name_old or not src.linked:
                raise KvfsError(errno.ENOENT, "file was renamed or removed meanwhile")
        replaced = await self.catalog.rename(parent_old, name_old, parent_new, name_new, flags)
        if replaced is not None:
            self._unlinked(replaced)

    async def setattr(self, ino: int, fh: int | None, *, mode: int | None = None,
                      uid: int | None = None, gid: int | None = None, size: int | None = None,
                      atime_ns: int | None = None, mtime_ns: int | None = None) -> Attr:
        node = self.catalog.get(ino)
        if size is not None:
            if not node.is_file:
                raise KvfsError(errno.EISDIR if node.is_dir else errno.EINVAL,
                                "can only truncate regular files")
            await self._truncate(node, size)
        if any(v is not None for v in (mode, uid, gid, atime_ns, mtime_ns)):
            await self.catalog.setattr(node, mode=mode, uid=uid, gid=gid, atime_ns=atime_ns,
                                       mtime_ns=mtime_ns)
        return self.attr(node)

    async def _truncate(self, node: Node, size: int) -> None:
        if size > self.max_block_size:
            raise KvfsError(errno.EFBIG, f"{size} bytes is more than the largest block kvfs "
                                         f"can hold ({self.max_block_size})")
        st = self._state(node.ino)
        async with st.lock:
            s = await self._writable_session(node, st, keep=size)
            await self._reserve(node, s, size)
            s.buffer.resize(size)
            s.contig = min(s.contig, size)
            s.next_early = min(s.next_early, size // self.pool.unit)
            if s.writer is not None:
                s.writer.touch(size // self.pool.unit, max(size // self.pool.unit,
                                                           max(s.writer.units, default=0)))
            self._charge(s)
            s.dirty = True
            if st.writers == 0:       # truncate(2) by path: nobody will close it, commit now
                await self._commit_locked(node, st)
                self._end_session(st)
        self._maybe_release_state(node)

    # --- opening -------------------------------------------------------------------------------
    def _new_fh(self, node: Node, flags: int) -> Handle:
        acc = flags & os.O_ACCMODE
        h = Handle(self._next_fh, node, readable=acc in (os.O_RDONLY, os.O_RDWR),
                   writable=acc in (os.O_WRONLY, os.O_RDWR))
        self._next_fh += 1
        self.handles[h.fh] = h
        st = self._state(node.ino)
        st.opens += 1
        if h.writable:
            st.writers += 1
        return h

    def _open_result(self, h: Handle, st: NodeState) -> OpenResult:
        node = h.node
        if st.session is not None or node.blob is None:
            st.cache_version = None
            return OpenResult(h.fh, keep_cache=False, direct_io=h.writable and bool(st.readers))
        keep = st.cache_version == node.blob.id
        st.cache_version = node.blob.id
        # A writer opened while read-only handles pin a committed version bypasses the page
        # cache, so its new bytes never reach those readers through cached pages.
        return OpenResult(h.fh, keep_cache=keep, direct_io=h.writable and bool(st.readers))

    async def open(self, ino: int, flags: int, pid: int = 0) -> OpenResult:
        node = self.catalog.get(ino)
        if node.is_dir:
            raise KvfsError(errno.EISDIR, "is a directory")
        if not node.is_file:
            raise KvfsError(errno.EINVAL, "not a regular file")
        self.stats.opens += 1
        h = self._new_fh(node, flags)
        st = self._state(ino)
        try:
            if h.writable and flags & os.O_TRUNC:
                async with st.lock:
                    s = await self._writable_session(node, st, keep=0)
                    s.buffer.resize(0)
                    s.contig = s.next_early = 0
                    self._abandon_writer(s)
                    self._charge(s)
                    s.dirty = True
            if not h.writable:
                self._pin_version(h, st, pid, access=not flags & os.O_NOATIME)
        except BaseException:
            await self.release(h.fh)
            raise
        return self._open_result(h, st)

    def _pin_version(self, h: Handle, st: NodeState, pid: int, access: bool = True) -> None:
        node = h.node
        if st.session is not None:
            h.version = st.session
        elif node.blob is not None:
            h.version = node.blob
            self.store.hold(node.blob)
            st.readers[node.blob.id] = st.readers.get(node.blob.id, 0) + 1
            if not access:
                return      # O_NOATIME (a scan, a checksum run): no atime, hit or LRU move
            # one access per open (not per read request): tiers count it, the policy hears it
            # with the block this reader read before it in the chain, readahead looks ahead
            parent = self.readahead.opened(node, pid) if self.readahead else None
            self.store.access(node.blob, parent)
            self.catalog.touch(node)
            self.hits[node.ino] += 1

    async def create(self, parent: int, name: bytes, mode: int, flags: int, uid: int,
                     gid: int, pid: int = 0) -> tuple[OpenResult, Attr]:
        p = self.catalog.dir(parent)
        gid, mode = self._owner(p, uid, gid, mode, False)
        node = self.catalog.create_file(parent, name, mode, uid, gid)
        self.stats.creates += 1
        if self.readahead is not None:
            self.readahead.created(node, pid)
        st = self._state(node.ino)
        st.session = Session(Buffer(self.pool.chunk), dirty=True)
        h = self._new_fh(node, flags)
        if not h.writable:          # O_CREAT|O_RDONLY: the empty file exists once create returns
            h.version = st.session
            await self._commit_if_dirty(node)
        return self._open_result(h, st), self.counted(node)

    # --- reading and writing -------------------------------------------------------------------
    def _handle(self, fh: int) -> Handle:
        try:
            return self.handles[fh]
        except KeyError:
            raise KvfsError(errno.EBADF, f"bad file handle {fh}") from None

    async def read(self, fh: int, offset: int, length: int):
        h = self.handles.get(fh)
        if h is None or not h.readable:
            raise KvfsError(errno.EBADF, "file is not open for reading")
        version = h.version
        if h.writable:
            st = self._state(h.node.ino)
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
            return version.buffer.view(offset, length)
        return await self.store.read(version, offset, length)

    async def write(self, fh: int, offset: int, data) -> int:
        h = self._handle(fh)
        if not h.writable:
            raise KvfsError(errno.EBADF, "file is not open for writing")
        n = len(data)
        end = offset + n
        if end > self.max_block_size:
            raise KvfsError(errno.EFBIG, f"a write to byte {end} is past the largest block kvfs "
                                         f"can hold ({self.max_block_size})")
        node = h.node
        st = self._state(node.ino)
        async with st.lock:
            s = await self._writable_session(node, st)
            if end > s.buffer.size:
                await self._reserve(node, s, end)
            s.buffer.write(offset, data)
            self._charge(s)
            s.dirty = True
            self._write_behind(s, offset, end)
        node.mtime_ns = node.ctime_ns = time.time_ns()
        self.stats.bytes_written += n
        return n

    async def fallocate(self, fh: int, mode: int, offset: int, length: int) -> None:
        """fallocate(2) mode 0: bytes up to offset+length become part of the file (zeros where
        nothing was written) and their pool space is reserved now, so later writes there
        cannot fail with ENOSPC. Within the current size it changes nothing (a session always
        holds its whole size's space). Other modes (KEEP_SIZE, PUNCH_HOLE...): EOPNOTSUPP."""
        if mode != 0:
            raise KvfsError(errno.EOPNOTSUPP, f"fallocate mode {mode:#x} is not supported")
        if offset < 0 or length <= 0:
            raise KvfsError(errno.EINVAL, "fallocate: bad offset or length")
        h = self._handle(fh)
        if not h.writable:
            raise KvfsError(errno.EBADF, "file is not open for writing")
        end = offset + length
        if end > self.max_block_size:
            raise KvfsError(errno.EFBIG, f"{end} bytes is more than the largest block kvfs can "
                                         f"hold ({self.max_block_size})")
        node = h.node
        st = self._state(node.ino)
        if st.session is None and end <= node.committed_size:
            return
        async with st.lock:
            s = await self._writable_session(node, st)
            if end <= s.buffer.size:
                return
            await self._reserve(node, s, end)
            s.buffer.resize(end)
            self._charge(s)
            s.dirty = True
        node.mtime_ns = node.ctime_ns = time.time_ns()

    async def _writable_session(self, node: Node, st: NodeState, keep: int | None = None) -> Session:
        """The node's open session, or a new one holding a copy of its current content
        (only the first `keep` bytes are needed when given)."""
        s = st.session
        if s is not None and not s.frozen:
            return s
        st.cache_version = None
        if s is not None:
            base = s.buffer
        elif node.blob is not None and keep != 0:
            self.store.hold(node.blob)
            try:
                base = await self.store.read_all(node.blob)
            finally:
                self.store.unhold(node.blob)
        else:
            base = None
        buf = base.copy() if base is not None else Buffer(self.pool.chunk)
        if keep is not None and keep < buf.size:
            buf.resize(keep)
        new = Session(buf, dirty=False)
        new.reserved = 0
        st.session = new
        await self._reserve(node, new, buf.size)
        self._charge(new)
        return new

    def _write_behind(self, s: Session, offset: int, end: int) -> None:
        """Start writing the units a sequential writer has completed and moved past, so its
        transfer overlaps the namespaces' I/O; close() then only has the rest to write."""
        unit = self.pool.unit
        if s.writer is not None and end > offset:
            s.writer.touch(offset // unit, (end - 1) // unit)
        if offset <= s.contig:
            s.contig = max(s.contig, end)
        full = s.contig // unit
        if full <= s.next_early or self.store.nursery is None:
            return
        if s.writer is None:
            s.writer = self.pool.writer()
        for k in range(s.next_early, full):
            if not s.writer.started(k):
                moved = s.writer.write_early(k, s.buffer, self.store.nursery)
                if not moved:
                    break                   # no room now: commit writes it
                # the unit's space now comes out of the pool's free space, not the reservation
                take = min(moved, s.reserved)
                s.reserved -= take
                self.pool.unreserve(take)
            s.next_early = k + 1

    def _abandon_writer(self, s: Session) -> None:
        """A session that will not be committed gives back what it wrote behind."""
        w, s.writer = s.writer, None
        if w is not None and self.store.nursery is not None:
            self.store.nursery.start_soon(w.abort)

    def _charge(self, s: Session) -> None:
        delta = s.buffer.nbytes - s.charged
        if delta:
            s.charged += delta
            self.store.charge(delta)

    def _end_session(self, st: NodeState) -> None:
        s = st.session
        st.session = None
        if s is None:
            return
        self._abandon_writer(s)
        self.pool.unreserve(s.reserved)
        s.reserved = 0
        if not s.frozen:
            self.store.charge(-s.charged)
            s.charged = 0

    async def _reserve(self, node: Node, s: Session, size: int) -> None:
        need = self.pool.stored_size(size) - s.reserved - s.early
        if need <= 0:
            return
        if size > self.max_block_size:
            raise KvfsError(errno.EFBIG, f"{size} bytes is more than the largest block kvfs can "
                                         f"hold ({self.max_block_size})")
        while not self.pool.reserve(need):
            if not await self._make_room(node.ino, need):
                raise no_space(f"pool is full: {need} more bytes needed, "
                               f"{self.pool.writable - self.pool.reserved} free")
        s.reserved += need

    async def _make_room(self, exclude: int, need: int) -> bool:
        """Find `need` more bytes this node may write: lease more of a shared pool, else evict
        (a shared pool's evicted space is free once its grace period is over). False if
        nothing helps."""
        if self.shared and await self.catalog.grow(need):
            return True
        if self.evict != "lru":
            return False
        if not self.shared:
            return bool(await self._evict_one(exclude))
        if self.pool.free + self.catalog.grave_bytes < need + self.pool.reserved:
            await self._evict_cluster(exclude, need + self.pool.reserved
                                      - self.pool.free - self.catalog.grave_bytes)
        # Evicted space is free once its grace period is over, and it may lie in a region
        # another node holds until that node gives its idle regions back (within a lease
        # period): wait while the grave, or free space in others' regions, may make room.
        cc = self.catalog.cfg
        elsewhere_until = trio.current_time() + cc.lease_seconds * 1.5 + 1

        def hopeless() -> bool:
            return not self.catalog.grave and (self.pool.free - self.pool.reserved < need or
                                               trio.current_time() > elsewhere_until)
        if hopeless():
            return False
        with trio.move_on_after(max(cc.grace_seconds, cc.lease_seconds) * 1.5 + 2):
            while True:
                await self.catalog.purge()
                if self.pool.writable - self.pool.reserved >= need or \
                        await self.catalog.grow(need):
                    return True
                if hopeless():
                    return False
                await trio.sleep(0.1)
        return False

    def _evictable(self, node: Node | None, exclude: int, bid: int | None = None) -> bool:
        if node is None or node.ino == exclude or not node.linked or node.blob is None:
            return False
        if bid is not None and node.blob.id != bid:
            return False
        if node.xattrs.get(PIN_XATTR) == b"1" or self.store.is_held(node.blob.id):
            return False
        st = self.states.get(node.ino)
        return st is None or (st.opens == 0 and st.session is None)

    async def _evict(self, node: Node) -> int:
        parent, name, ino, rec = node.parent, node.name, node.ino, node.blob
        log.info("pool full: evicting %s (%d bytes)", self.catalog.path_of(node), rec.size)
        if self.shared:
            await self.catalog.remove(node, expect=rec)
        else:
            await self.catalog.remove(node)
        self._unlinked(node)
        self.stats.pool_evictions += 1
        if self.on_evict is not None:
            self.on_evict(parent, name, ino)
        return rec.layout.stored_bytes()

    async def _evict_one(self, exclude: int) -> int:
        """Delete the least recently used closed file to free pool space; its bytes, 0 if none."""
        for bid, ino in self.store.pool_victims():
            node = self.catalog.nodes.get(ino)
            if self._evictable(node, exclude, bid):
                return await self._evict(node)
        return 0

    async def _evict_cluster(self, exclude: int, nbytes: int) -> int:
        """Evict at least `nbytes` from a shared pool in the cluster's LRU order (files another
        node holds open may be among them: their space stays in the grave while they are read)."""
        freed, seen = 0, 0
        while freed < nbytes:
            batch = await self.catalog.victims(seen + 64)
            fresh = batch[seen:]
            if not fresh:
                break
            seen = len(batch)
            for ino in fresh:
                node = self.catalog.nodes.get(ino)
                if not self._evictable(node, exclude):
                    continue
                try:
                    freed += await self._evict(node)
                except KvfsError as e:
                    if e.errno not in (errno.ENOENT, errno.ESTALE):
                        raise
                    continue                    # changed by another node meanwhile
                if freed >= nbytes:
                    break
        return freed

    async def keep_free(self) -> int:
        """Shared pool: evict (cluster LRU) so that `free_target` of the pool stays free or in
        its grace period, ahead of writers. One node at a time does it."""
        target = int(self.catalog.cfg.free_target * self.pool.capacity)
        short = target - self.pool.free - self.catalog.grave_bytes
        if short <= 0 or self.evict != "lru":
            return 0
        if not await self.catalog.try_lock("cleaner", 5.0):
            return 0
        return await self._evict_cluster(0, short + target // 2)

    # --- commit --------------------------------------------------------------------------------
    async def _commit_if_dirty(self, node: Node) -> None:
        st = self.states.get(node.ino)
        if st is None or st.session is None or not st.session.dirty:
            return
        async with st.lock:
            await self._commit_locked(node, st)

    async def _commit_locked(self, node: Node, st: NodeState) -> None:
        s = st.session
        if s is None or not s.dirty:
            return
        if not node.linked:          # unlinked before its first/next commit: nothing to keep
            s.dirty = False
            self._abandon_writer(s)
            return
        size = s.buffer.size
        self.pool.unreserve(s.reserved)   # the allocation below takes its place at once
        s.reserved = 0
        while True:
            writer, s.writer = s.writer, None
            try:
                layout = await self.store.write(s.buffer, size, writer)
                break
            except KvfsError as e:
                if e.errno == errno.ENOSPC and await self._make_room(node.ino, size):
                    continue
                self.stats.commit_errors += 1
                raise
        published = node.linked        # the catalog publishes exactly when the node is linked
        try:
            rec, old = await self.catalog.commit(node, layout)
        except BaseException:
            self.pool.release(layout)
            self.stats.commit_errors += 1
            raise
        if published:
            self.pool.committed(layout)
        s.dirty = False
        s.frozen = True
        self.stats.commits += 1
        if node.linked:
            pred = self.catalog.parent_of(node.ino)
            pnode = self.catalog.nodes.get(pred) if pred is not None else None
            self.store.adopt(rec, s.buffer, node.ino, charged=s.charged,
                             parent=pnode.blob.id if pnode is not None and pnode.blob else None)
            s.charged = 0
        elif not published:
            self.pool.release(rec.layout)      # never published: nobody can read it
        # (published, then unlinked while the commit was in flight: the unlink retired it)
        if old is not None:
            self.store.retire(old)
        if node.linked and node.xattrs.get(PIN_XATTR) == b"1":
            try:                                   # a pinned file's new version stays pinned
                await self.store.pin(rec)
            except KvfsError as e:
                log.warning("%s: new version not pinned: %s", self.catalog.path_of(node), e)

    async def flush(self, fh: int) -> None:
        h = self._handle(fh)
        if h.writable:
            await self._commit_if_dirty(h.node)

    async def fsync(self, fh: int) -> None:
        await self.flush(fh)

    async def release(self, fh: int) -> None:
        h = self.handles.pop(fh, None)
        if h is None:
            return
        node = h.node
        st = self._state(node.ino)
        st.opens -= 1
        if isinstance(h.version, BlobRec):
            self.store.unhold(h.version)
            n = st.readers.get(h.version.id, 0) - 1
            if n > 0:
                st.readers[h.version.id] = n
            else:
                st.readers.pop(h.version.id, None)
        if h.writable:
            st.writers -= 1
            if st.writers == 0:
                try:
                    # mmap(MAP_SHARED) writers may write after the last flush
                    await self._commit_if_dirty(node)
                except KvfsError as e:
                    log.error("%s: commit at release failed, content dropped: %s",
                              self.catalog.path_of(node), e)
                self._end_session(st)
        self._maybe_release_state(node)

    # --- extended attributes -------------------------------------------------------------------
    @staticmethod
    def _check_xattr_name(name: bytes) -> None:
        if not name.startswith(b"user."):
            raise KvfsError(errno.ENOTSUP, f"only user.* attributes are supported, not "
                                           f"{name.decode(errors='replace')}")
        if len(name) > XATTR_NAME_MAX:
            raise KvfsError(errno.ERANGE, "attribute name too long")

    def getxattr(self, ino: int, name: bytes) -> bytes:
        node = self.catalog.get(ino)
        try:
            return node.xattrs[name]
        except KeyError:
            raise KvfsError(errno.ENODATA, f"no attribute {name.decode(errors='replace')}") from None

    def listxattr(self, ino: int) -> list[bytes]:
        return list(self.catalog.get(ino).xattrs)

    async def setxattr(self, ino: int, name: bytes, value: bytes) -> None:
        self._check_xattr_name(name)
        if len(value) > XATTR_SIZE_MAX:
            raise KvfsError(errno.E2BIG, f"attribute value larger than {XATTR_SIZE_MAX} bytes")
        await self.catalog.set_xattr(self.catalog.get(ino), name, value)

    async def removexattr(self, ino: int, name: bytes) -> None:
        await self.catalog.remove_xattr(self.catalog.get(ino), name)

    # --- leases for direct readers (kvfs.direct) -------------------------------------------------
    def lease_version(self, ino: int, generation: int, ttl: float) -> None:
        """Hold a file's committed version `generation` for a direct reader for up to `ttl`
        seconds: its extents are not reused before `release` or the lease's expiry. ESTALE if
        the file's current version is another one."""
        node = self.catalog.get(ino)
        if node.blob is None or node.blob.id != generation:
            raise KvfsError(errno.ESTALE, f"version {generation} is not the file's current one"
                                          f" ({node.blob.id if node.blob else 'none'})")
        self.store.hold(node.blob)
        self.leases.setdefault(generation, []).append((time.monotonic() + ttl, node.blob, ino))
        self.stats.leases += 1

    def end_lease(self, ino: int, generation: int, hit: bool) -> None:
        """End a lease; `hit`: the reader read the block (counted as a hit of the pool tier).
        ESTALE if no live lease was left (it expired: the extents may have been reused)."""
        held = self.leases.get(generation)
        if not held:
            self.stats.stale_releases += 1
            raise KvfsError(errno.ESTALE, f"no live lease on version {generation} (expired?)")
        _, rec, _ = held.pop(0)
        if not held:
            del self.leases[generation]
        self.store.unhold(rec)
        if hit:
            self.hits[ino] += 1
            self.stats.direct_reads += 1
            self.store.access_direct(rec)

    def expire_leases(self) -> int:
        """Drop leases past their time (their readers died or stalled)."""
        now = time.monotonic()
        n = 0
        for gen in list(self.leases):
            keep = []
            for item in self.leases[gen]:
                if item[0] < now:
                    self.store.unhold(item[1])
                    n += 1
                else:
                    keep.append(item)
            if keep:
                self.leases[gen] = keep
            else:
                del self.leases[gen]
        self.stats.expired_leases += n
        return n

    # --- pinning -------------------------------------------------------------------------------
    async def set_pin(self, ino: int, on: bool) -> None:
        """Keep a file's block in DRAM (fetched now) until unpinned; remembered across
        restarts as the attribute user.kvfs.pin."""
        node = self.catalog.get(ino)
        if not node.is_file:
            raise KvfsError(errno.EISDIR if node.is_dir else errno.EINVAL,
                            "only regular files can be pinned")
        if on:
            if node.blob is not None:
                await self.store.pin(node.blob)
            await self.catalog.set_xattr(node, PIN_XATTR, b"1")
        else:
            if node.blob is not None:
                self.store.unpin(node.blob)
            if PIN_XATTR in node.xattrs:
                await self.catalog.remove_xattr(node, PIN_XATTR)

    async def warm_pinned(self) -> int:
        """Bring the files pinned before a restart back into DRAM."""
        n = 0
        for node in list(self.catalog.files()):
            if node.xattrs.get(PIN_XATTR) == b"1" and node.blob is not None:
                try:
                    await self.store.pin(node.blob)
                    n += 1
                except KvfsError as e:
                    log.warning("%s: cannot pin again after restart: %s",
                                self.catalog.path_of(node), e)
        return n

    # --- directories ---------------------------------------------------------------------------
    def entries(self, ino: int) -> list[Node]:
        return self.catalog.entries(ino)

    def statfs(self) -> dict:
        free = max(0, self.pool.free - self.pool.reserved)
        return {
            "bsize": 4096, "frsize": 4096,
            "blocks": self.pool.capacity // 4096,
            "bfree": free // 4096, "bavail": free // 4096,
            "files": len(self.catalog.nodes),
            "ffree": 1 << 32,
            "namemax": 255,
        }

    def is_root(self, ino: int) -> bool:
        return ino == ROOT_INO
