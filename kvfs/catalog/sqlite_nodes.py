"""The SQLite catalog's nodes in memory (`NodeRows`, an object SqliteCatalog holds as
`node_rows`): one object per inode, a bounded cache of the nodes used last, the names of cached
nodes and the names found absent, and a node read back from its row.

* `_live`: every `Node` object somebody holds (a weak map), so one inode is always one object;
  `_cache`: the `cache_nodes` most recently used nodes, kept alive (an LRU).
* `_names`: (parent, name) -> ino of cached nodes, so a lookup of a cached name needs no query
  (an entry is checked against the node, whose memory is the truth, before it is used).
* `_misses`: names looked up and found absent, most recent last (at most MISSES_KEPT): the
  create that follows a lookup's miss (open(O_CREAT) of a new block), and a lookup of the
  name again (an engine's "is it stored?", a direct writer's allocation then commit), know the
  name is free without asking SQLite again. Every name this node's tree gains passes
  `entered`, which forgets its miss; nothing else adds names to the table while mounted.

The catalog keeps the nodes that have no row (pending) or no name (unlinked) and asks about
them before it asks here. A node read from its row (`from_row`) takes the access time and score
not written yet (`unsaved`: the pool's order, kvfs/catalog/sqlite_order.py); a node in use is
never read again: its memory is the truth.
"""

from __future__ import annotations

import collections
import weakref
from typing import Callable

from kvfs.catalog.records import BlobRec, Node
from kvfs.catalog.sqlite_schema import BY_INO, BY_NAME, S_IFDIR, S_IFMT, SUBDIRS
from kvfs.errors import not_found

CACHE_NODES = 8192  # nodes kept in memory beyond those in use
MISSES_KEPT = 4096  # names remembered as absent (a lookup's miss, for the create after it)
XATTR_COUNT = 20  # the column of BY_NAME and BY_INO that counts the node's xattrs


class NodeRows:
    """The nodes in memory and the rows they are read from, over the catalog's connection:
    `unsaved(ino)` (the pool's order's) gives a node read back the scores its row lacks yet."""

    def __init__(self, conn, unsaved: Callable[[int], tuple | None]) -> None:
        self._conn = conn
        self._unsaved = unsaved
        self.cache_nodes = CACHE_NODES
        self._live: weakref.WeakValueDictionary[int, Node] = weakref.WeakValueDictionary()
        self._cache: collections.OrderedDict[int, Node] = collections.OrderedDict()
        self._names: dict[tuple[int, bytes], int] = {}
        self._misses: dict[tuple[int, bytes], None] = {}

    def add(self, node: Node) -> None:
        """A new node exists (in memory): one object for its inode, and recently used."""
        self._live[node.ino] = node
        self._remember(node)

    def forget(self, ino: int) -> None:
        """The node never existed (its creation was rolled back)."""
        self._live.pop(ino, None)
        self._cache.pop(ino, None)

    def uncache(self, ino: int) -> None:
        """The node is no longer kept alive (those who hold it still may)."""
        self._cache.pop(ino, None)

    def take_priorities(self) -> None:
        """The rows of files without a priority were given one (`score_unscored`): the nodes
        in memory take their rows'."""
        held = {n.ino: n for n in (*self._cache.values(), *self._live.values())}
        for node in held.values():
            if node.prio is None and node.persisted and node.blob is not None:
                row = self._conn.execute(
                    "SELECT prio FROM nodes WHERE ino=?", (node.ino,)
                ).fetchone()
                if row is not None:
                    node.prio = row[0]

    @property
    def cached(self) -> int:
        """Nodes in the cache (for statistics)."""
        return len(self._cache)

    @property
    def live(self) -> int:
        """Node objects in memory (for statistics)."""
        return len(self._live)

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

    def from_row(self, row) -> Node:
        """The node of a row of `nodes` (the object in memory if there is one)."""
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
            node.subdirs = self._conn.execute(SUBDIRS, (ino,)).fetchone()[0]
        dirty = self._unsaved(ino)
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
        """The node of an inode (in use, or read from its row), or None."""
        node = self._live.get(ino)
        if node is not None:
            self._remember(node)
            return node
        row = self._conn.execute(BY_INO, (ino,)).fetchone()
        return self.from_row(row) if row is not None else None

    def lookup(self, parent: int, name: bytes) -> Node:
        """The node named `name` in directory `parent` (cached, or read from its row); a name
        found absent is remembered (`child`)."""
        ino = self._names.get((parent, name))
        if ino is not None:
            node = self._cache.get(ino)
            if node is not None and node.linked and node.name == name and node.parent == parent:
                self._cache.move_to_end(ino)
                return node
        elif (parent, name) in self._misses:  # (found absent, and no name was made since)
            raise not_found(name.decode(errors="replace"))
        row = self._conn.execute(BY_NAME, (parent, name)).fetchone()
        if row is None:
            misses = self._misses
            misses[(parent, name)] = None
            if len(misses) > MISSES_KEPT:
                del misses[next(iter(misses))]
            raise not_found(name.decode(errors="replace"))
        return self.from_row(row)

    def child(self, parent: int, name: bytes) -> int | None:
        """The inode of the row named `name` in directory `parent`, or None."""
        if (parent, name) in self._misses:
            return None
        row = self._conn.execute(
            "SELECT ino FROM nodes WHERE parent=? AND name=?", (parent, name)
        ).fetchone()
        return row[0] if row is not None else None

    def entered(self, parent: int, node: Node) -> None:
        """`node` is now named node.name in directory `parent`."""
        self._misses.pop((parent, node.name), None)
        if node.ino in self._cache:
            self._names[(parent, node.name)] = node.ino

    def left(self, parent: int, node: Node) -> None:
        """`node` no longer has its name node.name in directory `parent`."""
        key = (parent, node.name)
        if self._names.get(key) == node.ino:
            del self._names[key]
