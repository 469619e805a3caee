"""The mirror: this node's copy of a shared catalog, kept current by following Redis.

At start-up the whole catalog is loaded (`load`); then every change any node makes arrives as an
entry in the change log (the stream `log`), which `_follow` reads with XREAD and applies by
re-reading what the entry names (`_refresh`): re-reading current state is idempotent, so entries
may be applied twice or late without harm. A node that missed part of the log (it was away
longer than the log's length) reloads a snapshot and reconciles its mirror with it.

Changes that touch space (a block published, retired into the grave, purged) are passed to the
space layer (kvfs/cluster/space.py); changes the layer above may cache (a name gone, new
content, a new name) are reported through `on_change`.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Callable

import trio

from kvfs.catalog.base import ROOT_INO, BlobRec, Node
from kvfs.catalog.redis.bootstrap import EPOCH_SHIFT, SCAN_BATCH, scan
from kvfs.catalog.redis.codec import (
    as_bytes,
    ids,
    node_fields,
    pairs,
    parse_blob,
    parse_entry,
    parse_node,
    stream_id,
)
from kvfs.catalog.tree import TreeCatalog, _now
from kvfs.cluster.link import ClusterLink
from kvfs.config import ClusterConfig
from kvfs.errors import KvfsError, StartupError
from kvfs.cluster.resp import RedisClient, RedisError, RedisUnavailable

log = logging.getLogger("kvfs.catalog")

# The follower retries this soon after Redis failed it. A name committed on another node right
# after a restarted Redis is ready reaches this node only once the follower is back and has
# reloaded the catalog (docs/cluster.md: 2 s from the writer's close). An attempt against a Redis
# that is down or still loading its AOF is refused at once and costs nothing; with 0.5 s the
# 200-cycle cluster torture saw one change 2.03 s late, in a Redis restart cycle.
FOLLOW_RETRY_SECONDS = 0.1
SNAPSHOT_ATTEMPTS = 8  # start-up reads of a catalog that kept changing while it was read


class RedisMirror(TreeCatalog):
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
    ):
        """`on_change(kind, node, old_blob, old_parent, old_name)` is called after another
        node changed something this node may cache: kind is "gone", "content", "new" or
        "moved" (the file layer answers, through a seam: kvfs/service.py); never calls back
        down. `announcer`: told of this node's changes to the names it recognises (KV events,
        kvfs/catalog/announce.py). `confirm_misses`: a name the mirror does not know is asked
        of Redis before it is answered ENOENT (durability "close", where a file is visible
        on every node once its close returned; with "fsync" a file is visible once its batch
        is published, and a fresh mirror answers a miss: kvfs/catalog/redis/catalog.py
        `lookup_fresh`)."""
        super().__init__(announcer)
        self.confirm_misses = confirm_misses
        self.redis = link
        self.cfg = cfg
        self.space = space  # ClusterSpace: used blocks, the grave
        self.pool_id = pool_id
        self.on_change = on_change
        self.epoch = link.epoch
        base = self.epoch << EPOCH_SHIFT
        self._next_ino = self._next_cookie = self._next_blob = base + 1
        self.last_id = b"0-0"  # the last log entry applied
        self._snapshot_tail = b"0-0"  # the log position the last snapshot read
        self.synced_at = trio.current_time()  # when the follower last heard from Redis
        self.catalog_lost = False  # Redis came back without this pool's catalog
        self._progress = trio.Event()
        self._link_delta: dict[tuple[int, int], list] = {}
        self._resync = False
        self._conn: RedisClient | None = None  # the follower's connection
        self._follower_trips = 0  # round trips of its connections that ended
        # This node's own changes, per inode: how many are in flight, and the sequence number
        # of the last one to finish (see _changing and _refresh)
        self._changes_in_flight: dict[int, int] = {}
        self._changed_at: dict[int, int] = {}
        self._change_seq = 0
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
        self.resyncs = 0

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
        """Whether the change log has entries after the position the last snapshot read."""
        last = await self.redis.call("XREVRANGE", self.redis.key("log"), "+", "-", "COUNT", 1)
        return (last[0][0] if last else b"0-0") != self._snapshot_tail

    async def _hgetall(self, conn, keys: list[bytes]) -> list[dict[bytes, bytes]]:
        out = []
        for i in range(0, len(keys), SCAN_BATCH):
            replies = await conn.pipeline([("HGETALL", k) for k in keys[i : i + SCAN_BATCH]])
            out += [pairs(r) for r in replies]
        return out

    async def _load_snapshot(self, initial: bool, conn=None) -> None:
        """Load the whole catalog: the log position first, then every key (not atomically);
        replaying the log from that position afterwards makes the mirror exact."""
        c = conn or self.redis
        mark = self._change_seq
        last = await c.call("XREVRANGE", self.redis.key("log"), "+", "-", "COUNT", 1)
        tail = last[0][0] if last else b"0-0"
        self._snapshot_tail = tail
        plen = len(self.redis.prefix)
        nkeys = await scan(c, self.redis.key("n:*"))
        nhashes = await self._hgetall(c, nkeys)
        bkeys = await scan(c, self.redis.key("b:*"))
        bhashes = await self._hgetall(c, bkeys)
        grave_ids = {int(x) for x in await c.call("ZRANGE", self.redis.key("grave"), 0, -1)}
        lkeys = await scan(c, self.redis.key("l:*"))
        lhashes = await self._hgetall(c, lkeys)
        blobs = {}
        for k, h in zip(bkeys, bhashes):
            if h:
                bid = int(k[plen + 2 :])
                blobs[bid] = parse_blob(bid, h)
        states = {}
        for k, h in zip(nkeys, nhashes):
            if h:
                states[int(k[plen + 2 :])] = h
        if ROOT_INO not in states:
            raise StartupError("cluster: the catalog in Redis has no root directory")
        links = {int(k[plen + 2 :]): h for k, h in zip(lkeys, lhashes) if h}
        if initial:
            self._build(states, blobs, grave_ids, links)
        else:
            # inodes this node changed while the snapshot was read: its mirror is newer than
            # what was read (and whatever came after the log position is replayed anyway)
            skip = set(self._changes_in_flight) | {
                i for i, seq in self._changed_at.items() if seq > mark
            }
            await self._reconcile(states, blobs, grave_ids, links, skip)
        self.last_id = tail
        self.synced_at = trio.current_time()

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
        for pred, h in links.items():
            self._set_links(pred, h)

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

    async def _fetch(self, conn, inos: list[int]) -> dict[int, dict[bytes, bytes]]:
        replies = await conn.pipeline([("HGETALL", self.redis.key("n", i)) for i in inos])
        return {i: pairs(r) for i, r in zip(inos, replies)}

    @contextlib.contextmanager
    def _changing(self, *inos: int):
        """This node is changing these inodes: a script in flight, then its mirror."""
        for i in inos:
            self._changes_in_flight[i] = self._changes_in_flight.get(i, 0) + 1
        try:
            yield
        finally:
            self._change_seq += 1
            for i in inos:
                n = self._changes_in_flight.pop(i) - 1
                if n:
                    self._changes_in_flight[i] = n
                self._changed_at[i] = self._change_seq

    async def _refresh(self, inos, conn=None, retired: set[int] | None = None) -> None:
        """Make the mirror's view of these inodes what Redis holds now. `retired`: blocks the
        change log says went to the grave (their space is not asked about again).

        What is read may be older than a change this node made to one of them while the read
        was in flight (its script ran after Redis answered, its mirror changed before the
        answer is applied): applying it would bring back the old state. Such inodes, and only
        they, are read again once this node's change is done. (Reading the whole batch again
        cost every follower 2-5x its reads while its own node wrote into the same directory,
        which each of its creates changes: bench/redis_scale.py.)"""
        c = conn or self.redis
        states: dict[int, dict] = {}
        blobs: dict[int, BlobRec] = {}
        read_at: dict[int, int] = {}  # inode -> this node's change count when read
        todo = list(inos)
        for _ in range(10):
            mark = self._change_seq
            got, got_blobs = await self._read_states(c, todo)
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
        await self.space.settle(leaving, c, retired=retired)
        self.refreshes += 1

    async def _read_states(self, c, inos) -> tuple[dict[int, dict], dict[int, BlobRec]]:
        """The inodes' hashes (and their parents' where the mirror lacks them), and the
        records of the blocks they name that this node does not know."""
        todo = [i for i in dict.fromkeys(inos)]
        states: dict[int, dict] = {}
        for _ in range(64):  # parents first, fetched as they are needed
            if not todo:
                break
            states.update(await self._fetch(c, todo))
            todo = [
                int(h[b"p"])
                for h in states.values()
                if h and int(h[b"p"]) not in states and int(h[b"p"]) not in self.nodes
            ]
        need = {int(h[b"b"]) for h in states.values() if h and b"b" in h}
        need = [b for b in need if not self.space.known(b)]
        blobs = {}
        if need:
            replies = await c.pipeline([("HGETALL", self.redis.key("b", b)) for b in need])
            for b, r in zip(need, replies):
                if r:
                    blobs[b] = parse_blob(b, pairs(r))
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
        if new:
            self._notify("new", node, None, node.parent, node.name)
        else:
            if ino in moved:
                self._notify("moved", node, None, *moved[ino])
            if old is not None and (rec is None or rec.id != old.id):
                self._notify("content", node, old, node.parent, node.name)
        return True

    async def _reconcile(self, states, blobs, grave_ids, links, skip=frozenset()) -> None:
        """After a gap in the log: make the mirror equal to a full snapshot (but for the
        inodes in `skip`, which this node changed since the snapshot was read)."""
        self.resyncs += 1
        leaving: list[BlobRec] = []
        gone = [
            n
            for n in self.nodes.values()
            if n.persisted and n.linked and n.ino not in states and n.ino not in skip
        ]
        for node in gone:
            self._vanish(node, leaving)
        self._apply({i: h for i, h in states.items() if i not in skip}, blobs, leaving)
        await self.space.reconcile_grave(grave_ids, blobs)
        await self.space.settle(leaving, retired=grave_ids)
        for pred in list(self.successors):
            if pred not in links:
                self._set_links(pred, {})
        for pred, h in links.items():
            self._set_links(pred, h)

    # ------------------------------------------------------------------------------ the follower
    async def _follow(self) -> None:
        """Apply other nodes' changes as the log reports them; reconnect and resync as needed."""
        self._unreplicated_seen = self.redis.unreplicated
        try:
            await self._follow_loop()
        finally:
            if self._conn is not None:
                self._conn.abort()

    @property
    def follower_round_trips(self) -> int:
        """Round trips of the follower's connections (not in the link's `calls`)."""
        c = self._conn
        return self._follower_trips + (c.round_trips if c is not None else 0)

    async def _follow_loop(self) -> None:
        conn = None
        key = self.redis.key("log")
        while True:
            if conn is None and self._conn is not None:  # a connection ended: keep its count
                self._follower_trips += self._conn.round_trips
            self._conn = conn
            try:
                if conn is None:
                    conn = self._conn = await self.redis.connect()
                    await self._check_catalog(conn)
                    first = await conn.call("XRANGE", key, "-", "+", "COUNT", 1)
                    if (
                        self.last_id != b"0-0"
                        and first
                        and stream_id(first[0][0]) > stream_id(self.last_id)
                    ):
                        older = await conn.call("XRANGE", key, "-", self.last_id, "COUNT", 1)
                        if not older:
                            log.warning(
                                "cluster: missed part of the change log (trimmed while "
                                "away); reloading the catalog"
                            )
                            self._resync = True
                if await self.redis.check_master():
                    # Sentinel replaced the master (the link logs the move): whatever this
                    # connection reads now comes from a server that is no longer the catalog:
                    # reconnect, then reload. A failover, not an outage: nothing is marked down
                    conn.abort()
                    conn = None
                    self._resync = True
                    continue
                if self.redis.unreplicated != self._unreplicated_seen:
                    # a change of ours is on the master but failed here (no replica confirmed
                    # it): the log entry naming it is ours, so it is skipped; reload instead
                    self._unreplicated_seen = self.redis.unreplicated
                    self._resync = True
                if self._resync:
                    self._resync = False
                    await self._load_snapshot(initial=False, conn=conn)
                mark = self._change_seq
                reply = await conn.call(
                    "XREAD", "COUNT", 512, "BLOCK", 1000, "STREAMS", key, self.last_id
                )
                self.synced_at = trio.current_time()
                if reply:
                    await self._apply_entries(reply[0][1], conn, mark)
                progress, self._progress = self._progress, trio.Event()
                progress.set()
            except (RedisUnavailable, RedisError) as e:
                # RedisError: an error reply on the follower's own connection, such as
                # "LOADING" from a Redis restarting from its AOF: as unreachable, retry later
                if conn is not None:
                    conn.abort()
                    conn = None
                # the batch in hand may be half applied (last_id is already past it), and
                # changes may have been missed: reload once back (docs/cluster.md)
                self._resync = True
                if await self.redis.check_master(now_please=True):
                    continue  # Sentinel moved the master (logged as such): follow it now
                self.redis.mark_down(str(e))
                await trio.sleep(FOLLOW_RETRY_SECONDS)
            except KvfsError as e:
                log.error("cluster: following the change log failed: %s; reloading", e)
                if conn is not None:
                    conn.abort()
                    conn = None
                self._resync = True
                await trio.sleep(0.5)  # (logged each time: not as often as the above)

    async def _check_catalog(self, conn) -> None:
        """After (re)connecting: is the catalog still in Redis? A Redis restarted without
        persistence comes back empty; say so once, loudly (this node keeps serving what its
        mirror holds; changes fail until an operator re-creates the pool)."""
        meta = pairs(await conn.call("HGETALL", self.redis.key("meta")))
        lost = meta.get(b"pool_id", b"").decode() != self.pool_id
        if lost and not self.catalog_lost:
            log.error(
                "cluster: Redis at %s no longer holds the catalog of pool %s (restarted "
                "without persistence, or flushed?): serving only what this node already "
                "knows; unmount every node and run `kvfs format --force` to start over",
                self.redis.where,
                self.pool_id,
            )
        self.catalog_lost = lost

    async def _apply_entries(self, entries: list, conn, mark: int = -1) -> None:
        """Apply a batch of the log's entries, read when this node's change count was `mark`.

        An entry that carries the records its script wrote (a publish: `parse_entry`) is
        applied from them, with nothing read back, unless this node may hold something newer
        for that inode: a change of its own to it in the batch, in flight, or finished since
        the batch was read. Such inodes, and those an entry names without records, are read
        from Redis (`_refresh`: current state, idempotent)."""
        inos: list[int] = []
        retired: set[int] = set()
        purged: list[int] = []
        states: dict[int, dict] = {}  # the records others' entries carry (last one wins)
        blobs: dict[int, BlobRec] = {}
        times: dict[int, int] = {}
        links: dict[int, dict] = {}  # a predecessor's chain links, as an entry carries them
        own: set[int] = set()
        origin = str(self.epoch).encode()
        for sid, flat in entries:
            self.events += 1
            f, records = parse_entry(flat)
            if f.get(b"o") != origin:
                inos += ids(f.get(b"i"))
                retired.update(ids(f.get(b"r")))
                purged += ids(f.get(b"g"))
                for tag, key, fields in records:
                    if tag == b"@n":
                        states[int(key)] = fields
                    elif tag == b"@u":  # a new version: the fields it changed
                        ino = int(key)
                        h = states.get(ino)
                        if h is None:
                            node = self.nodes.get(ino)
                            if node is None or not node.persisted or not node.linked:
                                inos.append(ino)  # unknown here: read it whole
                                continue
                            h = states[ino] = pairs([as_bytes(v) for v in node_fields(node)])
                        if h:
                            h.update(fields)
                    elif tag == b"@-":
                        states[int(key)] = {}
                    elif tag == b"@b":
                        bid = int(key)
                        if not self.space.known(bid):
                            blobs[bid] = parse_blob(bid, fields)
                    elif tag == b"@t":
                        ino, t = (int(x) for x in key.split())
                        times[ino] = max(t, times.get(ino, 0))
                    elif tag == b"@l":
                        links[int(key)] = fields
            else:
                own.update(ids(f.get(b"i")))
                own.update(int(key) for tag, key, _ in records if tag in (b"@n", b"@-"))
            self.last_id = sid
        reread = set(inos)
        for ino in list(states):
            h = states[ino]
            if (
                ino in reread
                or ino in own
                or ino in self._changes_in_flight
                or self._changed_at.get(ino, -1) > mark
                or (h and int(h[b"p"]) not in self.nodes and int(h[b"p"]) not in states)
            ):
                del states[ino]
                if ino not in reread:
                    reread.add(ino)
                    inos.append(ino)
        if inos:
            await self._refresh(inos, conn, retired)
        if states:
            await self._install_records(states, blobs, conn, retired)
        for ino, t in times.items():
            node = self.nodes.get(ino)
            if node is not None and ino not in reread:
                node.mtime_ns = max(node.mtime_ns, t)
                node.ctime_ns = max(node.ctime_ns, t)
        if retired:
            await self.space.settle(
                [r for r in map(self.space.known, retired) if r is not None], conn, retired=retired
            )
        for bid in purged:
            self.space.purged(bid)
        for pred, h in links.items():
            self._set_links(pred, h)

    async def _install_records(self, states, blobs, conn, retired: set[int]) -> None:
        """Install the records others' log entries carried (see `_apply_entries`)."""
        leaving: list[BlobRec] = []
        self._apply(states, blobs, leaving)
        await self.space.settle(leaving, conn, retired=retired)
        self.records += 1

    async def catch_up(self, tail: bytes, timeout: float = 10.0) -> bool:
        """Wait until the mirror has applied the log up to `tail`."""
        with trio.move_on_after(timeout):
            while stream_id(self.last_id) < stream_id(tail):
                await self._progress.wait()
            return True
        return False

    @property
    def fresh(self) -> bool:
        """True while the mirror is known to be current (within half the grace period): a
        block it names cannot have had its space reused yet."""
        return (
            self.redis.online
            and not self.catalog_lost
            and trio.current_time() - self.synced_at < max(2.0, self.cfg.grace_seconds / 2)
        )
