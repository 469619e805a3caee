"""The SQLite catalog's nodes in memory (a mix-in of SqliteCatalog): one object per inode, a
bounded cache of the nodes used last, the names of cached nodes and the names found absent, and
a node read back from its row.

* `_live`: every `Node` object somebody holds (a weak map), so one inode is always one object;
  `_cache`: the `cache_nodes` most recently used nodes, kept alive (an LRU).
* `_names`: (parent, name) -> ino of cached nodes, so a lookup of a cached name needs no query
  (an entry is checked against the node, whose memory is the truth, before it is used).
* `_misses`: names looked up and found absent, most recent last (at most MISSES_KEPT): the
  create that follows a lookup's miss (open(O_CREAT) of a new block) knows the name is free
  without asking SQLite again. Every name this node's tree gains passes `_enter`, which
  forgets its miss; nothing else adds names to the table while mounted.

A node read from its row (`_from_row`) takes the access time and score not written yet
(`_dirty_atime`, kvfs/catalog/sqlite_order.py); a node in use is never read again: its memory
is the truth.
"""

from __future__ import annotations

import collections
import errno
import weakref

from kvfs.catalog.base import NAME_MAX, BlobRec, Node
from kvfs.catalog.sqlite_schema import BY_INO, BY_NAME, S_IFDIR, S_IFMT, SUBDIRS
from kvfs.errors import KvfsError, not_found

CACHE_NODES = 8192  # nodes kept in memory beyond those in use
MISSES_KEPT = 4096  # names remembered as absent (a lookup's miss, for the create after it)
XATTR_COUNT = 20  # the column of BY_NAME and BY_INO that counts the node's xattrs


class NodeRows:
    """Expects `_conn`, `_one`, `dir`, `_pending`, `_pending_names`, `_unlinked` and
    `_dirty_atime` (SqliteCatalog); `_init_nodes()` is called by its constructor."""

    def _init_nodes(self) -> None:
        self.cache_nodes = CACHE_NODES
        self._live: weakref.WeakValueDictionary[int, Node] = weakref.WeakValueDictionary()
        self._cache: collections.OrderedDict[int, Node] = collections.OrderedDict()
        self._names: dict[tuple[int, bytes], int] = {}
        self._misses: dict[tuple[int, bytes], None] = {}

    def _remember(self, node: Node) -> None:
        c = self._cache
        if node.ino in c:
            c.move_to_end(node.ino)
            return
        c[node.ino] = node
        if node.linked:
            self._names[(node.parent, node.name)] = node.ino
        if len(c) > self.cache_nodes:
            old = c.popitem(last=False)[1]
            key = (old.parent, old.name)
            if self._names.get(key) == old.ino:
                del self._names[key]
            if len(self._names) > 2 * len(c):  # (entries of nodes that left the cache
                # otherwise, e.g. `drop`: never used, since a lookup checks the node)
                self._names = {(n.parent, n.name): i for i, n in c.items() if n.linked}

    def _from_row(self, row) -> Node:
        ino = row[0]
        node = self._live.get(ino)
        if node is not None:  # in use: its memory is the truth
            self._remember(node)
            return node
        node = Node(
            ino,
            row[1],
            row[2],
            row[4],
            row[5],
            row[6],
            row[7],
            row[8],
            row[9],
            cookie=row[3],
            target=row[10],
            persisted=True,
            prio=row[18],
            uses=row[19],
        )
        if row[11] is not None:  # (the layout is unpacked when something needs it)
            node.blob = BlobRec.packed(
                row[11], row[12], row[13], row[14], row[15], row[16], row[17]
            )
        if node.mode & S_IFMT == S_IFDIR:
            node.subdirs = self._one(SUBDIRS, (ino,))
        dirty = self._dirty_atime.get(ino)
        if dirty is not None:
            node.atime_ns, node.prio, node.uses = dirty
        if len(row) <= XATTR_COUNT or row[XATTR_COUNT]:  # (BY_NAME/BY_INO count them)
            for name, value in self._conn.execute(
                "SELECT name, value FROM xattrs WHERE ino=?", (ino,)
            ):
                node.xattrs[name] = value
        self._live[ino] = node
        self._remember(node)
        return node

    def find(self, ino: int) -> Node | None:
        node = self._unlinked.get(ino)
        if node is not None:
            return node
        node = self._live.get(ino)
        if node is not None:
            self._remember(node)
            return node
        row = self._conn.execute(BY_INO, (ino,)).fetchone()
        return self._from_row(row) if row is not None else None

    def lookup(self, parent: int, name: bytes) -> Node:
        if len(name) > NAME_MAX:  # no such name can exist; ext4 and tmpfs say so too
            raise KvfsError(errno.ENAMETOOLONG, f"file name longer than {NAME_MAX} bytes")
        self.dir(parent)
        ino = self._pending_names.get((parent, name))
        if ino is not None:
            return self._pending[ino]
        ino = self._names.get((parent, name))
        if ino is not None:
            node = self._cache.get(ino)
            if node is not None and node.linked and node.name == name and node.parent == parent:
                self._cache.move_to_end(ino)
                return node
        row = self._conn.execute(BY_NAME, (parent, name)).fetchone()
        if row is None:
            misses = self._misses
            misses[(parent, name)] = None
            if len(misses) > MISSES_KEPT:
                del misses[next(iter(misses))]
            raise not_found(name.decode(errors="replace"))
        return self._from_row(row)

    def _child(self, d: Node, name: bytes) -> int | None:
        ino = self._pending_names.get((d.ino, name))
        if ino is not None:
            return ino
        if (d.ino, name) in self._misses:
            return None
        row = self._conn.execute(
            "SELECT ino FROM nodes WHERE parent=? AND name=?", (d.ino, name)
        ).fetchone()
        return row[0] if row is not None else None

    def _enter(self, parent: Node, node: Node) -> None:
        self._misses.pop((parent.ino, node.name), None)
        if not node.persisted:
            self._pending_names[(parent.ino, node.name)] = node.ino
        if node.ino in self._cache:
            self._names[(parent.ino, node.name)] = node.ino

    def _leave(self, parent: Node, node: Node) -> None:
        if not node.persisted:
            self._pending_names.pop((parent.ino, node.name), None)
        key = (parent.ino, node.name)
        if self._names.get(key) == node.ino:
            del self._names[key]
