"""Who may do what, for requests the kernel did not check: kvfs.client.direct's batches come on
the daemon's socket (kvfs/fs/direct_socket.py), not through the mount, so the daemon resolves
their paths and checks them as the kernel checks a request through the mount (it is mounted
with `default_permissions`): search permission on every directory of a path, read permission
on a file to lease it, write and search permission on a directory to create or replace a name
in it, the sticky bit for a name another user owns. Symbolic links are followed (40 at most:
ELOOP) where they stay in the mount; a path that leaves the mount (`..` at its root, a link
to elsewhere) is EXDEV. kvfs keeps no ACLs (only user.* attributes), so the mode bits are the
whole rule; root may do anything but search where nobody may.
"""

from __future__ import annotations

import errno
import stat
from collections import deque
from dataclasses import dataclass
from typing import Callable

from kvfs.catalog.interface import Catalog
from kvfs.catalog.records import ROOT_INO, Node
from kvfs.catalog.tree import check_name
from kvfs.errors import KvfsError

READ, WRITE, SEARCH = 4, 2, 1
MAX_LINKS = 40  # symbolic links followed in one path, as Linux's MAXSYMLINKS


@dataclass(frozen=True, slots=True)
class Caller:
    """Whose request it is: a process's credentials (from the socket's SO_PEERCRED and
    SO_PEERGROUPS, kvfs/fs/direct_socket.py)."""

    pid: int
    uid: int
    gid: int
    groups: frozenset[int] = frozenset()


def allows(node: Node, caller: Caller, want: int) -> bool:
    """May `caller` have every access in `want` (READ | WRITE | SEARCH) to `node`? As
    generic_permission: the owner's bits, else the group's (primary or supplementary), else
    the others'; root needs nothing but a search bit somewhere to search (or execute)."""
    mode = node.mode
    if caller.uid == 0:
        return not want & SEARCH or node.is_dir or bool(mode & 0o111)
    if caller.uid == node.uid:
        bits = mode >> 6
    elif node.gid == caller.gid or node.gid in caller.groups:
        bits = mode >> 3
    else:
        bits = mode
    return bits & want == want


def _denied(path: bytes) -> KvfsError:
    return KvfsError(errno.EACCES, f"permission denied: {_show(path)}")


def _show(path: bytes) -> str:
    return "/" + path.decode(errors="replace")


class Resolver:
    """Paths from the mount's root to nodes, checked for a caller. `mount`: the mount's path
    (absolute symbolic links into it are followed; None: none are). `held_here`: the file
    layer's answer to a shared catalog's "is this content served here" (Files.held_here)."""

    def __init__(
        self,
        catalog: Catalog,
        mount: bytes | None = None,
        held_here: Callable[[Node], bool] | None = None,
    ):
        self.catalog = catalog
        self.mount = mount.rstrip(b"/") if mount else None
        self.held_here = held_here

    async def file(self, caller: Caller, path: bytes, want: int) -> Node:
        """The regular file at `path` (links followed), if `caller` may search its way there
        and have `want` of it: ENOENT, ENOTDIR, EACCES, EISDIR, EINVAL (not a regular file)."""
        node = await self._walk(caller, path, follow=True)
        if node.is_dir:
            raise KvfsError(errno.EISDIR, f"is a directory: {_show(path)}")
        if not node.is_file:
            raise KvfsError(errno.EINVAL, f"not a regular file: {_show(path)}")
        if not allows(node, caller, want):
            raise _denied(path)
        return node

    async def place(self, caller: Caller, path: bytes) -> tuple[Node, bytes]:
        """The directory `path` names a file in, and the file's name, if `caller` may create
        a file there or replace the one there (rename's rules: a directory there is EISDIR;
        in a sticky directory another user's file is EPERM). A link as the last component is
        not followed: it is what gets replaced."""
        head, _, name = path.rpartition(b"/")
        check_name(name)
        parent = await self._walk(caller, head, follow=True) if head else self.catalog.get(ROOT_INO)
        if not parent.is_dir:
            raise KvfsError(errno.ENOTDIR, f"not a directory: {_show(head)}")
        if not allows(parent, caller, WRITE | SEARCH):
            raise _denied(head or b".")
        try:
            there = await self.catalog.lookup_fresh(parent.ino, name, self.held_here)
        except KvfsError as e:
            if e.errno != errno.ENOENT:
                raise
            return parent, name
        if there.is_dir:
            raise KvfsError(errno.EISDIR, f"is a directory: {_show(path)}")
        if parent.mode & stat.S_ISVTX and caller.uid not in (0, parent.uid, there.uid):
            raise KvfsError(
                errno.EPERM, f"{_show(path)}: another user's file in a sticky directory"
            )
        return parent, name

    async def _walk(self, caller: Caller, path: bytes, *, follow: bool) -> Node:
        """Resolve `path` component by component from the root, as namei does: each
        directory searched must allow SEARCH; links are followed (the last one if
        `follow`)."""
        cat = self.catalog
        node = cat.get(ROOT_INO)
        parts = deque(p for p in path.split(b"/") if p)
        links = 0
        while parts:
            part = parts.popleft()
            if not node.is_dir:
                raise KvfsError(errno.ENOTDIR, f"not a directory on the way to {_show(path)}")
            if not allows(node, caller, SEARCH):
                raise _denied(path)
            if part == b".":
                continue
            if part == b"..":
                if node.ino == ROOT_INO:
                    raise KvfsError(errno.EXDEV, f"{_show(path)} leads out of the mount")
                node = cat.get(node.parent)
                continue
            child = await cat.lookup_fresh(node.ino, part, self.held_here)
            if not child.is_symlink or (not parts and not follow):
                node = child
                continue
            links += 1
            if links > MAX_LINKS:
                raise KvfsError(errno.ELOOP, f"too many symbolic links in {_show(path)}")
            target = child.target or b""
            if target.startswith(b"/"):
                m = self.mount
                if m is None or not (target == m or target.startswith(m + b"/")):
                    raise KvfsError(
                        errno.EXDEV,
                        f"{_show(path)}: a symbolic link leads out of the mount "
                        f"({target.decode(errors='replace')})",
                    )
                target = target[len(m) :]
                node = cat.get(ROOT_INO)
            parts.extendleft(reversed([p for p in target.split(b"/") if p]))
        return node
