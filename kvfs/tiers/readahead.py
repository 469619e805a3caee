"""Prefix chains and readahead along them.

LMCache names chunks by a one-way chained hash, so kvfs cannot read a chain from file names;
order is the only signal. A writer stores a request's chunks in prefix order and a reader
retrieves them in prefix order, so kvfs learns predecessor -> successor links:

* from creation order per writer process (weak: concurrent requests of one engine interleave),
* from read order per reader process (stronger: it is what readahead must predict),
* from explicit hints, `user.kvfs.next` / `user.kvfs.parent` (strongest).

Links live in the catalog (`TreeCatalog.link`, persisted in batches with access times).

Readahead works like the kernel's for files: a reader that opens block k of a chain gets the
next `window` blocks fetched into DRAM in the background. A new stream looks one block ahead;
each time the reader opens the block its chain predicted, the window doubles (from at least
INITIAL_WINDOW, up to MAX_WINDOW), and at each other open it halves (down to none: a random
reader costs no prefetch); prefetches of a stream that mispredicted are cancelled. A reader that
pauses longer than IDLE_SECONDS starts a new stream. Prefetch I/O yields to demand I/O and may
only displace cold DRAM blocks (see `BlockStore.prefetch`).
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field

import trio

from kvfs.catalog.interface import Catalog
from kvfs.catalog.records import Node
from kvfs.catalog.tree import LINK_READ, LINK_WRITE
from kvfs.knobs import Knobs

log = logging.getLogger("kvfs.tiers.readahead")

INITIAL_WINDOW = 2
MAX_WINDOW = 16
IDLE_SECONDS = 5.0
CHAIN_GAP_SECONDS = 2.0  # two creates of one writer further apart than this are unrelated


def process_of(pid: int, _cache: collections.OrderedDict = collections.OrderedDict()) -> int:
    """The process (thread group) a FUSE request's thread belongs to: an engine's I/O threads
    are one reader or writer."""
    tgid = _cache.get(pid)
    if tgid is not None:
        return tgid
    tgid = pid
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Tgid:"):
                    tgid = int(line.split()[1])
                    break
    except (OSError, ValueError):
        pass
    _cache[pid] = tgid
    if len(_cache) > 4096:
        _cache.popitem(last=False)
    return tgid


@dataclass
class Stream:
    """One reader's walk along chains."""

    last: int | None = None  # inode it opened last
    at: float = 0.0
    window: int = 1
    ahead: collections.OrderedDict = field(default_factory=collections.OrderedDict)  # ino -> rec


@dataclass
class ReadaheadStats:
    streams: int = 0
    predicted_hits: int = 0  # opens of the block readahead expected
    predicted_misses: int = 0
    window_grows: int = 0
    window_shrinks: int = 0


class Readahead:
    def __init__(self, catalog: Catalog, store, knobs: Knobs):
        self.catalog = catalog
        self.store = store
        self.knobs = knobs  # prefetch_enabled, prefetch_max_window
        self.streams: collections.OrderedDict[int, Stream] = collections.OrderedDict()
        self.writers: dict[int, tuple[int, float]] = {}
        self.stats = ReadaheadStats()

    # --- learning from writers -----------------------------------------------------------------
    def created(self, node: Node, pid: int) -> None:
        """A writer created a file: it likely follows the writer's previous one."""
        now = trio.current_time()
        proc = process_of(pid)
        prev = self.writers.get(proc)
        self.writers[proc] = (node.ino, now)
        if prev is not None and now - prev[1] < CHAIN_GAP_SECONDS:
            self.catalog.link(prev[0], node.ino, LINK_WRITE)

    # --- readers -------------------------------------------------------------------------------
    def _stream(self, proc: int, now: float) -> Stream:
        s = self.streams.get(proc)
        if s is None or now - s.at > IDLE_SECONDS:
            if s is not None:
                self._cancel(s)
            s = self.streams[proc] = Stream()
            self.stats.streams += 1
        self.streams.move_to_end(proc)
        if len(self.streams) > 1024:
            _, old = self.streams.popitem(last=False)
            self._cancel(old)
        return s

    def _cancel(self, s: Stream) -> None:
        for rec in s.ahead.values():
            self.store.cancel_prefetch(rec)
        s.ahead.clear()

    def opened(self, node: Node, pid: int):
        """A reader opened a file: learn the read order, adjust its readahead window, and return
        the block it read before this one in the same chain (for the DRAM policy), or None."""
        now = trio.current_time()
        s = self._stream(process_of(pid), now)
        prev, s.last, s.at = s.last, node.ino, now
        parent = None
        if prev is not None and prev != node.ino:
            predicted = node.ino in s.ahead or self.catalog.next_of(prev) == node.ino
            self.catalog.link(prev, node.ino, LINK_READ)
            pnode = self.catalog.find(prev)
            if pnode is not None and pnode.blob is not None:
                parent = pnode.blob.id
            if predicted:
                s.ahead.pop(node.ino, None)
                self.stats.predicted_hits += 1
                if s.window < self.knobs.prefetch_max_window:
                    s.window = min(
                        self.knobs.prefetch_max_window, max(INITIAL_WINDOW, s.window * 2)
                    )
                    self.stats.window_grows += 1
            else:
                self.stats.predicted_misses += 1
                self._cancel(s)
                if s.window > 0:
                    s.window //= 2
                    self.stats.window_shrinks += 1
        if self.knobs.prefetch_enabled:
            self._issue(s, node)
        return parent

    def _issue(self, s: Stream, node: Node) -> None:
        """Fetch the next `window` blocks along the chain that starts after `node`."""
        cat = self.catalog
        ino, prev_blob = node.ino, node.blob.id if node.blob else None
        seen = {ino}
        for _ in range(s.window):
            nxt = cat.next_of(ino)
            if nxt is None or nxt in seen:
                break
            seen.add(nxt)
            succ = cat.find(nxt)
            if succ is None or succ.blob is None:
                break
            if nxt not in s.ahead:
                self.store.prefetch(succ.blob, prev_blob)
                s.ahead[nxt] = succ.blob
            ino, prev_blob = nxt, succ.blob.id
        while len(s.ahead) > self.knobs.prefetch_max_window:
            _, rec = s.ahead.popitem(last=False)
            self.store.cancel_prefetch(rec)

    def window_of(self, pid: int) -> int | None:
        s = self.streams.get(process_of(pid))
        return s.window if s is not None else None
