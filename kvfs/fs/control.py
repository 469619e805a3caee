"""The control surface: a hidden control file and the `user.kvfs.*` attributes.

Queries are getxattr calls (anyone who may read the mount may query); actions are setxattr
calls on the control file `/.kvfs-control` with a JSON argument, dispatched from a table, and
allowed only to the mount's owner and root. The outcome of each caller's last action (result,
or the one-line error) can be read back as `user.kvfs.result` on the control file, by the
same thread, because a setxattr can return nothing but an errno.

    setfattr -n user.kvfs.drop_dram -v '{}' MNT/.kvfs-control
    getfattr --only-values -n user.kvfs.stats MNT
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from typing import Any, Awaitable, Callable, Protocol

import trio

from kvfs.catalog.interface import Catalog
from kvfs.catalog.records import CONTROL_INO, ROOT_INO
from kvfs.catalog.tree import LINK_HINT
from kvfs.client import wire
from kvfs.errors import KvfsError
from kvfs.fs.direct_socket import DirectSocket
from kvfs.fs.files import Files
from kvfs.fs.pool_admin import PoolAdmin
from kvfs.knobs import Knobs
from kvfs.tiers.store import BlockStore
from kvfs.write.handles import Attr

FH_BASE = 1 << 62  # control-file handles live apart from file handles
PREFIX = b"user.kvfs."
RESULTS_KEPT = 4096  # callers whose last action's outcome is kept for them to read back

HELP = """kvfs control file. Actions are setxattr calls with a JSON argument, for example
    setfattr -n user.kvfs.drop_dram -v '{}' MOUNT/.kvfs-control
then read the outcome with
    getfattr --only-values -n user.kvfs.result MOUNT/.kvfs-control
