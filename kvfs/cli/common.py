"""What every kvfs command shares: finding the mount (kvfs.client.mounts, which the integrations use
too), reading kvfs attributes, running control actions, and printing either tables for people
or JSON for scripts.

The commands talk to the daemon only through the mount (getxattr/setxattr), so they work
wherever the mount is visible and need no socket or privilege beyond the files' own.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from typing import Any, Callable, Sequence

from kvfs.client.mounts import find_mount
from kvfs.units import format_size

CONTROL = ".kvfs-control"


class CliError(Exception):
    """A refused request: one line for stderr and an exit status."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def fail(message: str, code: int = 1) -> int:
    print(f"kvfs: {message}", file=sys.stderr)
    return code


def _getxattr(path: str, name: str) -> bytes:
    try:
        return os.getxattr(path, name)
    except OSError as e:
        if e.errno == errno.ENOTCONN:
            raise CliError(
                f"kvfs at {path} is not responding (its daemon died: umount it and mount again)"
            ) from None
        if e.errno == errno.ENOENT:
            raise CliError(f"no such file or directory: {path}") from None
        raise


def stats(mount: str) -> dict:
    return json.loads(_getxattr(mount, "user.kvfs.stats"))


def file_attrs(path: str) -> dict:
    """kvfs's view of one file: tier, hits, access time, chain, layout, pin."""
    find_mount(path)
    if not os.path.isfile(path):
        if not os.path.exists(path):
            raise CliError(f"no such file or directory: {path}")
        raise CliError(f"not a regular file: {path}")
    out: dict[str, Any] = {"path": path, "size": os.stat(path).st_size}
    out["tier"] = _getxattr(path, "user.kvfs.tier").decode()
    out["hits"] = int(_getxattr(path, "user.kvfs.hits"))
    out["atime_ns"] = int(_getxattr(path, "user.kvfs.atime"))
    out["chain"] = json.loads(_getxattr(path, "user.kvfs.chain"))
    out["layout"] = json.loads(_getxattr(path, "user.kvfs.layout"))
    try:
        out["pinned"] = os.getxattr(path, "user.kvfs.pin") == b"1"
    except OSError:
        out["pinned"] = False
    return out


def control(mount: str, action: str, args: dict | None = None) -> Any:
    """Run a control action; returns its result, or raises CliError with the daemon's message."""
    ctl = os.path.join(mount, CONTROL)
    try:
        os.setxattr(ctl, f"user.kvfs.{action}", json.dumps(args or {}).encode())
    except OSError as e:
        try:
            res = json.loads(os.getxattr(ctl, "user.kvfs.result"))
        except OSError:
            res = {}
        if e.errno in (errno.EPERM, errno.EACCES) and not res.get("error"):
            raise CliError(f"{action}: only the mount's owner or root may do this") from None
        raise CliError(res.get("error") or f"{action}: {e.strerror}") from None
    return json.loads(os.getxattr(ctl, "user.kvfs.result")).get("result")


def with_json(parser):
    """A command's parser, given the --json flag its output follows (`emit`)."""
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    return parser


def emit(as_json: bool, obj: Any, human: Callable[[Any], str]) -> None:
    if as_json:
        print(json.dumps(obj))
    else:
        text = human(obj)
        if text:
            print(text)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: str = "") -> str:
    """A plain text table; columns named in `right` (by header) are right-aligned."""
    cells = [list(map(str, headers))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        parts = []
        for i, c in enumerate(r):
            parts.append(
                c.rjust(widths[i]) if headers[i] in right.split(",") else c.ljust(widths[i])
            )
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def size(n: int | float) -> str:
    return format_size(n)


def pct(a: float, b: float) -> str:
    return f"{100.0 * a / b:.1f}%" if b else "-"
