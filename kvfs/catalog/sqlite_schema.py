"""The SQLite catalog's database: its schema and queries, the check of its write-ahead log
before SQLite opens it, the upgrades from schemas 1 and 2, and the free map's rebuild from the rows
(kvfs/catalog/sqlite.py is the catalog that uses them)."""

from __future__ import annotations

import logging
import sqlite3
import struct
from pathlib import Path

import numpy as np

from kvfs.catalog.records import Node
from kvfs.pool.layout import PAGE

log = logging.getLogger("kvfs.catalog")

SCHEMA_VERSION = 3
S_IFMT, S_IFDIR = 0o170000, 0o040000

TABLES = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS xattrs (
    ino INTEGER NOT NULL, name BLOB NOT NULL, value BLOB NOT NULL, PRIMARY KEY (ino, name));
CREATE TABLE IF NOT EXISTS links (
    pred INTEGER NOT NULL, succ INTEGER NOT NULL, source INTEGER NOT NULL, weight REAL NOT NULL,
    PRIMARY KEY (pred, succ));
CREATE TABLE IF NOT EXISTS ghosts (
    seq INTEGER PRIMARY KEY, key INTEGER NOT NULL UNIQUE, uses INTEGER NOT NULL);
"""
# One row per node; a file's committed block (its generation, size, stripe unit and per-unit
# namespace / offset / checksum arrays) is part of its row, and so is its place in the pool's
# eviction order under `pool.evict = "prefix"` (`prio`, `uses`: kvfs.tiers.scoring.PrefixScore; NULL
# and 0 under "lru"). `ghosts` remembers the uses of names evicted last (key: a hash of the
# directory's inode and the name).
NODES_TABLE = """
CREATE TABLE nodes (
    ino INTEGER PRIMARY KEY, parent INTEGER NOT NULL, name BLOB NOT NULL,
    cookie INTEGER NOT NULL, mode INTEGER NOT NULL, uid INTEGER NOT NULL, gid INTEGER NOT NULL,
    atime_ns INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, ctime_ns INTEGER NOT NULL,
    target BLOB, blob INTEGER, size INTEGER, unit INTEGER, ns BLOB, offsets BLOB, sums BLOB,
    blob_ns INTEGER, prio REAL, uses INTEGER NOT NULL DEFAULT 0);
"""
INDEXES = f"""
CREATE UNIQUE INDEX IF NOT EXISTS nodes_name ON nodes (parent, name);
CREATE INDEX IF NOT EXISTS nodes_cookie ON nodes (parent, cookie);
CREATE INDEX IF NOT EXISTS nodes_subdirs ON nodes (parent) WHERE (mode & {S_IFMT}) = {S_IFDIR};
CREATE INDEX IF NOT EXISTS nodes_lru ON nodes (max(atime_ns, mtime_ns)) WHERE blob IS NOT NULL;
CREATE INDEX IF NOT EXISTS nodes_prio ON nodes (prio, max(atime_ns, mtime_ns), ino)
    WHERE blob IS NOT NULL AND prio IS NOT NULL;
CREATE INDEX IF NOT EXISTS links_succ ON links (succ);
"""
COLS = (
    "ino, parent, name, cookie, mode, uid, gid, atime_ns, mtime_ns, ctime_ns, target, "
    "blob, size, unit, ns, offsets, sums, blob_ns, prio, uses"
)
# a lookup's row also says how many xattrs the node has, so a node without any (most) needs no
# second query for them
_XATTR_COUNT = "(SELECT count(*) FROM xattrs WHERE xattrs.ino = nodes.ino)"
BY_INO = f"SELECT {COLS}, {_XATTR_COUNT} FROM nodes WHERE ino=?"
BY_NAME = f"SELECT {COLS}, {_XATTR_COUNT} FROM nodes WHERE parent=? AND name=?"
PAGE_ROWS = 128  # rows per page of the paged queries (readdir, the pool order)
PAGE_QUERY = f"SELECT {COLS} FROM nodes WHERE parent=? AND cookie>? ORDER BY cookie LIMIT ?"
SUBDIRS = f"SELECT count(*) FROM nodes WHERE parent=? AND (mode & {S_IFMT}) = {S_IFDIR}"
LRU_QUERY = (
    "SELECT max(atime_ns, mtime_ns), ino, blob FROM nodes WHERE blob IS NOT NULL AND "
    "(max(atime_ns, mtime_ns), ino) > (?, ?) ORDER BY max(atime_ns, mtime_ns), ino LIMIT ?"
)

# (equal priorities: least recently used first)
PRIO_QUERY = (
    "SELECT prio, max(atime_ns, mtime_ns), ino, blob FROM nodes WHERE blob IS NOT NULL "
    "AND prio IS NOT NULL AND (prio, max(atime_ns, mtime_ns), ino) > (?, ?, ?) "
    "ORDER BY prio, max(atime_ns, mtime_ns), ino LIMIT ?"
)
# Files stored under "lru" (no priority) get one when "prefix" takes over: below every scored
# file (-1 to 0), in their order of last use.
SCORE_UNSCORED = (
    "UPDATE nodes SET prio = r.p FROM (SELECT ino, (row_number() OVER (ORDER BY "
    "max(atime_ns, mtime_ns), ino)) * 1.0 / (count(*) OVER ()) - 1.0 AS p FROM "
    "nodes WHERE blob IS NOT NULL AND prio IS NULL) AS r WHERE nodes.ino = r.ino"
)

Stmt = tuple[str, tuple]


def insert_node(node: Node) -> list[Stmt]:
    """The statements that give a node its row (and its xattrs theirs)."""
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
        return (
            f"its write-ahead log {wal} ends in a partial frame ({partial} of {frame} "
            f"bytes): it was cut short. After a crash mid-transaction nothing committed is "
            f"lost; if the file was truncated or damaged, the changes after its last intact "
            f"commit are (files closed after it are missing)"
        )
    return None


def migrate_v1(conn: sqlite3.Connection, path) -> None:
    """Schema 1 (a `blobs` table) to 2 (the block in the node's row), in one transaction."""
    c = conn
    log.info("catalog %s: upgrading the schema from version 1 to %d", path, SCHEMA_VERSION)
    with c:
        c.execute("BEGIN")
        c.execute(NODES_TABLE.replace("CREATE TABLE nodes", "CREATE TABLE nodes2"))
        c.execute(
            f"INSERT INTO nodes2 ({COLS}) SELECT n.ino, n.parent, n.name, n.cookie, "
            f"n.mode, n.uid, n.gid, n.atime_ns, n.mtime_ns, n.ctime_ns, n.target, b.id, "
            f"b.size, b.unit, b.ns, b.offsets, b.sums, b.created_ns, NULL, 0 FROM nodes n "
            f"LEFT JOIN blobs b ON b.id = n.blob"
        )
        c.execute("DROP TABLE nodes")
        c.execute("DROP TABLE blobs")
        c.execute("ALTER TABLE nodes2 RENAME TO nodes")
        c.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))


