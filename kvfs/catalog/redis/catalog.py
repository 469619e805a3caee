"""The cluster catalog: one pool shared by many nodes, its catalog in Redis.

Every node mounts the same namespaces. Redis holds the truth: the tree (`n:<ino>` hashes and
`d:<ino>` name indexes), the blocks (`b:<id>`), the chains (`l:<ino>`), the cluster-wide LRU
order (`atime`), retired blocks waiting out their grace period (`grave`), the allocation
leases (`lease:<region>`) and a log of changes (the stream `log`); kvfs/catalog/redis/codec.py
lists the fields. Each node serves from a mirror of the tree in memory (kvfs/catalog/redis/
mirror.py), so lookups and getattr cost no round trip.

Changes are Redis-first: a mutation runs one Lua script (kvfs/catalog/redis/lua/) that checks
it against Redis (a name another node took, a directory another node filled, a lease this node
lost) and applies it atomically, together with an entry in the log naming what changed; only
then does this node apply it to its mirror. The space side (leases, the grave, eviction) is
kvfs/cluster/space.py. docs/cluster.md describes the protocol and what each failure leaves.
"""

from __future__ import annotations

import errno
import logging
import time

import trio

from kvfs.catalog.records import BlobRec, Node, ghost_key
from kvfs.catalog.redis.bootstrap import EPOCH_SHIFT
from kvfs.catalog.redis.codec import blob_fields, node_fields, publish_args, score_fields
from kvfs.catalog.redis.flushes import Flushes
from kvfs.catalog.redis.mirror import RedisMirror
from kvfs.catalog.redis.scripts import SCRIPTS
from kvfs.catalog.tree import RENAME_EXCHANGE, _now
from kvfs.errors import KvfsError, Unsure
from kvfs.pool.layout import Layout
from kvfs.redis.link import reply_error

log = logging.getLogger("kvfs.catalog")

# With durability "fsync" a write-back batch whose publish Redis did not run (unreachable, or
# its master being replaced: a Sentinel failover takes 6-8 s) is sent again every
# PUBLISH_RETRY_SECONDS for up to PUBLISH_PATIENCE seconds before its files fail (their
# blocks are durable on the namespaces meanwhile; an fsync waits for them). A close in "close"
# mode fails at once instead (its caller is told EIO).
PUBLISH_PATIENCE = 30.0
PUBLISH_RETRY_SECONDS = 0.25
# Files per PUBLISH call: a write-back batch takes whatever is queued (after an outage,
# thousands of files), and a script's arguments to one Redis command (ZADD, XADD) pass
# through Lua's stack, which holds about 8,000
PUBLISH_FILES = 128
# A script whose reply was lost: how long (at least; twice lease_seconds if longer) its node
# asks Redis whether it ran before it gives up not knowing (`_ran`)
RAN_PATIENCE = 10.0


