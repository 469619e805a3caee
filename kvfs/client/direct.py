"""kvfs.client.direct: read and write KV blocks straight between the namespaces and GPU or host
buffers.

GPUDirect Storage cannot work through a FUSE mount, and every byte through FUSE costs a kernel
round trip per MiB. kvfs's side channel is the block layout it already exposes: a client asks
the daemon (through the mount) where a block's stripe units are, leases that version so its
extents are not reused while it reads, reads every unit in parallel from the namespace devices
or files, and releases the lease, which also tells the daemon the block was read (a hit).

    import kvfs.client.direct
    with kvfs.client.direct.open("/mnt/kvfs", "/mnt/kvfs/lmcache/chunk.pt") as block:
        block.read_into(buf)              # numpy / bytearray / memoryview, or CuPy / torch CUDA
    kvfs.client.direct.read_many("/mnt/kvfs", paths, bufs)   # many blocks, all units in parallel
    kvfs.client.direct.write_many("/mnt/kvfs", paths, bufs)  # store blocks the same way

Host buffers are filled with O_DIRECT preads from a thread pool (straight into the buffer when
it is 4 KiB aligned, through an aligned bounce buffer otherwise). CUDA buffers are filled by
kvikio's CuFile (GPUDirect Storage where the platform has it, kvikio's compatibility mode
otherwise); `use_kvikio=True` sends host buffers through kvikio too.

Safety: the lease is tied to the block's generation. Leasing fails with ESTALE if the file
has a newer version (the client then re-reads the layout); releasing fails with ESTALE if the
lease expired meanwhile, since the extents may then have been reused: the read is retried, and
after `retries` attempts `StaleBlock` is raised. Bytes of another block are never returned,
and every unit read into a host buffer is checked against its xxh3-64 checksum (EIO on a
mismatch), as a read through the mount is, whether the host path or kvikio (`use_kvikio`)
read it; `verify=False` is the explicit opt-out (it saves about one pass over the bytes).
Every unit's byte count is checked on every path (a short or failed read is EIO). CUDA
buffers are not hashed (the bytes would have to come back to the host).

Writes: the file is opened for writing through the mount, the daemon places the block's stripe
units (`user.kvfs.alloc`), the client writes every unit in parallel with O_DIRECT from its own
buffer and computes their checksums, and commits (`user.kvfs.commit`): the daemon makes the
units durable and switches the file to the new version in one catalog transaction, atomically as
close() does. Space not committed within the allocation's time is reused; a commit after that
fails with ESTALE. Nothing is copied through FUSE or into kvfs's DRAM tier. (Readers that open
the file before the writer closes it see what was written through the mount: nothing.)

The process needs read access (write access, to write) to the namespace devices or files
(root, or the group that owns them).
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


class Direct:
    """Direct reads for one kvfs mount. Thread-safe; keep one per process and mount."""

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
        self._layouts: dict[str, BlockLayout] = {}  # last layout seen per path

    # --- metadata through the mount ------------------------------------------------------------
    def layout(self, path: str) -> BlockLayout:
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

    def _lease(self, lay: BlockLayout) -> None:
        os.setxattr(
            lay.path,
            "user.kvfs.lease",
            json.dumps({"generation": lay.generation, "ttl": self.ttl}).encode(),
        )

    def _release(self, lay: BlockLayout, hit: bool) -> bool:
        """True if the lease was still valid (the bytes read are the block's)."""
        try:
            os.setxattr(
                lay.path,
                "user.kvfs.release",
                json.dumps({"generation": lay.generation, "hit": hit}).encode(),
            )
            return True
        except OSError as e:
            if e.errno == errno.ESTALE:
                return False
            raise

    def _leased_layout(self, path: str) -> BlockLayout:
        """The current layout, leased. A layout seen before is tried first (a version's layout
        never changes, and the lease says whether it is still the current version); ESTALE on
        lease means the file changed: look again."""
        lay = self._layouts.get(path)
        for _ in range(self.retries * 3):
            if lay is None:
                lay = self.layout(path)
            try:
                self._lease(lay)
                self._layouts[path] = lay
                if len(self._layouts) > 65536:
                    self._layouts.clear()
                return lay
            except OSError as e:
                if e.errno != errno.ESTALE:
                    raise
                self._layouts.pop(path, None)
                lay = None
        raise StaleBlock(path)

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
        """Tell the daemon a run's read had no answer in time (`user.kvfs.stalled`): it reads
        the same bytes itself, and fails the namespace for reads if they are late there too,
        so other readers get their miss at once."""
        stored = sum((lay.unit_length(k) + PAGE - 1) // PAGE * PAGE for k in run)
        arg = {
            "namespace": lay.ns[run[0]],
            "offset": lay.offsets[run[0]],
            "length": min(stored, CHECK_MAX),
        }
        try:
            os.setxattr(lay.path, "user.kvfs.stalled", json.dumps(arg).encode())
        except OSError:
            pass  # (gone meanwhile, or an older daemon: the reader still has its answer)

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
    ) -> list[int]:
        """Read many blocks, every stripe unit of all of them in parallel; returns their sizes.

        A host read with no answer within the pool's read deadline (`[pool] read_timeout_ms`,
        plus the block's bytes at 64 MB/s) is reported to the daemon, which checks that
        namespace and fails it for reads if it is late for it too (then its blocks are no
        longer leased: ENOENT, a miss, at once). The read itself is waited for, since it
        lands in the caller's buffer, unless `abandon`: then ReadTimeout is raised at the
        deadline, and the caller keeps every buffer of the call until `ReadTimeout.on_end`."""
        if len(paths) != len(bufs):
            raise ValueError("kvfs.client.direct.read_many: as many buffers as paths")
        verify = self.verify if verify is None else verify
        pending = list(range(len(paths)))
        sizes = [0] * len(paths)
        for _ in range(self.retries):
            lays = {}
            read: set[int] = set()
            failed: dict[int, OSError] = {}  # a unit that failed its checksum (or its read)
            t0 = time.monotonic()
            try:
                for i in pending:
                    lays[i] = self._leased_layout(paths[i])
                jobs = [(*self._issue(lays[i], bufs[i], verify), i) for i in lays]
                for kind, futures, i in jobs:
                    try:
                        self._wait(kind, futures, lays[i], verify, t0, abandon)
                    except ReadTimeout as e:  # (abandon): the caller's answer, now
                        e.pending = [x[0] for k2, fs, _ in jobs if k2 == "host" for x in fs]
                        raise
                    except OSError as e:
                        failed[i] = e
                        continue
                    sizes[i] = lays[i].size
                    read.add(i)
            finally:
                stale = [i for i, lay in lays.items() if not self._release(lay, hit=i in read)]
            for i, e in failed.items():
                if i not in stale:
                    raise e  # the lease held: the block's bytes on the device are bad
                # else its lease expired during the read: the extents may have been reused
                # (a checksum mismatch is then expected), so it is read again
            pending = stale
            if not pending:
                return sizes
        raise StaleBlock(paths[pending[0]])

    def read_into(self, path: str, buf: Any, verify: bool | None = None) -> int:
        """Read one block into `buf`; returns its size."""
        return self.read_many([path], [buf], verify)[0]

    # --- writing -------------------------------------------------------------------------------
    def _write_unit(self, alloc: dict, k: int, src: memoryview, deadline: float) -> int:
        """Write unit k of a block from `src`; return the xxh3-64 of its content."""
        unit, size = alloc["stripe_unit"], alloc["size"]
        length = max(0, min(unit, size - k * unit))
        stored = (length + PAGE - 1) // PAGE * PAGE
        ns, off = alloc["unit_map"][k]
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
            raise OSError(errno.ESTALE, f"allocation {alloc['alloc']} ran out before unit {k}")
        fd = self._fd(alloc["namespace_paths"][ns], write=True)
        _whole(os.pwritev, fd, view, off, "short write to namespace", ns)
        return digest

    def write_many(
        self,
        paths: Sequence[str],
        bufs: Sequence[Any],
        *,
        mode: int = 0o644,
        xattrs: Sequence[dict] | None = None,
    ) -> None:
        """Store many blocks, every stripe unit of all of them written in parallel. Each goes
        to a temporary name in its directory, is committed there and renamed over `paths[i]`
        (so readers of an older version keep it, and nobody sees a partial block);
        `xattrs[i]` are attributes to give file i."""
        if len(paths) != len(bufs):
            raise ValueError("kvfs.client.direct.write_many: as many buffers as paths")
        fds: list[int] = []
        tmps: list[str] = []
        try:
            jobs = []
            for i, (path, buf) in enumerate(zip(paths, bufs)):
                src = _host_view(buf, writable=False)
                tmp = f"{path}.kvfs-direct-{os.getpid()}-{threading.get_ident()}-{i}"
                fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, mode)
                fds.append(fd)
                tmps.append(tmp)
                for name, value in (xattrs[i] if xattrs else {}).items():
                    os.setxattr(fd, name, value)
                os.setxattr(
                    fd,
                    "user.kvfs.alloc",
                    json.dumps({"size": src.nbytes, "ttl": self.ttl}).encode(),
                )
                alloc = json.loads(os.getxattr(fd, "user.kvfs.alloc"))
                deadline = time.monotonic() + 0.8 * alloc["expires_in"]
                jobs.append(
                    (
                        fd,
                        alloc,
                        [
                            self._pool.submit(self._write_unit, alloc, k, src, deadline)
                            for k in range(len(alloc["unit_map"]))
                        ],
                    )
                )
            for fd, alloc, futures in jobs:
                sums = [f.result() for f in futures]
                os.setxattr(
                    fd,
                    "user.kvfs.commit",
                    json.dumps({"alloc": alloc["alloc"], "sums": sums}).encode(),
                )
            for fd in fds:
                os.close(fd)
            fds.clear()
            for tmp, path in zip(tmps, paths):
                os.replace(tmp, path)
            tmps.clear()
        finally:
            for fd in fds:
                os.close(fd)
            for tmp in tmps:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def write(self, path: str, buf: Any, *, mode: int = 0o644, xattrs: dict | None = None) -> None:
        """Store one block as the file `path` (created or replaced)."""
        self.write_many([path], [buf], mode=mode, xattrs=[xattrs] if xattrs else None)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
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
