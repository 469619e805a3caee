"""The single-node catalog: the tree lives in SQLite (WAL mode), a bounded cache of nodes in front.

SQLite is the truth. Memory holds only what is in use or recently used, so a catalog of millions
of files costs a few megabytes and opens in a moment. `SqliteCatalog` holds the tree's logic
(kvfs/catalog/tree.py) and the nodes without a row or a name; what it keeps over its one
connection are objects of their own, each in its own file:

* `node_rows` (NodeRows, kvfs/catalog/sqlite_nodes.py): every `Node` object somebody holds (a
  weak map), so one inode is always one object; the `cache_nodes` most recently used nodes (an
  LRU), the names of cached nodes and those found absent; a node read back from its row.
* `_pending` (here): files created and never committed (no row: absent after a crash), by inode
  and by (parent, name); `_unlinked`: removed nodes that handles or the kernel still use, until
  `drop`. A node whose memory differs from its row is held by one of these, so evicting a node
  from the cache never loses a change.
* `order` (OrderRows, kvfs/catalog/sqlite_order.py): the pool's order (an index on max(atime,
  mtime), or on the policy's priority under `pool.evict = "prefix"`), the accesses and scores
  not written yet (written in batches; a node read back from its row takes them), the ghosts.
* `chains` (SqliteChains, kvfs/catalog/sqlite_chains.py): the rows of `links` and their caches.
* `group` (GroupCommit, kvfs/catalog/groupcommit.py): the open transaction and the rounds that
  make it durable.

Queries run on the trio thread against the one connection: a lookup is an index probe on
(parent, name), readdir pages through an index on (parent, cookie). With the database in the
page cache each costs a few microseconds.

Mutations are applied to memory and executed on the connection at once, in the transaction
that is open (so every later query sees them), then wait for durability. Group commit: the
first waiter commits the open transaction and `fdatasync`s the WAL in a worker thread;
statements executed meanwhile go to the next transaction, whose waiters are served by the next
round. A reply therefore waits for a WAL sync that started after its statements were
committed: durable at close, with one transaction and one sync for every mutation of a burst.

Crash safety: a commit of a file version is one transaction (the node's row with its block),
so after a crash a file has its old version or its new one, never a mix; transactions reach
the database in the order they were applied. A pending file has no row. Space written for a
version whose transaction never committed is referenced by no row, so it is free again when
the pool rebuilds its free map from the rows at start-up. The write-ahead log is checked
before SQLite opens it (`wal_damage`): a log cut short is logged once and kept in
`opened_with` (SQLite alone would silently drop the changes after its last intact commit).

If SQLite fails (disk full, I/O error: a statement, a COMMIT or the WAL's sync) the open
transaction is rolled back and memory may be ahead of the database: the catalog then sets
`failure` and refuses every further mutation with EIO until the daemon is restarted, which
starts from the last committed state. Meanwhile the pool frees no extent (`on_failure`,
called once), so none that the disk's catalog references is written again (a transaction
whose WAL sync failed may still reach the disk). A failed commit, mkdir or symlink leaves
memory as the database has it: the file keeps its previous version (a new file is pending
again, empty), the directory or symlink does not exist.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import stat
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from kvfs.catalog.groupcommit import CommitHooks, GroupCommit
from kvfs.catalog.records import FIRST_INO, NAME_MAX, ROOT_INO, BlobRec, Node
from kvfs.catalog.sqlite_chains import SqliteChains
from kvfs.catalog.sqlite_nodes import NodeRows
from kvfs.catalog.sqlite_order import OrderRows
from kvfs.catalog.sqlite_schema import (
    COLS,
    INDEXES,
    NODES_TABLE,
    PAGE_QUERY,
    PAGE_ROWS,
    SCHEMA_VERSION,
    TABLES,
    Stmt,
    extents,
    extents_by_row,
    insert_node,
    migrate_v1,
    migrate_v2,
    wal_damage,
)
from kvfs.catalog.tree import RENAME_EXCHANGE, TreeCatalog, _now
from kvfs.errors import KvfsError, StartupError
from kvfs.pool.layout import Layout

log = logging.getLogger("kvfs.catalog")

BLOB_ID_STEP = 4096  # block ids the meta row's high-water mark runs ahead by


class SqliteListing:
    """A directory's entries for readdir, paged from the (parent, cookie) index: entries made
    after opendir appear if their cookie is past the reader's offset, removed ones do not."""

    def __init__(self, cat: "SqliteCatalog", ino: int):
        self.cat = cat
        self.ino = ino

    def after(self, cookie: int) -> Iterator[Node]:
        cat = self.cat
        while True:
            rows = cat._conn.execute(PAGE_QUERY, (self.ino, cookie, PAGE_ROWS)).fetchall()
            nodes = [cat.node_rows.from_row(r) for r in rows]
            hi = rows[-1][3] if len(rows) == PAGE_ROWS else None
            extra = [
                n
                for n in cat._pending.values()
                if n.parent == self.ino
                and n.linked
                and n.cookie > cookie
                and (hi is None or n.cookie <= hi)
            ]
            if extra:
                nodes = sorted(nodes + extra, key=lambda n: n.cookie)
            yield from nodes
            if hi is None:
                return
            cookie = hi


