"""What every catalog shares, and the in-memory tree of the shared (Redis) catalog's mirror.

Catalogs give the layer above one interface: queries are plain methods (`find`, `get`, `lookup`,
`listing`...), mutations are async and return once the change is durable. `TreeCatalog` keeps
the whole namespace in memory (the Redis catalog's mirror: a few hundred bytes per file);
`SqliteCatalog` (one node) keeps it in SQLite with a bounded cache of nodes in front and
overrides the few primitives the shared logic below uses (`find`, `_child`, `_has_children`,
`_enter`, `_leave`, `_register`, the chains).

Prefix chains (which block follows which) are kept here too: `link` records them in memory and
each implementation persists them in batches (`flush_links`).
"""

from __future__ import annotations

import bisect
import errno
import stat
import time
from typing import Callable, Iterable, Iterator

import trio

from kvfs.catalog.announce import Announcer, Announcing
from kvfs.catalog.records import FIRST_INO, NAME_MAX, ROOT_INO, Node
from kvfs.errors import KvfsError, exists, not_found
from kvfs.pool.layout import Layout

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2

# Where a chain link was learned; a higher source outranks a lower one.
LINK_WRITE, LINK_READ, LINK_HINT = 1, 2, 3
MAX_SUCCESSORS = 8  # the strongest few successors of a block are kept


def _now() -> int:
    return time.time_ns()


def check_name(name: bytes) -> None:
    if not name or b"/" in name or b"\0" in name or name in (b".", b".."):
        raise KvfsError(errno.EINVAL, f"invalid file name: {name!r}")
    if len(name) > NAME_MAX:
        raise KvfsError(errno.ENAMETOOLONG, f"file name longer than {NAME_MAX} bytes")


def merge_link(
    out: dict[int, list], succ: int, source: int, weight: float
) -> tuple[bool, int | None]:
    """Apply a learned link pred -> succ to pred's successors `out` ({succ: [source, weight]}):
    a stronger source replaces a weaker one, the same source adds weight, a weaker one is
    ignored. Returns (whether `out` changed, the weakest successor dropped to keep the
    strongest MAX_SUCCESSORS, or None)."""
    cur = out.get(succ)
    if cur is None or source > cur[0]:
        out[succ] = [source, weight]
    elif source == cur[0]:
        cur[1] += weight
    else:
        return False, None
    if len(out) > MAX_SUCCESSORS:
        weakest = min(out, key=lambda s: (out[s][0], out[s][1]))
        del out[weakest]
        return True, weakest
    return True, None