Statistics: getfattr --only-values -n user.kvfs.stats MOUNT
Actions:
"""


class DaemonView(Protocol):
    """What the control file asks of the daemon above it (a seam the factory binds:
    kvfs/service.py): its statistics (a snapshot the service composes), and a flush of what
    is batched."""

    def statistics(self) -> dict: ...

    async def flush(self) -> dict: ...


class Control:
    """The control file and kvfs attributes over the layers it is given. `service` is the
    daemon's view (`DaemonView`), `pool_info` ({"pool_id", "namespace_paths",
    "read_timeout"}) goes into every layout shown, and `direct_socket` is where
    kvfs.client.direct is served (`user.kvfs.direct` on the root says where)."""

    def __init__(
        self,
        catalog: Catalog,
        store: BlockStore,
        files: Files,
        direct_socket: DirectSocket,
        knobs: Knobs,
        *,
        service: DaemonView,
        pool_admin: PoolAdmin,
        pool_info: dict,
    ):
        self.catalog = catalog
        self.store = store
        self.files = files
        self.direct_socket = direct_socket
        self.knobs = knobs
        self.service = service
        self.pool_admin = pool_admin
        self.pool_info = pool_info
        self.owner = os.geteuid()
        self.started = time.time_ns()
        self._next_fh = FH_BASE
        self._open: set[int] = set()
        self._results: dict[tuple[int, int], bytes] = {}  # (uid, pid) -> its last outcome
        self._stats: tuple[float, bytes] | None = None  # (when, the last snapshot given)
        self.actions: dict[str, tuple[Callable[[dict], Awaitable[Any]], str]] = {
            "drop_dram": (
                self._drop_dram,
                "drop every DRAM-resident copy (all are in the pool); "
                'with {"memory": true} also give the memory kept '
                "for reuse (spares) back to the system",
            ),
            "flush": (
                self._flush,
                "make closed files durable (write-back), persist access "
                "times and learned chain links now",
            ),
            "evict": (
                self._evict,
                '{"paths": ["/a", ...]} or {"cold": N}: drop blocks from DRAM and the local tier',
            ),
            "warm": (
                self._warm,
                '{"path": "/a", "depth": N}: fetch a file and the N blocks of '
                "its chain after it into DRAM",
            ),
            "pool_remove": (
                self._pool_remove,
                '{"namespace": 2, "drop": false}: remove a namespace from the pool while '
                "mounted, dropping the blocks with units on it (refused while it would lose "
                'blocks that still read, unless "drop")',
            ),
            "pool_add": (
                self._pool_add,
                '{"path": "/dev/nvme4n1", "size": null, "force": false}: format a namespace '
                "as the pool's next and use it at once (a size creates a file)",
            ),
            "set": (
                self._set,
                '{"prefetch.enabled": true, "prefetch.max_window": 8, '
                '"dram.capacity": "2GiB", "pool.evict": "never"}: change a knob '
                "until the next mount",
            ),
        }

    # --- the control file as a file ------------------------------------------------------------
    def attr(self) -> Attr:
        t = self.started
        return Attr(
            CONTROL_INO,
            stat.S_IFREG | 0o644,
            1,
            self.owner,
            os.getegid(),
            len(self.help()),
            t,
            t,
            t,
        )

    def help(self) -> bytes:
        lines = [f"    {name:12s} {doc}" for name, (_, doc) in sorted(self.actions.items())]
        return (HELP + "\n".join(lines) + "\n").encode()

    def open(self) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self._open.add(fh)
        return fh

    def owns(self, fh: int) -> bool:
        return fh >= FH_BASE

    def read(self, fh: int, off: int, size: int) -> bytes:
        return self.help()[off : off + size]

    def release(self, fh: int) -> None:
        self._open.discard(fh)

    # --- attributes ----------------------------------------------------------------------------
    FILE_ATTRS = (b"tier", b"layout", b"hits", b"atime", b"chain")

    async def getxattr(self, inode: int, name: bytes, uid: int, pid: int = 0) -> bytes | None:
        """The value of a kvfs attribute, or None when `name` is an ordinary user attribute.
        (`uid`, `pid`: who asks; an action's outcome is read back by the thread that ran it.)"""
        if not name.startswith(PREFIX):
            return None
        key = name[len(PREFIX) :]
        if inode == ROOT_INO and key == b"stats":
            return self._stats_snapshot()
        if inode == ROOT_INO and key == b"direct":
            return self._direct_socket()
        if inode == CONTROL_INO:
            if key == b"result":
                return self._results.get((uid, pid), b'{"ok": true, "action": null}')
            raise KvfsError(errno.ENODATA, f"no attribute {name.decode(errors='replace')}")
        if key in self.FILE_ATTRS:
            node = self.catalog.get(inode)
            if node.is_file:
                if key == b"layout":  # extents a direct reader will read: durable first
                    await self.files.settle(inode)
                return self._file_attr(node, key)
        return None

    def _direct_socket(self) -> bytes:
        """Where kvfs.client.direct sends its batches (kvfs/fs/direct_socket.py), and the pid
        a client checks the socket's peer against."""
        sock = self.direct_socket
        if not sock.listening:
            raise KvfsError(errno.ENODATA, "the direct path is not served (no socket)")
        return json.dumps(
            {"version": wire.VERSION, "socket": sock.address, "pid": os.getpid()}
        ).encode()

    STATS_REUSE = 1.0  # seconds a snapshot is given again (once)

    def _stats_snapshot(self) -> bytes:
        """The statistics as JSON. A reader asks for the size first and then for the value (two
        requests: getfattr, os.getxattr on ERANGE); a snapshot taken anew for the second could
        be longer than the size the first said (a counter gained a digit) and the reader would
        fail with ERANGE. So a snapshot is given twice, the second time if asked within
        STATS_REUSE seconds (it is at most that old)."""
        now = trio.current_time()
        if self._stats is not None and now - self._stats[0] < self.STATS_REUSE:
            value, self._stats = self._stats[1], None
            return value
        value = json.dumps(self.service.statistics(), sort_keys=True).encode()
        self._stats = (now, value)
        return value

    def _file_attr(self, node, key: bytes) -> bytes:
        if key == b"tier":
            if node.blob is None or self.files.dirty(node.ino):
                return b"write-buffer"
            return self.store.tier_of(node.blob).encode()
        if key == b"hits":
            return str(self.files.hits.get(node.ino, 0)).encode()
        if key == b"atime":
            return str(node.atime_ns).encode()
        if key == b"chain":
            cat = self.catalog

            def name_of(ino):
                n = cat.find(ino) if ino is not None else None
                return cat.path_of(n) if n is not None else None

            return json.dumps(
                {"parent": name_of(cat.parent_of(node.ino)), "next": name_of(cat.next_of(node.ino))}
            ).encode()
        if key == b"layout":
            if node.blob is None:
                return b"{}"
            lay = node.blob.layout.describe()
            lay.update(
                checksum=f"{node.blob.checksum:016x}",
                generation=node.blob.id,
                sums=list(node.blob.layout.sums),
                **self.pool_info,
            )
            return json.dumps(lay).encode()
        raise KvfsError(errno.ENODATA, "no such attribute")

    def listxattr(self, inode: int) -> list[bytes]:
        if inode == ROOT_INO:
            return [PREFIX + b"stats", PREFIX + b"direct"]
        if inode == CONTROL_INO:
            return [PREFIX + b"result"]
        node = self.catalog.find(inode)
        if node is not None and node.is_file:
            return [PREFIX + k for k in self.FILE_ATTRS]
        return []

    async def setxattr(self, inode: int, name: bytes, value: bytes, uid: int, pid: int = 0) -> bool:
        """Run an action or set a kvfs attribute (True), or leave an ordinary attribute to the
        caller (False). The outcome is kept for the caller's thread (`uid`, `pid`: FUSE's pid
        is the thread's), so callers running actions side by side each read back their own."""
        if inode != CONTROL_INO:
            if not name.startswith(PREFIX):
                return False
            key = name[len(PREFIX) :]
            if key in (b"pin", b"next", b"parent"):
                await self._set_file_attr(inode, key, value)
                return True
            raise KvfsError(
                errno.EPERM,
                f"{name.decode(errors='replace')} is not writable "
                f"(writable kvfs attributes: pin, next, parent)",
            )
        if uid not in (0, self.owner):
            raise KvfsError(errno.EPERM, "only the mount's owner or root may run kvfs actions")
        action = name[len(PREFIX) :].decode(errors="replace") if name.startswith(PREFIX) else ""
        entry = self.actions.get(action)
        try:
            if entry is None:
                raise KvfsError(
                    errno.EINVAL,
                    f"unknown action {name.decode(errors='replace')!r} "
                    f"(known: {', '.join(sorted(self.actions))})",
                )
            try:
                args = json.loads(value or b"{}")
            except ValueError:
                raise KvfsError(
                    errno.EINVAL,
                    f"{action}: the argument is not JSON: {value[:80].decode(errors='replace')!r}",
                ) from None
            if not isinstance(args, dict):
                raise KvfsError(errno.EINVAL, f"{action}: the argument must be a JSON object")
            result = await entry[0](args)
        except KvfsError as e:
            self._outcome(
                (uid, pid), {"ok": False, "action": action, "error": str(e), "errno": e.errno}
            )
            raise
        self._outcome((uid, pid), {"ok": True, "action": action, "result": result})
        return True

    def _outcome(self, caller: tuple[int, int], outcome: dict) -> None:
        """Keep a caller's last outcome (the RESULTS_KEPT latest callers')."""
        self._results.pop(caller, None)
        self._results[caller] = json.dumps(outcome).encode()
        if len(self._results) > RESULTS_KEPT:
            del self._results[next(iter(self._results))]

    async def _set_file_attr(self, inode: int, key: bytes, value: bytes) -> None:
        node = self.catalog.get(inode)
        if not node.is_file:
            raise KvfsError(errno.EINVAL, "kvfs attributes apply to regular files")
        text = value.decode(errors="replace").strip()
        if key == b"pin":
            if text.lower() in ("1", "true", "yes", "on"):
                await self.files.xattrs.set_pin(inode, True)
            elif text.lower() in ("0", "false", "no", "off", ""):
                await self.files.xattrs.set_pin(inode, False)
            else:
                raise KvfsError(errno.EINVAL, f"user.kvfs.pin takes 1 or 0, not {text!r}")
            return
        other = self._resolve(node, text)
        if key == b"next":
            self.catalog.link(node.ino, other.ino, LINK_HINT)
        else:
            self.catalog.link(other.ino, node.ino, LINK_HINT)
        await self.catalog.flush_links()

    def _resolve(self, node, text: str):
        """A file named by a hint: a name in the same directory, or a path from the mount's
        root when it starts with '/'."""
        cat = self.catalog
        if not text:
            raise KvfsError(errno.EINVAL, "a chain hint needs a file name")
        if text.startswith("/"):
            ino, parts = ROOT_INO, [p for p in text.split("/") if p]
        else:
            ino, parts = node.parent, [p for p in text.split("/") if p]
        target = cat.get(ino)
        for p in parts:
            target = cat.lookup(target.ino, p.encode())
        if not target.is_file:
            raise KvfsError(errno.EINVAL, f"chain hint {text!r} is not a regular file")
        return target

    @staticmethod
    def _no_args(action: str, args: dict) -> None:
        if args:
            raise KvfsError(errno.EINVAL, f"{action}: takes no arguments, got {sorted(args)}")

    # --- actions -------------------------------------------------------------------------------
    async def _drop_dram(self, args: dict) -> dict:
        if set(args) - {"memory"} or not isinstance(args.get("memory", False), bool):
            raise KvfsError(errno.EINVAL, 'drop_dram: takes nothing, or {"memory": true}')
        await self.files.sync_all()  # (closed files still in write-back are in DRAM only)
        out = {"bytes_dropped": self.store.drop_dram()}
        if args.get("memory"):
            out["spare_bytes_freed"] = self.store.spares.bytes
            self.store.spares.trim(0)
        return out

    async def _pool_remove(self, args: dict) -> dict:
        j, drop = args.get("namespace"), args.get("drop", False)
        if set(args) - {"namespace", "drop"} or type(j) is not int or type(drop) is not bool:
            raise KvfsError(errno.EINVAL, 'pool_remove: takes {"namespace": N, "drop": false}')
        return await self.pool_admin.remove(j, drop)

    async def _pool_add(self, args: dict) -> dict:
        path, size, force = args.get("path"), args.get("size"), args.get("force", False)
        if (
            set(args) - {"path", "size", "force"}
            or not isinstance(path, str)
            or not (size is None or (type(size) is int and size > 0))
            or type(force) is not bool
        ):
            raise KvfsError(
                errno.EINVAL, 'pool_add: takes {"path": "/abs/path", "size": bytes or null}'
            )
        return await self.pool_admin.add(path, size, force)

    def _path_node(self, path, action: str):
        if not isinstance(path, str) or not path:
            raise KvfsError(errno.EINVAL, f'{action}: paths are strings like "/dir/file"')
        cat = self.catalog
        node = cat.get(ROOT_INO)
        for part in [p for p in path.split("/") if p]:
            try:
                node = cat.lookup(node.ino, part.encode())
            except KvfsError:
                raise KvfsError(errno.ENOENT, f"{action}: no such file: {path}") from None
        if not node.is_file:
            raise KvfsError(errno.EINVAL, f"{action}: not a regular file: {path}")
        return node

    async def _evict(self, args: dict) -> dict:
        paths, cold = args.get("paths"), args.get("cold")
        if (paths is None) == (cold is None) or set(args) - {"paths", "cold"}:
            raise KvfsError(errno.EINVAL, 'evict: give {"paths": [...]} or {"cold": N}')
        store, cat = self.store, self.catalog
        evicted, total = [], 0
        if paths is not None:
            if not isinstance(paths, list):
                raise KvfsError(errno.EINVAL, "evict: paths must be a list")
            nodes = [self._path_node(p, "evict") for p in paths]
            for p, node in zip(paths, nodes):
                if node.blob is not None:
                    try:
                        total += store.evict(node.blob)
                    except KvfsError as e:
                        raise KvfsError(e.errno, f"evict: {p}: {e}") from None
                    evicted.append(p)
        else:
            if isinstance(cold, bool) or not isinstance(cold, int) or cold < 1:
                raise KvfsError(errno.EINVAL, "evict: cold must be a positive integer")
            for bid, ino in store.evict_cold(cold):
                node = cat.find(ino) if ino else None
                if node is not None and (node.blob is None or node.blob.id != bid):
                    node = None
                evicted.append(cat.path_of(node) if node is not None else f"block {bid}")
                total += node.blob.size if node is not None and node.blob else 0
        return {"evicted": evicted, "bytes": total}

    async def _warm(self, args: dict) -> dict:
        if set(args) - {"path", "depth"} or "path" not in args:
            raise KvfsError(errno.EINVAL, 'warm: give {"path": "/file", "depth": N}')
        depth = args.get("depth", 64)
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise KvfsError(errno.EINVAL, "warm: depth must be a non-negative integer")
        cat, store = self.catalog, self.store
        node = self._path_node(args["path"], "warm")
        blocks, seen = [], set()
        while node is not None and node.ino not in seen and len(blocks) <= depth:
            seen.add(node.ino)
            if node.blob is not None:
                store.warm(node.blob)
                blocks.append(cat.path_of(node))
            nxt = cat.next_of(node.ino)
            node = cat.find(nxt) if nxt is not None else None
        return {"blocks": blocks}

    async def _set(self, args: dict) -> dict:
        from kvfs.units import parse_size

        knobs, store = self.knobs, self.store
        known = ("prefetch.enabled", "prefetch.max_window", "dram.capacity", "pool.evict")
        if not args:
            raise KvfsError(errno.EINVAL, f"set: name a knob ({', '.join(known)})")
        for key, value in args.items():
            if key == "prefetch.enabled":
                if not isinstance(value, bool):
                    raise KvfsError(errno.EINVAL, "set: prefetch.enabled takes true or false")
            elif key == "prefetch.max_window":
                if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 256:
                    raise KvfsError(errno.EINVAL, "set: prefetch.max_window takes 1 to 256")
            elif key == "dram.capacity":
                try:
                    if parse_size(value) < store.pinned_bytes:
                        raise KvfsError(
                            errno.EINVAL,
                            "set: dram.capacity is below the pinned bytes; unpin first",
                        )
                except ValueError as e:
                    raise KvfsError(errno.EINVAL, f"set: dram.capacity: {e}") from None
            elif key == "pool.evict":
                if value not in ("lru", "prefix", "never"):
                    raise KvfsError(
                        errno.EINVAL, 'set: pool.evict takes "lru", "prefix" or "never"'
                    )
            else:
                raise KvfsError(
                    errno.EINVAL, f"set: unknown knob {key!r} (known: {', '.join(known)})"
                )
        for key, value in args.items():  # all valid: apply them together
            if key == "prefetch.enabled":
                knobs.prefetch_enabled = value
            elif key == "prefetch.max_window":
                knobs.prefetch_max_window = value
            elif key == "dram.capacity":
                store.set_capacity(parse_size(value))
            elif key == "pool.evict":
                knobs.pool_evict = value
        return {
            "prefetch.enabled": knobs.prefetch_enabled,
            "prefetch.max_window": knobs.prefetch_max_window,
            "dram.capacity": store.capacity,
            "pool.evict": knobs.pool_evict,
        }

    async def _flush(self, args: dict) -> dict:
        self._no_args("flush", args)
        return await self.service.flush()
