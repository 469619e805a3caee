"""The follower: how a node's mirror (mirror.py) keeps current, one follower per shard of the
pool's catalog reading that shard's change log (the stream `log`) with XREAD and applying each
batch of entries (`_apply_entries`): from the records an entry carries, or by reading what it
names again (`_refresh`, idempotent, so entries may be applied twice or late without harm). A
follower that missed part of its log, or whose Redis was replaced by Sentinel, has the whole
catalog reloaded (`_reload`); a reload and the followers' batches are applied one at a time.
"""

from __future__ import annotations

import logging

import trio

from kvfs.catalog.records import BlobRec
from kvfs.catalog.redis.codec import (
    as_bytes,
    ids,
    node_fields,
    pairs,
    parse_blob,
    parse_entry,
    stream_id,
)
from kvfs.errors import KvfsError
from kvfs.redis.link import ClusterLink, replica_in_sync
from kvfs.redis.resp import RedisClient, RedisError, RedisUnavailable

log = logging.getLogger("kvfs.catalog")

# The follower retries this soon after Redis failed it. A name committed on another node right
# after a restarted Redis is ready reaches this node only once the follower is back and has
# reloaded the catalog (docs/cluster.md: 2 s from the writer's close). An attempt against a Redis
# that is down or still loading its AOF is refused at once and costs nothing; with 0.5 s the
# 200-cycle cluster torture saw one change 2.03 s late, in a Redis restart cycle.
FOLLOW_RETRY_SECONDS = 0.1
# With durability "fsync", after a read that found entries (and not a full FOLLOW_COUNT), the
# follower waits this long before it reads again, so that a busy log is read in batches: each
# read costs Redis a round trip per follower, whatever it returns (bench/redis_shards.py). A
# file is visible elsewhere `writeback_ms` (100 ms) after its close in that mode anyway; with
# "close" the follower reads at once.
FOLLOW_PACE_SECONDS = 0.02
FOLLOW_COUNT = 512
# (follow_replicas) A follower that could not use a replica follows the master and tries a
# replica again after this long.
REPLICA_RETRY_SECONDS = 5.0


class Shard:
    """One shard of the pool's catalog as this node follows it: its link, its place in its
    change log, its follower's connection (docs/cluster.md, "More than one Redis")."""

    def __init__(self, k: int, link: ClusterLink):
        self.k = k
        self.link = link
        self.last_id = b"0-0"  # the last log entry applied
        self.snapshot_tail = b"0-0"  # the log position the last snapshot read
        self.synced_at = trio.current_time()  # when the follower last heard from it
        self.conn: RedisClient | None = None  # the follower's connection
        self.trips = 0  # round trips of its follower's connections that ended
        self.resync = False
        self.unreplicated_seen = 0
        self.replica: tuple[str, int] | None = None  # (follow_replicas) the one it reads
        self.replica_retry_at = 0.0  # when it tries a replica again after one failed it
        self.replica_fallbacks = 0  # times it left a replica for the master


