"""The single-node catalog: an in-memory tree, persisted to SQLite in WAL mode.

Reads never touch SQLite: the whole tree lives in memory (a few hundred bytes per file), so
lookups, getattr and readdir cost no I/O and no thread hop. Every mutation is applied to memory
first, on the trio thread, and then persisted; the caller's reply waits until SQLite has
committed it with `synchronous=FULL` (fsync of the WAL). Mutations are persisted in the order
they were applied, and concurrent ones share a transaction (group commit): one fsync for a burst
of closes.

Crash safety: a commit of a file version is one transaction (blob row + node row + the old
blob's deletion), so after a crash a file has its old version or its new one, never a mix. A
pending file (created, never committed) has no row at all and is absent after a crash. Space
written for a version whose transaction never committed is not referenced by any row and is
free again when the pool rebuilds its free map from the catalog at start-up.

If SQLite fails to commit (disk full, I/O error) the memory tree is ahead of the disk: the
catalog then refuses every further mutation with EIO until the daemon is restarted, which
reloads the last committed state; meanwhile the pool frees no extent (`on_failure`), so none
that the disk's catalog references is written again. A failed commit or mkdir leaves the
memory as the disk has it.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import stat
import struct
import time
from pathlib import Path

import trio

from kvfs.catalog.base import FIRST_INO, ROOT_INO, BlobRec, Node
from kvfs.catalog.tree import RENAME_EXCHANGE, TreeCatalog, _now
from kvfs.errors import KvfsError, StartupError
from kvfs.layout import Layout

log = logging.getLogger("kvfs.catalog")

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS blobs (
    id INTEGER PRIMARY KEY, size INTEGER NOT NULL, unit INTEGER NOT NULL,
    ns BLOB NOT NULL, offsets BLOB NOT NULL, sums BLOB NOT NULL, created_ns INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS nodes (
    ino INTEGER PRIMARY KEY, parent INTEGER NOT NULL, name BLOB NOT NULL,
    cookie INTEGER NOT NULL, mode INTEGER NOT NULL, uid INTEGER NOT NULL, gid INTEGER NOT NULL,
    atime_ns INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, ctime_ns INTEGER NOT NULL,
    blob INTEGER REFERENCES blobs(id), target BLOB,
    UNIQUE (parent, name));
CREATE TABLE IF NOT EXISTS xattrs (
    ino INTEGER NOT NULL, name BLOB NOT NULL, value BLOB NOT NULL, PRIMARY KEY (ino, name));
CREATE TABLE IF NOT EXISTS links (
    pred INTEGER NOT NULL, succ INTEGER NOT NULL, source INTEGER NOT NULL, weight REAL NOT NULL,
    PRIMARY KEY (pred, succ));
"""

Stmt = tuple[str, tuple]

WAL_MAGIC = (0x377F0682, 0x377F0683)
WAL_HEADER, WAL_FRAME_HEADER = 32, 24


def wal_damage(path: Path) -> str | None:
    """What is wrong with the catalog's write-ahead log (read before SQLite opens it), or None.
    A log that ends in a partial frame was cut short: by a crash while a transaction was
    being written (nothing committed is lost: close() had not returned), or by damage or
    truncation of the file (then SQLite drops every change after the last intact commit)."""
    wal = Path(str(path) + "-wal")
    try:
        size = wal.stat().st_size
        with open(wal, "rb") as f:
            head = f.read(WAL_HEADER)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"cannot read its write-ahead log {wal}: {e.strerror}"
    if size == 0:
        return None
    if len(head) < WAL_HEADER:
        return f"its write-ahead log {wal} is cut short ({size} bytes, less than its header)"
    magic, _, page = struct.unpack(">III", head[:12])
    if magic not in WAL_MAGIC or page < 512 or page & (page - 1):
        return f"its write-ahead log {wal} has no valid header (damaged?)"
    frame = WAL_FRAME_HEADER + page
    partial = (size - WAL_HEADER) % frame
    if partial:
        return (f"its write-ahead log {wal} ends in a partial frame ({partial} of {frame} "
                f"bytes): it was cut short. After a crash mid-transaction nothing committed is "
                f"lost; if the file was truncated or damaged, the changes after its last intact "
                f"commit are (files closed after it are missing)")
    return None


