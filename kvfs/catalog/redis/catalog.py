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

from kvfs.catalog.base import BlobRec, Node, ghost_key
from kvfs.catalog.redis.bootstrap import EPOCH_SHIFT
from kvfs.catalog.redis.codec import blob_fields, node_fields, score_fields
from kvfs.catalog.redis.mirror import RedisMirror
from kvfs.catalog.redis.scripts import SCRIPTS
from kvfs.catalog.tree import RENAME_EXCHANGE, _now
from kvfs.errors import KvfsError
from kvfs.pool.layout import Layout

log = logging.getLogger("kvfs.catalog")


class RedisCatalog(RedisMirror):
    """The catalog of a pool shared by several nodes (see the module docstring). Built by
    kvfs/service.py after `bootstrap.join`; `load()` fills the mirror."""

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Follow the other nodes' changes until cancelled."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._follow)
            task_status.started()
            await trio.sleep_forever()

    async def stop(self) -> None:
        await self.redis.aclose()

    def close(self) -> None:
        pass

    def statistics(self) -> dict:
        link = self.redis
        return {
            "node_id": self.cfg.node_id,
            "epoch": self.epoch,
            "redis": link.where,
            "online": link.online,
            "fresh": self.fresh,
            "catalog_lost": self.catalog_lost,
            "lag_seconds": round(trio.current_time() - self.synced_at, 3),
            "events": self.events,
            "refreshes": self.refreshes,
            "resyncs": self.resyncs,
            "redis_calls": link.calls,
            "follower_round_trips": self.follower_round_trips,
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
        node may have created it a moment ago), and while the mirror may be behind, so is a
        file whose content is not `held_here` (its space may have been reused meanwhile).
        EIO if Redis cannot be asked."""
        try:
            node = self.lookup(parent, name)
        except KvfsError as e:
            if e.errno != errno.ENOENT or parent not in self.nodes:
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
        ino = await self.redis.call("HGET", self.redis.key("d", parent), name)
        inos = [int(ino)] if ino is not None else []
        if known is not None and known not in inos:
            inos.append(known)  # renamed or removed meanwhile: the mirror forgets it
        if inos:
            await self._refresh(inos)
        return self.lookup(parent, name)

    # ------------------------------------------------------------------------------ mutations
    def _regions_of(self, layout: Layout) -> str:
        regions = self.space.regions
        rs = set()
        for e in layout.unit_extents():
            rs.update(regions.touched(e.offset, e.length))
        return " ".join(str(r) for r in sorted(rs))

    async def _own(self, retired: list, leaving: list[BlobRec]) -> None:
        """After one of this node's scripts: the blocks it retired are in the grave; blocks
        that left a file here and are not among them were retired earlier by another node."""
        retired_ids = {int(b) for b in retired}
        self.space.buried(retired_ids)
        try:
            await self.space.settle(leaving, retired=retired_ids)
        except KvfsError:  # the change is made; the follower reconciles later
            self._resync = True

    async def _publish(self, script: str, args: list, rec: BlobRec) -> list:
        """Run a script that publishes `rec` (COMMIT, MKNODE). If the connection broke after
        the script was sent, Redis may have run it: ask (once Redis answers) whether the block
        record exists. It does: the block is published, return as if the reply had come
        (the follower reloads to learn exactly what the script retired). It does not: the
        original error. Redis cannot tell in time: the error, marked `maybe_published`, so
        the caller keeps the block's space instead of allocating it to someone else."""
        try:
            return await self.redis.eval(script, args)
        except KvfsError as e:
            if getattr(e, "unreplicated", False):
                # published on the master, but no replica confirmed it: not reported durable,
                # and its space stays taken (the master names it); the follower reloads
                e.maybe_published = True
                raise
            if not getattr(e, "maybe_done", False):
                raise
            err = e

        async def published() -> bool:
            return bool(await self.redis.call("EXISTS", self.redis.key("b", rec.id)))

        done = await self._ran(err, published, f"block {rec.id}: published")
        if done is None:
            err.maybe_published = True
            raise err from None
        if not done:
            raise err
        return []

    async def _ran(self, err: KvfsError, probe, what: str) -> bool | None:
        """A script's reply was lost (`err.maybe_done`): ask Redis, once it answers again,
        whether the script ran (`probe()`, which reads what the script writes). True: it ran
        (the follower then reloads the catalog, to learn what else it changed); False: it did
        not; None: Redis did not answer in time to tell."""
        deadline = trio.current_time() + max(10.0, 2 * self.cfg.lease_seconds)
        with trio.CancelScope(shield=True):
            while True:
                try:
                    done = await probe()
                    break
                except KvfsError:
                    if trio.current_time() > deadline:
                        log.error("cluster: %s? Redis did not say in time (%s)", what, err)
                        return None
                    await trio.sleep(0.5)
        if done:
            log.warning("cluster: %s, though Redis's reply was lost", what)
            self._resync = True
        return done

    async def _publish_new(self, node: Node, policy: str) -> None:
        """Run MKNODE for a node not yet in Redis, then place it in the mirror."""
        t = time.perf_counter()
        rec = node.blob
        blob = blob_fields(rec, node.ino) if rec is not None else []
        run = (
            (lambda script, args: self._publish(script, args, rec))
            if rec is not None
            else self.redis.eval
        )
        with self._changing(node.ino, node.parent):
            retired = await run(
                SCRIPTS.mknode,
                [
                    self.epoch,
                    node.ino,
                    node.parent,
                    node.name,
                    policy,
                    self.redis.token,
                    self._regions_of(rec.layout) if rec else "",
                    self.space.grace_ms,
                    node.ctime_ns,
                    rec.id if rec else "",
                    len(blob) // 2,
                    *blob,
                    *node_fields(node),
                ],
            )
            self.commits += 1
            self.commit_seconds += time.perf_counter() - t
            leaving: list[BlobRec] = []
            parent = self.nodes[node.parent]
            occupant = parent.children.get(node.name)
            if occupant is not None and occupant != node.ino:  # replaced another node's file
                other = self.nodes[occupant]
                self._vanish(other, leaving)
            node.persisted = True
            if rec is not None:
                self.space.published_here(rec)
        await self._own(retired, leaving)

    async def _add(self, node: Node) -> None:
        """A new directory or symlink: published in Redis first (EEXIST if another node took
        the name), then in the mirror."""
        with self._changing(node.ino, node.parent):
            await self._publish_new(node, "excl")
            self._place(node)

    async def commit(
        self, node: Node, layout: Layout, score: tuple[float, int] | None = None
    ) -> tuple[BlobRec, BlobRec | None]:
        """Publish `layout` as the file's content once it is durable on the namespaces: one
        script checks this node still holds the leases of the space and swaps the block in."""
        now = _now()
        rec = BlobRec(self.next_blob_id(), layout, now)
        old = node.blob
        if not node.linked:
            node.blob = rec
            return rec, old
        prev = (node.blob, node.mtime_ns, node.ctime_ns, node.prio, node.uses)
        node.blob = rec
        node.mtime_ns = node.ctime_ns = now
        if score is not None:
            node.prio, node.uses = score
        try:
            if not node.persisted:
                await self._publish_new(node, "replace")
                self._announce(node, True)
                return rec, old
            t = time.perf_counter()
            blob = blob_fields(rec, node.ino)
            with self._changing(node.ino):
                retired = await self._publish(
                    SCRIPTS.commit,
                    [
                        self.epoch,
                        node.ino,
                        self.redis.token,
                        self._regions_of(layout),
                        self.space.grace_ms,
                        rec.id,
                        len(blob) // 2,
                        *blob,
                        b"t",
                        now,
                        b"k",
                        now,
                        b"m",
                        node.mode,
                        b"u",
                        node.uid,
                        b"g",
                        node.gid,
                        b"a",
                        node.atime_ns,
                        *score_fields(node),
                    ],
                    rec,
                )
                self.space.published_here(rec)
            self._announce(node, True)
            self.commits += 1
            self.commit_seconds += time.perf_counter() - t
        except KvfsError as e:
            node.blob, node.mtime_ns, node.ctime_ns, node.prio, node.uses = prev
            if e.errno == errno.ENOENT and node.persisted:
                with trio.CancelScope(shield=True):
                    try:
                        await self._refresh([node.ino])  # removed by another node
                    except KvfsError:
                        pass
            if e.errno == errno.ESTALE:
                log.error("cluster: %s: %s", self.path_of(node), e)
                raise KvfsError(errno.EIO, str(e)) from None
            raise
        await self._own(retired, [old] if old is not None else [])
        return rec, old

    async def _remove(
        self, node: Node, want: str, expect: BlobRec | None = None, ghosts: int = 0
    ) -> Node:
        p = self.nodes[node.parent]
        now = _now()
        ghost = (
            [ghost_key(node.parent, node.name), node.uses, ghosts] if ghosts and node.uses else []
        )
        with self._changing(node.ino, node.parent):
            try:
                retired = await self.redis.eval(
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
                if not getattr(e, "maybe_done", False):
                    raise

                async def removed() -> bool:
                    return not await self.redis.call("EXISTS", self.redis.key("n", node.ino))

                if not await self._ran(e, removed, f"removal of inode {node.ino}: done"):
                    raise
                retired = []
        self.commits += 1
        self._detach_here(node)
        node.ctime_ns = now
        self._forget_links(node.ino)
        p.mtime_ns = p.ctime_ns = now
        await self._own(retired, [node.blob] if node.blob is not None else [])
        return node

    async def remove(self, node: Node, expect: BlobRec | None = None, ghosts: int = 0) -> Node:
        """Unlink a file by node (eviction passes the version it chose: if another node has
        rewritten the file meanwhile, ESTALE and nothing changes)."""
        if not node.persisted:
            self._detach(node)
            node.ctime_ns = _now()
            return node
        return await self._remove(node, "file", expect, ghosts)

    async def take_ghost(self, parent: int, name: bytes) -> int | None:
        """The uses an evicted name had, if the pool still remembers it (then forgotten)."""
        got = await self.redis.eval(SCRIPTS.ghost, [ghost_key(parent, name)], durable=False)
        return int(got) if got is not None else None

    async def raise_floor(self, priority: float) -> float:
        """The pool order's floor, raised to `priority` if below; the floor now."""
        return float(await self.redis.eval(SCRIPTS.floor, [repr(priority)], durable=False))

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
        if not src.persisted or (target is not None and not target.persisted):
            # A file this node has not committed yet: renamed here only (its commit publishes
            # it under the name it has then).
            return await self._rename_local(src, pold, pnew, name_new, target, flags)
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
            ]
            try:
                retired = await self.redis.eval(SCRIPTS.rename, args)
            except KvfsError as e:
                # The reply was lost: a plain rename gave the node our new cookie if it ran
                # (the error it was is then no error: the caller must not retry it).
                if not getattr(e, "maybe_done", False) or flags & RENAME_EXCHANGE:
                    raise

                async def renamed() -> bool:
                    c = await self.redis.call("HGET", self.redis.key("n", src.ino), "c")
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
        if pold.children.get(src.name) == src.ino:
            self._move(src, pold, pnew, name_new, now, cookie)
        # else the follower reloaded the catalog while the script ran: the mirror has it
        await self._own(retired, leaving)
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
        if src.persisted or (target is not None and target.persisted) or flags & RENAME_EXCHANGE:
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
        if not node.persisted or not node.linked:
            return
        with self._changing(node.ino):
            await self.redis.eval(
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

    async def flush_atimes(self) -> int:
        """Persist recorded accesses: the cluster-wide LRU order eviction follows."""
        inos, self._dirty_atime = self._dirty_atime, set()
        args: list = []
        for i in inos:
            n = self.nodes.get(i)
            if n is not None and n.linked and n.persisted:
                args += [
                    i,
                    n.atime_ns,
                    n.atime_ns // 1_000_000,
                    repr(n.prio) if n.prio is not None else "",
                    n.uses,
                ]
        if args:
            try:
                await self.redis.eval(SCRIPTS.atimes, args, durable=False)
            except KvfsError:
                self._dirty_atime |= inos
                raise
        return len(args) // 5

    # ------------------------------------------------------------------------------ chains
    def link(self, pred: int, succ: int, source: int, weight: float = 1.0) -> None:
        before = self.successors.get(pred, {}).get(succ)
        before = list(before) if before else None
        super().link(pred, succ, source, weight)
        after = self.successors.get(pred, {}).get(succ)
        if after is None or after == before:
            return
        d = self._link_delta.get((pred, succ))
        if d is None or source > d[0]:
            self._link_delta[(pred, succ)] = [source, weight]
        elif source == d[0]:
            d[1] += weight

    def unlink_chain(self, pred: int, succ: int) -> None:
        super().unlink_chain(pred, succ)
        self._link_delta[(pred, succ)] = [0, None]

    async def flush_links(self) -> int:
        """Merge the links learned here into Redis (weights add up across nodes)."""
        self._dirty_links.clear()
        deltas, self._link_delta = self._link_delta, {}
        args: list = [self.epoch]
        later = {}
        for (pred, succ), (source, weight) in deltas.items():
            p, s = self.nodes.get(pred), self.nodes.get(succ)
            if weight is None:
                args += [pred, succ, 0, "-"]
            elif p is not None and s is not None and p.persisted and s.persisted:
                args += [pred, succ, source, weight]
            elif p is not None and s is not None and p.linked and s.linked:
                later[(pred, succ)] = [source, weight]  # with their files, later
        self._link_delta.update(later)
        if len(args) > 1:
            try:
                await self.redis.eval(SCRIPTS.links, args, durable=False)
            except KvfsError:
                for k, v in deltas.items():
                    self._link_delta.setdefault(k, v)
                raise
        return (len(args) - 1) // 4
