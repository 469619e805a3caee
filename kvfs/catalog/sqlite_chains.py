"""Prefix chains of the SQLite catalog (a mix-in of SqliteCatalog): the links between blocks
that readahead learns, as rows of the `links` table.

Links are written at once in the open transaction (they ride with the next commit;
`flush_links` makes them durable). A link may name a pending file: it goes with the file if
the file is never committed (and after a crash, links to inode numbers past the last one are
dropped at start-up).

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

from kvfs.catalog.sqlite_schema import Stmt
from kvfs.catalog.tree import merge_link
from kvfs.errors import KvfsError

CHAIN_CACHE = 8192          # blocks whose links are kept in memory, each way


class ChainRows:
    """Expects `_conn`, `find`, `_execute`, `sync` and `_links_changed` (SqliteCatalog);
    `_init_chains()` is called by its constructor."""

    def _init_chains(self) -> None:
        self._succ: collections.OrderedDict[int, dict[int, list]] = collections.OrderedDict()
        self._pred: collections.OrderedDict[int, dict[int, list]] = collections.OrderedDict()

    def _cached(self, cache: collections.OrderedDict, key: int, query: str) -> dict[int, list]:
        out = cache.get(key)
        if out is None:
            out = cache[key] = {other: [src, w] for other, src, w in
                                self._conn.execute(query, (key,))}
            if len(cache) > CHAIN_CACHE:
                cache.popitem(last=False)
        else:
            cache.move_to_end(key)
        return out

    def _links_from(self, pred: int) -> dict[int, list]:
        return self._cached(self._succ, pred,
                            "SELECT succ, source, weight FROM links WHERE pred=?")

    def _links_to(self, succ: int) -> dict[int, list]:
        return self._cached(self._pred, succ,
                            "SELECT pred, source, weight FROM links WHERE succ=?")

    def _new_chain_node(self, ino: int) -> None:
        """A block made since the start: it has no links yet (no query needed to know)."""
        for cache in (self._succ, self._pred):
            cache[ino] = {}
            if len(cache) > CHAIN_CACHE:
                cache.popitem(last=False)

    def _uncache_links(self, ino: int) -> None:
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
            pass                        # a hint: nothing to undo

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
        stmts: list[Stmt] = []
        if weakest is not None:                             # keep the strongest few successors
            stmts.append(("DELETE FROM links WHERE pred=? AND succ=?", (pred, weakest)))
            w = self._pred.get(weakest)
            if w is not None:
                w.pop(pred, None)
        if succ in out:
            stmts.append(("INSERT OR REPLACE INTO links VALUES (?,?,?,?)",
                          (pred, succ, out[succ][0], out[succ][1])))
            back = self._pred.get(succ)
            if back is not None:
                back[pred] = out[succ]
        self._write_links(stmts)

    def unlink_chain(self, pred: int, succ: int) -> None:
        s, p = self._succ.get(pred), self._pred.get(succ)
        if s is not None:
            s.pop(succ, None)
        if p is not None:
            p.pop(pred, None)
        self._write_links([("DELETE FROM links WHERE pred=? AND succ=?", (pred, succ))])

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

    def _forget_links(self, ino: int) -> None:
        self._uncache_links(ino)
        self._write_links([("DELETE FROM links WHERE pred=?1 OR succ=?1", (ino,))])

    async def flush_links(self) -> int:
        """Make the chain links written since the last flush durable."""
        n, self._links_changed = self._links_changed, 0
        await self.sync()
        return n
