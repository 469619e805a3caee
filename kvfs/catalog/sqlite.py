"""The single-node catalog: the tree lives in SQLite (WAL mode), a bounded cache of nodes in front.

SQLite is the truth. Memory holds only what is in use or recently used, so a catalog of millions
of files costs a few megabytes and opens in a moment:

* `_live`: every `Node` object somebody holds (a weak map), so one inode is always one object;
  `_cache`: the `cache_nodes` most recently used nodes, kept alive (an LRU); with the names
  of cached nodes and those found absent (kvfs/catalog/sqlite_nodes.py).
* `_pending`: files created and never committed (no row: absent after a crash), by inode and
  by (parent, name); `_unlinked`: removed nodes that handles or the kernel still use, until
  `drop`. A node whose memory differs from its row is held by one of these, so evicting a
  node from the cache never loses a change.
* `_dirty_atime`: accesses not persisted yet (inode -> (atime in ns, the pool order's priority
  and uses); written in batches and applied to a node read back from its row (the pool's
  order: kvfs/catalog/sqlite_order.py).

Queries run on the trio thread against the one connection: a lookup is an index probe on
(parent, name), readdir pages through an index on (parent, cookie), the pool's LRU order is
an index on max(atime, mtime) (or on the policy's priority under `pool.evict = "prefix"`),
chains are rows of `links` (kvfs/catalog/sqlite_chains.py). With the database in the page
cache each costs a few microseconds.

Mutations are applied to memory and executed on the connection at once, in the transaction
that is open (so every later query sees them), then wait for durability. Group commit: the
first waiter commits the open transaction (on the trio thread; `synchronous=NORMAL` writes the
WAL without syncing it) and `fdatasync`s the WAL in a worker thread; statements executed
meanwhile go to the next transaction, whose waiters are served by the next round. A reply
therefore waits for a WAL sync that started after its statements were committed: durable at
close, with one transaction and one sync for every mutation of a burst.

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
from typing import Iterator

import numpy as np

from kvfs.catalog.base import FIRST_INO, ROOT_INO, BlobRec, Node
from kvfs.catalog.groupcommit import CommitHooks, GroupCommit
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
            nodes = [cat._from_row(r) for r in rows]
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


class SqliteCatalog(GroupCommit, OrderRows, NodeRows, TreeCatalog):
    """The catalog. Mutating methods are async (they wait for durability); queries are not."""

    tree_children = False

    def __init__(self, conn: sqlite3.Connection, path: Path, hooks: CommitHooks = CommitHooks()):
        super().__init__(hooks.announcer)
        del self.nodes  # no memory tree: see find() and the module doc
        del self.successors, self.predecessors, self._dirty_links
        self._conn = conn
        self.path = path
        self.opened_with: str | None = None  # what wal_damage found at open
        self._pending: dict[int, Node] = {}
        self._pending_names: dict[tuple[int, bytes], int] = {}
        self._unlinked: dict[int, Node] = {}
        self._nodes = 0  # rows (persisted nodes)
        self._files = 0  # rows with a block
        self._init_nodes()
        self._init_order()
        self._init_group_commit(hooks)
        # the prefix chains' rows and caches: an object of their own (sqlite_chains.py)
        self.chains = SqliteChains(conn, self.find, self._execute, self._execute_many, self.sync)

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

    def _one(self, sql: str, params: tuple = ()):
        return self._conn.execute(sql, params).fetchone()[0]

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

    def close(self) -> None:
        """Commit and sync what is open, then close (SQLite checkpoints the WAL)."""
        if self._in_txn and not self.failure:
            try:
                self._conn.execute("COMMIT")
            except sqlite3.Error as e:
                log.error("catalog %s: the last commit failed: %s", self.path, e)
            self._in_txn = False
        self._conn.close()
        if self._wal_fd is not None:
            os.close(self._wal_fd)
            self._wal_fd = None

    def extents(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(namespace, offset, length) of every stripe unit of every block, as arrays (the pool
        rebuilds its free space from them), and the stripe units the blocks use."""
        return extents(self._conn)

    def _extents_by_row(self):
        return extents_by_row(self._conn)

    # ------------------------------------------------------------------------------ nodes
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
                yield self._from_row(r)
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
        return {
            "wal_syncs": self.syncs,
            "commit_sql_seconds": round(self.sql_seconds, 4),
            "wal_sync_seconds": round(self.sync_seconds, 4),
            "cached_nodes": len(self._cache),
            "live_nodes": len(self._live),
            "pending_nodes": len(self._pending),
            "unlinked_nodes": len(self._unlinked),
            "dirty_atimes": len(self._dirty_atime),
            "cache_limit": self.cache_nodes,
        }

    def _register(self, node: Node) -> None:
        self._live[node.ino] = node
        self._remember(node)
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
            self._cache.pop(ino, None)
            self._dirty_atime.pop(ino, None)

    def statistics(self) -> dict:
        return {
            "wal_syncs": self.syncs,
            **self.cache_statistics(),
            "commit_sql_seconds": round(self.sql_seconds, 4),
            "wal_sync_seconds": round(self.sync_seconds, 4),
            "nodes": self.node_count,
            "files": self.file_count,
        }

    @staticmethod
    def _insert_node(node: Node) -> list[Stmt]:
        b = node.blob
        blob = (
            (b.id, b.layout.size, b.layout.unit, *b.layout.pack(), b.created_ns)
            if b is not None
            else (None,) * 7
        )
        out: list[Stmt] = [
            (
                f"INSERT INTO nodes ({COLS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    node.ino,
                    node.parent,
                    node.name,
                    node.cookie,
                    node.mode,
                    node.uid,
                    node.gid,
                    node.atime_ns,
                    node.mtime_ns,
                    node.ctime_ns,
                    node.target,
                    *blob,
                    node.prio,
                    node.uses,
                ),
            )
        ]
        for name, value in node.xattrs.items():
            out.append(("INSERT INTO xattrs VALUES (?,?,?)", (node.ino, name, value)))
        return out

    def _delete_node(self, node: Node) -> list[Stmt]:
        self._nodes -= 1
        if node.blob is not None:
            self._files -= 1
        self._dirty_atime.pop(node.ino, None)
        self.chains.uncache(node.ino)
        self._release_mark = self._txn  # its block's space is free once this is durable
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
            await self._change(self._insert_node(node) + self._parent_times(self.get(node.parent)))
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
            self._live.pop(node.ino, None)
            self._cache.pop(node.ino, None)
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
                txn = self._execute([(sql, rows[0]) for sql, rows in batches.items()])
            else:
                txn = self._execute_many(list(batches.items()))
            await self._durable(txn)
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
            self._dirty_atime.pop(node.ino, None)
            if old is None:
                self._files += 1
            self._release_mark = self._txn  # the old version's row reference goes here
        else:
            self._persisted(node)
            self._files += 1
            stmts += self._insert_node(node)
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
            ghost = self._ghost(node, ghosts) if ghosts and node.uses else []
            stmts = self._delete_node(node) + self._parent_times(p) + ghost
            # an eviction (`expect`) frees space a writer waits for: durable before it returns
            await (self._persist(stmts) if expect is not None else self._change(stmts))
        else:
            self._forget_links(node.ino)
        return node

    async def rmdir(self, parent: int, name: bytes) -> Node:
        node = self._removable_dir(parent, name)
        p = self.get(node.parent)
        self._detach(node)
        await self._change(self._delete_node(node) + self._parent_times(p))
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
            await self._change(stmts)
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
            await self._change(stmts)
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
            self._dirty_atime.pop(node.ino, None)
            await self._change(
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
            await self._change(
                [("INSERT OR REPLACE INTO xattrs VALUES (?,?,?)", (node.ino, name, value))]
            )

    async def remove_xattr(self, node: Node, name: bytes) -> None:
        if name not in node.xattrs:
            raise KvfsError(errno.ENODATA, f"no such attribute: {name.decode(errors='replace')}")
        del node.xattrs[name]
        node.ctime_ns = _now()
        if node.persisted and node.linked:
            await self._change([("DELETE FROM xattrs WHERE ino=? AND name=?", (node.ino, name))])
