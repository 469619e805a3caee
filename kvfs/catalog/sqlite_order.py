"""The pool's eviction order in the SQLite catalog (`OrderRows`, an object SqliteCatalog holds
as `order`): the rows read in order of last use (`pool.evict = "lru"`) or of priority
(`"prefix"`), the access times and scores not written yet, and the ghosts (the uses of names
evicted last).

Every read or write moves a file in the order (`rescore`): its access time, priority and uses
are kept in `_dirty_atime` (inode -> (atime in ns, priority, uses)) and written in batches into
the open transaction, at the latest every DIRTY_ATIMES accesses (they ride with the next
commit; `flush_atimes` makes them durable). A node read back from its row takes them (`unsaved`,
asked by kvfs/catalog/sqlite_nodes.py), and the order's queries merge them in at their
place: the rows are paged through an index on max(atime, mtime) (`nodes_lru`) or on the
priority (`nodes_prio`), PAGE_ROWS at a time, skipping the inodes whose accesses are still in
memory.
"""

from __future__ import annotations

import heapq
from typing import Callable, Iterator

from kvfs.catalog.groupcommit import GroupCommit
from kvfs.catalog.records import Node, ghost_key
from kvfs.catalog.sqlite_schema import LRU_QUERY, PAGE_ROWS, PRIO_QUERY, SCORE_UNSCORED, Stmt
from kvfs.errors import KvfsError

DIRTY_ATIMES = 4096  # access times kept in memory before they go to the database


