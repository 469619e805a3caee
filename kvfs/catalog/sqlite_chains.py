"""Prefix chains of the SQLite catalog (a mix-in of SqliteCatalog): the links between blocks
that readahead learns, as rows of the `links` table.

Links are written at once in the open transaction (they ride with the next commit;
`flush_links` makes them durable). A link may name a pending file: it goes with the file if
the file is never committed (and after a crash, links to inode numbers past the last one are
dropped at start-up).
"""

from __future__ import annotations

from kvfs.catalog.sqlite_schema import Stmt
from kvfs.catalog.tree import merge_link
from kvfs.errors import KvfsError


class ChainRows:
    """Expects `_conn`, `find`, `_execute`, `sync` and `_links_changed` (SqliteCatalog)."""

    def _links_from(self, pred: int) -> dict[int, list]:
        return {s: [src, w] for s, src, w in self._conn.execute(
            "SELECT succ, source, weight FROM links WHERE pred=?", (pred,))}

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
        if succ in out:
            stmts.append(("INSERT OR REPLACE INTO links VALUES (?,?,?,?)",
                          (pred, succ, out[succ][0], out[succ][1])))
        self._write_links(stmts)

    def unlink_chain(self, pred: int, succ: int) -> None:
        self._write_links([("DELETE FROM links WHERE pred=? AND succ=?", (pred, succ))])

    def _linked(self, ino: int) -> bool:
        node = self.find(ino)
        return node is not None and node.linked

    def next_of(self, ino: int) -> int | None:
        for (succ,) in self._conn.execute("SELECT succ FROM links WHERE pred=? ORDER BY source "
                                          "DESC, weight DESC", (ino,)).fetchall():
            if self._linked(succ):
                return succ
        return None

    def parent_of(self, ino: int) -> int | None:
        for (pred,) in self._conn.execute("SELECT pred FROM links WHERE succ=? ORDER BY source "
                                          "DESC, weight DESC", (ino,)).fetchall():
            if self._linked(pred):
                return pred
        return None

    def _forget_links(self, ino: int) -> None:
        self._write_links([("DELETE FROM links WHERE pred=?1 OR succ=?1", (ino,))])

    async def flush_links(self) -> int:
        """Make the chain links written since the last flush durable."""
        n, self._links_changed = self._links_changed, 0
        await self.sync()
        return n
