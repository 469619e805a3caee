"""kvfs.client.direct: read and write KV blocks straight between the namespaces and GPU or host
buffers.

GPUDirect Storage cannot work through a FUSE mount, and every byte through FUSE costs a kernel
round trip per MiB. kvfs's side channel is the block layout: a client asks the daemon where a
batch of blocks' stripe units are and leases those versions, so their extents are not reused
while it reads (one request for the whole batch, on the daemon's direct socket, which the
mount names: kvfs/client/channel.py), reads every unit of every block in parallel from the
namespace devices or files, and releases the leases (one more request), which also tells the
daemon the blocks were read (hits).

    import kvfs.client.direct
    with kvfs.client.direct.open("/mnt/kvfs", "/mnt/kvfs/lmcache/chunk.pt") as block:
        block.read_into(buf)              # numpy / bytearray / memoryview, or CuPy / torch CUDA
    kvfs.client.direct.read_many("/mnt/kvfs", paths, bufs)   # many blocks, all units in parallel
    kvfs.client.direct.write_many("/mnt/kvfs", paths, bufs)  # store blocks the same way

Each block of a batch succeeds or fails on its own: `return_exceptions=True` gives each
block's size (or None, writing) or its error in the batch's order; without it the first
error is raised once every block of the call is done. `Direct.inspect(paths, xattrs)` gives a
batch's sizes and user.* attributes in one request (to size the buffers first).

Host buffers are filled with O_DIRECT preads from a thread pool (straight into the buffer when
it is 4 KiB aligned, through an aligned bounce buffer otherwise). CUDA buffers are filled by
kvikio's CuFile (GPUDirect Storage where the platform has it, kvikio's compatibility mode
otherwise); `use_kvikio=True` sends host buffers through kvikio too.

Safety: a lease holds the version the daemon described, whatever happens to the file
meanwhile; releasing fails with ESTALE if the lease expired during the read (the extents may
then have been reused): the block is read again, and after `retries` attempts `StaleBlock`
is its error. Bytes of another block are never returned, and every unit read into a host
buffer is checked against its xxh3-64 checksum (EIO on a mismatch), as a read through the
mount is, whether the host path or kvikio (`use_kvikio`) read it; `verify=False` is the
explicit opt-out (it saves about one pass over the bytes). Every unit's byte count is checked
on every path (a short or failed read is EIO). CUDA buffers are not hashed (the bytes would
have to come back to the host).

Writes: the daemon places a batch of blocks' stripe units (one request), the client writes
every unit in parallel with O_DIRECT from its own buffers and computes their checksums, and
commits them (one request): the daemon makes the units durable and each block a file's new
content, as writing a temporary file, closing it and renaming it over the path would
(readers of an older version keep it; nobody sees a partial block). Space not committed
within the allocation's time is reused; a commit after that fails with ESTALE. Nothing is
copied through FUSE or into kvfs's DRAM tier.

The daemon checks every path as the mount would for this process's user (read permission to
read; write permission on the directory to write). The process also needs read access (write
access, to write) to the namespace devices or files (root, or the group that owns them).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import errno
import json
import mmap
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

import xxhash

from kvfs.client import wire
from kvfs.client.channel import Channels

PAGE = 4096
DEFAULT_TTL = 30.0
MAX_RUN = 4  # units read by one preadv at most (a run keeps the namespace busy alone)
DEADLINE_RATE = 64e6  # bytes per second a read deadline allows beyond read_timeout (the daemon's)
CHECK_MAX = 8 << 20  # bytes of a stalled read the daemon is asked to check, at most


class StaleBlock(OSError):
    """The block changed or its lease expired during every attempt to read it."""

    def __init__(self, path: str):
        super().__init__(errno.ESTALE, f"block changed while being read: {path}", path)


class ReadTimeout(OSError):
    """A read had no answer within the pool's read deadline (`read_many(abandon=True)`).
    The reads still in flight go on into the caller's buffers: the caller must not reuse
    them before `on_end` calls it back (then they are its own again)."""

    def __init__(self, path: str, pending: list):
        super().__init__(errno.ETIMEDOUT, f"no answer within the read deadline: {path}", path)
        self.pending = pending  # the call's reads (concurrent.futures.Future)

    def on_end(self, fn) -> None:
        """Call `fn()` once every read of the call has ended (at once if they have)."""
        left = [len(self.pending)]
        lock = threading.Lock()

        def one(_f) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                fn()

        if not self.pending:
            fn()
        for f in self.pending:
            f.add_done_callback(one)


@dataclass
class BlockLayout:
    path: str
    size: int
    unit: int
    generation: int
    ns: list[int]
    offsets: list[int]
    sums: list[int]
    ns_paths: list[str]
    read_timeout: float | None = None  # the pool's read deadline (None: none)
    lease: int = 0  # the lease that holds it (0: none, the layout was only looked at)

    def deadline(self) -> float | None:
        """Seconds a read of this block may take (the daemon's readers' deadline)."""
        if self.read_timeout is None:
            return None
        return self.read_timeout + self.size / DEADLINE_RATE

    def unit_length(self, k: int) -> int:
        return max(0, min(self.unit, self.size - k * self.unit))


def _is_cuda(buf: Any) -> bool:
    return hasattr(buf, "__cuda_array_interface__")


def _host_view(buf: Any, writable: bool = True) -> memoryview:
    """A flat byte view of a host buffer (numpy array, bytearray, mmap, memoryview, or anything
    with the buffer protocol, such as a CPU torch tensor's storage); writable unless asked."""
    if hasattr(buf, "__array_interface__") and not isinstance(buf, (bytearray, memoryview)):
        import numpy as np

        arr = np.asarray(buf)
        if not arr.flags.c_contiguous:
            raise ValueError("kvfs.client.direct: the buffer must be contiguous")
        return memoryview(arr.reshape(-1).view(np.uint8))
    mv = memoryview(buf)
    if mv.readonly and writable:
        raise ValueError("kvfs.client.direct: the buffer is read-only")
    if not mv.c_contiguous:
        raise ValueError("kvfs.client.direct: the buffer must be contiguous")
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


def _address(mv: memoryview) -> int:
    """The address of a byte view's first byte (read-only views too)."""
    if not mv.readonly:
        return ctypes.addressof(ctypes.c_char.from_buffer(mv))
    import numpy as np

    return np.frombuffer(mv, dtype=np.uint8).__array_interface__["data"][0]


def _whole(io, fd: int, view: memoryview, off: int, what: str, ns: int) -> None:
    """All of `view` at `off` in one call or more of `io` (os.preadv, os.pwritev), each going on
    where a short one stopped; one that moves nothing is EIO ("`what` `ns` at <offset>")."""
    done = 0
    while done < len(view):
        n = io(fd, [view[done:]], off + done)
        if n <= 0:
            raise OSError(errno.EIO, f"{what} {ns} at {off + done}")
        done += n


def _check_sum(lay: BlockLayout, k: int, data: Any) -> None:
    """EIO unless unit k's bytes, as read, have the xxh3-64 the block committed."""
    if xxhash.xxh3_64_intdigest(data) != lay.sums[k]:
        raise OSError(errno.EIO, f"checksum mismatch in unit {k} of {lay.path}")


def _same_length(replies: list, asked: list) -> None:
    """A reply answers every block asked about (EPROTO otherwise: not kvfs's daemon)."""
    if len(replies) != len(asked):
        raise OSError(
            errno.EPROTO, f"the daemon answered {len(replies)} blocks of {len(asked)} asked"
        )


def _umask() -> int:
    """The process's umask (as the kernel applies it to a file created through the mount)."""
    fd = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
    try:
        status = os.read(fd, 1 << 16)
    finally:
        os.close(fd)
    for line in status.splitlines():
        if line.startswith(b"Umask:"):
            return int(line.split()[1], 8)
    raise OSError(errno.ENOTSUP, "no Umask in /proc/self/status (Linux 4.7 or later)")


class Direct:
    """Direct reads and writes for one kvfs mount. Thread-safe; keep one per process and
    mount."""

    def __init__(
        self,
        mountpoint: str,
        *,
        threads: int = 16,
        verify: bool = True,
        use_kvikio: bool | None = None,
        ttl: float = DEFAULT_TTL,
        retries: int = 3,
    ):
        self.mountpoint = os.path.abspath(mountpoint)
        self.verify = verify
        self.use_kvikio = use_kvikio
        self.ttl = ttl
        self.retries = retries
        self._pool = concurrent.futures.ThreadPoolExecutor(
            threads, thread_name_prefix="kvfs-direct"
        )
        self._fds: dict[tuple[str, bool], int] = {}
        self._cufiles: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        self._daemon = Channels(self.mountpoint)
        # the mount's path as written and as it really is: paths under either are sent as
        # they are (the daemon resolves them), others are resolved here first
        self._prefixes = {
            os.fsencode(p).rstrip(b"/") + b"/"
            for p in (self.mountpoint, os.path.realpath(self.mountpoint))
        }

    # --- metadata ------------------------------------------------------------------------------
    def layout(self, path: str) -> BlockLayout:
        """The file's current layout, as the mount shows it (`user.kvfs.layout`): not leased."""
        try:
            raw = json.loads(os.getxattr(path, "user.kvfs.layout"))
        except OSError as e:
            if e.errno in (errno.ENODATA, errno.ENOTSUP):
                raise OSError(e.errno, f"not a file on a kvfs mount: {path}", path) from None
            raise
        if not raw:
            raise OSError(errno.EAGAIN, f"{path} has no committed content yet", path)
        umap = raw["unit_map"]
        return BlockLayout(
            path,
            raw["size"],
            raw["stripe_unit"],
            raw["generation"],
            [u[0] for u in umap],
            [u[1] for u in umap],
            raw["sums"],
            raw["namespace_paths"],
            raw.get("read_timeout"),
        )

    def _relative(self, path: str) -> bytes:
        """`path` from the mount's root, for the daemon: a path under the mountpoint as it is
        written (the daemon resolves `..` and symbolic links in the mount as the kernel
        would), one elsewhere (a link into the mount) resolved here first. EXDEV if it is not
        in the mount."""
        p = os.fsencode(path)
        if not p.startswith(b"/"):
            p = os.fsencode(os.getcwd()) + b"/" + p
        for prefix in self._prefixes:
            if p.startswith(prefix) and len(p) > len(prefix):
                return p[len(prefix) :]
        real = os.fsencode(os.path.realpath(p))
        for prefix in self._prefixes:
            if real.startswith(prefix) and len(real) > len(prefix):
                return real[len(prefix) :]
        raise OSError(errno.EXDEV, f"not in the kvfs mount at {self.mountpoint}", path)

    def _sendable(self, paths: Sequence[str]) -> tuple[list, list[int], list[bytes]]:
        """(each path's error so far, or None; the indices of those to send; their paths
        for the daemon)."""
        out: list = [None] * len(paths)
        todo: list[int] = []
        rels: list[bytes] = []
        for i, path in enumerate(paths):
            try:
                rels.append(self._relative(path))
                todo.append(i)
            except OSError as e:
                out[i] = e
        return out, todo, rels

    def inspect(self, paths: Sequence[str], xattrs: Sequence[str] = ()) -> list:
        """Each file's size and those of its user.* attributes named in `xattrs` that it has
        (`wire.FileInfo`: .size, .xattrs), or its error (OSError), as stat and getxattr
        through the mount would give them: for a batch, one request to the daemon instead of
        a FUSE request or two per file (what a reader may need to size the batch's
        buffers)."""
        out, todo, rels = self._sendable(paths)
        for at in range(0, len(todo), wire.MAX_BATCH):
            part = todo[at : at + wire.MAX_BATCH]
            got = self._daemon.call(
                wire.Inspect(rels[at : at + wire.MAX_BATCH], list(xattrs)), wire.Inspected
            ).files
            _same_length(got, part)
            for i, info in zip(part, got):
                isbad = isinstance(info, wire.Failure)
                out[i] = OSError(info.errno, info.message, paths[i]) if isbad else info
        return out

    def _lease(self, paths: Sequence[str]) -> list[BlockLayout | OSError]:
        """Lease the files' current versions: each one's layout, or its error. One request per
        wire.MAX_BATCH files."""
        out, todo, rels = self._sendable(paths)
        for at in range(0, len(todo), wire.MAX_BATCH):
            part = todo[at : at + wire.MAX_BATCH]
            got = self._daemon.call(
                wire.Lease(rels[at : at + wire.MAX_BATCH], float(self.ttl)), wire.Leased
            ).blocks
            _same_length(got, part)
            ch = self._daemon.get()  # (the connection that answered)
            welcome = ch.welcome
            ns_paths = self._daemon.paths_for(ch, got)
            for i, block in zip(part, got):
                if isinstance(block, wire.Failure):
                    out[i] = OSError(block.errno, block.message, paths[i])
                else:
                    out[i] = BlockLayout(
                        paths[i],
                        block.size,
                        block.unit,
                        block.generation,
                        block.ns,
                        block.offsets,
                        block.sums,
                        ns_paths,
                        welcome.read_timeout,
                        block.lease,
                    )
        return out

    def _release(self, lays: dict[int, BlockLayout], read: set[int]) -> set[int]:
        """End the leases of `lays` (block index -> layout; those in `read` were read: hits);
        the indices of those whose lease was not live any more (ESTALE: the bytes read may
        come from reused extents)."""
        stale: set[int] = set()
        items = list(lays.items())
        for at in range(0, len(items), wire.MAX_BATCH):
            part = items[at : at + wire.MAX_BATCH]
            done = self._daemon.call(
                wire.Release([lay.lease for _, lay in part], [i in read for i, _ in part]),
                wire.Results,
            ).results
            _same_length(done, part)
            stale.update(i for (i, _), r in zip(part, done) if r is not None)
        return stale

    # --- reading units -------------------------------------------------------------------------
    def _fd(self, path: str, write: bool = False) -> int:
        """A cached O_DIRECT descriptor of a namespace (buffered where O_DIRECT is refused)."""
        key = (path, write)
        fd = self._fds.get(key)
        if fd is None:
            with self._lock:
                fd = self._fds.get(key)
                if fd is None:
                    mode = (os.O_RDWR if write else os.O_RDONLY) | os.O_CLOEXEC
                    try:
                        fd = os.open(path, mode | os.O_DIRECT)
                    except OSError as e:
                        if e.errno != errno.EINVAL:
                            raise
                        fd = os.open(path, mode)
                    self._fds[key] = fd
        return fd

    def _bounce(self, n: int) -> mmap.mmap:
        b = getattr(self._local, "bounce", None)
        if b is None or len(b) < n:
            b = self._local.bounce = mmap.mmap(-1, max(n, 1 << 20))
        return b

    def _read_unit_host(self, lay: BlockLayout, k: int, dest: memoryview, verify: bool) -> None:
        length = lay.unit_length(k)
        stored = (length + PAGE - 1) // PAGE * PAGE
        fd = self._fd(lay.ns_paths[lay.ns[k]])
        off = lay.offsets[k]
        target = dest[k * lay.unit : k * lay.unit + length]
        # O_DIRECT straight into the caller's buffer when it is aligned, else via a bounce buffer
        straight = stored == length and _address(target) % PAGE == 0
        view = target if straight else memoryview(self._bounce(stored))[:stored]
        _whole(os.preadv, fd, view, off, "short read of namespace", lay.ns[k])
        if not straight:
            target[:] = view[:length]
        if verify:
            _check_sum(lay, k, target)

    def _runs(self, lay: BlockLayout, dest: memoryview) -> list[list[int]]:
        """Units grouped into runs that one preadv can read: same namespace, back to back on
        it, full units, going straight into an aligned buffer. Other units are runs of one."""
        runs: list[list[int]] = []
        last: dict[int, list[int]] = {}
        aligned = len(lay.ns) > 1 and _address(dest) % PAGE == 0 and lay.unit % PAGE == 0
        for k in range(len(lay.ns)):
            j = lay.ns[k]
            run = last.get(j)
            full = lay.unit_length(k) == lay.unit
            if (
                aligned
                and full
                and run is not None
                and lay.offsets[run[-1]] + lay.unit == lay.offsets[k]
                and len(run) < MAX_RUN
            ):
                run.append(k)
                continue
            run = [k]
            runs.append(run)
            last[j] = run if aligned and full else None
        return runs

    def _read_run(self, lay: BlockLayout, run: list[int], dest: memoryview, verify: bool) -> None:
        if len(run) == 1:
            return self._read_unit_host(lay, run[0], dest, verify)
        fd = self._fd(lay.ns_paths[lay.ns[run[0]]])
        views = [dest[k * lay.unit : (k + 1) * lay.unit] for k in run]
        total = lay.unit * len(run)
        got = os.preadv(fd, views, lay.offsets[run[0]])
        if got != total:  # short: finish unit by unit
            for k in run:
                self._read_unit_host(lay, k, dest, False)
        if verify:
            for k, v in zip(run, views):
                _check_sum(lay, k, v)

    def _kvikio_file(self, path: str):
        f = self._cufiles.get(path)
        if f is None:
            import kvikio

            with self._lock:
                f = self._cufiles.get(path)
                if f is None:
                    f = self._cufiles[path] = kvikio.CuFile(path, "r")
        return f

    def _reads_kvikio(self, lay: BlockLayout, dest: Any) -> list:
        """Issue every unit of a block to kvikio; returns (unit, length, destination, future)
        for each, for `_kvikio_done` to check."""
        reads = []
        for k in range(len(lay.ns)):
            length = lay.unit_length(k)
            f = self._kvikio_file(lay.ns_paths[lay.ns[k]])
            part = dest[k * lay.unit : k * lay.unit + length]
            reads.append((k, length, part, f.pread(part, length, lay.offsets[k])))
        return reads

    @staticmethod
    def _kvikio_done(lay: BlockLayout, read: tuple, verify: bool, host: bool) -> None:
        """Wait for one unit kvikio reads; a failed or short read is EIO, and in host memory a
        unit whose xxh3-64 is not the one committed is too (device memory is not hashed)."""
        k, length, part, future = read
        try:
            got = future.get()
        except RuntimeError as e:  # kvikio's errors (a read past the end: "EOF")
            raise OSError(
                errno.EIO,
                f"kvikio could not read unit {k} of {lay.path}: {str(e).strip().splitlines()[-1]}",
            ) from None
        if got != length:
            raise OSError(
                errno.EIO, f"short read of unit {k} of {lay.path}: {got} of {length} bytes"
            )
        if verify and host:
            _check_sum(lay, k, part)

    @staticmethod
    def _flat_cuda(buf: Any):
        """A flat uint8 view of a CUDA array (CuPy or torch)."""
        if (
            hasattr(buf, "view")
            and hasattr(buf, "reshape")
            and type(buf).__module__.startswith("torch")
        ):
            import torch

            return buf.reshape(-1).view(torch.uint8)
        import cupy

        return cupy.asarray(buf).reshape(-1).view(cupy.uint8)

    # --- the API -------------------------------------------------------------------------------
    def _stalled(self, lay: BlockLayout, run: list[int]) -> None:
        """Tell the daemon a run's read had no answer in time (`wire.Stalled`): it reads the
        same bytes itself, and fails the namespace for reads if they are late there too, so
        other readers get their miss at once."""
        stored = sum((lay.unit_length(k) + PAGE - 1) // PAGE * PAGE for k in run)
        req = wire.Stalled(lay.lease, lay.ns[run[0]], lay.offsets[run[0]], min(stored, CHECK_MAX))
        try:
            self._daemon.call(req, wire.Results)
        except OSError:
            pass  # (the lease ended meanwhile, the daemon is gone: the reader has its answer)

    def _host_result(self, f, lay: BlockLayout, run: list[int], t0: float, abandon: bool):
        """A host read's result, within the block's read deadline from `t0`; past it, the
        daemon is told, and the read waited for unless `abandon` (then ReadTimeout)."""
        limit = lay.deadline()
        if limit is None:
            return f.result()
        try:
            return f.result(timeout=max(0.0, t0 + limit - time.monotonic()))
        except concurrent.futures.TimeoutError:
            pass
        self._stalled(lay, run)
        if not abandon:
            return f.result()  # (the buffer is the caller's: a late read would land there)
        raise ReadTimeout(lay.path, [])

    def _issue(self, lay: BlockLayout, buf: Any, verify: bool) -> tuple[str, list]:
        """Start reading every unit of a leased block into `buf`: (how, its reads) — "host"
        (the thread pool's futures, each with its run of units), "kvikio-host" or
        "kvikio-device" (kvikio's)."""
        nbytes = buf.nbytes if hasattr(buf, "nbytes") else memoryview(buf).nbytes
        if nbytes < lay.size:
            raise ValueError(
                f"kvfs.client.direct: buffer of {nbytes} bytes is smaller than "
                f"{lay.path} ({lay.size} bytes)"
            )
        if _is_cuda(buf):
            return "kvikio-device", self._reads_kvikio(lay, self._flat_cuda(buf))
        if self.use_kvikio:
            dest = __import__("numpy").frombuffer(_host_view(buf), dtype="uint8")
            return "kvikio-host", self._reads_kvikio(lay, dest)
        dest = _host_view(buf)
        return "host", [
            (self._pool.submit(self._read_run, lay, run, dest, verify), run)
            for run in self._runs(lay, dest)
        ]

    def _wait(
        self, kind: str, reads: list, lay: BlockLayout, verify: bool, t0: float, abandon: bool
    ) -> None:
        """Wait for every read of a block (each ends before the lease's release, even after
        one failed); raise the first one's error."""
        first: OSError | None = None
        for f in reads:
            try:
                if kind == "host":
                    self._host_result(f[0], lay, f[1], t0, abandon)
                else:
                    self._kvikio_done(lay, f, verify, kind == "kvikio-host")
            except ReadTimeout:
                raise
            except OSError as e:
                first = first or e
        if first is not None:
            raise first

    def read_many(
        self,
        paths: Sequence[str],
        bufs: Sequence[Any],
        verify: bool | None = None,
        *,
        abandon: bool = False,
        return_exceptions: bool = False,
    ) -> list:
        """Read many blocks, every stripe unit of all of them in parallel; returns their sizes.
        The daemon is asked twice for the whole batch (leases and layouts; releases), not per
        block. Each block succeeds or fails on its own: with `return_exceptions` the list
        holds each block's size or its error (OSError; ValueError for a buffer smaller than
        the block); without, the first error is raised once every block is done.

        A host read with no answer within the pool's read deadline (`[pool] read_timeout_ms`,
        plus the block's bytes at 64 MB/s) is reported to the daemon, which checks that
        namespace and fails it for reads if it is late for it too (then its blocks are no
        longer leased: ENOENT, a miss, at once). The read itself is waited for, since it
        lands in the caller's buffer, unless `abandon`: then ReadTimeout is raised at the
        deadline, and the caller keeps every buffer of the call until `ReadTimeout.on_end`."""
        if len(paths) != len(bufs):
            raise ValueError("kvfs.client.direct.read_many: as many buffers as paths")
        verify = self.verify if verify is None else verify
        results: list = [None] * len(paths)
        pending = list(range(len(paths)))
        for _ in range(self.retries):
            lays: dict[int, BlockLayout] = {}
            for i, got in zip(pending, self._lease([paths[i] for i in pending])):
                if isinstance(got, BlockLayout):
                    lays[i] = got
                else:
                    results[i] = got
            read: set[int] = set()
            failed: dict[int, Exception] = {}  # a unit that failed its checksum (or its read)
            t0 = time.monotonic()
            try:
                jobs = []
                for i, lay in lays.items():
                    try:
                        jobs.append((*self._issue(lay, bufs[i], verify), i))
                    except ValueError as e:  # (a buffer too small for this block)
                        failed[i] = e
                for kind, futures, i in jobs:
                    try:
                        self._wait(kind, futures, lays[i], verify, t0, abandon)
                    except ReadTimeout as e:  # (abandon): the caller's answer, now
                        e.pending = [x[0] for k2, fs, _ in jobs if k2 == "host" for x in fs]
                        raise
                    except OSError as e:
                        failed[i] = e
                        continue
                    read.add(i)
            finally:
                stale = self._release(lays, read)
            for i, lay in lays.items():
                if i not in stale:  # the lease held: these are the block's bytes (or errors)
                    results[i] = failed.get(i, lay.size)
            # a lease that expired during the read: the extents may have been reused (a
            # checksum mismatch is then expected), so the block is read again
            pending = sorted(stale)
            if not pending:
                break
        for i in pending:
            results[i] = StaleBlock(paths[i])
        if not return_exceptions:
            first = next((r for r in results if isinstance(r, Exception)), None)
            if first is not None:
                raise first
        return results

    def read_into(self, path: str, buf: Any, verify: bool | None = None) -> int:
        """Read one block into `buf`; returns its size."""
        return self.read_many([path], [buf], verify)[0]

    # --- writing -------------------------------------------------------------------------------
    def _write_unit(
        self,
        at: wire.Placement,
        ns_paths: list[str],
        k: int,
        src: memoryview,
        deadline: float,
    ) -> int:
        """Write unit k of a block from `src` where the daemon placed it; return the xxh3-64
        of its content."""
        unit, size = at.unit, src.nbytes
        length = max(0, min(unit, size - k * unit))
        stored = (length + PAGE - 1) // PAGE * PAGE
        ns, off = at.ns[k], at.offsets[k]
        content = src[k * unit : k * unit + length]
        digest = xxhash.xxh3_64_intdigest(content)
        straight = stored == length and _address(content) % PAGE == 0 if length else False
        if straight:
            view = content
        else:
            view = memoryview(self._bounce(stored))[:stored]
            view[:length] = content
            view[length:] = bytes(stored - length)
        if time.monotonic() > deadline:  # the space may be another writer's by now
            raise OSError(errno.ESTALE, f"allocation {at.alloc} ran out before unit {k}")
        fd = self._fd(ns_paths[ns], write=True)
        _whole(os.pwritev, fd, view, off, "short write to namespace", ns)
        return digest

    def write_many(
        self,
        paths: Sequence[str],
        bufs: Sequence[Any],
        *,
        mode: int = 0o644,
        xattrs: Sequence[dict] | None = None,
        return_exceptions: bool = False,
    ) -> list:
        """Store many blocks, every stripe unit of all of them written in parallel: each
        becomes the file `paths[i]` (created, or replacing what is there: its readers keep
        it, and nobody sees a partial block), with `mode` (less the process's umask) and
        `xattrs[i]` (user.* attributes). The daemon is asked twice for the whole batch
        (placements; commits), not per block. Each block succeeds or fails on its own: with
        `return_exceptions` the list holds None for each block stored or its error; without,
        the first error is raised once every block is done."""
        if len(paths) != len(bufs):
            raise ValueError("kvfs.client.direct.write_many: as many buffers as paths")
        srcs = [_host_view(buf, writable=False) for buf in bufs]
        mode &= ~_umask()
        results, todo, rels = self._sendable(paths)
        targets = [
            wire.Target(
                rel,
                srcs[i].nbytes,
                mode,
                {k: bytes(v) for k, v in xattrs[i].items()} if xattrs and xattrs[i] else {},
            )
            for i, rel in zip(todo, rels)
        ]
        jobs = []  # (block, its placement, its units' writes)
        for at in range(0, len(todo), wire.MAX_BATCH):
            part = todo[at : at + wire.MAX_BATCH]
            placed = self._daemon.call(
                wire.Alloc(targets[at : at + wire.MAX_BATCH], float(self.ttl)), wire.Allocated
            ).blocks
            _same_length(placed, part)
            ns_paths = self._daemon.paths_for(self._daemon.get(), placed)
            for i, pl in zip(part, placed):
                if isinstance(pl, wire.Failure):
                    results[i] = OSError(pl.errno, pl.message, paths[i])
                    continue
                deadline = time.monotonic() + 0.8 * pl.expires_in
                writes = [
                    self._pool.submit(self._write_unit, pl, ns_paths, k, srcs[i], deadline)
                    for k in range(len(pl.ns))
                ]
                jobs.append((i, pl, writes))
        done = []  # (block, its allocation, its units' checksums)
        for i, pl, writes in jobs:
            sums, err = [], None
            for f in writes:  # (every write ends before the call does, even after a failure)
                try:
                    sums.append(f.result())
                except OSError as e:
                    err = err or e
            if err is None:
                done.append((i, pl.alloc, sums))
            else:
                results[i] = err  # (its allocation is left to expire: nothing refers to it)
        for at in range(0, len(done), wire.MAX_BATCH):
            part = done[at : at + wire.MAX_BATCH]
            got = self._daemon.call(
                wire.Commit([a for _, a, _ in part], [x for _, _, x in part]), wire.Results
            ).results
            _same_length(got, part)
            for (i, _, _), r in zip(part, got):
                if r is not None:
                    results[i] = OSError(r.errno, r.message, paths[i])
        if not return_exceptions:
            first = next((r for r in results if isinstance(r, Exception)), None)
            if first is not None:
                raise first
        return results

    def write(self, path: str, buf: Any, *, mode: int = 0o644, xattrs: dict | None = None) -> None:
        """Store one block as the file `path` (created or replaced)."""
        self.write_many([path], [buf], mode=mode, xattrs=[xattrs] if xattrs else None)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._daemon.close()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        for f in self._cufiles.values():
            f.close()
        self._cufiles.clear()

    def __enter__(self) -> "Direct":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Block:
    """One block opened for direct reading (see `open`)."""

    def __init__(self, direct: Direct, path: str, owned: bool):
        self.direct = direct
        self.path = path
        self._owned = owned
        self.layout = direct.layout(path)

    @property
    def size(self) -> int:
        return self.layout.size

    def read_into(self, buf: Any, verify: bool | None = None) -> int:
        return self.direct.read_into(self.path, buf, verify)

    def close(self) -> None:
        if self._owned:
            self.direct.close()

    def __enter__(self) -> "Block":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open(mountpoint: str, path: str, **kwargs) -> Block:  # noqa: A001 - the module's verb
    """Open one block for direct reading:
    `with kvfs.client.direct.open(mnt, path) as b: b.read_into(buf)`."""
    return Block(Direct(mountpoint, **kwargs), path, owned=True)


def read_many(mountpoint: str, paths: Sequence[str], bufs: Sequence[Any], **kwargs) -> list[int]:
    with Direct(mountpoint, **kwargs) as d:
        return d.read_many(paths, bufs)


def write_many(mountpoint: str, paths: Sequence[str], bufs: Sequence[Any], **kwargs) -> None:
    with Direct(mountpoint, **kwargs) as d:
        d.write_many(paths, bufs)