class OrderRows:
    """The order's rows and the scores not written yet, over the catalog's connection: `group`
    (the catalog's group commit) takes the statements, `find` (the catalog's: a node by inode)
    says which blocks the unwritten scores belong to."""

    def __init__(self, conn, group: GroupCommit, find: Callable[[int], Node | None]) -> None:
        self._conn = conn
        self._group = group
        self.find = find
        self._dirty_atime: dict[int, tuple[int, float | None, int]] = {}
        self._ghost_puts = 0

    def rescore(self, node: Node) -> None:
        """The node's access time, priority or uses changed: written with the next batch."""
        if node.persisted and node.linked:
            self._dirty_atime[node.ino] = (node.atime_ns, node.prio, node.uses)
            if len(self._dirty_atime) >= DIRTY_ATIMES:
                self._write_atimes()

    def _write_atimes(self) -> int:
        """Write the recorded access times in the open transaction (they ride with the next
        commit; `flush_atimes` makes them durable)."""
        dirty, self._dirty_atime = self._dirty_atime, {}
        stmts = [
            ("UPDATE nodes SET atime_ns=?, prio=?, uses=? WHERE ino=?", (t, p, u, i))
            for i, (t, p, u) in dirty.items()
        ]
        if stmts:
            try:
                self._group.execute(stmts)
            except KvfsError:
                pass  # LRU hints: the next restart starts from older ones
        return len(stmts)

    async def flush_atimes(self) -> int:
        """Persist the access times recorded since the last flush (for LRU order after restart)."""
        n = self._write_atimes()
        await self._group.sync()
        return n

    def lru_files(self) -> Iterator[tuple[int, int]]:
        """(block id, inode) of the current blocks, least recently used (read or written)
        first: the pool's eviction order. Accesses not yet flushed to the rows are merged in
        at their place (a file read a minute ago is older than one written since)."""
        dirty = []
        for ino, (atime, _, _) in self._dirty_atime.items():
            node = self.find(ino)
            if node is not None and node.linked and node.blob is not None:
                dirty.append((max(atime, node.mtime_ns), ino, node.blob.id))
        dirty.sort()
        for _, ino, bid in heapq.merge(self._lru_rows(), dirty):
            yield bid, ino

    def _lru_rows(self) -> Iterator[tuple[int, int, int]]:
        """(last use, inode, block id) of the rows in LRU order, but for dirty access times."""
        key, ino = -1, 0
        while True:
            rows = self._conn.execute(LRU_QUERY, (key, ino, PAGE_ROWS)).fetchall()
            for key, ino, bid in rows:
                if ino not in self._dirty_atime:
                    yield key, ino, bid
            if len(rows) < PAGE_ROWS:
                break

    def scored_files(self) -> Iterator[tuple[int, int, float]]:
        """(block id, inode, priority) of the current blocks with a priority, lowest first
        (equal priorities: least recently used first): the pool's eviction order under
        `pool.evict = "prefix"` (accesses not yet flushed to the rows are merged in at their
        place)."""
        dirty = []
        for ino, (atime, prio, _) in self._dirty_atime.items():
            node = self.find(ino)
            if prio is not None and node is not None and node.linked and node.blob is not None:
                dirty.append((prio, max(atime, node.mtime_ns), ino, node.blob.id))
        dirty.sort()
        for prio, _, ino, bid in heapq.merge(self._prio_rows(), dirty):
            yield bid, ino, prio

    def _prio_rows(self) -> Iterator[tuple[float, int, int, int]]:
        key, last, ino = float("-inf"), -1, 0
        while True:
            rows = self._conn.execute(PRIO_QUERY, (key, last, ino, PAGE_ROWS)).fetchall()
            for key, last, ino, bid in rows:
                if ino not in self._dirty_atime:
                    yield key, last, ino, bid
            if len(rows) < PAGE_ROWS:
                break

    def lowest_priority(self) -> float | None:
        """The lowest priority of a file in the pool's order (where the policy's floor was)."""
        row = self._conn.execute(
            "SELECT min(prio) FROM nodes WHERE blob IS NOT NULL AND prio IS NOT NULL"
        ).fetchone()
        low = row[0] if row else None
        dirty = [p for (_, p, _) in self._dirty_atime.values() if p is not None]
        return min([x for x in (low, *dirty) if x is not None], default=None)

    async def score_unscored(self) -> int:
        """Give the files that have no priority (stored under `pool.evict = "lru"`, or before
        schema 3) one below every scored file, in their order of last use; how many (the
        catalog then has the nodes in memory take their rows' priority)."""
        self._write_atimes()
        n = self._conn.execute(
            "SELECT count(*) FROM nodes WHERE blob IS NOT NULL AND prio IS NULL"
        ).fetchone()[0]
        if n:
            await self._group.persist([(SCORE_UNSCORED, ())])
        return n

    def take_ghost(self, parent: int, name: bytes) -> int | None:
        """The uses the name had when it was evicted, if it is still remembered (then it is
        forgotten: the file it names now carries them)."""
        key = ghost_key(parent, name)
        row = self._conn.execute("SELECT uses FROM ghosts WHERE key=?", (key,)).fetchone()
        if row is None:
            return None
        self._group.execute([("DELETE FROM ghosts WHERE key=?", (key,))])
        return row[0]

    def ghost(self, node: Node, limit: int) -> list[Stmt]:
        """Remember the uses of an evicted file's name (the `limit` names evicted last)."""
        self._ghost_puts += 1
        out: list[Stmt] = [
            (
                "INSERT OR REPLACE INTO ghosts (key, uses) VALUES (?, ?)",
                (ghost_key(node.parent, node.name), node.uses),
            )
        ]
        if self._ghost_puts % 256 == 0:
            out.append(
                (
                    "DELETE FROM ghosts WHERE seq <= (SELECT max(seq) FROM ghosts) - ?",
                    (max(1, limit),),
                )
            )
        return out

    def ghost_count(self) -> int:
        return self._conn.execute("SELECT count(*) FROM ghosts").fetchone()[0]

    def unsaved(self, ino: int) -> tuple[int, float | None, int] | None:
        """The access time, priority and uses of a node not written to its row yet, if any."""
        return self._dirty_atime.get(ino)

    def forget(self, ino: int) -> None:
        """The node's row was written with its scores, or is gone: nothing is left to write."""
        self._dirty_atime.pop(ino, None)

    @property
    def unsaved_count(self) -> int:
        """Nodes whose scores are not written yet (for statistics)."""
        return len(self._dirty_atime)