class TreeCatalog(Announcing):
    """The memory tree and the chains; subclasses add durability."""

    shared = False  # True: other nodes change the same catalog (RedisCatalog)
    tree_children = True  # directories hold their `children` in memory
    fresh = True  # False while a shared catalog may be out of date here
    # Why changes can no longer be made durable (a catalog write failed), until a restart
    # (a SQLite catalog's group commit says, and calls its hooks' on_failure:
    # kvfs/catalog/groupcommit.py).
    failure: str | None = None
    opened_with: str | None = None  # what the catalog found amiss when it was opened
    # for statistics, counted by whatever makes changes durable (the SQLite catalog's group
    # commit, the Redis catalog's scripts)
    commits = 0  # durable transactions
    statements = 0
    commit_seconds = 0.0  # time spent making changes durable

    def cache_statistics(self) -> dict:
        """What the catalog's caches hold and hit (none: every node is in memory)."""
        return {}

    def __init__(self, announcer: Announcer | None = None) -> None:
        """`announcer`: told of durable changes to the names it recognises (KV events,
        kvfs/catalog/announce.py)."""
        self._init_announce(announcer)
        self.nodes: dict[int, Node] = {}
        self.pool_id: str | None = None
        self._next_ino = FIRST_INO
        self._next_cookie = 1
        self._next_blob = 1
        self._dirty_atime: set[int] = set()
        # prefix chains: pred -> {succ: [source, weight]}, and the reverse
        self.successors: dict[int, dict[int, list]] = {}
        self.predecessors: dict[int, set[int]] = {}
        self._dirty_links: set[tuple[int, int]] = set()

    # ------------------------------------------------------------------------------ queries
    def find(self, ino: int) -> Node | None:
        """The node of an inode (linked, or unlinked and still used), or None."""
        return self.nodes.get(ino)

    def get(self, ino: int) -> Node:
        node = self.find(ino)
        if node is None:
            raise KvfsError(errno.ENOENT, f"no such inode: {ino}")
        return node

    def dir(self, ino: int) -> Node:
        node = self.get(ino)
        if not node.is_dir:
            raise KvfsError(errno.ENOTDIR, f"not a directory: inode {ino}")
        return node

    def _child(self, d: Node, name: bytes) -> int | None:
        """The inode named `name` in directory `d`, or None."""
        return d.children.get(name)

    def _has_children(self, d: Node) -> bool:
        return bool(d.children)

    def lookup(self, parent: int, name: bytes) -> Node:
        if len(name) > NAME_MAX:  # no such name can exist; ext4 and tmpfs say so too
            raise KvfsError(errno.ENAMETOOLONG, f"file name longer than {NAME_MAX} bytes")
        d = self.dir(parent)
        ino = self._child(d, name)
        if ino is None:
            raise not_found(name.decode(errors="replace"))
        return self.get(ino)

    def listing(self, ino: int) -> "Listing":
        """A directory's entries for readdir (see `Listing`)."""
        d = self.dir(ino)
        return Listing(
            ino, sorted((self.nodes[i] for i in d.children.values()), key=lambda n: n.cookie)
        )

    def entries(self, ino: int) -> list[Node]:
        """The directory's children in readdir order (by cookie, which only grows)."""
        return list(self.listing(ino).after(0))

    def path_of(self, node: Node) -> str:
        parts = []
        while node.ino != ROOT_INO:
            if not node.linked:
                return "(unlinked)/" + node.name.decode(errors="replace")
            parts.append(node.name.decode(errors="replace"))
            node = self.get(node.parent)
        return "/" + "/".join(reversed(parts))

    def files(self) -> Iterator[Node]:
        return (n for n in self.nodes.values() if n.blob is not None)

    def pinned_files(self) -> list[Node]:
        """Files whose block is pinned in DRAM (the attribute user.kvfs.pin = 1)."""
        return [n for n in self.files() if n.xattrs.get(b"user.kvfs.pin") == b"1"]

    @property
    def node_count(self) -> int:
        """Nodes the catalog holds (files, directories, symlinks; pending ones included)."""
        return len(self.nodes)

    @property
    def file_count(self) -> int:
        """Files with a committed block."""
        return sum(1 for _ in self.files())

    def layouts(self) -> Iterable[Layout]:
        return (n.blob.layout for n in self.files())

    def next_blob_id(self) -> int:
        bid = self._next_blob
        self._next_blob += 1
        return bid

    async def lookup_fresh(
        self, parent: int, name: bytes, held_here: Callable[[Node], bool] | None = None
    ) -> Node:
        """`lookup` for the FUSE layer: the name as the catalog holds it now. (A shared catalog
        asks Redis about names it does not know, and, while its mirror may be behind, about
        files whose content is not `held_here`.)"""
        return self.lookup(parent, name)

    async def confirm(self, parent: int, name: bytes) -> Node:
        """`lookup` checked against the shared store now (here: the tree is the store)."""
        return self.lookup(parent, name)

    # ------------------------------------------------------------------------------ life cycle
    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Background work while mounted (a shared catalog follows the other nodes)."""
        task_status.started()
        await trio.sleep_forever()

    async def stop(self) -> None:
        """Unmounting (after the last flush)."""

    # ------------------------------------------------------------------------------ tree changes
    def _id(self, attr: str) -> int:
        """Take the next value of an id counter (`_next_ino`, `_next_cookie`)."""
        value = getattr(self, attr)
        setattr(self, attr, value + 1)
        return value

    def _make_node(self, parent: Node, name: bytes, mode: int, uid: int, gid: int) -> Node:
        """A new node named `name` in `parent` (checked), not yet in the tree."""
        check_name(name)
        if not parent.is_dir:
            raise KvfsError(errno.ENOTDIR, f"not a directory: {self.path_of(parent)}")
        if not parent.linked:
            raise KvfsError(errno.ENOENT, "directory was removed")
        if self._child(parent, name) is not None:
            raise exists(name.decode(errors="replace"))
        now = _now()
        return Node(
            self._id("_next_ino"),
            parent.ino,
            name,
            mode,
            uid,
            gid,
            now,
            now,
            now,
            cookie=self._id("_next_cookie"),
        )

    def _register(self, node: Node) -> None:
        """A new node exists (in memory)."""
        self.nodes[node.ino] = node

    def _enter(self, parent: Node, node: Node) -> None:
        """`node` is now named node.name in `parent` (the name index)."""
        parent.children[node.name] = node.ino

    def _leave(self, parent: Node, node: Node) -> None:
        """`node` no longer has its name node.name in `parent`."""
        del parent.children[node.name]

    def _place(self, node: Node) -> None:
        """Put a node made by `_make_node` (a directory: with its `children` set) in the tree."""
        parent = self.get(node.parent)
        self._register(node)
        self._enter(parent, node)
        if node.is_dir:
            parent.subdirs += 1
        parent.mtime_ns = parent.ctime_ns = node.ctime_ns

    async def mkdir(self, parent: int, name: bytes, mode: int, uid: int, gid: int) -> Node:
        node = self._make_node(self.dir(parent), name, stat.S_IFDIR | (mode & 0o7777), uid, gid)
        if self.tree_children:
            node.children = {}
        await self._add(node)
        return node

    async def symlink(self, parent: int, name: bytes, target: bytes, uid: int, gid: int) -> Node:
        if not target or len(target) > 4095:
            raise KvfsError(errno.ENAMETOOLONG if target else errno.ENOENT, "bad symlink target")
        node = self._make_node(self.dir(parent), name, stat.S_IFLNK | 0o777, uid, gid)
        node.target = target
        await self._add(node)
        return node

    async def _add(self, node: Node) -> None:
        """Make a new directory or symlink (from `_make_node`) durable and put it in the tree
        (each catalog in its own order)."""
        raise NotImplementedError

    def create_file(self, parent: int, name: bytes, mode: int, uid: int, gid: int) -> Node:
        """A new, pending file: in this node's memory only until its first commit."""
        node = self._make_node(self.dir(parent), name, stat.S_IFREG | (mode & 0o7777), uid, gid)
        self._place(node)
        return node

    def _move(
        self,
        src: Node,
        pold: Node,
        pnew: Node,
        name_new: bytes,
        now: int,
        cookie: int | None = None,
    ) -> None:
        """Rename `src` to `name_new` in `pnew` (the target name is free); it gets a new readdir
        cookie (`cookie`, or the next one)."""
        self._announce(src, False)
        self._leave(pold, src)
        if src.is_dir:
            pold.subdirs -= 1
            pnew.subdirs += 1
        if cookie is None:
            cookie = self._id("_next_cookie")
        src.parent, src.name, src.cookie = pnew.ino, name_new, cookie
        src.ctime_ns = now
        self._enter(pnew, src)
        self._announce(src, True)
        pold.mtime_ns = pold.ctime_ns = pnew.mtime_ns = pnew.ctime_ns = now

    def _swap(self, a: Node, b: Node, now: int) -> None:
        """RENAME_EXCHANGE: `a` and `b` trade names (and readdir cookies)."""
        pa, pb = self.get(a.parent), self.get(b.parent)
        na, nb = a.name, b.name
        self._announce(a, False)
        self._announce(b, False)
        self._leave(pa, a)
        self._leave(pb, b)
        if pa is not pb:
            delta = b.is_dir - a.is_dir
            pa.subdirs += delta
            pb.subdirs -= delta
        a.parent, a.name, b.parent, b.name = pb.ino, nb, pa.ino, na
        a.cookie, b.cookie = b.cookie, a.cookie
        a.ctime_ns = b.ctime_ns = now
        self._enter(pb, a)
        self._enter(pa, b)
        self._announce(a, True)
        self._announce(b, True)

    def _detach(self, node: Node) -> None:
        self._announce(node, False)
        parent = self.get(node.parent)
        self._leave(parent, node)
        if node.is_dir:
            parent.subdirs -= 1
        parent.mtime_ns = parent.ctime_ns = _now()
        node.linked = False

    def _is_ancestor(self, maybe: Node, node: Node) -> bool:
        cur = node
        while True:
            if cur.ino == maybe.ino:
                return True
            if cur.ino == ROOT_INO:
                return False
            cur = self.get(cur.parent)

    async def unlink(self, parent: int, name: bytes) -> Node:
        """Remove a file or symlink; the node stays in memory (unlinked) until `drop`."""
        node = self.lookup(parent, name)
        if node.is_dir:
            raise KvfsError(errno.EISDIR, f"is a directory: {name.decode(errors='replace')}")
        return await self.remove(node)

    async def remove(self, node: Node, expect=None, ghosts: int = 0) -> Node:
        """Unlink a file by node (each catalog makes it durable its own way). `expect`: the
        version the caller chose to delete (a shared catalog refuses with ESTALE if another
        node replaced it meanwhile)."""
        raise NotImplementedError

    def _removable_dir(self, parent: int, name: bytes) -> Node:
        """The directory `rmdir` may remove (ENOTDIR, ENOTEMPTY otherwise)."""
        node = self.lookup(parent, name)
        if not node.is_dir:
            raise KvfsError(errno.ENOTDIR, f"not a directory: {name.decode(errors='replace')}")
        if self._has_children(node):
            raise KvfsError(
                errno.ENOTEMPTY, f"directory not empty: {name.decode(errors='replace')}"
            )
        return node

    async def rename(
        self, parent_old: int, name_old: bytes, parent_new: int, name_new: bytes, flags: int = 0
    ) -> Node | None:
        """Atomically rename, replacing the target; return the replaced node (now unlinked).
        The checks are made here; a name renamed onto itself is left as it is."""
        src, pold, pnew, target = self._rename_check(
            parent_old, name_old, parent_new, name_new, flags
        )
        if target is src:
            return None
        return await self._rename(src, pold, name_old, pnew, name_new, target, flags)

    async def _rename(
        self,
        src: Node,
        pold: Node,
        name_old: bytes,
        pnew: Node,
        name_new: bytes,
        target: Node | None,
        flags: int,
    ) -> Node | None:
        """Make a checked rename durable and apply it to the tree (each catalog its own way):
        `src`, named `name_old` in `pold`, becomes `name_new` in `pnew`, replacing `target`
        (None: the name is free), or trading names with it under RENAME_EXCHANGE."""
        raise NotImplementedError

    def _rename_check(
        self, parent_old: int, name_old: bytes, parent_new: int, name_new: bytes, flags: int
    ) -> tuple[Node, Node, Node, Node | None]:
        """Validate a rename against the tree; return (source, old parent, new parent, target).
        The target is None when the name is free; the source itself when renaming onto itself."""
        if (
            flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE)
            or flags == RENAME_NOREPLACE | RENAME_EXCHANGE
        ):
            raise KvfsError(errno.EINVAL, f"unsupported rename flags {flags:#x}")
        check_name(name_new)
        src = self.lookup(parent_old, name_old)
        pold = self.get(parent_old)
        pnew = self.dir(parent_new)
        target_ino = self._child(pnew, name_new)
        target = self.get(target_ino) if target_ino is not None else None
        if target is src:
            return src, pold, pnew, src
        if src.is_dir and self._is_ancestor(src, pnew):
            raise KvfsError(errno.EINVAL, "cannot move a directory into itself")
        if flags & RENAME_EXCHANGE:
            if target is None:
                raise not_found(name_new.decode(errors="replace"))
            if target.is_dir and self._is_ancestor(target, pold):
                raise KvfsError(errno.EINVAL, "cannot move a directory into itself")
        elif target is not None:
            if flags & RENAME_NOREPLACE:
                raise exists(name_new.decode(errors="replace"))
            if src.is_dir and not target.is_dir:
                raise KvfsError(
                    errno.ENOTDIR, f"not a directory: {name_new.decode(errors='replace')}"
                )
            if not src.is_dir and target.is_dir:
                raise KvfsError(
                    errno.EISDIR, f"is a directory: {name_new.decode(errors='replace')}"
                )
            if target.is_dir and self._has_children(target):
                raise KvfsError(
                    errno.ENOTEMPTY, f"directory not empty: {name_new.decode(errors='replace')}"
                )
        return src, pold, pnew, target

    def rescore(self, node: Node) -> None:
        """The node's place in the pool's order changed: persisted with the next batch of
        accesses (`flush_atimes`)."""
        if node.persisted and node.linked:
            self._dirty_atime.add(node.ino)

    def last_use(self, ino: int) -> int:
        """When the file was last read or written (ns; 0 if it is not in memory): its place
        in the pool's LRU order (lru_files)."""
        node = self.find(ino)
        return max(node.atime_ns, node.mtime_ns) if node is not None else 0

    def touch(self, node: Node, now_ns: int | None = None) -> None:
        """Record an access in memory; `flush_atimes` persists accesses in one batch."""
        node.atime_ns = now_ns or _now()
        self.rescore(node)

    # ------------------------------------------------------------------------------ chains
    def link(self, pred: int, succ: int, source: int, weight: float = 1.0) -> None:
        """Record (in memory; `flush_links` persists) that `succ` follows `pred` in a prefix chain.

        A link learned from a stronger source replaces a weaker one; the same source adds
        weight. Only files that are linked (named) take links.
        """
        if pred == succ or pred not in self.nodes or succ not in self.nodes:
            return
        if not (self.nodes[pred].linked and self.nodes[succ].linked):
            return
        out = self.successors.setdefault(pred, {})
        changed, weakest = merge_link(out, succ, source, weight)
        if not changed:
            return
        self.predecessors.setdefault(succ, set()).add(pred)
        if weakest is not None:
            self.predecessors.get(weakest, set()).discard(pred)
            self._dirty_links.add((pred, weakest))
        self._dirty_links.add((pred, succ))

    def unlink_chain(self, pred: int, succ: int) -> None:
        out = self.successors.get(pred)
        if out and out.pop(succ, None) is not None:
            self.predecessors.get(succ, set()).discard(pred)
            self._dirty_links.add((pred, succ))

    def links_of(self, pred: int) -> dict[int, tuple[int, float]]:
        """The successors recorded for `pred`: {succ: (source, weight)}."""
        return {s: (v[0], v[1]) for s, v in self.successors.get(pred, {}).items()}

    def next_of(self, ino: int) -> int | None:
        """The most likely successor of a block: the strongest source, then the most weight."""
        out = self.successors.get(ino)
        if not out:
            return None
        return max(out, key=lambda s: (out[s][0], out[s][1]))

    def parent_of(self, ino: int) -> int | None:
        preds = self.predecessors.get(ino)
        if not preds:
            return None
        return max(preds, key=lambda p: tuple(self.successors.get(p, {}).get(ino, (0, 0))))

    def _forget_links(self, ino: int) -> None:
        for succ in list(self.successors.pop(ino, {})):
            self.predecessors.get(succ, set()).discard(ino)
        for pred in list(self.predecessors.pop(ino, set())):
            self.successors.get(pred, {}).pop(ino, None)
        self._dirty_links = {(a, b) for a, b in self._dirty_links if ino not in (a, b)}

    def drop(self, ino: int) -> None:
        """Forget an unlinked node (the kernel and all handles are done with it)."""
        node = self.nodes.get(ino)
        if node is not None and not node.linked:
            del self.nodes[ino]


class Listing:
    """A directory's entries for readdir, from readdir offset (cookie) to offset: here a
    snapshot taken at opendir; entries removed or renamed since are skipped."""

    def __init__(self, ino: int, nodes: list[Node]):
        self.ino = ino
        self.nodes = nodes
        self.cookies = [n.cookie for n in nodes]

    def after(self, cookie: int) -> Iterator[Node]:
        """The entries whose cookie is greater than `cookie`, in cookie order."""
        for i in range(bisect.bisect_right(self.cookies, cookie), len(self.nodes)):
            node = self.nodes[i]
            if node.linked and node.parent == self.ino and node.cookie == self.cookies[i]:
                yield node
