"""FUSE operations: translate pyfuse3 requests into calls on the layers below, and nothing more.

Errors are translated once, here: a `KvfsError` becomes `FUSEError(errno)`; anything else is a
bug, logged with its traceback, and answered with EIO (pyfuse3 would otherwise stop the whole
main loop).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import time
import weakref

import pyfuse3
import trio

from kvfs.catalog.records import CONTROL_INO, ROOT_INO
from kvfs.errors import Dropped, KvfsError
from kvfs.fs.control import FH_BASE as CONTROL_FH_BASE
from kvfs.fs.control import Control
from kvfs.fs.files import PIN_XATTR, Attr, Files
from kvfs.fs.latency import Latency

log = logging.getLogger("kvfs.fuse")

CONTROL_NAME = b".kvfs-control"
PREFERRED_IO = 1 << 20  # st_blksize: buffered writers then send 1 MiB writes


# KVFS_HANDLER_CPU=1: count the trio thread's CPU time in each handler's own steps (not the
# time it waits, nor the request loop around it), reported as `cpu_us` in the statistics'
# latency of each operation (bench/block_sizes.py --handlers; docs/architecture.md, "The
# per-file budget"). It costs a clock read per step, so it is off by default.
HANDLER_CPU = os.environ.get("KVFS_HANDLER_CPU") == "1"


class _Timed:
    """Awaits a handler's coroutine, adding the thread's CPU time of each of its steps."""

    __slots__ = ("coro", "latency", "op")

    def __init__(self, coro, latency: Latency, op: str):
        self.coro, self.latency, self.op = coro, latency, op

    def __await__(self):
        return self

    def __iter__(self):
        return self

    def close(self):
        self.coro.close()

    def __next__(self):
        return self.send(None)

    def send(self, value):
        t = time.thread_time()
        try:
            return self.coro.send(value)
        finally:
            self.latency.add_cpu(self.op, time.thread_time() - t)

    def throw(self, *exc):
        t = time.thread_time()
        try:
            return self.coro.throw(*exc)
        finally:
            self.latency.add_cpu(self.op, time.thread_time() - t)


def translate(fn):
    name = fn.__name__.lstrip("_")

    @functools.wraps(fn)
    async def wrapper(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            if HANDLER_CPU:
                return await _Timed(fn(self, *args, **kwargs), self.latency, name)
            return await fn(self, *args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except KvfsError as e:
            log.debug("%s: %s", name, e)
            raise pyfuse3.FUSEError(e.errno) from None
        except OSError as e:
            log.debug("%s: %s", name, e)
            raise pyfuse3.FUSEError(e.errno or errno.EIO) from None
        except Exception:
            log.exception("%s failed", name)
            raise pyfuse3.FUSEError(errno.EIO) from None
        finally:
            self.latency.record(name, time.perf_counter() - t0)

    return wrapper


class Backings:
    """Backing ids of the memfds passthrough handles use (FUSE_DEV_IOC_BACKING_OPEN): one id
    per buffer for as long as the buffer lives, not per open. A block read again while it is
    resident in DRAM (a prefix hit) is then opened without an ioctl, and a release closes
    nothing; the id goes when its buffer dies (evicted, dropped, replaced). The kernel's
    backing keeps a reference to the buffer's file, so it is closed at once then, or the
    memory would stay taken: the buffer's finalizer (which may run in any thread, inside the
    collector) hands the id to the trio thread (`run_sync_soon`), which closes it."""

    def __init__(self) -> None:
        self.ids: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Buffer -> [id, handles]
        self.of_fh: dict[int, object] = {}  # fh -> Buffer
        self.opened = 0  # backing ids registered, for statistics
        self.closed = 0  # ... and closed (open: the difference)
        self.token: trio.lowlevel.TrioToken | None = None  # set at INIT (FuseOps.init)

    @property
    def in_use(self) -> int:
        """Backing ids that open handles use now."""
        return sum(1 for e in list(self.ids.values()) if e[1] > 0)

    def bind(self, fh: int, buf) -> int:
        entry = self.ids.get(buf)
        if entry is None:
            bid = pyfuse3.passthrough_open(buf.fd)
            entry = self.ids[buf] = [bid, 0]
            weakref.finalize(buf, self._died, bid)
            self.opened += 1
        entry[1] += 1
        self.of_fh[fh] = buf
        return entry[0]

    def release(self, fh: int) -> None:
        buf = self.of_fh.pop(fh, None)
        if buf is not None:
            self.ids[buf][1] -= 1  # (the id stays while the buffer lives)

    def _died(self, bid: int) -> None:
        """A buffer with a backing id died (its finalizer, in any thread)."""
        token = self.token
        if token is None:
            self._close(bid)
            return
        try:
            token.run_sync_soon(self._close, bid)
        except trio.RunFinishedError:  # unmounted: /dev/fuse is closed, and the ids with it
            pass

    def _close(self, bid: int) -> None:
        self.closed += 1
        try:
            pyfuse3.passthrough_close(bid)
        except OSError as e:
            log.warning("closing passthrough backing id %d failed: %s", bid, e)


def _has_noflush() -> bool:
    """Does this pyfuse3 take FileInfo(noflush=...) (mount/fuse/pyfuse3-requests.patch)?"""
    try:
        pyfuse3.FileInfo(noflush=True)
    except TypeError:
        return False
    return True


NOFLUSH = _has_noflush()  # read-only opens ask the kernel to send no FLUSH at close


def passthrough_available() -> str | None:
    """None if this pyfuse3 can do FUSE passthrough, else why not."""
    if not hasattr(pyfuse3, "passthrough_open"):
        return (
            "pyfuse3 has no passthrough API (install kvfs's patched build: make install, "
            "mount/fuse/build.sh)"
        )
    return None


class FuseOps(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False
    # lookups of one directory reach the daemon concurrently, not one at a time under the
    # directory's lock (mount/fuse/pyfuse3-parallel-dirops.patch; a stock pyfuse3 ignores it)
    enable_parallel_dirops = True
    # the kernel stops asking for security.capability before every write of a file: once per
    # inode (SB_NOSEC); kvfs keeps no set-user-ID / set-group-ID bit on files (Files.refuse_setid)
    # nor any security.* attribute, so it has nothing to clear (mount/fuse/pyfuse3-killpriv.patch)
    enable_killpriv_v2 = True
    # that one question per new file is answered ENODATA by pyfuse3's request loop itself
    user_xattrs_only = True

    def __init__(
        self,
        files: Files,
        control: Control,
        latency: Latency,
        attr_timeout: float = 1.0,
        passthrough: bool = True,
    ):
        """What a file changes behind the kernel's back the layers below tell the kernel
        themselves (`files.kernel`, kvfs/fs/kernel.py): nothing here is called from below."""
        super().__init__()
        self.files = files
        self.control = control
        self.timeout = attr_timeout
        self.latency = latency
        # non-user attributes asked for, answered in pyfuse3's request loop (user_xattrs_only)
        latency.answered_below("getxattr_nonuser", pyfuse3.foreign_xattr_replies)
        # Ask for FUSE passthrough at INIT (the patched pyfuse3 reads this); whether the kernel
        # agreed is known in init(), and `data_path` says which path serves the data, and why.
        why = (
            passthrough_available()
            if passthrough
            else "FUSE passthrough is turned off ([mount] passthrough, or KVFS_PASSTHROUGH)"
        )
        self.enable_passthrough = why is None
        self.data_path = {"passthrough": False, "why": why or "INIT not answered yet"}
        self.backings = Backings()
        self._dirs: dict[int, object] = {}  # fh -> the directory's listing
        self._dir_errors: dict[int, int] = {}  # fh -> write errors it has seen (errseq)
        self._next_dir = 1
        self.initialized = trio.Event()  # set once the kernel's INIT has been answered

    def init(self) -> None:
        # pyfuse3 calls this inside its INIT handler and replies right after it returns, so
        # a task woken by this event runs once the kernel has the connection's parameters.
        if self.enable_passthrough:
            self.backings.token = trio.lowlevel.current_trio_token()
            on = pyfuse3.passthrough_enabled()
            self.files.passthrough = on
            self.data_path = {
                "passthrough": on,
                "why": (
                    "the kernel agreed to FUSE passthrough: reads, writes and mmap of files go "
                    "between the application and kvfs's memfds without the daemon"
                    if on
                    else "the kernel did not offer FUSE passthrough (Linux >= 6.9 with "
                    "CONFIG_FUSE_PASSTHROUGH, and CAP_SYS_ADMIN, are needed)"
                ),
            }
        enabled = getattr(pyfuse3, "parallel_dirops_enabled", None)
        self.data_path["parallel_dirops"] = bool(enabled and enabled())
        self.data_path["killpriv_v2"] = pyfuse3.killpriv_v2_enabled()
        self.initialized.set()

    def _file_info(self, r) -> pyfuse3.FileInfo:
        extra = {"noflush": True} if r.noflush and NOFLUSH else {}
        if r.backing is not None:
            return pyfuse3.FileInfo(
                fh=r.fh,
                backing_id=self.backings.bind(r.fh, r.backing),
                direct_io=False,
                keep_cache=False,
                **extra,
            )
        return pyfuse3.FileInfo(fh=r.fh, direct_io=r.direct_io, keep_cache=r.keep_cache, **extra)

    # --- helpers -------------------------------------------------------------------------------
    def entry(self, a: Attr) -> pyfuse3.EntryAttributes:
        e = pyfuse3.EntryAttributes()
        e.st_ino = a.ino
        e.generation = 0
        e.entry_timeout = self.timeout
        e.attr_timeout = self.timeout
        e.st_mode = a.mode
        e.st_nlink = a.nlink
        e.st_uid = a.uid
        e.st_gid = a.gid
        e.st_rdev = 0
        e.st_size = a.size
        e.st_blksize = PREFERRED_IO
        e.st_blocks = a.blocks
        e.st_atime_ns = a.atime_ns
        e.st_mtime_ns = a.mtime_ns
        e.st_ctime_ns = a.ctime_ns
        return e

    # --- names ---------------------------------------------------------------------------------
    @translate
    async def lookup(self, parent_inode, name, ctx=None):
        if parent_inode == ROOT_INO and name == CONTROL_NAME:
            return self.entry(self.control.attr())
        try:
            return self.entry(await self.files.lookup(parent_inode, name))
        except KvfsError as e:
            if e.errno != errno.ENOENT or not self.files.misses_cacheable:
                raise
            # A negative entry: the kernel answers "no such file" itself for a while, and an
            # O_CREAT open of the name goes straight to CREATE. Every name is made through
            # this mount (one node: nothing else makes names), which updates the cache.
            miss = pyfuse3.EntryAttributes()
            miss.st_ino = 0
            miss.entry_timeout = self.timeout
            return miss

    async def forget(self, inode_list):
        for ino, n in inode_list:
            if ino != CONTROL_INO:
                self.files.forget(ino, n)

    @translate
    async def getattr(self, inode, ctx=None):
        if inode == CONTROL_INO:
            return self.entry(self.control.attr())
        return self.entry(self.files.getattr(inode))

    @translate
    async def setattr(self, inode, attr, fields, fh, ctx):
        if inode == CONTROL_INO:
            raise KvfsError(errno.EPERM, "the control file cannot be changed")
        a = await self.files.setattr(
            inode,
            fh,
            mode=attr.st_mode if fields.update_mode else None,
            uid=attr.st_uid if fields.update_uid else None,
            gid=attr.st_gid if fields.update_gid else None,
            size=attr.st_size if fields.update_size else None,
            atime_ns=attr.st_atime_ns if fields.update_atime else None,
            mtime_ns=attr.st_mtime_ns if fields.update_mtime else None,
        )
        return self.entry(a)

    @translate
    async def readlink(self, inode, ctx):
        return self.files.readlink(inode)

    @translate
    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        import stat

        if not stat.S_ISREG(mode):
            raise KvfsError(errno.EPERM, "kvfs holds regular files, directories and symlinks only")
        res, attr = await self.files.create(parent_inode, name, mode, os.O_RDONLY, ctx.uid, ctx.gid)
        await self.files.release(res.fh)
        return self.entry(attr)

    @translate
    async def mkdir(self, parent_inode, name, mode, ctx):
        return self.entry(await self.files.mkdir(parent_inode, name, mode, ctx.uid, ctx.gid))

    @translate
    async def symlink(self, parent_inode, name, target, ctx):
        return self.entry(await self.files.symlink(parent_inode, name, target, ctx.uid, ctx.gid))

    @translate
    async def unlink(self, parent_inode, name, ctx):
        self._not_control(parent_inode, name)
        await self.files.unlink(parent_inode, name)

    @translate
    async def rmdir(self, parent_inode, name, ctx):
        self._not_control(parent_inode, name)
        await self.files.rmdir(parent_inode, name)

    @translate
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        self._not_control(parent_inode_old, name_old)
        self._not_control(parent_inode_new, name_new)
        await self.files.rename(parent_inode_old, name_old, parent_inode_new, name_new, flags)

    @translate
    async def link(self, inode, new_parent_inode, new_name, ctx):
        raise KvfsError(errno.EPERM, "kvfs does not support hard links")

    @staticmethod
    def _not_control(parent: int, name: bytes) -> None:
        if parent == ROOT_INO and name == CONTROL_NAME:
            raise KvfsError(errno.EPERM, "the control file cannot be removed or renamed")

    # --- files ---------------------------------------------------------------------------------
    @translate
    async def open(self, inode, flags, ctx):
        if inode == CONTROL_INO:
            return pyfuse3.FileInfo(
                fh=self.control.open(),
                direct_io=True,
                keep_cache=False,
                **({"noflush": True} if NOFLUSH else {}),
            )
        r = await self.files.open(inode, flags, ctx.pid)
        try:
            return self._file_info(r)
        except OSError:
            await self.files.release(r.fh)
            raise

    @translate
    async def create(self, parent_inode, name, mode, flags, ctx):
        if parent_inode == ROOT_INO and name == CONTROL_NAME:
            raise KvfsError(errno.EEXIST, "the control file exists")
        r, attr = await self.files.create(
            parent_inode, name, mode, flags, ctx.uid, ctx.gid, ctx.pid
        )
        try:
            fi = self._file_info(r)
        except OSError:
            await self.files.release(r.fh)
            raise
        return fi, self.entry(attr)

    async def read(self, fh, off, size):
        # The hot path: no wrapper frame; errors are translated inline.
        t0 = time.perf_counter()
        try:
            if fh >= CONTROL_FH_BASE:
                return self.control.read(fh, off, size)
            return await self.files.read(fh, off, size)
        except KvfsError as e:
            raise pyfuse3.FUSEError(e.errno) from None
        except Exception:
            log.exception("read failed")
            raise pyfuse3.FUSEError(errno.EIO) from None
        finally:
            self.latency.record("read", time.perf_counter() - t0)

    @translate
    async def write(self, fh, off, buf):
        if self.control.owns(fh):
            raise KvfsError(errno.EBADF, "the control file takes setxattr calls, not writes")
        return await self.files.write(fh, off, buf)

    @translate
    async def flush(self, fh, ctx=None):
        # ctx (mount/fuse/pyfuse3-flush-ctx.patch): the thread that closes, which tells a
        # close from the kernel closing the files of a killed process
        if not self.control.owns(fh):
            await self._commit(self.files.flush(fh, ctx.pid if ctx is not None else None))

    @translate
    async def fsync(self, fh, datasync):
        if not self.control.owns(fh):
            await self._commit(self.files.fsync(fh))

    async def _commit(self, commit) -> None:
        """Await a flush's or fsync's commit. One that failed dropped what was written (see
        Sessions.drop): the kernel forgets the size those writes gave the inode, and the name
        of a file never committed, before the caller hears of the failure, so a stat or an
        open right after the failed close() finds the previous version or no file, never
        the cached one. The name is invalidated synchronously, in a worker thread: the kernel
        takes the directory's lock, which neither request holds (this loop goes on serving
        whoever does meanwhile). Only the entry, not as deleted (`deleted=` would take the
        file's own lock too, which the kernel holds for an fsync until it is answered: a
        deadlock); a lookup then asks, and hears there is no such file."""
        try:
            await commit
        except Dropped as e:
            self.files.kernel.new_content(e.dropped)
            if e.removed is not None:
                await trio.to_thread.run_sync(self._forget_name, *e.removed)
            raise

    @staticmethod
    def _forget_name(parent: int, name: bytes, ino: int) -> None:
        try:
            pyfuse3.invalidate_entry(parent, name)
        except OSError as e:  # the kernel may not know the entry (ENOENT): nothing to undo
            log.debug("invalidate_entry(%d, %r) failed: %s", parent, name, e)

    @translate
    async def fallocate(self, fh, mode, offset, length):
        # pyfuse3 dispatches FUSE_FALLOCATE only when built with mount/fuse/pyfuse3-fallocate.patch
        if self.control.owns(fh):
            raise KvfsError(errno.EBADF, "the control file takes setxattr calls")
        await self.files.fallocate(fh, mode, offset, length)

    @translate
    async def release(self, fh):
        if self.control.owns(fh):
            self.control.release(fh)
        else:
            try:
                await self.files.release(fh)
            finally:
                self.backings.release(fh)

    # --- directories ---------------------------------------------------------------------------
    @translate
    async def opendir(self, inode, ctx):
        listing = self.files.listing(inode)
        fh = self._next_dir
        self._next_dir += 1
        self._dirs[fh] = listing
        self._dir_errors[fh] = self.files.write_errors.sample()  # (Files.fsyncdir)
        return fh

    @translate
    async def readdir(self, fh, start_id, token):
        # entries stream from the catalog by offset (cookie): a directory of millions of
        # entries is never held in memory
        for node in self._dirs[fh].after(start_id):
            attr = self.files.attr(node)
            if not pyfuse3.readdir_reply(token, node.name, self.entry(attr), node.cookie):
                break
            self.files.counted(node)  # readdirplus: the kernel took a reference

    async def releasedir(self, fh):
        self._dirs.pop(fh, None)
        self._dir_errors.pop(fh, None)

    @translate
    async def fsyncdir(self, fh, datasync):
        # every closed file and every change to the tree durable (with durability "close"
        # they are when their call returns). The kernel sends no FUSE_SYNCFS for a /dev/fuse
        # mount (only virtiofs gets it): syncfs(2) and sync(1) reach no daemon; an fsync of
        # the mount's root directory, or `kvfs flush`, is the way to ask for all of it.
        # EIO if a file's write-back failed since this directory was opened (or unseen).
        self._dir_errors[fh] = await self.files.fsyncdir(self._dir_errors.get(fh, 0))

    @translate
    async def statfs(self, ctx):
        s = self.files.statfs()
        st = pyfuse3.StatvfsData()
        st.f_bsize = s["bsize"]
        st.f_frsize = s["frsize"]
        st.f_blocks = s["blocks"]
        st.f_bfree = s["bfree"]
        st.f_bavail = s["bavail"]
        st.f_files = s["files"]
        st.f_ffree = s["ffree"]
        st.f_favail = s["ffree"]
        st.f_namemax = s["namemax"]
        return st

    # --- extended attributes -------------------------------------------------------------------
    # (names outside user.* never reach here: user_xattrs_only; setxattr refuses them)
    @translate
    async def getxattr(self, inode, name, ctx):
        value = await self.control.getxattr(inode, name, ctx.uid, ctx.pid)
        if value is not None:
            return value
        return self.files.xattrs.getxattr(inode, name)

    @translate
    async def listxattr(self, inode, ctx):
        return self.control.listxattr(inode) + self.files.xattrs.listxattr(inode)

    @translate
    async def setxattr(self, inode, name, value, ctx):
        if await self.control.setxattr(inode, name, value, ctx.uid, ctx.pid):
            return
        await self.files.xattrs.setxattr(inode, name, value)

    @translate
    async def removexattr(self, inode, name, ctx):
        if inode == CONTROL_INO:
            raise KvfsError(errno.ENODATA, "no such attribute")
        if name == PIN_XATTR:
            await self.files.xattrs.set_pin(inode, False)
            return
        await self.files.xattrs.removexattr(inode, name)

    async def access(self, inode, mode, ctx):
        return True  # mounted with default_permissions: the kernel checks modes
