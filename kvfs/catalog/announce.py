"""KV events' side of the catalog (a mix-in of TreeCatalog): changes to the names an announcer
recognises, noted as they are made and handed to it once durable.

The announcer (kvfs/events/publisher.py: `Publisher`, given when the catalog is opened) has a
naming rule: `match(name)`, the cheap test of a changed file's own name, and `key(names)`, the
block a path's last `depth` components name (or None). A file announces a *stored* block when
its committed content gets a recognised name (its commit while it has one, or a rename or
exchange that gives it one) and a *removed* block when a recognised name stops naming committed
content (an unlink, an eviction, a rename that replaces it or moves it away). A rename or
exchange of a directory does the same for every file beneath it that the rule can see. Files
never committed (pending) announce nothing: their content does not exist for a reader yet.

When: a note carries the transaction its change goes to (`_note_txn`), and the notes are
handed over, in order, once that transaction is durable (`_announce_due`, called by the
SQLite group commit after each WAL sync). A change of the shared (Redis) catalog is durable
when its script returns, before the mirror applies it: notes there are handed over at once.
Changes the follower applies (another node's) are not noted: the node that made a change
announces it.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from kvfs.catalog.records import ROOT_INO, Node

log = logging.getLogger("kvfs.events")


class Announcer(Protocol):
    depth: int  # the path components `key` reads (the file's own name last)
    cpu_s: float  # the trio thread's CPU time spent announcing (the catalog's part added)

    def match(self, name: bytes) -> bool: ...

    def key(self, names: list[bytes]) -> object | None: ...

    def durable(self, changes: list[tuple[bool, object]]) -> None:
        """Changes now durable, in the order they were made: (stored?, key)."""


class Announcing:
    """Expects `find` and `entries` (the catalog's queries); `_init_announce` is called by the
    catalog's constructor."""

    def _init_announce(self, announcer: Announcer | None) -> None:
        self.announcer = announcer
        self._notes: list[tuple[int, bool, object]] = []  # (transaction, stored?, key)

    def _note_txn(self) -> int:
        """The transaction a change made now goes to (0: it is durable already)."""
        return 0

    def _durable_txn(self) -> int:
        """The last transaction durable."""
        return 0

    def _announce(self, node: Node, stored: bool) -> None:
        """Note that `node` (a file with committed content, under its current name) now is
        (stored) or no longer is (removed) in the pool; a directory: every file beneath it."""
        a = self.announcer
        if a is None:
            return
        t = time.thread_time()
        try:
            self._note(a, node, stored, a.depth - 1)
        except Exception:  # an announcement is never worth a failed change
            log.exception("events: %s not announced", node.name)
        a.cpu_s += time.thread_time() - t
        self._announce_due()

    def _note(self, a: Announcer, node: Node, stored: bool, levels: int) -> None:
        if node.is_dir:
            if levels > 0:
                for child in self.entries(node.ino):
                    self._note(a, child, stored, levels - 1)
        elif node.blob is not None and a.match(node.name):
            key = self._key_of(a, node)
            if key is not None:
                self._notes.append((self._note_txn(), stored, key))

    def _announce_due(self) -> None:
        """Hand the notes whose transaction is durable to the announcer."""
        notes = self._notes
        if not notes:
            return
        durable = self._durable_txn()
        if notes[0][0] > durable:
            return
        n = 0
        while n < len(notes) and notes[n][0] <= durable:
            n += 1
        due = [(stored, key) for _, stored, key in notes[:n]]
        del notes[:n]
        try:
            self.announcer.durable(due)
        except Exception:  # (called from a commit round, which must go on)
            log.exception("events: %d change(s) not announced", len(due))

    def announced_keys(self) -> list:
        """The key of every recognised file with committed content (the inventory a
        publisher sends at a start)."""
        a = self.announcer
        if a is None:
            return []
        keys = []
        for node in self.files():
            if node.linked and a.match(node.name):
                key = self._key_of(a, node)
                if key is not None:
                    keys.append(key)
        return keys

    def _key_of(self, a: Announcer, node: Node) -> object | None:
        """The key of `node`'s path (its last `a.depth` components), or None."""
        names = [node.name]
        ino = node.parent
        for _ in range(a.depth - 1):
            if ino == ROOT_INO:
                break
            p = self.find(ino)
            if p is None:
                return None
            names.append(p.name)
            ino = p.parent
        names.reverse()
        return a.key(names)