class RedisCatalog(Flushes, RedisMirror):
    """The catalog of a pool shared by several nodes (see the module docstring). Built by
    kvfs/service.py after `bootstrap.join`; `load()` fills the mirror."""

    # Every change is in Redis once its script has returned (made durable by Redis's own
    # persistence and the replicas the link waits for): no transaction is ever left open for
    # the write-back's flusher to commit (kvfs/write/writeback.py).
    unsynced = False
    open_since = None

    async def sync(self) -> None:
        """Every change applied so far is durable already (see above)."""

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Follow the other nodes' changes until cancelled."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._follow)
            task_status.started()
            await trio.sleep_forever()

    async def stop(self) -> None:
        for sh in reversed(self.shards):
            await sh.link.aclose()

    def close(self) -> None:
        pass

    def statistics(self) -> dict:
        link = self.redis
        calls = [sh.link.calls for sh in self.shards]
        return {
            "node_id": self.cfg.node_id,
            "epoch": self.epoch,
            # with shards: every shard's Redis, and online only while all of them are
            "redis": ", ".join(sh.link.where for sh in self.shards),
            "online": all(sh.link.online for sh in self.shards),
            "offline": [sh.link.where for sh in self.shards if not sh.link.online],
            "fresh": self.fresh,
            "catalog_lost": self.catalog_lost,
            "lag_seconds": round(trio.current_time() - self.synced_at, 3),
            "events": self.events,
            "refreshes": self.refreshes,
            "records": self.records,
            "misses_answered": self.misses_answered,
            "stale_own_rereads": self.stale_own_rereads,
            "publish_retries": self.publish_retries,
            "resyncs": self.resyncs,
            "redis_calls": sum(calls),
            "shards": len(self.shards),
            "shard_calls": calls,
            "follower_round_trips": self.follower_round_trips,
            # what each shard's follower reads (follow_replicas: a replica, unless none serves)
            "following": [
                "master" if sh.replica is None else "replica %s:%d" % sh.replica
                for sh in self.shards
            ],
            "replica_fallbacks": sum(sh.replica_fallbacks for sh in self.shards),
            "redis_failures": link.failures,
            "redis_call_ms": round(1000 * link.call_seconds / max(1, link.calls), 3),
            "master": link.where,
            "failovers": link.failovers,
            "min_replicas": self.cfg.min_replicas,
            "replicas_confirming": link.replica_target,
            "unreplicated": link.unreplicated,
            "replica_waits": link.replica_waits,
            "refused_writes": link.refused,
        }

    # ------------------------------------------------------------------------------ ids
    def _id(self, attr: str) -> int:
        if getattr(self, attr) & ((1 << EPOCH_SHIFT) - 1) == (1 << EPOCH_SHIFT) - 1:
            raise KvfsError(errno.EOVERFLOW, "this mount has used up its ids; remount")
        return super()._id(attr)

    def next_blob_id(self) -> int:
        return self._id("_next_blob")

    # ------------------------------------------------------------------------------ lookups
    async def lookup_fresh(self, parent: int, name: bytes, held_here=None) -> Node:
        """Like `lookup`, but a name this node does not know is looked up in Redis (another
        node may have created it a moment ago: with `confirm_misses`, or while the mirror
        is not fresh), and while the mirror may be behind, so is a file whose content is not
        `held_here` (its space may have been reused meanwhile). EIO if Redis cannot be asked.

        Without `confirm_misses` (durability "fsync") a fresh mirror answers a miss itself:
        a file another node closed is visible here once its write-back batch is published
        and the follower has applied it (docs/cluster.md: the close-to-visible bound), and a
        store, whose create looks its new name up first, costs no round trip for it."""
        try:
            node = self.lookup(parent, name)
        except KvfsError as e:
            if e.errno != errno.ENOENT or parent not in self.nodes:
                raise
            if not self.confirm_misses and self.fresh:
                self.misses_answered += 1
                raise
            return await self.confirm(parent, name)
        if (
            node.is_file
            and node.blob is not None
            and not self.fresh
            and not (held_here is not None and held_here(node))
        ):
            try:
                node = await self.confirm(parent, name)
            except KvfsError as e:
                if e.errno != errno.EIO:
                    raise
                raise KvfsError(
                    errno.EIO,
                    f"{self.path_of(node)}: the cluster catalog is "
                    f"unreachable and this block is not held here",
                ) from None
        return node

    async def confirm(self, parent: int, name: bytes) -> Node:
        """The current record of one name, read from Redis now (for a mirror that is not
        fresh: what it names is then as safe to read as a fresh mirror's); EIO if Redis cannot
        be asked, ENOENT if the name is gone."""
        p = self.nodes.get(parent)
        known = p.children.get(name) if p is not None and p.children is not None else None
        sh = self.shard_of_dir(parent)
        ino = await sh.link.call("HGET", sh.link.key("d", parent), name)
        inos = [int(ino)] if ino is not None else []
        if known is not None and known not in inos:
            inos.append(known)  # renamed or removed meanwhile: the mirror forgets it
        if inos:
            await self._refresh(inos, sh=sh)
        return self.lookup(parent, name)

    # ------------------------------------------------------------------------------ mutations
    def _regions_of(self, layout: Layout) -> str:
        regions = self.space.regions
        rs = set()
        for e in layout.unit_extents():
            rs.update(regions.touched(e.offset, e.length))
        return " ".join(str(r) for r in sorted(rs))

    async def _own(self, retired: list, leaving: list[BlobRec], link=None) -> None:
        """After one of this node's scripts (in shard `link`): the blocks it retired are in
        the grave; blocks that left a file here and are not among them were retired earlier
        by another node."""
        retired_ids = {int(b) for b in retired}
        self.space.buried(retired_ids)
        try:
            await self.space.settle(leaving, retired=retired_ids, link=link or self.redis)
        except KvfsError:  # the change is made; the follower reconciles later
            self._resync = True

    async def _publish(self, args: list, recs: list[tuple[int, BlobRec]], link) -> list:
        """Run PUBLISH for blocks `recs`. If the connection broke after the script was sent,
        Redis may have run it: ask (once Redis answers) which block records exist. Some do:
        the script ran, and published exactly those (the follower reloads to learn exactly
        what it retired); the others are refused with the original error. None does: the
        original error. Redis cannot tell in time: the error, marked `maybe_published`, so
        the caller keeps the blocks' space instead of allocating it to someone else."""
        try:
            return await link.eval(SCRIPTS.publish, args)
        except KvfsError as e:
            if isinstance(e, Unsure) and e.unreplicated:
                # published on the master, but no replica confirmed it: not reported durable,
                # and its space stays taken (the master names it); the follower reloads
                e.maybe_published = True
                raise
            if not (isinstance(e, Unsure) and e.maybe_done):
                raise
            err = e
        found: list = []

        async def published() -> bool:
            found[:] = await link.pipeline([("EXISTS", link.key("b", r.id)) for _, r in recs])
            return any(found)

        done = await self._ran(err, published, f"block {recs[0][1].id}: published")
        if done is None:
            err.maybe_published = True
            raise err from None
        if not done:
            err.not_run = True  # (Redis said so: the publish may be sent again)
            raise err
        return [[], [f"{ino} EIO {err}".encode() for (ino, _), f in zip(recs, found) if not f], []]

    async def _ran(self, err: KvfsError, probe, what: str) -> bool | None:
        """A script's reply was lost (`err.maybe_done`): ask Redis, once it answers again,
        whether the script ran (`probe()`, which reads what the script writes). True: it ran
        (the follower then reloads the catalog, to learn what else it changed); False: it did
        not; None: Redis did not answer in time to tell, and the follower reloads the catalog
        once it does. The caller's mirror keeps the state from before the change, which is
        wrong if the script ran: the follower skips this node's own log entries, and a reload
        under way skipped the inodes while the change was in flight, so nothing else would
        read them again: the node would serve the version before for good, the other nodes
        the new one."""
        deadline = trio.current_time() + max(RAN_PATIENCE, 2 * self.cfg.lease_seconds)
        with trio.CancelScope(shield=True):
            while True:
                try:
                    done = await probe()
                    break
                except KvfsError:
                    if trio.current_time() > deadline:
                        log.error("cluster: %s? Redis did not say in time (%s)", what, err)
                        self._resync = True
                        return None
                    await trio.sleep(0.5)
        if done:
            log.warning("cluster: %s, though Redis's reply was lost", what)
            self._resync = True
        return done

    async def _publish_new(self, node: Node, policy: str) -> None:
        """Run MKNODE for a directory or symlink not yet in Redis, then mark it published.
        With several shards, a directory's record goes in its parent's shard and its entries
        in its own: its marker there first (`o:<ino>`, dirmark.lua), taken back if the
        record cannot be published."""
        t = time.perf_counter()
        link = self.shard_of_node(node).link
        fields = node_fields(node)
        own = None
        if node.children is not None and len(self.shards) > 1:
            own = self.shard_of_dir(node.ino)
            fields += [b"h", own.k]
            if own.link is link:
                own = None
            else:
                await own.link.eval(SCRIPTS.dirmark, ["open", node.ino, node.parent])
        with self._changing(node.ino, node.parent):
            try:
                retired = await link.eval(
                    SCRIPTS.mknode,
                    [
                        self.epoch,
                        node.ino,
                        node.parent,
                        node.name,
                        policy,
                        self.space.grace_ms,
                        node.ctime_ns,
                        *fields,
                    ],
                )
            except KvfsError as e:
                if own is not None and not (isinstance(e, Unsure) and e.maybe_done):
                    with trio.CancelScope(shield=True):
                        try:
                            await own.link.eval(SCRIPTS.dirmark, ["close", node.ino, node.parent])
                        except KvfsError:
                            pass  # (a marker nobody names: harmless)
                raise
            self.commits += 1
            self.commit_seconds += time.perf_counter() - t
            leaving: list[BlobRec] = []
            parent = self.nodes[node.parent]
            occupant = parent.children.get(node.name)
            if occupant is not None and occupant != node.ino:  # replaced another node's file
                self._vanish(self.nodes[occupant], leaving)
            node.persisted = True
        await self._own(retired, leaving, link)

    async def _add(self, node: Node) -> None:
        """A new directory or symlink: published in Redis first (EEXIST if another node took
        the name), then in the mirror."""
        with self._changing(node.ino, node.parent):
            await self._publish_new(node, "excl")
            self._place(node)

    async def commit(
        self, node: Node, layout: Layout, score: tuple[float, int] | None = None
    ) -> tuple[BlobRec, BlobRec | None]:
        """Publish `layout` as the file's content once it is durable on the namespaces (a
        batch of one: `commit_batch`)."""
        (got,) = await self.commit_batch([(node, layout, score)])
        if isinstance(got, KvfsError):
            raise got
        return got

    async def commit_batch(
        self, items: list[tuple], mtimes: list[int] | None = None
    ) -> list[tuple[BlobRec, BlobRec | None] | KvfsError]:
        """Publish several files' blocks, each (node, layout, score), durable on the
        namespaces, in one script call (one round trip: the write-back flusher's batch,
        kvfs/write/writeback.py). Each file on its own: the script checks that this node
        still holds the leases of its space, that its directory (a new file) or its record
        (a new version) is still there, and swaps its block in; a file it refuses gets its
        error in the returned list, in its place, and keeps the version it had. `mtimes`:
        each file's modification time (default: now). An error for the whole call (Redis
        unreachable) is raised, every file then keeping its version (`maybe_published`:
        Redis may have published them, their space stays taken). With shards, each shard's
        files go in a call of its own; more than PUBLISH_FILES files of a shard go in several
        calls; an error for one call is then each of its files' own (the calls before it
        published theirs)."""
        if len(self.shards) > 1:
            # one call per shard (first: each shard's call then carries up to PUBLISH_FILES
            # of its files): a file's records go in its directory's shard (computed as the
            # arguments are built, with no wait between: a rename of a file waits for its
            # publish, `settled`)
            groups: dict[int, list[int]] = {}
            for i, (node, *_) in enumerate(items):
                groups.setdefault(self.shard_of_node(node).k, []).append(i)
            if len(groups) > 1:
                out = [None] * len(items)
                for idx in groups.values():
                    try:
                        got = await self.commit_batch(
                            [items[i] for i in idx],
                            [mtimes[i] for i in idx] if mtimes is not None else None,
                        )
                    except KvfsError as e:
                        got = [e] * len(idx)
                    for i, g in zip(idx, got):
                        out[i] = g
                return out
        if len(items) > PUBLISH_FILES:
            out = []
            for k in range(0, len(items), PUBLISH_FILES):
                part = items[k : k + PUBLISH_FILES]
                try:
                    out += await self.commit_batch(
                        part, mtimes[k : k + PUBLISH_FILES] if mtimes is not None else None
                    )
                except KvfsError as e:
                    out += [e] * len(part)
            return out
        sh = self.shard_of_node(items[0][0])
        now = _now()
        out: list = [None] * len(items)
        args: list = [self.epoch, self.redis.token, self.space.grace_ms, now, 0]
        sent = []  # (index, node, rec, old, what to restore)
        for i, (node, layout, score) in enumerate(items):
            ghost = node.ino in self._ghosts_asked
            self._ghosts_asked.discard(node.ino)
            rec = BlobRec(self.next_blob_id(), layout, now)
            old = node.blob
            if not node.linked:
                node.blob = rec
                out[i] = (rec, old)
                continue
            sent.append(
                (i, node, rec, old, (old, node.mtime_ns, node.ctime_ns, node.prio, node.uses))
            )
            node.blob = rec
            node.mtime_ns = node.ctime_ns = now if mtimes is None else mtimes[i]
            if score is not None:
                node.prio, node.uses = score
            blob = blob_fields(rec, node.ino)
            if node.persisted:
                kind = b"old"
                fields = [
                    *(b"b", rec.id, b"t", node.mtime_ns, b"k", node.ctime_ns, b"m", node.mode),
                    *(b"u", node.uid, b"g", node.gid, b"a", node.atime_ns),
                    *score_fields(node),
                ]
            else:
                kind, fields = b"new", node_fields(node)
                if node.ino in self._wpred:  # its writer's previous file (mirror._write_link)
                    fields += [b"w", self._wpred[node.ino]]
            args += publish_args(
                *(node.ino, node.parent, node.name, kind, self._regions_of(layout), rec.id),
                ghost_key(node.parent, node.name) if ghost else b"",
                node.prio,
                blob,
                fields,
            )
        if not sent:
            return out
        args[4] = len(sent)
        t = time.perf_counter()
        touched = dict.fromkeys(x for _, n, *_ in sent for x in (n.ino, n.parent))
        for _, n, *_ in sent:
            self._publishing[n.ino] = self._publishing.get(n.ino, 0) + 1
        try:
            return await self._commit_sent(sent, args, touched, out, t, sh)
        finally:
            for _, n, *_ in sent:
                left = self._publishing.pop(n.ino) - 1
                if left:
                    self._publishing[n.ino] = left
            done, self._published = self._published, trio.Event()
            done.set()

    async def settled(self, *nodes: Node | None) -> None:
        """Return once none of `nodes` has a publish in flight. A file this node has not
        published yet changes here only (its publish takes its name and attributes then); one
        whose publish is under way must not: renamed, removed or changed meanwhile here only,
        Redis would publish it as it was (a rename lost on the other nodes, an unlinked file
        brought back). Such changes wait for the publish (a batch: milliseconds)."""
        while any(n is not None and n.ino in self._publishing for n in nodes):
            await self._published.wait()

    async def _commit_sent(
        self, sent: list, args: list, touched: dict, out: list, t: float, sh
    ) -> list:
        patience = trio.current_time() + PUBLISH_PATIENCE if not self.confirm_misses else None
        with self._changing(*touched):
            while True:
                try:
                    await self.space.copies_current(sh.link)
                    retired, refused, revived = await self._publish(
                        args, [(n.ino, rec) for _, n, rec, _, _ in sent], sh.link
                    )
                    break
                except KvfsError as e:
                    if (
                        patience is None
                        or trio.current_time() > patience
                        or (isinstance(e, Unsure) and e.maybe_published)
                        or (isinstance(e, Unsure) and e.maybe_done and not e.not_run)
                    ):
                        for _, node, _, _, prev in sent:
                            node.blob, node.mtime_ns, node.ctime_ns, node.prio, node.uses = prev
                        raise
                    # the write-back's batch (nobody waits for it but an fsync): Redis did not
                    # run it (unreachable, or a master being replaced): sent again once back
                    self.publish_retries += 1
                    await trio.sleep(PUBLISH_RETRY_SECONDS)
            self.commits += 1
            self.commit_seconds += time.perf_counter() - t
            had = {int(ino): int(uses) for ino, uses in (x.split() for x in revived)}
            errors = {}
            for line in refused:
                ino, _, why = line.partition(b" ")
                errors[int(ino)] = reply_error(why.decode(errors="replace"))
            leaving: list[BlobRec] = []
            gone = []
            for i, node, rec, old, prev in sent:
                e = errors.get(node.ino)
                if e is not None:
                    node.blob, node.mtime_ns, node.ctime_ns, node.prio, node.uses = prev
                    if e.errno == errno.ENOENT and node.persisted:
                        gone.append(node.ino)  # removed by another node
                    if e.errno == errno.ESTALE:
                        log.error("cluster: %s: %s", self.path_of(node), e)
                        e = KvfsError(errno.EIO, str(e))
                    out[i] = e
                    continue
                if not node.persisted:
                    parent = self.nodes[node.parent]
                    occupant = parent.children.get(node.name)
                    if occupant is not None and occupant != node.ino:
                        self._vanish(self.nodes[occupant], leaving)  # another node's file
                    node.persisted = True
                elif old is not None:
                    leaving.append(old)
                self.space.published_here(rec)
                if node.ino in had:  # its name's ghost: the file carries the uses it had
                    self.space.revived(node, had[node.ino])
                    self.rescore(node)
                self._announce(node, True)
                out[i] = (rec, old)
        if gone:
            with trio.CancelScope(shield=True):
                try:
                    await self._refresh(gone, sh=sh)
                except KvfsError:
                    pass
        await self._own(retired, leaving, sh.link)
        return out

    async def _remove(
        self, node: Node, want: str, expect: BlobRec | None = None, ghosts: int = 0
    ) -> Node:
        p = self.nodes[node.parent]
        now = _now()
        ghost = (
            [ghost_key(node.parent, node.name), node.uses, ghosts] if ghosts and node.uses else []
        )
        link = self.shard_of_node(node).link
        if want == "dir" and len(self.shards) > 1:
            own = self.shard_of_dir(node.ino)
            if own.link is not link:
                # its entries' shard first: from then on nothing is created in it (ENOTEMPTY
                # if something was); then its record. Interrupted between the two, it stays
                # an empty directory that takes no new names until rmdir is run again.
                await own.link.eval(SCRIPTS.dirmark, ["close", node.ino, node.parent])
        with self._changing(node.ino, node.parent):
            try:
                retired = await link.eval(
                    SCRIPTS.remove,
                    [
                        self.epoch,
                        node.ino,
                        node.parent,
                        node.name,
                        want,
                        expect.id if expect is not None else "",
                        self.space.grace_ms,
                        now,
                        *ghost,
                    ],
                )
            except KvfsError as e:
                # The reply was lost: if the script ran, the inode's record is gone (an
                # unlink that answered EIO though Redis had done it: the torture's "vanished
                # under its writer" in a redis cycle), and the error it was is no error.
                if not (isinstance(e, Unsure) and e.maybe_done):
                    raise

                async def removed() -> bool:
                    return not await link.call("EXISTS", link.key("n", node.ino))

                if not await self._ran(e, removed, f"removal of inode {node.ino}: done"):
                    raise
                retired = []
        self.commits += 1
        self._detach_here(node)
        node.ctime_ns = now
        self._forget_links(node.ino)
        p.mtime_ns = p.ctime_ns = now
        await self._own(retired, [node.blob] if node.blob is not None else [], link)
        return node

    async def remove(self, node: Node, expect: BlobRec | None = None, ghosts: int = 0) -> Node:
        await self.settled(node)
        """Unlink a file by node (eviction passes the version it chose: if another node has
        rewritten the file meanwhile, ESTALE and nothing changes)."""
        if not node.persisted:
            self._detach(node)
            node.ctime_ns = _now()
            return node
        return await self._remove(node, "file", expect, ghosts)

    def ghost_at_publish(self, node: Node) -> None:
        """The ghost of the node's name is taken by the script that publishes it (under the
        name it has then), and the space told (`revived`)."""
        self._ghosts_asked.add(node.ino)

    def drop(self, ino: int) -> None:
        super().drop(ino)
        if ino not in self.nodes:
            self._ghosts_asked.discard(ino)

    async def take_ghost(self, parent: int, name: bytes) -> int | None:
        """The uses an evicted name had, if the pool still remembers it (then forgotten)."""
        link = self.shard_of_dir(parent).link
        got = await link.eval(SCRIPTS.ghost, [ghost_key(parent, name)], durable=False)
        return int(got) if got is not None else None

    async def raise_floor(self, priority: float) -> float:
        """The pool order's floor, raised to `priority` if below; the floor now."""
        return float(await self.redis.eval(SCRIPTS.floor, [repr(priority)], durable=False))

    async def rename(
        self, parent_old: int, name_old: bytes, parent_new: int, name_new: bytes, flags: int = 0
    ) -> Node | None:
        """As on one node, once neither file has a publish in flight (`settled`)."""
        await self.settled(self._known(parent_old, name_old), self._known(parent_new, name_new))
        return await super().rename(parent_old, name_old, parent_new, name_new, flags)

    def _known(self, parent: int, name: bytes) -> Node | None:
        try:
            return self.lookup(parent, name)
        except KvfsError:
            return None

    async def rmdir(self, parent: int, name: bytes) -> Node:
        node = self._removable_dir(parent, name)
        return await self._remove(node, "dir")

    async def _rename(
        self,
        src: Node,
        pold: Node,
        name_old: bytes,
        pnew: Node,
        name_new: bytes,
        target: Node | None,
        flags: int,
    ) -> Node | None:
        if not src.persisted or (flags & RENAME_EXCHANGE and not target.persisted):
            # A file this node has not committed yet: renamed here only (its commit publishes
            # it under the name it has then, in that directory's shard).
            return await self._rename_local(src, pold, pnew, name_new, target, flags)
        if self.shard_of_dir(pold.ino) is not self.shard_of_dir(pnew.ino):
            raise KvfsError(
                errno.EXDEV,
                "rename between directories whose entries are in different shards of the "
                "pool's catalog (as across file systems: copy, then remove)",
            )
        local = None
        if target is not None and not target.persisted:
            # a published file renamed over one only this node knows (written here, waiting
            # for its write-back): Redis renames it over whatever it holds under that name,
            # and the local file loses its name here, now (a write-back that has not taken it
            # yet never publishes it: kvfs/write/sessions.py `committable`)
            local, target = target, None
            self._detach(local)
        try:
            return await self._rename_published(
                src, pold, name_old, pnew, name_new, target, flags, local
            )
        except BaseException:
            if local is not None and pnew.children.get(name_new) is None:
                local.linked = True  # (the rename failed: it keeps its name)
                self._place(local)
            raise

    async def _rename_published(
        self,
        src: Node,
        pold: Node,
        name_old: bytes,
        pnew: Node,
        name_new: bytes,
        target: Node | None,
        flags: int,
        local: Node | None,
    ) -> Node | None:
        now = _now()
        cookie = self._id("_next_cookie")
        touched = [src.ino, pold.ino, pnew.ino] + ([target.ino] if target is not None else [])
        with self._changing(*touched):
            args = [
                self.epoch,
                src.ino,
                pold.ino,
                name_old,
                pnew.ino,
                name_new,
                flags,
                self.space.grace_ms,
                cookie,
                target.cookie if target is not None else 0,
                now,
                self.shard_of_dir(pold.ino).k,
            ]
            link = self.shard_of_dir(pold.ino).link
            try:
                retired = await link.eval(SCRIPTS.rename, args)
            except KvfsError as e:
                # The reply was lost: a plain rename gave the node our new cookie if it ran
                # (the error it was is then no error: the caller must not retry it).
                if not (isinstance(e, Unsure) and e.maybe_done) or flags & RENAME_EXCHANGE:
                    raise

                async def renamed() -> bool:
                    c = await link.call("HGET", link.key("n", src.ino), "c")
                    return c is not None and int(c) == cookie

                if not await self._ran(e, renamed, f"rename of inode {src.ino}: done"):
                    raise
                retired = []
        self.commits += 1
        leaving: list[BlobRec] = []
        if flags & RENAME_EXCHANGE:
            self._swap(src, target, now)
            return None
        if target is not None:
            self._detach_here(target)
            self._forget_links(target.ino)
            if target.blob is not None:
                leaving.append(target.blob)
        if local is not None:
            target = local
        if pold.children.get(src.name) == src.ino:
            self._move(src, pold, pnew, name_new, now, cookie)
        # else the follower reloaded the catalog while the script ran: the mirror has it
        await self._own(retired, leaving, link)
        return target

    def _detach_here(self, node: Node) -> None:
        """`_detach` after this node's script removed the name in Redis, unless the follower
        (reloading the catalog while the script ran) already took it out of the mirror."""
        parent = self.nodes.get(node.parent)
        if (
            node.linked
            and parent is not None
            and parent.children is not None
            and parent.children.get(node.name) == node.ino
        ):
            self._detach(node)
        else:
            self._announce(node, False)
            node.linked = False

    async def _rename_local(
        self, src: Node, pold: Node, pnew: Node, name_new: bytes, target: Node | None, flags: int
    ) -> Node | None:
        # (a published target loses its name here now, and in Redis when the source's publish
        # replaces it: until then the other nodes still see it; after a crash before that
        # publish it is still there, as a rename not yet made durable may be undone)
        if src.persisted or flags & RENAME_EXCHANGE:
            raise KvfsError(
                errno.EBUSY,
                "rename involving a file another name of which is still "
                "being written on this node; close it first",
            )
        now = _now()
        if target is not None:
            self._detach(target)
        self._move(src, pold, pnew, name_new, now)
        return target

    async def _update(self, node: Node, fields: list, delete: list | None = None) -> None:
        await self.settled(node)
        if not node.persisted or not node.linked:
            return
        with self._changing(node.ino):
            await self.shard_of_node(node).link.eval(
                SCRIPTS.update, [self.epoch, node.ino, len(fields) // 2, *fields, *(delete or [])]
            )
        self.commits += 1

    async def setattr(
        self,
        node: Node,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        atime_ns: int | None = None,
        mtime_ns: int | None = None,
    ) -> None:
        new_mode = (node.mode & ~0o7777) | (mode & 0o7777) if mode is not None else node.mode
        now = _now()
        fields = [
            b"m",
            new_mode,
            b"u",
            uid if uid is not None else node.uid,
            b"g",
            gid if gid is not None else node.gid,
            b"a",
            atime_ns if atime_ns is not None else node.atime_ns,
            b"t",
            mtime_ns if mtime_ns is not None else node.mtime_ns,
            b"k",
            now,
        ]
        await self._update(node, fields)
        node.mode = new_mode
        node.uid, node.gid = fields[3], fields[5]
        node.atime_ns, node.mtime_ns, node.ctime_ns = fields[7], fields[9], now
        self._dirty_atime.discard(node.ino)

    async def set_xattr(self, node: Node, name: bytes, value: bytes) -> None:
        now = _now()
        await self._update(node, [b"x:" + name, value, b"k", now])
        node.xattrs[name] = value
        node.ctime_ns = now

    async def remove_xattr(self, node: Node, name: bytes) -> None:
        if name not in node.xattrs:
            raise KvfsError(errno.ENODATA, f"no such attribute: {name.decode(errors='replace')}")
        now = _now()
        await self._update(node, [b"k", now], [b"x:" + name])
        del node.xattrs[name]
        node.ctime_ns = now
