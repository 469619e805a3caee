"""The mirror: this node's copy of a shared catalog, kept current by following Redis.

At start-up the whole catalog is loaded (`load`, every shard of it); then every change any node
makes arrives as an entry in a change log (each shard's stream `log`), which the follower
(follower.py) applies from the records it carries or by re-reading what the entry names
(`_refresh`): re-reading current state is idempotent, so entries may be applied twice or late
without harm. A node that missed part of a log (it was away longer than the log's length)
reloads a snapshot and reconciles its mirror with it.

Changes that touch space (a block published, retired into the grave, purged) are passed to the
space layer (kvfs/cluster/space.py); changes the layer above may cache (a name gone, new
content, a new name) are reported through `on_change`.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Callable

import trio

from kvfs.catalog.records import ROOT_INO, BlobRec, Node
from kvfs.catalog.redis.bootstrap import EPOCH_SHIFT, SCAN_BATCH, scan
from kvfs.catalog.redis.codec import (
    pairs,
    parse_blob,
    parse_node,
    record,
)
from kvfs.catalog.redis.follower import FOLLOW_PACE_SECONDS, Following, Shard
from kvfs.catalog.redis.shards import shard_of
from kvfs.catalog.tree import LINK_WRITE, MAX_SUCCESSORS, TreeCatalog, _now, merge_link
from kvfs.config import ClusterConfig
from kvfs.errors import KvfsError, StartupError
from kvfs.redis.link import ClusterLink

log = logging.getLogger("kvfs.catalog")


SNAPSHOT_ATTEMPTS = 8  # start-up reads of a catalog that kept changing while it was read


class RedisMirror(Following, TreeCatalog):
    """The memory tree of a shared catalog and what keeps it current (see the module doc)."""

    shared = True

    def __init__(
        self,
        link: ClusterLink,
        cfg: ClusterConfig,
        space,
        *,
        pool_id: str,
        on_change: Callable[..., None] | None = None,
        announcer=None,
        confirm_misses: bool = True,
        shards: list[ClusterLink] = (),
    ):
        """`on_change(kind, node, old_blob, old_parent, old_name)` is called after another
        node changed something this node may cache: kind is "gone", "content", "new" or
        "moved" (the file layer answers, through a seam: kvfs/service.py); never calls back
        down. `announcer`: told of this node's changes to the names it recognises (KV events,
        kvfs/catalog/announce.py). `confirm_misses`: a name the mirror does not know is asked
        of Redis before it is answered ENOENT (durability "close", where a file is visible
        on every node once its close returned; with "fsync" a file is visible once its batch
        is published, and a fresh mirror answers a miss: kvfs/catalog/redis/catalog.py
        `lookup_fresh`). `shards`: the links to the pool's shards past the first (`link`),
        with `[cluster] shards` (kvfs/catalog/redis/shards.py)."""
        super().__init__(announcer)
        self.confirm_misses = confirm_misses
        # (follower.py) reads of a busy log batched with "fsync", at once with "close"
        self.follow_pace = 0.0 if confirm_misses else FOLLOW_PACE_SECONDS
        self.redis = link
        self.cfg = cfg
        self.space = space  # ClusterSpace: used blocks, the grave
        self.pool_id = pool_id
        self.on_change = on_change
        self.epoch = link.epoch
        base = self.epoch << EPOCH_SHIFT
        self._next_ino = self._next_cookie = self._next_blob = base + 1
        self.shards = [Shard(0, link)] + [Shard(k, x) for k, x in enumerate(shards, 1)]
        self.catalog_lost = False  # Redis came back without this pool's catalog
        self._progress = trio.Event()
        self._link_delta: dict[tuple[int, int], list] = {}
        # write links carried in the successors' records (field `w`: the file its writer wrote
        # before it, kvfs.tiers.readahead): predecessor -> those successors, and back
        self._wsuccs: dict[int, set[int]] = {}
        self._wpred: dict[int, int] = {}
        self._unwritten: set[int] = set()  # their `w` removed here, not yet in Redis
        # a reload and the followers' batches are applied one at a time; a batch read before
        # a reload is dropped (the reload's tails are before it)
        self._apply_lock = trio.Lock()
        self._reloads = 0
        # This node's own changes, per inode: how many are in flight, and the sequence number
        # of the last one to finish (see _changing and _refresh)
        self._changes_in_flight: dict[int, int] = {}
        self._changed_at: dict[int, int] = {}
        self._change_seq = 0
        # Which came last to an inode's mirror, one order for both: this node's own change
        # finishing (`_own_at`), or another node's record installed from the log
        # (`_others_at`). A record installed after an own change that the log has not yet
        # shown is older than that change (the log is in order): when the follower reaches
        # the own change's entry, the inode is read again (follower.py, `_apply_entries`)
        self._order = 0
        self._own_at: dict[int, int] = {}
        self._others_at: dict[int, int] = {}
        # files whose publish is in flight (ino -> how many), and the event set (and replaced)
        # when a publish ends (RedisCatalog.settled)
        self._publishing: dict[int, int] = {}
        self._published = trio.Event()
        # files whose publish takes their name's ghost (`ghost_at_publish`)
        self._ghosts_asked: set[int] = set()
        self.events = 0
        self.refreshes = 0  # batches of inodes read back from Redis
        self.records = 0  # batches of records installed from the log, nothing read back
        self.misses_answered = 0  # lookups of unknown names answered without asking Redis
        self.publish_retries = 0  # write-back publishes sent again (Redis had not run them)
        self.stale_own_rereads = 0  # inodes read again: an older record came after an own change
        self.resyncs = 0

    # ------------------------------------------------------------------------------ the shards
    @property
    def last_id(self) -> bytes:
        return self.shards[0].last_id

    @property
    def synced_at(self) -> float:
        """When the follower that heard from Redis least recently last heard."""
        return min(sh.synced_at for sh in self.shards)

    @property
    def _resync(self) -> bool:
        return any(sh.resync for sh in self.shards)

    @_resync.setter
    def _resync(self, value: bool) -> None:
        """Set: reload the whole catalog (every shard) once the followers get to it."""
        for sh in self.shards:
            sh.resync = value

    def shard_of_dir(self, ino: int) -> Shard:
        """The shard holding directory `ino`'s entries and its children's records."""
        return self.shards[shard_of(ino, len(self.shards))]

    def shard_of_node(self, node: Node) -> Shard:
        """The shard holding `node`'s record (its parent's; the root's own)."""
        return self.shard_of_dir(node.parent)

    def _records_here(self, ino: int, sh: Shard) -> bool:
        """Whether `ino`'s record may be in shard `sh` (it is, or the mirror does not know
        where it is)."""
        node = self.nodes.get(ino)
        return node is None or len(self.shards) == 1 or self.shard_of_node(node) is sh

    async def load(self) -> None:
        """Start-up: the whole catalog into memory.

        Its keys are read batch after batch, not atomically, while other nodes keep writing:
        a file may be read pointing at a block that was purged before the blocks were read, or
        a purged block's space may be read as two blocks' (the old one still named by a file
        read early, the new one written there since). Either makes the snapshot inconsistent
        and start-up would refuse it, though replaying the log would make it exact (seen in
        the cluster torture: "used extent overlaps another", 2 starts in about 300). If the
        log moved while the keys were read, that is what happened: read them again."""
        for attempt in range(SNAPSHOT_ATTEMPTS):
            try:
                await self._load_snapshot(initial=True)
                return
            except StartupError as e:
                moved = await self._log_moved()
                if attempt == SNAPSHOT_ATTEMPTS - 1 or not moved:
                    raise
                log.info("cluster: the catalog changed while it was read (%s); reading it again", e)
                self.nodes.clear()
                self.successors.clear()
                self.predecessors.clear()

    async def _log_moved(self) -> bool:
        """Whether a change log has entries after the position the last snapshot read."""
        for sh in self.shards:
            last = await sh.link.call("XREVRANGE", sh.link.key("log"), "+", "-", "COUNT", 1)
            if (last[0][0] if last else b"0-0") != sh.snapshot_tail:
                return True
        return False

    async def _hgetall(self, conn, keys: list[bytes], parse=record) -> list[dict[bytes, bytes]]:
        """The hashes at `keys`, each parsed: a node's or block's record (`record`: its packed
        fields expanded), or a plain hash (`pairs`)."""
        out = []
        for i in range(0, len(keys), SCAN_BATCH):
            replies = await conn.pipeline([("HGETALL", k) for k in keys[i : i + SCAN_BATCH]])
            out += [parse(r) for r in replies]
        return out

    async def _load_snapshot(
        self, initial: bool, conns: dict | None = None, only: Shard | None = None
    ) -> None:
        """Load the whole catalog, every shard (or, with `only`, that shard's part of it):
        each log's position first, then every key (not atomically); replaying the logs from
        those positions afterwards makes the mirror exact. `conns`: shard index -> a
        connection to read that shard with (a follower's)."""
        mark = self._change_seq
        tails = {}
        shards = [only] if only is not None else self.shards
        for sh in shards:
            c = (conns or {}).get(sh.k) or sh.link
            last = await c.call("XREVRANGE", sh.link.key("log"), "+", "-", "COUNT", 1)
            tails[sh.k] = sh.snapshot_tail = last[0][0] if last else b"0-0"
        blobs: dict[int, BlobRec] = {}
        states: dict[int, dict] = {}
        grave_ids: set[int] = set()
        links: dict[int, dict] = {}
        for sh in shards:
            c = (conns or {}).get(sh.k) or sh.link
            plen = len(sh.link.prefix)
            nkeys = await scan(c, sh.link.key("n:*"))
            nhashes = await self._hgetall(c, nkeys)
            bkeys = await scan(c, sh.link.key("b:*"))
            bhashes = await self._hgetall(c, bkeys)
            grave_ids |= {int(x) for x in await c.call("ZRANGE", sh.link.key("grave"), 0, -1)}
            lkeys = await scan(c, sh.link.key("l:*"))
            lhashes = await self._hgetall(c, lkeys, pairs)
            for k, h in zip(bkeys, bhashes):
                if h:
                    bid = int(k[plen + 2 :])
                    blobs[bid] = parse_blob(bid, h)
            for k, h in zip(nkeys, nhashes):
                if h:
                    states[int(k[plen + 2 :])] = h
            links.update({int(k[plen + 2 :]): h for k, h in zip(lkeys, lhashes) if h})
        if ROOT_INO not in states and (only is None or only is self.shard_of_dir(ROOT_INO)):
            raise StartupError("cluster: the catalog in Redis has no root directory")
        if initial:
            self._build(states, blobs, grave_ids, links)
        else:
            # inodes this node changed while the snapshot was read: its mirror is newer than
            # what was read (and whatever came after the log position is replayed anyway)
            skip = set(self._changes_in_flight) | {
                i for i, seq in self._changed_at.items() if seq > mark
            }
            await self._reconcile(states, blobs, grave_ids, links, skip, only)
        for sh in shards:
            sh.last_id = tails[sh.k]
            sh.synced_at = trio.current_time()

    def _build(self, states, blobs, grave_ids, links) -> None:
        for ino, h in states.items():
            node = parse_node(ino, h)
            if b"b" in h:
                bid = int(h[b"b"])
                node.blob = blobs.get(bid)
                if node.blob is None:
                    raise StartupError(f"cluster: file {ino} refers to missing block {bid}")
            self.nodes[ino] = node
        for node in self.nodes.values():
            if node.ino == ROOT_INO:
                continue
            parent = self.nodes.get(node.parent)
            if parent is None or parent.children is None:
                log.error(
                    "cluster: node %d has no parent directory in Redis; ignoring it", node.ino
                )
                continue
            parent.children[node.name] = node.ino
            if node.children is not None:
                parent.subdirs += 1
        try:
            self.space.attach(
                (n.blob for n in self.nodes.values() if n.blob is not None),
                (blobs[b] for b in grave_ids if b in blobs),
            )
        except StartupError as e:
            raise StartupError(f"cluster: {e}") from None
        for ino, h in states.items():
            self._write_link(ino, h)
        for pred, h in links.items():
            self._set_links(pred, h)
        for pred in self._wsuccs:
            if pred not in links:
                self._set_links(pred, {})

    def _write_link(self, ino: int, h: dict[bytes, bytes]) -> bool:
        """Index the write link a file's record carries (`w`: its predecessor; "0": none any
        more, `unlink_chain`; absent: unchanged). Returns whether it changed."""
        w = h.get(b"w")
        if w is None:
            return False
        pred, old = int(w), self._wpred.get(ino)
        if pred == old or (pred == 0 and old is None):
            return False
        if old is not None:
            self._wsuccs.get(old, set()).discard(ino)
            del self._wpred[ino]
            out = self.successors.get(old)
            if out and out.get(ino, [0])[0] == LINK_WRITE:
                del out[ino]
                self.predecessors.get(ino, set()).discard(old)
        if pred:
            self._wpred[ino] = pred
            self._wsuccs.setdefault(pred, set()).add(ino)
        return True

    def _forget_links(self, ino: int) -> None:
        super()._forget_links(ino)
        pred = self._wpred.pop(ino, None)
        if pred is not None:
            self._wsuccs.get(pred, set()).discard(ino)
        self._wsuccs.pop(ino, None)

    def _merge_write_links(self, pred: int, succs) -> None:
        """Write links from `pred` to `succs` (carried in their records) into the mirror's
        chains, as `link` would learn them (the strongest MAX_SUCCESSORS kept)."""
        if pred not in self.nodes:
            return
        out = self.successors.setdefault(pred, {})
        for succ in list(succs):
            if succ in self.nodes and succ not in out:
                changed, weakest = merge_link(out, succ, LINK_WRITE, 1.0)
                if changed:
                    self.predecessors.setdefault(succ, set()).add(pred)
                if weakest is not None:
                    self.predecessors.get(weakest, set()).discard(pred)
        if not out:
            del self.successors[pred]

    def _set_links(self, pred: int, h: dict[bytes, bytes]) -> None:
        for succ in list(self.successors.get(pred, {})):
            self.predecessors.get(succ, set()).discard(pred)
        out = {}
        for k, v in h.items():
            succ = int(k)
            if pred in self.nodes and succ in self.nodes:
                s, w = v.split()
                out[succ] = [int(s), float(w)]
                self.predecessors.setdefault(succ, set()).add(pred)
        for (p, succ), (src, delta) in self._link_delta.items():  # not yet flushed here
            if p == pred and succ in self.nodes:
                cur = out.get(succ)
                if cur is None or src > cur[0]:
                    out[succ] = [src, delta]
                elif src == cur[0]:
                    cur[1] += delta
                self.predecessors.setdefault(succ, set()).add(pred)
        for succ in self._wsuccs.get(pred, ()):  # carried in the successors' records
            if pred in self.nodes and succ in self.nodes and succ not in out:
                out[succ] = [LINK_WRITE, 1.0]
                self.predecessors.setdefault(succ, set()).add(pred)
        while len(out) > MAX_SUCCESSORS:  # (Redis keeps its own links to 8: not these)
            weakest = min(out, key=lambda s: (out[s][0], out[s][1]))
            del out[weakest]
            self.predecessors.get(weakest, set()).discard(pred)
        if out:
            self.successors[pred] = out
        else:
            self.successors.pop(pred, None)

    # ------------------------------------------------------------------------------ the mirror
    def _unplace(self, node: Node) -> None:
        parent = self.nodes.get(node.parent)
        if (
            parent is not None
            and parent.children is not None
            and parent.children.get(node.name) == node.ino
        ):
            del parent.children[node.name]
            if node.children is not None:
                parent.subdirs -= 1

    def _notify(self, kind: str, node: Node, old: BlobRec | None, parent: int, name: bytes) -> None:
        if self.on_change is not None:
            self.on_change(kind, node, old, parent, name)

    def _vanish(self, node: Node, leaving: list[BlobRec]) -> None:
        """The node is gone from Redis (another node removed it or replaced it)."""
        if not node.persisted or not node.linked:
            return
        parent, name = node.parent, node.name
        self._unplace(node)
        node.linked = False
        node.ctime_ns = _now()
        self._forget_links(node.ino)
        if node.children:
            for child in [self.nodes[i] for i in node.children.values()]:
                child.linked = False
                self._notify("gone", child, None, child.parent, child.name)
            node.children.clear()
        if node.blob is not None and self.space.known(node.blob.id):
            leaving.append(node.blob)
        self._notify("gone", node, node.blob, parent, name)

    async def _fetch(
        self, conn, inos: list[int], sh: Shard | None = None
    ) -> dict[int, dict[bytes, bytes]]:
        keys = (sh or self.shards[0]).link
        replies = await conn.pipeline([("HGETALL", keys.key("n", i)) for i in inos])
        return {i: record(r) for i, r in zip(inos, replies)}

    async def _fetch_elsewhere(self, conn, dirs: list[int], sh: Shard) -> dict[int, dict]:
        """Directories whose entries are in shard `sh` and whose records are not: their
        markers there name their parents, whose shards hold the records."""
        marks = await conn.pipeline([("GET", sh.link.key("o", d)) for d in dirs])
        out = {}
        for d, parent in zip(dirs, marks):
            if parent is not None:
                home = self.shard_of_dir(int(parent))
                if home is not sh:
                    out.update(await self._fetch(home.link, [d], home))
        return out

    @contextlib.contextmanager
    def _changing(self, *inos: int):
        """This node is changing these inodes: a script in flight, then its mirror."""
        for i in inos:
            self._changes_in_flight[i] = self._changes_in_flight.get(i, 0) + 1
        try:
            yield
        finally:
            self._change_seq += 1
            self._order += 1
            for i in inos:
                n = self._changes_in_flight.pop(i) - 1
                if n:
                    self._changes_in_flight[i] = n
                self._changed_at[i] = self._change_seq
                self._own_at[i] = self._order

    async def _refresh(
        self, inos, conn=None, retired: set[int] | None = None, sh: Shard | None = None
    ) -> None:
        """Make the mirror's view of these inodes what Redis holds now. `retired`: blocks the
        change log says went to the grave (their space is not asked about again).

        What is read may be older than a change this node made to one of them while the read
        was in flight (its script ran after Redis answered, its mirror changed before the
        answer is applied): applying it would bring back the old state. Such inodes, and only
        they, are read again once this node's change is done. (Reading the whole batch again
        cost every follower 2-5x its reads while its own node wrote into the same directory,
        which each of its creates changes: bench/redis_scale.py.)

        `sh`: the shard to read them from (through `conn`, a connection to it, if given);
        only inodes whose records may be there are read (an entry names the directory a
        change was made in, whose own record may be in another shard, unchanged). Without
        either, each inode is read from the shard the mirror places it in."""
        if sh is None and len(self.shards) > 1:
            groups: dict[int, list[int]] = {}
            for i in inos:
                node = self.nodes.get(i)
                k = self.shard_of_node(node).k if node is not None else 0
                groups.setdefault(k, []).append(i)
            for k, group in groups.items():
                await self._refresh(group, None, retired, self.shards[k])
            return
        sh = sh or self.shards[0]
        c = conn or sh.link
        inos = [i for i in inos if self._records_here(i, sh)]
        states: dict[int, dict] = {}
        blobs: dict[int, BlobRec] = {}
        read_at: dict[int, int] = {}  # inode -> this node's change count when read
        todo = list(inos)
        for _ in range(10):
            mark = self._change_seq
            got, got_blobs = await self._read_states(c, todo, sh)
            states.update(got)
            blobs.update(got_blobs)
            read_at.update(dict.fromkeys(got, mark))
            # every inode against the moment it was read: one read in an earlier round may
            # have become stale while this round's read was in flight
            todo = [
                i
                for i in states
                if i in self._changes_in_flight or self._changed_at.get(i, -1) > read_at[i]
            ]
            if not todo:
                break
            with trio.move_on_after(1.0):
                while any(i in self._changes_in_flight for i in todo):
                    await trio.sleep(0.01)
        leaving: list[BlobRec] = []
        self._apply(states, blobs, leaving)
        await self.space.settle(leaving, c, retired=retired, link=sh.link)
        self.refreshes += 1

    async def _read_states(
        self, c, inos, sh: Shard | None = None
    ) -> tuple[dict[int, dict], dict[int, BlobRec]]:
        """The inodes' hashes in shard `sh` (through connection `c`), their parents' where the
        mirror lacks them (a parent's record may be in another shard: its marker here names
        its own parent, whose shard holds it), and the records of the blocks they name that
        this node does not know."""
        sh = sh or self.shards[0]
        todo = [i for i in dict.fromkeys(inos)]
        states: dict[int, dict] = {}
        for _ in range(64):  # parents first, fetched as they are needed
            if not todo:
                break
            states.update(await self._fetch(c, todo, sh))
            todo = [
                int(h[b"p"])
                for h in states.values()
                if h and int(h[b"p"]) not in states and int(h[b"p"]) not in self.nodes
            ]
            if len(self.shards) > 1 and todo:
                states.update(await self._fetch_elsewhere(c, todo, sh))
                todo = [i for i in todo if not states.get(i)]
        need = {int(h[b"b"]) for h in states.values() if h and b"b" in h}
        need = [b for b in need if not self.space.known(b)]
        blobs = {}
        if need:
            replies = await c.pipeline([("HGETALL", sh.link.key("b", b)) for b in need])
            for b, r in zip(need, replies):
                if r:
                    blobs[b] = parse_blob(b, record(r))
        return states, blobs

    def _known_blob(self, bid: int, blobs: dict[int, BlobRec]) -> BlobRec | None:
        return self.space.known(bid) or blobs.get(bid)

    def _apply(
        self, states: dict[int, dict], blobs: dict[int, BlobRec], leaving: list[BlobRec]
    ) -> None:
        """Install fetched states (an empty dict: the inode is gone) into the mirror."""
        moved: dict[int, tuple[int, bytes]] = {}
        for ino, h in states.items():  # 1: take the nodes out of their places
            node = self.nodes.get(ino)
            if node is None or not node.persisted or not node.linked:
                continue
            if not h:
                self._vanish(node, leaving)
            elif (int(h[b"p"]), h[b"n"]) != (node.parent, node.name):
                moved[ino] = (node.parent, node.name)
                self._unplace(node)
        placed = []
        pending = [ino for ino, h in states.items() if h]
        for _ in range(len(pending) + 1):  # 2: parents before children
            rest = []
            for ino in pending:
                h = states[ino]
                parent = self.nodes.get(int(h[b"p"]))
                if ino != ROOT_INO and (parent is None or parent.children is None):
                    rest.append(ino)
                    continue
                if self._install(ino, h, blobs, leaving, moved):
                    placed.append(ino)
            if not rest or len(rest) == len(pending):
                for ino in rest:
                    log.warning("cluster: inode %d has no parent directory in Redis; skipped", ino)
                break
            pending = rest

    def _install(
        self,
        ino: int,
        h: dict,
        blobs: dict[int, BlobRec],
        leaving: list[BlobRec],
        moved: dict[int, tuple[int, bytes]],
    ) -> bool:
        node = self.nodes.get(ino)
        new = node is None or not node.linked
        fresh = parse_node(ino, h)
        bid = int(h[b"b"]) if b"b" in h else None
        rec = None
        if bid is not None:
            rec = self._known_blob(bid, blobs)
            if rec is None:
                log.error(
                    "cluster: file %d refers to block %d, which Redis does not hold", ino, bid
                )
                self._resync = True
                return False
        if ino != ROOT_INO:
            parent = self.nodes[fresh.parent]
            occupant = parent.children.get(fresh.name)
            if occupant is not None and occupant != ino:
                other = self.nodes[occupant]
                if not other.persisted:
                    # This node is writing a file of that name and has not committed it: its
                    # commit will replace the other node's file (the last close wins). The
                    # other file's space is in use meanwhile.
                    if rec is not None:
                        self.space.use(rec)
                    if node is not None and node.linked and node.persisted:
                        self._vanish(node, leaving)
                    return False
                self._unplace(other)  # stale here; Redis will tell where it went
                self._resync = True
        if node is None:
            node = fresh
            self.nodes[ino] = node
        elif not node.linked:  # a node this node had dropped came back (rare)
            node.linked = True
        else:
            node.parent, node.name, node.cookie = fresh.parent, fresh.name, fresh.cookie
            node.mode, node.uid, node.gid = fresh.mode, fresh.uid, fresh.gid
            node.atime_ns, node.mtime_ns, node.ctime_ns = (
                fresh.atime_ns,
                fresh.mtime_ns,
                fresh.ctime_ns,
            )
            node.target, node.xattrs = fresh.target, fresh.xattrs
            if fresh.prio is not None and fresh.uses >= node.uses:  # (uses only grow)
                node.prio, node.uses = fresh.prio, fresh.uses
        if ino != ROOT_INO:
            parent = self.nodes[node.parent]
            if parent.children.get(node.name) != ino:
                parent.children[node.name] = ino
                if node.children is not None:
                    parent.subdirs += 1
        old = node.blob
        if (old.id if old else None) != bid:
            node.blob = rec
            if rec is not None:
                self.space.use(rec)
            if old is not None and self.space.known(old.id):
                leaving.append(old)
        if self._write_link(ino, h) and ino in self._wpred:  # it follows its writer's last
            self._merge_write_links(self._wpred[ino], (ino,))
        if new and ino in self._wsuccs:  # files that follow it came first
            self._merge_write_links(ino, self._wsuccs[ino])
        if new:
            self._notify("new", node, None, node.parent, node.name)
        else:
            if ino in moved:
                self._notify("moved", node, None, *moved[ino])
            if old is not None and (rec is None or rec.id != old.id):
                self._notify("content", node, old, node.parent, node.name)
        return True

    async def _reconcile(
        self, states, blobs, grave_ids, links, skip=frozenset(), only: Shard | None = None
    ) -> None:
        """After a gap in the log: make the mirror equal to a full snapshot (but for the
        inodes in `skip`, which this node changed since the snapshot was read); with `only`,
        a snapshot of that shard, to which the inodes whose records are there are made equal
        (a block that left the grave of that shard while its log was not followed is freed
        once no shard holds its record: with a shard unreachable, later)."""
        self.resyncs += 1

        def here(ino: int) -> bool:
            node = self.nodes.get(ino)
            return only is None or (node is not None and self.shard_of_node(node) is only)

        leaving: list[BlobRec] = []
        gone = [
            n
            for n in self.nodes.values()
            if n.persisted
            and n.linked
            and n.ino not in states
            and n.ino not in skip
            and here(n.ino)
        ]
        for node in gone:
            self._vanish(node, leaving)
        self._apply({i: h for i, h in states.items() if i not in skip}, blobs, leaving)
        try:
            await self.space.reconcile_grave(grave_ids, blobs, prune=True)
        except KvfsError:
            if only is None:
                raise
            await self.space.reconcile_grave(grave_ids, blobs, prune=False)
        await self.space.settle(
            leaving, retired=grave_ids, link=only.link if only is not None else None
        )
        for pred in list(self.successors):
            if pred not in links and here(pred):
                self._set_links(pred, {})
        for pred, h in links.items():
            self._set_links(pred, h)