class SqliteCatalog(TreeCatalog):
    """The catalog. Mutating methods are async (they wait for durability); queries are not.
    The tree's logic is here; what it keeps over the one connection are objects of their own
    (see the module doc): `group` (GroupCommit), `order` (OrderRows), `node_rows` (NodeRows)
    and `chains` (SqliteChains)."""

    tree_children = False

    def __init__(self, conn: sqlite3.Connection, path: Path, hooks: CommitHooks = CommitHooks()):
        super().__init__(hooks.announcer)
        del self.nodes  # no memory tree: see find() and the module doc
        del self.successors, self.predecessors, self._dirty_links, self._dirty_atime
        self._conn = conn
        self.path = path
        self.opened_with: str | None = None  # what wal_damage found at open
        self._pending: dict[int, Node] = {}
        self._pending_names: dict[tuple[int, bytes], int] = {}
        self._unlinked: dict[int, Node] = {}
        self._nodes = 0  # rows (persisted nodes)
        self._files = 0  # rows with a block
        group = self.group = GroupCommit(conn, path, hooks, self._announce_due)
        self.order = OrderRows(conn, group, self.find)
        self.node_rows = NodeRows(conn, self.order.unsaved)
        self.chains = SqliteChains(conn, self.find, group.execute, group.execute_many, group.sync)

    # ------------------------------------------------------------------------ durability
    # (the open transaction and its rounds are GroupCommit's: kvfs/catalog/groupcommit.py)
    @property
    def failure(self) -> str | None:
        return self.group.failure

    @property
    def commits(self) -> int:
        return self.group.commits

    @property
    def statements(self) -> int:
        return self.group.statements

    @property
    def commit_seconds(self) -> float:
        return self.group.commit_seconds

    @property
    def unsynced(self) -> bool:
        """Changes were applied that are not durable yet."""
        return self.group.unsynced

    @property
    def open_since(self) -> float | None:
        """The trio time the open transaction began (None: none is open)."""
        return self.group.open_since

    async def sync(self) -> None:
        """Make everything applied so far durable."""
        await self.group.sync()

    def after_release(self, fn: Callable[[], None]) -> None:
        """Call fn() once the change that released space last is durable (see GroupCommit)."""
        self.group.after_release(fn)

    def _note_txn(self) -> int:
        """(KV events) the transaction a change made now goes to."""
        return self.group.txn

    def _durable_txn(self) -> int:
        return self.group.synced

    # ------------------------------------------------------------------------ the pool's order
    # (its rows and the scores not written yet are OrderRows': kvfs/catalog/sqlite_order.py)
    def rescore(self, node: Node) -> None:
        self.order.rescore(node)

    async def flush_atimes(self) -> int:
        """Persist the access times recorded since the last flush (for LRU order after restart)."""
        return await self.order.flush_atimes()

    def lru_files(self) -> Iterator[tuple[int, int]]:
        return self.order.lru_files()

    def scored_files(self) -> Iterator[tuple[int, int, float]]:
        return self.order.scored_files()

    def lowest_priority(self) -> float | None:
        return self.order.lowest_priority()

    async def score_unscored(self) -> int:
        n = await self.order.score_unscored()
        if n:
            self.node_rows.take_priorities()
        return n

    def take_ghost(self, parent: int, name: bytes) -> int | None:
        return self.order.take_ghost(parent, name)

    def ghost_count(self) -> int:
        return self.order.ghost_count()

    # ------------------------------------------------------------------------ prefix chains
    # (the rows and caches are SqliteChains': kvfs/catalog/sqlite_chains.py)
    def link(self, pred: int, succ: int, source: int, weight: float = 1.0) -> None:
        self.chains.link(pred, succ, source, weight)

    def unlink_chain(self, pred: int, succ: int) -> None:
        self.chains.unlink_chain(pred, succ)

    def links_of(self, pred: int) -> dict[int, tuple[int, float]]:
        return self.chains.links_of(pred)

    def next_of(self, ino: int) -> int | None:
        return self.chains.next_of(ino)

    def parent_of(self, ino: int) -> int | None:
        return self.chains.parent_of(ino)

    def _forget_links(self, ino: int) -> None:
        self.chains.forget(ino)

    async def flush_links(self) -> int:
        """Make the chain links learned since the last flush durable."""
        return await self.chains.flush()

    # ------------------------------------------------------------------------------ opening
    @classmethod
    def open(cls, path: Path, hooks: CommitHooks = CommitHooks()) -> "SqliteCatalog":
        """Open (creating if absent) the catalog database; nothing is loaded but counters.
        `hooks`: what the group commit tells or asks the layers around it."""
        damage = wal_damage(path)  # before SQLite reads (and then resets) the log
        if damage:
            log.warning("catalog %s: %s", path, damage)
        try:
            conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            # the WAL is synced by the group commit (see the module doc), checkpoints by SQLite
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=OFF")
            conn.execute("PRAGMA cache_size=-8192")
            conn.executescript(TABLES)
        except sqlite3.Error as e:
            raise StartupError(f"catalog {path}: cannot open: {e}") from None
        cat = cls(conn, path, hooks)
        cat.opened_with = damage
        try:
            cat._load()
        except sqlite3.Error as e:
            conn.close()
            raise StartupError(f"catalog {path}: cannot read: {e}") from None
        return cat

    def _meta(self, key: str) -> str | None:
        row = self._conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def _load(self) -> None:
        c = self._conn
        version = self._meta("schema_version")
        if version is None:
            now = _now()
            c.execute(NODES_TABLE.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS"))
            with c:
                c.execute("BEGIN")
                c.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                c.execute(
                    f"INSERT OR IGNORE INTO nodes ({COLS}) VALUES "
                    f"(?,?,?,?,?,?,?,?,?,?,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,0)",
                    (
                        ROOT_INO,
                        ROOT_INO,
                        b"",
                        0,
                        stat.S_IFDIR | 0o755,
                        os.geteuid(),
                        os.getegid(),
                        now,
                        now,
                        now,
                    ),
                )
        elif int(version) == 1:
            migrate_v1(c, self.path)
        elif int(version) == 2:
            migrate_v2(c, self.path)
        elif int(version) != SCHEMA_VERSION:
            raise StartupError(
                f"catalog {self.path}: schema version {version} is not supported "
                f"(this kvfs uses {SCHEMA_VERSION})"
            )
        c.executescript(INDEXES)
        self.pool_id = self._meta("pool_id")
        if c.execute("SELECT 1 FROM nodes WHERE ino=?", (ROOT_INO,)).fetchone() is None:
            raise StartupError(f"catalog {self.path}: the root directory is missing")
        # one scan of the table for the counters (a fraction of a second at a million rows)
        nodes, files, ino, cookie, blob = c.execute(
            "SELECT count(*), count(blob), max(ino), max(cookie), max(blob) FROM nodes"
        ).fetchone()
        self._nodes, self._files = nodes, files
        self._next_ino = max(FIRST_INO - 1, ino) + 1
        self._next_cookie = (cookie or 0) + 1
        hwm = int(self._meta("blob_hwm") or 0)
        self._next_blob = max(hwm, blob or 0) + 1
        self._blob_hwm = self._next_blob - 1  # the highest block id the meta row covers
        # SQLite's own page cache grows with the catalog (64 bytes a node, 8 to 128 MiB: the
        # interior pages of the indexes and the hottest leaves); the rest comes from the
        # kernel's page cache, which is asked to read the database ahead now
        kib = min(128 << 10, max(8 << 10, nodes * 64 >> 10))
        c.execute(f"PRAGMA cache_size=-{kib}")
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)
        except OSError:
            pass
        # links to inodes that were pending when the daemon stopped (never committed; their
        # numbers will be given again)
        with c:
            c.execute("BEGIN")
            c.execute("DELETE FROM links WHERE pred >= ?1 OR succ >= ?1", (self._next_ino,))

    def set_pool_id(self, pool_id: str) -> None:
        """Bind a new catalog to its pool (synchronous: start-up and `kvfs format` only)."""
        with self._conn:
            self._conn.execute("BEGIN")
            self._conn.execute("INSERT OR REPLACE INTO meta VALUES ('pool_id', ?)", (pool_id,))
        self.pool_id = pool_id

    @property
    def members(self) -> str | None:
        """The pool's membership record (kvfs/pool/members.py), None if it never changed."""
        return self._meta("pool_members")

    async def set_members(self, encoded: str) -> None:
        """Record the pool's membership; return once it is durable."""
        await self.group.persist(
            [("INSERT OR REPLACE INTO meta VALUES ('pool_members', ?)", (encoded,))]
        )

    def close(self) -> None:
        """Commit and sync what is open, then close (SQLite checkpoints the WAL)."""
        self.group.close()
        self._conn.close()

    def extents(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(namespace, offset, length) of every stripe unit of every block, as arrays (the pool
        rebuilds its free space from them), and the stripe units the blocks use."""
        return extents(self._conn)

    def _extents_by_row(self):
        return extents_by_row(self._conn)

    # ------------------------------------------------------------------------------ nodes
    # (those in memory and their rows are NodeRows': kvfs/catalog/sqlite_nodes.py; the ones
    # with no row yet, pending, or no name any more, unlinked, are asked about here first)
    def find(self, ino: int) -> Node | None:
        node = self._unlinked.get(ino)
        if node is not None:
            return node
        return self.node_rows.find(ino)

    def lookup(self, parent: int, name: bytes) -> Node:
        if len(name) > NAME_MAX:  # no such name can exist; ext4 and tmpfs say so too
            raise KvfsError(errno.ENAMETOOLONG, f"file name longer than {NAME_MAX} bytes")
        self.dir(parent)
        ino = self._pending_names.get((parent, name))
        if ino is not None:
            return self._pending[ino]
        return self.node_rows.lookup(parent, name)

    def _child(self, d: Node, name: bytes) -> int | None:
        ino = self._pending_names.get((d.ino, name))
        if ino is not None:
            return ino
        return self.node_rows.child(d.ino, name)

    def _enter(self, parent: Node, node: Node) -> None:
        if not node.persisted:
            self._pending_names[(parent.ino, node.name)] = node.ino
        self.node_rows.entered(parent.ino, node)

    def _leave(self, parent: Node, node: Node) -> None:
        if not node.persisted:
            self._pending_names.pop((parent.ino, node.name), None)
        self.node_rows.left(parent.ino, node)

    def _has_children(self, d: Node) -> bool:
        if any(n.parent == d.ino and n.linked for n in self._pending.values()):
            return True
        return (
            self._conn.execute("SELECT 1 FROM nodes WHERE parent=? LIMIT 1", (d.ino,)).fetchone()
            is not None
        )

    def listing(self, ino: int) -> SqliteListing:
        self.dir(ino)
        return SqliteListing(self, ino)

    def files(self) -> Iterator[Node]:
        """Every file with a committed block (a scan of the whole catalog: tests and tools)."""
        last = 0
        while True:
            rows = self._conn.execute(
                f"SELECT {COLS} FROM nodes WHERE ino>? AND blob IS NOT NULL ORDER BY ino LIMIT ?",
                (last, PAGE_ROWS),
            ).fetchall()
            if not rows:
                return
            for r in rows:
                yield self.node_rows.from_row(r)
            last = rows[-1][0]

    def layouts(self):
        return (n.blob.layout for n in self.files())

    def pinned_files(self) -> list[Node]:
        rows = self._conn.execute(
            "SELECT ino FROM xattrs WHERE name=? AND value=?", (b"user.kvfs.pin", b"1")
        ).fetchall()
        nodes = [self.find(ino) for (ino,) in rows]
        return [n for n in nodes if n is not None and n.blob is not None]

    @property
    def node_count(self) -> int:
        return self._nodes + len(self._pending)

    @property
    def file_count(self) -> int:
        return self._files

    def cache_statistics(self) -> dict:
        group = self.group
        return {
            "wal_syncs": group.syncs,
            "commit_sql_seconds": round(group.sql_seconds, 4),
            "wal_sync_seconds": round(group.sync_seconds, 4),
            "cached_nodes": self.node_rows.cached,
            "live_nodes": self.node_rows.live,
            "pending_nodes": len(self._pending),
            "unlinked_nodes": len(self._unlinked),
            "dirty_atimes": self.order.unsaved_count,
            "cache_limit": self.node_rows.cache_nodes,
        }

    def _register(self, node: Node) -> None:
        self.node_rows.add(node)
        self.chains.new_node(node.ino)
        if not node.persisted:
            self._pending[node.ino] = node

    def _persisted(self, node: Node) -> None:
        """A pending node got its row."""
        node.persisted = True
        self._pending.pop(node.ino, None)
        self._pending_names.pop((node.parent, node.name), None)
        self._nodes += 1

    def _detach(self, node: Node) -> None:
        super()._detach(node)
        self._pending.pop(node.ino, None)
        self._unlinked[node.ino] = node

    def drop(self, ino: int) -> None:
        node = self._unlinked.pop(ino, None)
        if node is not None:
            self.node_rows.uncache(ino)
            self.order.forget(ino)

    def statistics(self) -> dict:
        return {
            "wal_syncs": self.group.syncs,
            **self.cache_statistics(),
            "commit_sql_seconds": round(self.group.sql_seconds, 4),
            "wal_sync_seconds": round(self.group.sync_seconds, 4),
            "nodes": self.node_count,
            "files": self.file_count,
        }

    def _delete_node(self, node: Node) -> list[Stmt]:
        self._nodes -= 1
        if node.blob is not None:
            self._files -= 1
        self.order.forget(node.ino)
        self.chains.uncache(node.ino)
        self.group.mark_release()  # its block's space is free once this is durable
        return [
            ("DELETE FROM nodes WHERE ino=?", (node.ino,)),
            ("DELETE FROM xattrs WHERE ino=?", (node.ino,)),
        ] + self.chains.delete_stmts(node.ino)

    # ------------------------------------------------------------------------------ mutations
    def _parent_times(self, parent: Node) -> list[Stmt]:
        if not parent.persisted:
            return []
        return [
            (
                "UPDATE nodes SET mtime_ns=?, ctime_ns=? WHERE ino=?",
                (parent.mtime_ns, parent.ctime_ns, parent.ino),
            )
        ]

    async def _add(self, node: Node) -> None:
        """A new directory or symlink: in the tree first, then durable (out of the tree
        again if that fails: the caller gets the error, and the name does not exist)."""
        node.persisted = True
        self._place(node)
        self._nodes += 1
        try:
            await self.group.change(insert_node(node) + self._parent_times(self.get(node.parent)))
        except BaseException:
            # rolled back (or never executed): the row is not there, nor may the node be
            if node.linked:
                parent = self.find(node.parent)
                if parent is not None:
                    self._leave(parent, node)
                    if node.is_dir:
                        parent.subdirs -= 1
                node.linked = False
                self._nodes -= 1
            self.node_rows.forget(node.ino)
            raise

    async def commit(
        self, node: Node, layout: Layout, score: tuple[float, int] | None = None
    ) -> tuple[BlobRec, BlobRec | None]:
        """Make `layout` the file's committed content; return (new, old) versions. `score`:
        the file's new (priority, uses) in the pool's order, if the pool keeps one.

        A pending node is persisted now, under its current name. A node unlinked meanwhile is
        not persisted (its content is dropped by the caller). The old version goes with the
        row's update, in the same transaction.
        """
        return (await self.commit_batch([(node, layout, score)]))[0]

    async def commit_batch(
        self, items: list[tuple], mtimes: list[int] | None = None
    ) -> list[tuple[BlobRec, BlobRec | None]]:
        """`commit` for several files, each (node, layout, score), in one transaction and one
        wait for its WAL sync (the write-back flusher's batch, kvfs/write/writeback.py): each
        statement runs once with every file's parameters (executemany). `mtimes`: each
        file's modification time (the last write, not the write-back; default: now). All or
        none: if the transaction fails, every file keeps the version the database has."""
        out, undo, batches = [], [], {}
        for i, (node, layout, score) in enumerate(items):
            rec, old, before, stmts = self._prepare_commit(
                node, layout, score, mtimes[i] if mtimes is not None else None
            )
            out.append((rec, old))
            undo.append((node, old, before))
            for sql, params in stmts:
                batches.setdefault(sql, []).append(params)
        if not batches:
            return out
        try:
            if len(items) == 1:
                txn = self.group.execute([(sql, rows[0]) for sql, rows in batches.items()])
            else:
                txn = self.group.execute_many(list(batches.items()))
            await self.group.durable(txn)
        except BaseException:
            for node, old, before in undo:
                self._undo_commit(node, old, before)
            raise
        return out

    def _prepare_commit(self, node: Node, layout: Layout, score, mtime: int | None = None):
        """A commit applied to memory: (the new version, the old one, what to restore if it
        fails, the statements that make it durable)."""
        now = _now()
        rec = BlobRec(self.next_blob_id(), layout, now)
        old = node.blob
        before = (node.persisted, node.mtime_ns, node.ctime_ns, node.prio, node.uses)
        node.blob = rec
        node.mtime_ns = node.ctime_ns = now if mtime is None else mtime
        if score is not None:
            node.prio, node.uses = score
        if not node.linked:
            return rec, old, before, []
        self._announce(node, True)  # (durable with the transaction the statements go to)
        stmts: list[Stmt] = []
        if rec.id > self._blob_hwm:
            # Block ids are never reused (a reader's lease names one): the meta row records
            # one beyond the ids given, BLOB_ID_STEP at a time, rather than every id in every
            # commit. A restart then starts past it (ids skip at most one step).
            self._blob_hwm = rec.id + BLOB_ID_STEP
            stmts.append(
                ("INSERT OR REPLACE INTO meta VALUES ('blob_hwm', ?)", (str(self._blob_hwm),))
            )
        if node.persisted:
            ns, offs, sums = layout.pack()
            stmts.append(
                (
                    "UPDATE nodes SET blob=?, size=?, unit=?, ns=?, offsets=?, sums=?, "
                    "blob_ns=?, mtime_ns=?, ctime_ns=?, mode=?, uid=?, gid=?, atime_ns=?, "
                    "prio=?, uses=? WHERE ino=?",
                    (
                        rec.id,
                        layout.size,
                        layout.unit,
                        ns,
                        offs,
                        sums,
                        now,
                        node.mtime_ns,
                        node.ctime_ns,
                        node.mode,
                        node.uid,
                        node.gid,
                        node.atime_ns,
                        node.prio,
                        node.uses,
                        node.ino,
                    ),
                )
            )
            self.order.forget(node.ino)
            if old is None:
                self._files += 1
            self.group.mark_release()  # the old version's row reference goes here
        else:
            self._persisted(node)
            self._files += 1
            stmts += insert_node(node)
        return rec, old, before, stmts

    def _undo_commit(self, node: Node, old: BlobRec | None, before: tuple) -> None:
        """Not durable: the file keeps the version the database has (the caller gives the new
        block's space back, so nothing may point at it); a new file is pending again."""
        node.blob = old
        was_persisted, node.mtime_ns, node.ctime_ns, node.prio, node.uses = before
        if node.linked:
            if not was_persisted:
                node.persisted = False
                self._nodes -= 1
                self._files -= 1
                self._pending[node.ino] = node
                self._pending_names[(node.parent, node.name)] = node.ino
            elif old is None:
                self._files -= 1

    async def remove(self, node: Node, expect: BlobRec | None = None, ghosts: int = 0) -> Node:
        """Unlink a file by node (eviction uses this; on one node nothing else can have
        replaced `expect`). `ghosts`: remember the name's uses among the `ghosts` names
        evicted last (in the same transaction)."""
        p = self.get(node.parent)
        self._detach(node)
        node.ctime_ns = _now()
        if node.persisted:
            ghost = self.order.ghost(node, ghosts) if ghosts and node.uses else []
            stmts = self._delete_node(node) + self._parent_times(p) + ghost
            # an eviction (`expect`) frees space a writer waits for: durable before it returns
            await (self.group.persist(stmts) if expect is not None else self.group.change(stmts))
        else:
            self._forget_links(node.ino)
        return node

    async def rmdir(self, parent: int, name: bytes) -> Node:
        node = self._removable_dir(parent, name)
        p = self.get(node.parent)
        self._detach(node)
        await self.group.change(self._delete_node(node) + self._parent_times(p))
        return node

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
        if flags & RENAME_EXCHANGE:
            return await self._exchange(src, target)
        stmts: list[Stmt] = []
        if target is not None:
            self._detach(target)
            if target.persisted:
                stmts += self._delete_node(target)
            else:
                self._forget_links(target.ino)
        now = _now()
        self._move(src, pold, pnew, name_new, now)
        if src.persisted:
            stmts.append(
                (
                    "UPDATE nodes SET parent=?, name=?, cookie=?, ctime_ns=? WHERE ino=?",
                    (src.parent, src.name, src.cookie, now, src.ino),
                )
            )
        stmts += self._parent_times(pold)
        if pnew is not pold:
            stmts += self._parent_times(pnew)
        if stmts:
            await self.group.change(stmts)
        return target

    async def _exchange(self, a: Node, b: Node) -> None:
        now = _now()
        self._swap(a, b, now)
        stmts: list[Stmt] = []
        # Two rows swap names under a UNIQUE(parent, name) index: park one first.
        if a.persisted and b.persisted:
            stmts.append(("UPDATE nodes SET parent=0, name=? WHERE ino=?", (b"\0swap", a.ino)))
        for n in (b, a):
            if n.persisted:
                stmts.append(
                    (
                        "UPDATE nodes SET parent=?, name=?, cookie=?, ctime_ns=? WHERE ino=?",
                        (n.parent, n.name, n.cookie, now, n.ino),
                    )
                )
        if stmts:
            await self.group.change(stmts)
        return None

    async def setattr(
        self,
        node: Node,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        atime_ns: int | None = None,
        mtime_ns: int | None = None,
    ) -> None:
        if mode is not None:
            node.mode = (node.mode & ~0o7777) | (mode & 0o7777)
        if uid is not None:
            node.uid = uid
        if gid is not None:
            node.gid = gid
        if atime_ns is not None:
            node.atime_ns = atime_ns
        if mtime_ns is not None:
            node.mtime_ns = mtime_ns
        node.ctime_ns = _now()
        if node.persisted and node.linked:
            self.order.forget(node.ino)
            await self.group.change(
                [
                    (
                        "UPDATE nodes SET mode=?, uid=?, gid=?, atime_ns=?, mtime_ns=?, "
                        "ctime_ns=?, prio=?, uses=? WHERE ino=?",
                        (
                            node.mode,
                            node.uid,
                            node.gid,
                            node.atime_ns,
                            node.mtime_ns,
                            node.ctime_ns,
                            node.prio,
                            node.uses,
                            node.ino,
                        ),
                    )
                ]
            )

    async def set_xattr(self, node: Node, name: bytes, value: bytes) -> None:
        node.xattrs[name] = value
        node.ctime_ns = _now()
        if node.persisted and node.linked:
            await self.group.change(
                [("INSERT OR REPLACE INTO xattrs VALUES (?,?,?)", (node.ino, name, value))]
            )

    async def remove_xattr(self, node: Node, name: bytes) -> None:
        if name not in node.xattrs:
            raise KvfsError(errno.ENODATA, f"no such attribute: {name.decode(errors='replace')}")
        del node.xattrs[name]
        node.ctime_ns = _now()
        if node.persisted and node.linked:
            await self.group.change(
                [("DELETE FROM xattrs WHERE ino=? AND name=?", (node.ino, name))]
            )
