"""The control surface: a hidden control file and the `user.kvfs.*` attributes.

Queries are getxattr calls (anyone who may read the mount may query); actions are setxattr
calls on the control file `/.kvfs-control` with a JSON argument, dispatched from a table, and
allowed only to the mount's owner and root. The outcome of each caller's last action (result,
or the one-line error) can be read back as `user.kvfs.result` on the control file, because a
setxattr can return nothing but an errno.

    setfattr -n user.kvfs.drop_dram -v '{}' MNT/.kvfs-control
    getfattr --only-values -n user.kvfs.stats MNT
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from kvfs.catalog.base import CONTROL_INO, ROOT_INO
from kvfs.errors import KvfsError
from kvfs.files import Attr

if TYPE_CHECKING:
    from kvfs.service import Service

STATS_VERSION = 1
FH_BASE = 1 << 62            # control-file handles live apart from file handles
PREFIX = b"user.kvfs."

HELP = """kvfs control file. Actions are setxattr calls with a JSON argument, for example
    setfattr -n user.kvfs.drop_dram -v '{}' MOUNT/.kvfs-control
then read the outcome with
    getfattr --only-values -n user.kvfs.result MOUNT/.kvfs-control
Statistics: getfattr --only-values -n user.kvfs.stats MOUNT
Actions:
"""


class Control:
    def __init__(self, service: "Service"):
        self.service = service
        self.owner = os.geteuid()
        self.started = time.time_ns()
        self._next_fh = FH_BASE
        self._open: set[int] = set()
        self._results: dict[int, bytes] = {}
        self.actions: dict[str, tuple[Callable[[dict], Awaitable[Any]], str]] = {
            "drop_dram": (self._drop_dram, "drop every DRAM-resident copy (all are in the pool)"),
            "flush": (self._flush, "persist access times and learned chain links now"),
        }

    # --- the control file as a file ------------------------------------------------------------
    def attr(self) -> Attr:
        t = self.started
        return Attr(CONTROL_INO, stat.S_IFREG | 0o644, 1, self.owner, os.getegid(),
                    len(self.help()), t, t, t)

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
        return self.help()[off:off + size]

    def release(self, fh: int) -> None:
        self._open.discard(fh)

    # --- attributes ----------------------------------------------------------------------------
    def getxattr(self, inode: int, name: bytes, uid: int) -> bytes | None:
        """The value of a kvfs attribute, or None when `name` is an ordinary user attribute."""
        if inode == ROOT_INO and name == PREFIX + b"stats":
            return json.dumps(self.service.statistics(), sort_keys=True).encode()
        if inode == CONTROL_INO:
            if name == PREFIX + b"result":
                return self._results.get(uid, b'{"ok": true, "action": null}')
            raise KvfsError(errno.ENODATA, f"no attribute {name.decode(errors='replace')}")
        return None

    def listxattr(self, inode: int) -> list[bytes]:
        if inode == ROOT_INO:
            return [PREFIX + b"stats"]
        if inode == CONTROL_INO:
            return [PREFIX + b"result"]
        return []

    async def setxattr(self, inode: int, name: bytes, value: bytes, uid: int) -> bool:
        """Run an action if this is one (True), or leave an ordinary attribute to the caller."""
        if inode != CONTROL_INO:
            if inode == ROOT_INO and name == PREFIX + b"stats":
                raise KvfsError(errno.EPERM, "user.kvfs.stats is read-only")
            return False
        if uid not in (0, self.owner):
            raise KvfsError(errno.EPERM, "only the mount's owner or root may run kvfs actions")
        action = name[len(PREFIX):].decode(errors="replace") if name.startswith(PREFIX) else ""
        entry = self.actions.get(action)
        try:
            if entry is None:
                raise KvfsError(errno.EINVAL, f"unknown action {name.decode(errors='replace')!r} "
                                              f"(known: {', '.join(sorted(self.actions))})")
            try:
                args = json.loads(value or b"{}")
            except ValueError:
                raise KvfsError(errno.EINVAL, f"{action}: the argument is not JSON: "
                                              f"{value[:80].decode(errors='replace')!r}") from None
            if not isinstance(args, dict):
                raise KvfsError(errno.EINVAL, f"{action}: the argument must be a JSON object")
            result = await entry[0](args)
        except KvfsError as e:
            self._results[uid] = json.dumps({"ok": False, "action": action, "error": str(e),
                                             "errno": e.errno}).encode()
            raise
        self._results[uid] = json.dumps({"ok": True, "action": action, "result": result}).encode()
        return True

    @staticmethod
    def _no_args(action: str, args: dict) -> None:
        if args:
            raise KvfsError(errno.EINVAL, f"{action}: takes no arguments, got {sorted(args)}")

    # --- actions -------------------------------------------------------------------------------
    async def _drop_dram(self, args: dict) -> dict:
        self._no_args("drop_dram", args)
        return {"bytes_dropped": self.service.store.drop_dram()}

    async def _flush(self, args: dict) -> dict:
        self._no_args("flush", args)
        return await self.service.flush()
