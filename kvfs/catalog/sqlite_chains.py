"""Prefix chains of the SQLite catalog (`SqliteChains`, an object SqliteCatalog holds as
`chains`): the links between blocks that readahead learns, as rows of the `links` table.

Links learned are queued and written in batches into the open transaction (they ride with the
next commit; `flush_links` makes them durable). A link may name a pending file: it goes with the
file if the file is never committed (and after a crash, links to inode numbers past the last one
are dropped at start-up).

Every create, commit and open asks about chains (the writer's previous file, the file's parent
for the DRAM policy, the reader's next file), so the links of recently used blocks are kept in
memory, both ways: `_succ[pred]` = {succ: [source, weight]} and `_pred[succ]` = {pred: same
list}, each an LRU of `CHAIN_CACHE` blocks loaded from the rows on a miss and updated with
every write. A block made since the start has no rows: its links start empty without a query.
A cached entry may still name a block removed since (its rows are gone); readers skip blocks
that are not linked, as they do for rows.
"""

from __future__ import annotations

import collections
from typing import Awaitable, Callable

from kvfs.catalog.records import Node
from kvfs.catalog.sqlite_schema import Stmt
from kvfs.catalog.tree import merge_link
from kvfs.errors import KvfsError

CHAIN_CACHE = 8192  # blocks whose links are kept in memory, each way
LINK_BATCH = 256  # learned links written together (executemany)