def migrate_v2(conn: sqlite3.Connection, path) -> None:
    """Schema 2 to 3: the pool policy's columns (the index and the ghosts' table are made by
    TABLES and INDEXES, as for a new catalog)."""
    log.info("catalog %s: upgrading the schema from version 2 to %d", path, SCHEMA_VERSION)
    with conn:
        conn.execute("BEGIN")
        conn.execute("ALTER TABLE nodes ADD COLUMN prio REAL")
        conn.execute("ALTER TABLE nodes ADD COLUMN uses INTEGER NOT NULL DEFAULT 0")
        conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))


def extents(conn: sqlite3.Connection) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(namespace, offset, length) of every stripe unit of every block, as arrays (the pool
    rebuilds its free space from them), and the stripe units the blocks use.

    SQLite concatenates the rows' packed arrays in one aggregate query (sizes and unit
    counts as fixed-width hex), so no Python object is made per row: about a second for a
    million blocks when the database is cached."""
    try:
        ns, off, sizes, counts, umin, umax = conn.execute(
            "SELECT CAST(group_concat(ns, '') AS BLOB), CAST(group_concat(offsets, '') AS "
            "BLOB), group_concat(printf('%016x', size), ''), "
            "group_concat(printf('%08x', length(ns) / 2), ''), min(unit), max(unit) "
            "FROM nodes WHERE blob IS NOT NULL"
        ).fetchone()
    except sqlite3.Error:  # too big for one value: row by row
        return extents_by_row(conn)
    if sizes is None:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, empty
    units = np.unique(np.asarray([umin, umax], dtype=np.int64))
    if len(units) > 1:  # blocks of several stripe units: each one
        units = np.asarray(
            [u for (u,) in conn.execute("SELECT DISTINCT unit FROM nodes WHERE blob IS NOT NULL")],
            dtype=np.int64,
        )
        return (*extents_by_row(conn)[:3], units)
    return (
        *unit_extents(
            np.frombuffer(ns or b"", dtype=np.uint16),
            np.frombuffer(off or b"", dtype=np.uint64),
            np.frombuffer(bytes.fromhex(sizes), dtype=">u8").astype(np.int64),
            np.frombuffer(bytes.fromhex(counts), dtype=">u4").astype(np.int64),
            int(umin),
        ),
        units,
    )


def unit_extents(ns, off, sizes, counts, unit) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-unit (namespace, offset, stored length) from per-block sizes and unit counts."""
    ns = ns.astype(np.int64)
    off = off.astype(np.int64)
    first = np.cumsum(counts) - counts
    k = np.arange(len(ns), dtype=np.int64) - np.repeat(first, counts)
    size = np.repeat(sizes, counts)
    unit = (
        np.repeat(np.asarray(unit, dtype=np.int64), len(ns))
        if np.ndim(unit) == 0
        else np.repeat(unit, counts)
    )
    content = np.minimum(unit, size - k * unit)
    return ns, off, (content + PAGE - 1) // PAGE * PAGE


def extents_by_row(conn: sqlite3.Connection):
    ns_parts: list[bytes] = []
    off_parts: list[bytes] = []
    sizes: list[int] = []
    units: list[int] = []
    cur = conn.execute("SELECT size, unit, ns, offsets FROM nodes WHERE blob IS NOT NULL")
    while True:
        rows = cur.fetchmany(65536)
        if not rows:
            break
        s, u, n, o = zip(*rows)
        sizes += s
        units += u
        ns_parts += n
        off_parts += o
    counts = np.fromiter(map(len, ns_parts), dtype=np.int64, count=len(ns_parts)) // 2
    u = np.asarray(units, dtype=np.int64)
    return (
        *unit_extents(
            np.frombuffer(b"".join(ns_parts), dtype=np.uint16),
            np.frombuffer(b"".join(off_parts), dtype=np.uint64),
            np.asarray(sizes, dtype=np.int64),
            counts,
            u,
        ),
        np.unique(u),
    )