class _Batch:
    __slots__ = ("stmts", "done", "error")

    def __init__(self) -> None:
        self.stmts: list[Stmt] = []
        self.done = False
        self.error: BaseException | None = None


class SqliteCatalog(TreeCatalog):
    """The catalog. Mutating methods are async (they wait for durability); queries are not."""

    def __init__(self, conn: sqlite3.Connection, path: Path):
        super().__init__()
        self._conn = conn
        self.path = path
        self._batch = _Batch()
        self._commit_lock = trio.Lock()
        self.opened_with: str | None = None    # what wal_damage found at open

    # ------------------------------------------------------------------------------ opening
    @classmethod
    def open(cls, path: Path) -> "SqliteCatalog":
        """Open (creating if absent) the catalog database and load it into memory."""
        damage = wal_damage(path)       # before SQLite reads (and then resets) the log
        if damage:
            log.warning("catalog %s: %s", path, damage)
        try:
            conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=OFF")
            conn.executescript(_SCHEMA)
        except sqlite3.Error as e:
            raise StartupError(f"catalog {path}: cannot open: {e}") from None
        cat = cls(conn, path)
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
            with c:
                c.execute("BEGIN")
                c.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                c.execute("INSERT OR IGNORE INTO nodes VALUES (?,?,?,?,?,?,?,?,?,?,NULL,NULL)",
                          (ROOT_INO, ROOT_INO, b"", 0, stat.S_IFDIR | 0o755, os.geteuid(),
                           os.getegid(), now, now, now))
        elif int(version) != SCHEMA_VERSION:
            raise StartupError(f"catalog {self.path}: schema version {version} is not supported "
                               f"(this kvfs uses {SCHEMA_VERSION})")
        self.pool_id = self._meta("pool_id")
        blobs: dict[int, BlobRec] = {}
        for bid, size, unit, ns, offs, sums, created in c.execute(
                "SELECT id, size, unit, ns, offsets, sums, created_ns FROM blobs"):
            blobs[bid] = BlobRec(bid, Layout.unpack(size, unit, ns, offs, sums), created)
        used_blobs: set[int] = set()
        for row in c.execute("SELECT ino, parent, name, cookie, mode, uid, gid, atime_ns, "
                             "mtime_ns, ctime_ns, blob, target FROM nodes"):
            ino, parent, name, cookie, mode, uid, gid, at, mt, ct, bid, target = row
            node = Node(ino, parent, bytes(name), mode, uid, gid, at, mt, ct, cookie=cookie,
                        target=bytes(target) if target is not None else None, persisted=True)
            if stat.S_ISDIR(mode):
                node.children = {}
            if bid is not None:
                node.blob = blobs.get(bid)
                if node.blob is None:
                    raise StartupError(f"catalog {self.path}: file {ino} refers to missing "
                                       f"block {bid}")
                used_blobs.add(bid)
            self.nodes[ino] = node
        for ino, name, value in c.execute("SELECT ino, name, value FROM xattrs"):
            if ino in self.nodes:
                self.nodes[ino].xattrs[bytes(name)] = bytes(value)
        if ROOT_INO not in self.nodes:
            raise StartupError(f"catalog {self.path}: the root directory is missing")
        orphans = []
        for node in self.nodes.values():
            if node.ino == ROOT_INO:
                continue
            parent = self.nodes.get(node.parent)
            if parent is None or parent.children is None:
                orphans.append(node)
                continue
            parent.children[node.name] = node.ino
            if node.children is not None:
                parent.subdirs += 1
        if orphans:   # cannot happen with atomic transactions; repair rather than refuse
            log.error("catalog: %d node(s) without a parent directory; removing them", len(orphans))
            with c:
                c.execute("BEGIN")
                for node in orphans:
                    c.execute("DELETE FROM nodes WHERE ino=?", (node.ino,))
                    c.execute("DELETE FROM xattrs WHERE ino=?", (node.ino,))
                    if node.blob is not None:
                        used_blobs.discard(node.blob.id)
                    del self.nodes[node.ino]
        for pred, succ, source, weight in c.execute("SELECT pred, succ, source, weight FROM links"):
            if pred in self.nodes and succ in self.nodes:
                self.successors.setdefault(pred, {})[succ] = [source, weight]
                self.predecessors.setdefault(succ, set()).add(pred)
        unused = set(blobs) - used_blobs
        if unused:
            log.warning("catalog: dropping %d unreferenced block record(s)", len(unused))
            with c:
                c.execute("BEGIN")
                c.executemany("DELETE FROM blobs WHERE id=?", [(b,) for b in unused])
        self._next_ino = max([FIRST_INO - 1, *self.nodes]) + 1
        self._next_cookie = max([0, *(n.cookie for n in self.nodes.values())]) + 1
        hwm = int(self._meta("blob_hwm") or 0)
        self._next_blob = max([hwm, *blobs]) + 1

    def set_pool_id(self, pool_id: str) -> None:
        """Bind a new catalog to its pool (synchronous: start-up and `kvfs format` only)."""
        with self._conn:
            self._conn.execute("BEGIN")
            self._conn.execute("INSERT OR REPLACE INTO meta VALUES ('pool_id', ?)", (pool_id,))
        self.pool_id = pool_id

    def close(self) -> None:
        self._conn.close()

    # ------------------------------------------------------------------------------ persistence
    async def _persist(self, stmts: list[Stmt]) -> None:
        """Queue statements behind everything queued before; return once they are durable."""
        if self.failure:
            raise KvfsError(errno.EIO, self.failure)
        batch = self._batch
        batch.stmts.extend(stmts)
        with trio.CancelScope(shield=True):
            async with self._commit_lock:
                if not batch.done:
                    self._batch = _Batch()
                    try:
                        await trio.to_thread.run_sync(self._apply, batch.stmts)
                    except sqlite3.Error as e:
                        batch.error = e
                        self.failure = (f"catalog {self.path}: a write failed ({e}); refusing "
                                        f"changes until kvfs is restarted")
                        log.error(self.failure)
                        if self.on_failure is not None:
                            self.on_failure(self.failure)
                    batch.done = True
        if batch.error is not None:
            raise KvfsError(errno.EIO, f"catalog write failed: {batch.error}")

    def _apply(self, stmts: list[Stmt]) -> None:
        c = self._conn
        t = time.perf_counter()
        try:
            c.execute("BEGIN")
            for sql, params in stmts:
                c.execute(sql, params)
            c.execute("COMMIT")
        except BaseException:
            if c.in_transaction:
                c.execute("ROLLBACK")
            raise
        self.commits += 1
        self.statements += len(stmts)
        self.commit_seconds += time.perf_counter() - t

    @staticmethod
    def _insert_node(node: Node) -> list[Stmt]:
        out: list[Stmt] = [(
            "INSERT INTO nodes VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (node.ino, node.parent, node.name, node.cookie, node.mode, node.uid, node.gid,
             node.atime_ns, node.mtime_ns, node.ctime_ns,
             node.blob.id if node.blob else None, node.target))]
        for name, value in node.xattrs.items():
            out.append(("INSERT INTO xattrs VALUES (?,?,?)", (node.ino, name, value)))
        return out

    def _delete_node(self, node: Node) -> list[Stmt]:
        self._forget_links(node.ino)
        out: list[Stmt] = [("DELETE FROM nodes WHERE ino=?", (node.ino,)),
                           ("DELETE FROM xattrs WHERE ino=?", (node.ino,)),
                           ("DELETE FROM links WHERE pred=? OR succ=?", (node.ino, node.ino))]
        if node.blob is not None:
            out.append(("DELETE FROM blobs WHERE id=?", (node.blob.id,)))
        return out

    @staticmethod
    def _insert_blob(b: BlobRec) -> list[Stmt]:
        ns, offs, sums = b.layout.pack()
        return [("INSERT INTO blobs VALUES (?,?,?,?,?,?,?)",
                 (b.id, b.layout.size, b.layout.unit, ns, offs, sums, b.created_ns)),
                ("INSERT OR REPLACE INTO meta VALUES ('blob_hwm', ?)", (str(b.id),))]

    # ------------------------------------------------------------------------------ mutations
    def _parent_times(self, parent: Node) -> list[Stmt]:
        if not parent.persisted:
            return []
        return [("UPDATE nodes SET mtime_ns=?, ctime_ns=? WHERE ino=?",
                 (parent.mtime_ns, parent.ctime_ns, parent.ino))]

    async def _add(self, node: Node) -> None:
        """A new directory or symlink: in the tree first, then durable (out of the tree
        again if that fails: the caller gets the error, and the name does not exist)."""
        node.persisted = True
        self._place(node)
        try:
            await self._persist(self._insert_node(node) +
                                self._parent_times(self.nodes[node.parent]))
        except BaseException:
            parent = self.nodes[node.parent]
            if parent.children.get(node.name) == node.ino:
                del parent.children[node.name]
                if node.children is not None:
                    parent.subdirs -= 1
            self.nodes.pop(node.ino, None)
            node.linked = False
            raise

    async def commit(self, node: Node, layout: Layout) -> tuple[BlobRec, BlobRec | None]:
        """Make `layout` the file's committed content; return (new, old) versions.

        A pending node is persisted now, under its current name. A node unlinked meanwhile is
        not persisted (its content is dropped by the caller). The old version's record is
        deleted in the same transaction.
        """
        now = _now()
        rec = BlobRec(self.next_blob_id(), layout, now)
        old = node.blob
        before = (node.persisted, node.mtime_ns, node.ctime_ns)
        node.blob = rec
        node.mtime_ns = node.ctime_ns = now
        if not node.linked:
            return rec, old
        stmts = self._insert_blob(rec)
        if node.persisted:
            stmts.append(("UPDATE nodes SET blob=?, mtime_ns=?, ctime_ns=?, mode=?, uid=?, gid=?, "
                          "atime_ns=? WHERE ino=?", (rec.id, now, now, node.mode, node.uid,
                                                      node.gid, node.atime_ns, node.ino)))
        else:
            node.persisted = True
            stmts += self._insert_node(node)
        if old is not None:
            stmts.append(("DELETE FROM blobs WHERE id=?", (old.id,)))
        try:
            await self._persist(stmts)
        except BaseException:
            # not durable: the file keeps the version the disk has (the caller gives the new
            # block's space back, so nothing may point at it)
            node.blob = old
            node.persisted, node.mtime_ns, node.ctime_ns = before
            raise
        return rec, old

    async def remove(self, node: Node, expect: BlobRec | None = None) -> Node:
        """Unlink a file by node (eviction uses this; on one node nothing else can have
        replaced `expect`)."""
        p = self.nodes[node.parent]
        self._detach(node)
        node.ctime_ns = _now()
        if node.persisted:
            await self._persist(self._delete_node(node) + self._parent_times(p))
        return node

    async def rmdir(self, parent: int, name: bytes) -> Node:
        node = self._removable_dir(parent, name)
        p = self.nodes[node.parent]
        self._detach(node)
        await self._persist(self._delete_node(node) + self._parent_times(p))
        return node

    async def rename(self, parent_old: int, name_old: bytes, parent_new: int, name_new: bytes,
                     flags: int = 0) -> Node | None:
        """Atomically rename, replacing the target; return the replaced node (now unlinked)."""
        src, pold, pnew, target = self._rename_check(parent_old, name_old, parent_new, name_new,
                                                     flags)
        if target is src:
            return None
        if flags & RENAME_EXCHANGE:
            return await self._exchange(src, target)
        stmts: list[Stmt] = []
        if target is not None:
            self._detach(target)
            if target.persisted:
                stmts += self._delete_node(target)
        now = _now()
        self._move(src, pold, pnew, name_new, now)
        if src.persisted:
            stmts.append(("UPDATE nodes SET parent=?, name=?, cookie=?, ctime_ns=? WHERE ino=?",
                          (src.parent, src.name, src.cookie, now, src.ino)))
        stmts += self._parent_times(pold)
        if pnew is not pold:
            stmts += self._parent_times(pnew)
        if stmts:
            await self._persist(stmts)
        return target

    async def _exchange(self, a: Node, b: Node) -> None:
        now = _now()
        self._swap(a, b, now)
        stmts: list[Stmt] = []
        # Two rows swap names under a UNIQUE(parent, name) constraint: park one first.
        if a.persisted and b.persisted:
            stmts.append(("UPDATE nodes SET parent=0, name=? WHERE ino=?", (b"\0swap", a.ino)))
        for n in (b, a):
            if n.persisted:
                stmts.append(("UPDATE nodes SET parent=?, name=?, cookie=?, ctime_ns=? WHERE ino=?",
                              (n.parent, n.name, n.cookie, now, n.ino)))
        if stmts:
            await self._persist(stmts)
        return None

    async def setattr(self, node: Node, *, mode: int | None = None, uid: int | None = None,
                      gid: int | None = None, atime_ns: int | None = None,
                      mtime_ns: int | None = None) -> None:
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
            self._dirty_atime.discard(node.ino)
            await self._persist([("UPDATE nodes SET mode=?, uid=?, gid=?, atime_ns=?, mtime_ns=?, "
                                  "ctime_ns=? WHERE ino=?",
                                  (node.mode, node.uid, node.gid, node.atime_ns, node.mtime_ns,
                                   node.ctime_ns, node.ino))])

    async def set_xattr(self, node: Node, name: bytes, value: bytes) -> None:
        node.xattrs[name] = value
        node.ctime_ns = _now()
        if node.persisted and node.linked:
            await self._persist([("INSERT OR REPLACE INTO xattrs VALUES (?,?,?)",
                                  (node.ino, name, value))])

    async def remove_xattr(self, node: Node, name: bytes) -> None:
        if name not in node.xattrs:
            raise KvfsError(errno.ENODATA, f"no such attribute: {name.decode(errors='replace')}")
        del node.xattrs[name]
        node.ctime_ns = _now()
        if node.persisted and node.linked:
            await self._persist([("DELETE FROM xattrs WHERE ino=? AND name=?", (node.ino, name))])

    async def flush_atimes(self) -> int:
        """Persist the access times recorded since the last flush (for LRU order after restart)."""
        inos, self._dirty_atime = self._dirty_atime, set()
        stmts = [("UPDATE nodes SET atime_ns=? WHERE ino=?", (self.nodes[i].atime_ns, i))
                 for i in inos if i in self.nodes and self.nodes[i].linked]
        if stmts:
            await self._persist(stmts)
        return len(stmts)

    # ------------------------------------------------------------------------------ chains
    async def flush_links(self) -> int:
        """Persist chain links changed since the last flush."""
        dirty, self._dirty_links = self._dirty_links, set()
        stmts: list[Stmt] = []
        for pred, succ in dirty:
            cur = self.successors.get(pred, {}).get(succ)
            if cur is None:
                stmts.append(("DELETE FROM links WHERE pred=? AND succ=?", (pred, succ)))
            elif self.nodes.get(pred) and self.nodes[pred].persisted and \
                    self.nodes.get(succ) and self.nodes[succ].persisted:
                stmts.append(("INSERT OR REPLACE INTO links VALUES (?,?,?,?)",
                              (pred, succ, cur[0], cur[1])))
            else:
                self._dirty_links.add((pred, succ))       # persisted with its files, later
        if stmts:
            await self._persist(stmts)
        return len(stmts)