class SqliteChains:
    """The chains' rows and their caches, over the catalog's connection: `find` (a node by
    inode), `execute` / `execute_many` (statements into the open transaction) and `sync` (make
    it durable) are the catalog's."""

    def __init__(
        self,
        conn,
        find: Callable[[int], Node | None],
        execute: Callable[[list[Stmt]], int],
        execute_many: Callable[[list[tuple[str, list[tuple]]]], int],
        sync: Callable[[], Awaitable[None]],
    ):
        self._conn = conn
        self.find = find
        self._execute = execute
        self._execute_many = execute_many
        self.sync = sync
        self._links_changed = 0  # link rows written since the last flush
        self._succ: collections.OrderedDict[int, dict[int, list]] = collections.OrderedDict()
        self._pred: collections.OrderedDict[int, dict[int, list]] = collections.OrderedDict()
        self._link_queue: dict[tuple[int, int], tuple | None] = {}
        # the blocks the queued links leave from, and arrive at
        self._queued_from: set[int] = set()
        self._queued_to: set[int] = set()

    def _cached(
        self, cache: collections.OrderedDict, key: int, query: str, queued: set[int]
    ) -> dict[int, list]:
        out = cache.get(key)
        if out is None:
            if key in queued:  # the rows must hold what was learned of this block's links
                self.write_queued()
            out = cache[key] = {
                other: [src, w] for other, src, w in self._conn.execute(query, (key,))
            }
            if len(cache) > CHAIN_CACHE:
                cache.popitem(last=False)
        else:
            cache.move_to_end(key)
        return out

    def _links_from(self, pred: int) -> dict[int, list]:
        return self._cached(
            self._succ,
            pred,
            "SELECT succ, source, weight FROM links WHERE pred=?",
            self._queued_from,
        )

    def _links_to(self, succ: int) -> dict[int, list]:
        return self._cached(
            self._pred, succ, "SELECT pred, source, weight FROM links WHERE succ=?", self._queued_to
        )

    def new_node(self, ino: int) -> None:
        """A block made since the start: it has no links yet (no query needed to know)."""
        for cache in (self._succ, self._pred):
            cache[ino] = {}
            if len(cache) > CHAIN_CACHE:
                cache.popitem(last=False)

    def uncache(self, ino: int) -> None:
        """The block's rows are being deleted: so are its cached links, both ways."""
        for succ in self._succ.pop(ino, {}):
            p = self._pred.get(succ)
            if p is not None:
                p.pop(ino, None)
        for pred in self._pred.pop(ino, {}):
            s = self._succ.get(pred)
            if s is not None:
                s.pop(ino, None)

    def links_of(self, pred: int) -> dict[int, tuple[int, float]]:
        return {s: (v[0], v[1]) for s, v in self._links_from(pred).items()}

    def _write_links(self, stmts: list[Stmt]) -> None:
        try:
            self._execute(stmts)
            self._links_changed += 1
        except KvfsError:
            pass  # a hint: nothing to undo

    def _queue_link(self, pred: int, succ: int, value: list | None) -> None:
        """A link to write (`value` [source, weight]) or delete (None). Links are learned at
        every create and open: they are queued, latest value per pair, and written in one
        batch (`write_queued`) before rows they change are next read (a chain walk reads the
        links from the block it just linked to: not those), at the next flush, or once
        LINK_BATCH are waiting; the cache answers meanwhile."""
        self._link_queue[(pred, succ)] = None if value is None else (value[0], value[1])
        self._queued_from.add(pred)
        self._queued_to.add(succ)
        if len(self._link_queue) >= LINK_BATCH:
            self.write_queued()

    def write_queued(self) -> None:
        """Write the queued links into the open transaction (they ride with the next commit)."""
        queue, self._link_queue = self._link_queue, {}
        if not queue:
            return
        self._queued_from.clear()
        self._queued_to.clear()
        gone = [k for k, v in queue.items() if v is None]
        kept = [(p, s, v[0], v[1]) for (p, s), v in queue.items() if v is not None]
        try:
            self._execute_many(
                [
                    ("DELETE FROM links WHERE pred=? AND succ=?", gone),
                    ("INSERT OR REPLACE INTO links VALUES (?,?,?,?)", kept),
                ]
            )
            self._links_changed += 1
        except KvfsError:
            pass  # hints: nothing to undo

    def link(self, pred: int, succ: int, source: int, weight: float = 1.0) -> None:
        if pred == succ:
            return
        p, s = self.find(pred), self.find(succ)
        if p is None or s is None or not (p.linked and s.linked):
            return
        out = self._links_from(pred)
        changed, weakest = merge_link(out, succ, source, weight)
        if not changed:
            return
        if weakest is not None:  # keep the strongest few successors
            self._queue_link(pred, weakest, None)
            w = self._pred.get(weakest)
            if w is not None:
                w.pop(pred, None)
        if succ in out:
            self._queue_link(pred, succ, out[succ])
            back = self._pred.get(succ)
            if back is not None:
                back[pred] = out[succ]

    def unlink_chain(self, pred: int, succ: int) -> None:
        s, p = self._succ.get(pred), self._pred.get(succ)
        if s is not None:
            s.pop(succ, None)
        if p is not None:
            p.pop(pred, None)
        self._queue_link(pred, succ, None)

    def _linked(self, ino: int) -> bool:
        node = self.find(ino)
        return node is not None and node.linked

    @staticmethod
    def _strongest(links: dict[int, list]) -> list[int]:
        return sorted(links, key=lambda k: (links[k][0], links[k][1]), reverse=True)

    def next_of(self, ino: int) -> int | None:
        for succ in self._strongest(self._links_from(ino)):
            if self._linked(succ):
                return succ
        return None

    def parent_of(self, ino: int) -> int | None:
        for pred in self._strongest(self._links_to(ino)):
            if self._linked(pred):
                return pred
        return None

    def forget(self, ino: int) -> None:
        """A block went: its links too (cached and rows)."""
        self.uncache(ino)
        self._write_links(self.delete_stmts(ino))

    def delete_stmts(self, ino: int) -> list[Stmt]:
        """Statements deleting every link of a block (queued ones first)."""
        if self._link_queue:
            self.write_queued()
        return [("DELETE FROM links WHERE pred=?1 OR succ=?1", (ino,))]

    async def flush(self) -> int:
        """Make the chain links learned since the last flush durable."""
        self.write_queued()
        n, self._links_changed = self._links_changed, 0
        await self.sync()
        return n