class Following:
    """RedisMirror's follower half (a mixin: it works on the mirror's tree, its shards and
    its change marks; kvfs/catalog/redis/mirror.py)."""

    async def _follow(self) -> None:
        """Apply other nodes' changes as the logs report them (a follower per shard);
        reconnect and resync as needed."""
        for sh in self.shards:
            sh.unreplicated_seen = sh.link.unreplicated
        try:
            async with trio.open_nursery() as nursery:
                for sh in self.shards:
                    nursery.start_soon(self._follow_loop, sh)
        finally:
            for sh in self.shards:
                if sh.conn is not None:
                    sh.conn.abort()

    @property
    def follower_round_trips(self) -> int:
        """Round trips of the followers' connections (not in the links' `calls`)."""
        return sum(
            sh.trips + (sh.conn.round_trips if sh.conn is not None else 0) for sh in self.shards
        )

    async def _reload(self, sh: Shard, conn) -> None:
        """Reload shard `sh`'s part of the catalog (after a gap in its log, a failover, a
        broken connection: its follower's own), or the whole catalog when every shard asks
        (the catalog's own doubts set them all): a shard that is away holds up no other."""
        async with self._apply_lock:
            self._reloads += 1
            if len(self.shards) == 1 or all(x.resync for x in self.shards):
                self._resync = False
                await self._load_snapshot(initial=False, conns={sh.k: conn})
            else:
                sh.resync = False
                await self._load_snapshot(initial=False, conns={sh.k: conn}, only=sh)

    async def _follow_loop(self, sh: Shard) -> None:
        conn = None
        link = sh.link
        key = link.key("log")
        while True:
            applying = False  # (a batch in hand, half applied if this fails)
            if conn is None and sh.conn is not None:  # a connection ended: keep its count
                sh.trips += sh.conn.round_trips
            sh.conn = conn
            try:
                if conn is None:
                    conn = sh.conn = await self._connect(sh)
                    await self._check_catalog(conn, sh)
                    first = await conn.call("XRANGE", key, "-", "+", "COUNT", 1)
                    if (
                        sh.last_id != b"0-0"
                        and first
                        and stream_id(first[0][0]) > stream_id(sh.last_id)
                    ):
                        older = await conn.call("XRANGE", key, "-", sh.last_id, "COUNT", 1)
                        if not older:
                            log.warning(
                                "cluster: missed part of the change log (trimmed while "
                                "away); reloading the catalog"
                            )
                            sh.resync = True
                if await link.check_master():
                    # Sentinel replaced the master (the link logs the move): whatever this
                    # connection reads now comes from a server that is no longer the catalog:
                    # reconnect, then reload. A failover, not an outage: nothing is marked down
                    conn.abort()
                    conn = None
                    sh.resync = True
                    continue
                if (
                    sh.replica is None
                    and self.cfg.follow_replicas
                    and link.replica_addrs
                    and trio.current_time() >= sh.replica_retry_at
                ):
                    conn.abort()  # following the master while a replica may serve: move
                    conn = None
                    continue
                if link.unreplicated != sh.unreplicated_seen:
                    # a change of ours is on the master but failed here (no replica confirmed
                    # it): the log entry naming it is ours, so it is skipped; reload instead
                    sh.unreplicated_seen = link.unreplicated
                    sh.resync = True
                if sh.resync:
                    await self._reload(sh, conn)
                mark = self._change_seq
                reloads = self._reloads
                read = ("XREAD", "COUNT", FOLLOW_COUNT, "BLOCK", 1000, "STREAMS", key, sh.last_id)
                if sh.replica is None:
                    reply = await conn.call(*read)
                else:  # a replica: still linked to the master when the read began?
                    role, reply = await conn.pipeline([("ROLE",), read])
                    if not replica_in_sync(role):
                        self._leave_replica(sh, "its link to the master is down")
                        conn.abort()  # (what it read is not applied)
                        conn = None
                        continue
                sh.synced_at = trio.current_time()
                if not link.online and sh.replica is None:
                    link.reached()
                if reply:
                    async with self._apply_lock:
                        if reloads == self._reloads:  # (else: read before a reload's tails)
                            applying = True
                            await self._apply_entries(reply[0][1], conn, mark, sh)
                            applying = False
                progress, self._progress = self._progress, trio.Event()
                progress.set()
                if self.follow_pace and reply and len(reply[0][1]) < FOLLOW_COUNT:
                    await trio.sleep(self.follow_pace)
            except (RedisUnavailable, RedisError) as e:
                # RedisError: an error reply on the follower's own connection, such as
                # "LOADING" from a Redis restarting from its AOF: as unreachable, retry later
                if conn is not None:
                    conn.abort()
                    conn = None
                if sh.replica is not None:  # the replica failed, not (as far as known) the master
                    # the master holds what the replica did, and more: a batch half applied
                    # (last_id already past it) is the one reason to reload
                    sh.resync = sh.resync or applying
                    self._leave_replica(sh, str(e))
                    continue
                # the batch in hand may be half applied (last_id is already past it), and
                # changes may have been missed: reload once back (docs/cluster.md)
                sh.resync = True
                if await link.check_master(now_please=True):
                    continue  # Sentinel moved the master (logged as such): follow it now
                link.mark_down(str(e))
                await trio.sleep(FOLLOW_RETRY_SECONDS)
            except KvfsError as e:
                log.error("cluster: following the change log failed: %s; reloading", e)
                if conn is not None:
                    conn.abort()
                    conn = None
                sh.resync = True
                await trio.sleep(0.5)  # (logged each time: not as often as the above)

    async def _connect(self, sh: Shard):
        """The follower's connection to shard `sh`: with `follow_replicas`, to one of its
        master's replicas (the nodes spread over them by epoch) unless none is usable now, else
        to the master. Both hold the same log and the same entry ids, so a follower moves
        between them without reloading: a replica answers a read from where the follower is
        once it has the entries after it, and what it reads then is at least that recent."""
        sh.replica = None
        if self.cfg.follow_replicas and trio.current_time() >= sh.replica_retry_at:
            if await sh.link.check_master(now_please=True):
                sh.resync = True  # Sentinel moved the master: as in the loop
            got = await sh.link.connect_replica(self.epoch + sh.k)
            if got is not None:
                conn, sh.replica = got
                return conn
            sh.replica_retry_at = trio.current_time() + REPLICA_RETRY_SECONDS
        return await sh.link.connect()

    def _leave_replica(self, sh: Shard, why: str) -> None:
        """Follow shard `sh`'s master until REPLICA_RETRY_SECONDS from now."""
        assert sh.replica is not None
        sh.link.warn(
            "replica",
            "cluster: stopped reading the change log of %s from its replica %s:%d (%s); "
            "reading it from the master",
            sh.link.where,
            *sh.replica,
            why,
        )
        sh.replica = None
        sh.replica_fallbacks += 1
        sh.replica_retry_at = trio.current_time() + REPLICA_RETRY_SECONDS

    async def _check_catalog(self, conn, sh: Shard) -> None:
        """After (re)connecting: is the catalog still in Redis? A Redis restarted without
        persistence comes back empty; say so once, loudly (this node keeps serving what its
        mirror holds; changes fail until an operator re-creates the pool)."""
        meta = pairs(await conn.call("HGETALL", sh.link.key("meta")))
        lost = meta.get(b"pool_id", b"").decode() != self.pool_id
        if lost and not self.catalog_lost:
            log.error(
                "cluster: Redis at %s no longer holds the catalog of pool %s (restarted "
                "without persistence, or flushed?): serving only what this node already "
                "knows; unmount every node and run `kvfs format --force` to start over",
                sh.link.where,
                self.pool_id,
            )
        self.catalog_lost = lost

    async def _apply_entries(
        self, entries: list, conn, mark: int = -1, sh: Shard | None = None
    ) -> None:
        """Apply a batch of shard `sh`'s log entries, read when this node's change count was
        `mark`.

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
        sh = sh or self.shards[0]
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
                own.update(int(key) for tag, key, _ in records if tag in (b"@n", b"@u", b"@-"))
            sh.last_id = sid
        # An own entry for an inode whose mirror then took another node's record (replayed
        # after a reload, or read behind this node's own change): that record was older than
        # this change, so the inode is read again, else the mirror would keep the older state
        stale_own = [
            i for i in own if self._others_at.get(i, -1) > self._own_at.get(i, -1) and i not in inos
        ]
        inos += stale_own
        self.stale_own_rereads += len(stale_own)
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
            await self._refresh(inos, conn, retired, sh)
        if states:
            await self._install_records(states, blobs, conn, retired, sh)
        for ino, t in times.items():
            node = self.nodes.get(ino)
            if node is not None and ino not in reread:
                node.mtime_ns = max(node.mtime_ns, t)
                node.ctime_ns = max(node.ctime_ns, t)
        if retired:
            await self.space.settle(
                [r for r in map(self.space.known, retired) if r is not None],
                conn,
                retired=retired,
                link=sh.link,
            )
        for bid in purged:
            self.space.purged(bid)
        for pred, h in links.items():
            self._set_links(pred, h)

    async def _install_records(self, states, blobs, conn, retired: set[int], sh: Shard) -> None:
        """Install the records others' log entries carried (see `_apply_entries`)."""
        leaving: list[BlobRec] = []
        self._apply(states, blobs, leaving)
        self._order += 1
        for ino in states:
            self._others_at[ino] = self._order
        await self.space.settle(leaving, conn, retired=retired, link=sh.link)
        self.records += 1

    async def catch_up(self, tails: list[bytes] | bytes, timeout: float = 10.0) -> bool:
        """Wait until the mirror has applied each shard's log up to its tail in `tails` (one
        tail: the first shard's)."""
        if isinstance(tails, bytes):
            tails = [tails]
        with trio.move_on_after(timeout):
            while any(stream_id(sh.last_id) < stream_id(t) for sh, t in zip(self.shards, tails)):
                await self._progress.wait()
            return True
        return False

    @property
    def fresh(self) -> bool:
        """True while the mirror is known to be current (within half the grace period): a
        block it names cannot have had its space reused yet."""
        return (
            all(sh.link.online for sh in self.shards)
            and not self.catalog_lost
            and trio.current_time() - self.synced_at < max(2.0, self.cfg.grace_seconds / 2)
        )
