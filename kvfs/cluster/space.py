"""The space of a pool shared by several nodes (its catalog in Redis; see docs/cluster.md).

* **Regions and leases.** The pool is cut into regions; this node allocates only inside regions
  it holds a lease on (`SET NX PX` in Redis, renewed every quarter of `lease_seconds`), and
  refuses to write into a region whose lease may have run out (`Regions.fence`). The publishing
  script checks the leases again, so a node that lost one cannot publish a block lying in it.
  Regions that are full, or that this node has not allocated in for a lease period, are given
  back so other nodes can use the space freed there.
* **Used space and the grave.** Every block published anywhere is counted as used here (the
  catalog's mirror reports them: `use`). A block replaced or removed anywhere goes to the grave
  for `grace_seconds`; its space is free again only when some node purges it after that, and
  every node learns the purge from the change log (`purged`). A node whose readers still hold a
  retired block pushes its deadline back (`_hold_graves`), so it is not reused while read.
* **Making room.** A writer first leases another region; then files are evicted in the cluster's
  order (`evict_in_order`: the pool's policy, `scored_victims`, or LRU, `victims`), and the
  writer waits (bounded) for the grave to empty or for other nodes to give back regions. One node
  at a time (a short Redis lock) evicts ahead of writers to keep `free_target` of the pool free.
"""

from __future__ import annotations

import collections
import errno
import logging
from contextlib import aclosing
from typing import Iterable, Protocol

import trio

from kvfs.catalog.records import BlobRec
from kvfs.catalog.redis.leases import RegionLeases
from kvfs.config import ClusterConfig
from kvfs.errors import KvfsError
from kvfs.knobs import Knobs
from kvfs.pool.layout import DATA_START, Layout, align_up, stored_length
from kvfs.pool.pool import Area, Pool
from kvfs.redis.link import ClusterLink
from kvfs.space.base import Evictor, Space

log = logging.getLogger("kvfs.space")


class ClusterOrder(Protocol):
    """What a shared pool's space asks the catalog in Redis."""

    file_count: int  # files in the pool

    async def catch_up(self, tails: list[bytes]) -> bool:
        """Wait until the mirror has applied each shard's change log up to its tail in
        `tails`; False on timeout."""

    async def take_ghost(self, parent: int, name: bytes) -> int | None:
        """The uses an evicted name had, forgotten once taken."""

    def ghost_at_publish(self, node) -> None:
        """Take the ghost of the node's name (then) in the script that publishes it."""

    async def raise_floor(self, priority: float) -> float:
        """The cluster's floor of priorities, raised to `priority` if below."""


LEASE_MARGIN = 0.8  # a lease is trusted for this share of its time-to-live
VICTIM_BATCH = 64
# Every node looks each CLEAN_PERIOD whether the pool needs evicting ahead of writers; a lock
# of the same length lets one of them do it. (A 5 s lock let the cluster clean once per 5 s:
# writers storing 60 blocks/s into a full pool of 2,000 with the default free target waited
# 34 s of 100 for the grave, against none with a 1 s lock; two writing nodes 48 s against
# 13-20.)
CLEAN_PERIOD = 1.0


class Regions(Area):
    """A shared pool's regions: region r is [DATA_START + r*size, DATA_START + (r+1)*size) on
    every namespace. A held region's lease is valid until `deadline[r]` (trio's clock, a safety
    margin before Redis would expire it). `inflight` counts the bytes allocated in a region
    and not yet published or freed (bytes, not extents: one allocation may hold several units,
    published or freed later unit by unit): a region with some is not given back. `used_at` is
    when this node last allocated in (or leased) a region."""

    whole = False

    def __init__(self, data_bytes: int, count: int, unit: int):
        size = max(unit, align_up(-(-data_bytes // count), unit))
        self.size = size
        self.count = -(-data_bytes // size)
        self.deadline: dict[int, float] = {}
        self.inflight: collections.Counter[int] = collections.Counter()
        self.used_at: dict[int, float] = {}
        self.fenced = 0  # writes refused because a lease had run out

    def of(self, offset: int) -> int:
        return (offset - DATA_START) // self.size

    def touched(self, offset: int, length: int) -> range:
        return range(self.of(offset), self.of(offset + length - 1) + 1)

    def span(self, r: int, end: int) -> tuple[int, int]:
        lo = DATA_START + r * self.size
        return lo, min(lo + self.size, end)

    def valid(self, r: int) -> bool:
        return self.deadline.get(r, 0.0) > trio.current_time()

    def held(self) -> list[int]:
        now = trio.current_time()
        return sorted(r for r, t in self.deadline.items() if t > now)

    # --- Area ----------------------------------------------------------------------------------
    def ranges(self, ns_size: int) -> list[tuple[int, int]]:
        """The held regions' spans (one per region: an extent never straddles two regions)."""
        out = []
        for r in self.held():
            lo, hi = self.span(r, ns_size)
            if hi > lo:
                out.append((lo, hi))
        return out

    def _in_flight(self, offset: int, length: int, sign: int) -> None:
        for r in self.touched(offset, length):
            lo, hi = self.span(r, offset + length)
            self.inflight[r] += sign * (hi - max(lo, offset))

    def allocated(self, offset: int, length: int) -> None:
        now = trio.current_time()
        self._in_flight(offset, length, 1)
        for r in self.touched(offset, length):
            self.used_at[r] = now

    def freed(self, offset: int, length: int) -> None:
        self._in_flight(offset, length, -1)

    published = freed

    def fence(self, offset: int, length: int) -> None:
        for r in self.touched(offset, length):
            if not self.valid(r):
                self.fenced += 1
                raise KvfsError(
                    errno.EIO,
                    f"the allocation lease on pool region {r} ran out "
                    f"(Redis unreachable?); not writing there",
                )


class ClusterSpace(Space):
    kind = "cluster"

    def __init__(
        self,
        pool: Pool,
        knobs: Knobs,
        link: ClusterLink,
        cfg: ClusterConfig,
        evictor: Evictor,
        order: ClusterOrder,
        shards: list[ClusterLink] = (),
    ):
        """`order`: the cluster's order of files and its change log, kept by the catalog in
        Redis (kvfs/catalog/redis/catalog.py), which is built with this space: the factory
        passes a seam it binds to the catalog (kvfs/service.py). `shards`: the links to the
        pool's shards past the first (`link`), with `[cluster] shards`: the orders, the grave
        and the lease copies are in every shard."""
        super().__init__(pool, knobs, evictor)
        self.link = link
        self.links = [link, *shards]
        self.leases = RegionLeases(link, shards)  # acquire, renew, release; purge, hold
        self.cfg = cfg
        self.order = order
        data = max(ns.size for ns in pool.namespaces) - DATA_START
        self.regions = Regions(data, cfg.regions, pool.unit)
        pool.area = self.regions
        self.room_wait = max(cfg.grace_seconds, cfg.lease_seconds) * 1.5 + 2
        self.grace_ms = int(cfg.grace_seconds * 1000)
        self.lease_ms = int(cfg.lease_seconds * 1000)
        self.grave: dict[int, BlobRec] = {}  # retired blocks whose space is not free yet
        self.used: dict[int, BlobRec] = {}  # published blocks whose space is used here
        self.leases_lost = 0
        self.purged_count = 0
        self.room_waits = 0  # writers that waited for the grave or for regions
        self.purges_skipped = 0  # purge periods with nothing in the grave (no round trip)
        self.room_wait_seconds = 0.0
        self._scored_all = False  # files stored without a priority joined the order

    def file_count(self) -> int:
        return self.order.file_count

    async def take_ghost(self, node, at_publish: bool = False) -> int | None:
        if at_publish:  # (no round trip now: the publish takes it and calls `revived`)
            self.order.ghost_at_publish(node)
            return None
        return await self.order.take_ghost(node.parent, node.name)

    # --- blocks, as the catalog's mirror reports them --------------------------------------------
    def attach(self, current: Iterable[BlobRec], grave: Iterable[BlobRec]) -> None:
        """Start-up: the blocks Redis holds (files' versions, and those in the grave)."""
        self.grave = {r.id: r for r in grave}
        self.used = {r.id: r for r in current}
        self.used.update(self.grave)
        self.pool.attach(r.layout for r in self.used.values())

    def known(self, bid: int) -> BlobRec | None:
        return self.used.get(bid)

    def use(self, rec: BlobRec) -> None:
        """A block published anywhere: its space is used here (claimed once)."""
        if rec.id not in self.used:
            self.used[rec.id] = rec
            self.pool.claim(rec.layout)

    def published_here(self, rec: BlobRec) -> None:
        """This node published the block (its space was allocated here)."""
        self.used[rec.id] = rec

    def buried(self, ids: Iterable[int]) -> None:
        """This node's own change retired these blocks (they are in the grave now)."""
        for b in ids:
            if b in self.used:
                self.grave[b] = self.used[b]

    async def settle(
        self, leaving: list[BlobRec], conn=None, retired: set[int] | None = None, link=None
    ) -> None:
        """Blocks that stopped being a file's content here: in the grave (space still used),
        still live in Redis (space still used), or already purged (space free). `retired`: ids
        known to be in the grave; others are asked, of the shard `link` (through `conn`, a
        connection to it, if given), or with neither, of every shard."""
        leaving = [r for r in leaving if r.id in self.used and r.id not in self.grave]
        if not leaving:
            return
        unknown = [r for r in leaving if retired is None or r.id not in retired]
        scores, live = {}, set()
        if unknown:
            # a block's records are in its file's shard, which `conn` is when given; with
            # several shards and no `conn`, every shard is asked
            if conn is not None or link is not None:
                where = [(conn or link, link or self.link)]
            else:
                where = [(x, x) for x in self.links]
            for c, keys in where:
                replies = await c.pipeline(
                    [
                        cmd
                        for r in unknown
                        for cmd in (
                            ("ZSCORE", keys.key("grave"), r.id),
                            ("EXISTS", keys.key("b", r.id)),
                        )
                    ]
                )
                for r, sc in zip(unknown, replies[0::2]):
                    if sc is not None:
                        scores[r.id] = sc
                live |= {r.id for r, e in zip(unknown, replies[1::2]) if e}
        for r in leaving:
            if (retired is not None and r.id in retired) or scores.get(r.id) is not None:
                self.grave[r.id] = r
            elif r.id in live:
                # Not retired at all: the state this node read was older than what it knows
                # (its own commit landed meanwhile). The block's space stays used; when it is
                # retired, the log (or this node's own script) says so.
                pass
            else:
                self.used.pop(r.id, None)
                self.pool.unclaim(r.layout)

    async def reconcile_grave(
        self, grave_ids: set[int], blobs: dict[int, BlobRec], prune: bool = True
    ) -> None:
        """After a resync: the grave is what Redis says. A block the snapshot's grave lacks was
        purged, or retired by this node after the grave was read (or, after a resync of one
        shard, is in another shard's grave): only one whose record is gone from every shard
        has free space. Without `prune`, the blocks of `grave_ids` only join the grave."""
        missing = [bid for bid in self.grave if bid not in grave_ids] if prune else []
        exists = [0] * len(missing)
        if missing:
            for link in self.links:  # (a block's record is in one shard, its file's)
                got = await link.pipeline([("EXISTS", link.key("b", b)) for b in missing])
                exists = [a or b for a, b in zip(exists, got)]
        for bid, alive in zip(missing, exists):
            if not alive and bid in self.grave:
                rec = self.grave.pop(bid)
                self.used.pop(bid, None)
                self.pool.unclaim(rec.layout)
        for bid in grave_ids:
            if bid in blobs:
                self.use(blobs[bid])
                self.grave[bid] = self.used[bid]

    def purged(self, bid: int) -> None:
        """Some node purged the block after its grace period: its space is free."""
        rec = self.grave.pop(bid, None)
        if rec is not None and self.used.pop(bid, None) is not None:
            self.pool.unclaim(rec.layout)
            self.purged_count += 1

    @property
    def grave_bytes(self) -> int:
        return sum(r.layout.stored_bytes() for r in self.grave.values())

    def retired(self, layout: Layout) -> None:
        """Nobody here reads it any more; its space is freed by a purge after the grace period
        (another node may still read it)."""

    # --- leases ----------------------------------------------------------------------------------
    def region_free(self) -> list[tuple[int, int]]:
        """(free bytes, largest free extent on any namespace) of every region. A unit needs
        one extent on one namespace (a block's units go to the namespaces with room), so a
        region whose other namespaces are full still has room for units."""
        out = []
        for r in range(self.regions.count):
            total = fit = 0
            for a, ns in zip(self.pool.allocators, self.pool.namespaces):
                lo, hi = self.regions.span(r, ns.size)
                if hi <= lo:
                    continue
                f, largest = a.free_in(lo, hi)
                total += f
                fit = max(fit, largest)
            out.append((total, fit))
        return out

    async def grow(self, need: int) -> bool:
        """Lease another region with room (the emptiest this node knows of). True if one was
        leased; False if none is free."""
        regions = self.regions
        free = self.region_free()
        held = set(regions.held())
        cands = sorted(
            (
                r
                for r in range(regions.count)
                if r not in held and free[r][1] >= stored_length(need, self.pool.unit, 0)
            ),
            key=lambda r: -free[r][0],
        )[:16]
        if not cands:
            return False
        t = trio.current_time()
        got, tails = await self.leases.acquire(cands, self.lease_ms)
        if not got:
            return False
        r = int(got)
        # Whoever held the region before published everything it wrote there before giving
        # it up (or its lease expired): apply the log (every shard's) up to now before
        # allocating in it.
        if not await self.order.catch_up(tails):
            await self.leases.release([r])
            raise KvfsError(errno.EIO, "cluster: could not catch up with the change log")
        regions.deadline[r] = t + self.cfg.lease_seconds * LEASE_MARGIN
        regions.used_at[r] = t
        log.debug("cluster: leased region %d (%d bytes free)", r, self.region_free()[r][0])
        return True

    async def copies_current(self, link: ClusterLink) -> None:
        """Before a publish in the shard of `link`: where a renewal of this node's lease copies
        failed there (the shard was away), set them again first, with what is left of the
        leases by this node's deadlines (earlier than Redis's), so that a publish right after
        the shard is back is not refused for a copy that ran out meanwhile. A failure here is
        left to the publish to report."""
        if link not in self.leases.stale:
            return  # (the common case, on every publish: nothing to do)
        now = trio.current_time()
        held = {r: d for r, d in self.regions.deadline.items() if d > now}
        if not held:
            return
        try:
            await self.leases.recopy(link, sorted(held), int((min(held.values()) - now) * 1000) - 1)
        except KvfsError:
            pass

    async def _renew_leases(self) -> None:
        regions = self.regions
        while True:
            await trio.sleep(self.cfg.lease_seconds / 4)
            held = sorted(regions.deadline)
            if not held:
                continue
            t = trio.current_time()
            try:
                ok = {int(r) for r in await self.leases.renew(held, self.lease_ms)}
            except KvfsError:
                continue  # the deadlines run out by themselves
            for r in held:
                if r in ok:
                    regions.deadline[r] = t + self.cfg.lease_seconds * LEASE_MARGIN
                else:
                    del regions.deadline[r]
                    self.leases_lost += 1
                    log.warning(
                        "cluster: lost the allocation lease on region %d (expired while "
                        "Redis was unreachable?)",
                        r,
                    )
            await self._give_back_regions()

    async def _give_back_regions(self) -> None:
        """Release held regions with no writes in flight that are full (no room for a stripe
        unit) or that this node has not allocated in for a lease period, so that another node
        that needs space (space freed there by eviction, say) can lease them."""
        regions = self.regions
        free = self.region_free()
        idle_since = trio.current_time() - self.cfg.lease_seconds
        full = [
            r
            for r in regions.held()
            if regions.inflight[r] <= 0
            and (free[r][1] < self.pool.unit or regions.used_at.get(r, 0.0) < idle_since)
        ]
        if full:
            await self._release(full)

    async def _release(self, rs: list[int]) -> None:
        for r in rs:
            self.regions.deadline.pop(r, None)
        try:
            await self.leases.release(rs)
        except KvfsError:
            pass  # they expire instead

    async def stop(self) -> None:
        """Unmounting: give back the regions this node holds."""
        held = [r for r in sorted(self.regions.deadline) if self.regions.inflight[r] <= 0]
        if held:
            await self._release(held)

    # --- the grave --------------------------------------------------------------------------------
    async def purge(self) -> int:
        """Free the space of retired blocks whose grace period is over (any node may do it)."""
        ids = await self.leases.purge(256)
        for b in ids:
            self.purged(int(b))
        return len(ids)

    async def _purge_periodically(self) -> None:
        """Purge every grace/4, when the grave holds something: a block retired by any node
        reaches this node's grave through the change log (an idle pool costs Redis nothing
        here; every node purged every period, grave empty or not)."""
        while True:
            await trio.sleep(max(0.2, self.cfg.grace_seconds / 4))
            if not self.grave:
                self.purges_skipped += 1
                continue
            try:
                await self.purge()
            except KvfsError:
                pass

    async def _hold_graves(self) -> None:
        """Blocks retired elsewhere that a reader on this node still uses (an open handle, a
        fetch, a direct-read lease): push their grace period back every quarter of it, so no
        node purges and reuses their space while they are read."""
        while True:
            await trio.sleep(max(0.2, self.cfg.grace_seconds / 4))
            held = [bid for bid in self.grave if self.evictor.held(bid)]
            if not held:
                continue
            try:
                await self.leases.hold(held, self.grace_ms)
            except KvfsError as e:
                log.debug("cluster: holding retired blocks that are still read failed: %s", e)

    # --- making room ------------------------------------------------------------------------------
    async def _lowest(self, key: str, n: int) -> list[tuple[int, float]]:
        """The `n` lowest (inode, score) of sorted set `key`, merged over the shards."""
        out = []
        for link in self.links:
            got = await link.call("ZRANGE", link.key(key), 0, n - 1, "WITHSCORES")
            out += [(int(got[i]), float(got[i + 1])) for i in range(0, len(got), 2)]
        if len(self.links) > 1:
            out.sort(key=lambda x: x[1])
        return out[:n]

    async def victims(self, n: int) -> list[int]:
        """Files (inodes) from least to most recently used across the cluster."""
        return [ino for ino, _ in await self._lowest("atime", n)]

    async def try_lock(self, name: str, seconds: float) -> bool:
        """A short cluster-wide lock (e.g. one node at a time cleans the pool)."""
        return bool(
            await self.link.call(
                "SET", self.link.key("lock", name), self.link.token, "NX", "PX", int(seconds * 1000)
            )
        )

    async def scored_victims(self, n: int) -> list[tuple[int, float]]:
        """(inode, priority) of the `n` files lowest in the cluster's policy order."""
        return await self._lowest("prio", n)

    async def _score_unscored(self) -> None:
        """Once per pool (the first node that evicts by "prefix"): files stored without a
        priority (under "lru", or by an older kvfs) join the policy's order below every scored
        file, in their LRU order, so they go first."""
        for link in self.links:  # (each shard's files, in their shard's order)
            if not await link.call("SET", link.key("prio_init"), 1, "NX"):
                continue
            total = await link.call("ZCARD", link.key("atime"))
            for start in range(0, total, 1000):
                inos = await link.call("ZRANGE", link.key("atime"), start, start + 999)
                if not inos:
                    break
                args: list = []
                for k, ino in enumerate(inos):
                    args += [-1.0 + (start + k + 1) / (total + 1), ino]
                await link.call("ZADD", link.key("prio"), "NX", *args)

    async def evict_in_order(self, exclude: int, nbytes: int) -> int:
        """Evict at least `nbytes`: in the cluster's order of the pool's policy under
        `pool.evict = "prefix"` (then in LRU order, files no node has scored), else in the
        cluster's LRU order (files another node holds open may be among them: their space
        stays in the grave while they are read)."""
        freed = 0
        if nbytes <= 0:
            return freed
        rule = self._rule()
        if rule is not None:
            if not self._scored_all:
                self._scored_all = True
                await self._score_unscored()
            top = None
            async with aclosing(self._in_batches(self.scored_victims)) as order:
                async for ino, prio in order:
                    got = await self._evict(ino, exclude)
                    if got:
                        freed += got
                        top = prio
                    if freed >= nbytes:
                        break
            if top is not None:
                rule.evicted(top)
                rule.evicted(await self.order.raise_floor(top))  # for the other nodes too
            if freed >= nbytes:
                return freed
        async with aclosing(self._in_batches(self.victims)) as order:
            async for ino in order:
                if rule is not None and await self._scored(ino):
                    continue  # scored: its turn was above
                freed += await self._evict(ino, exclude)
                if freed >= nbytes:
                    break
        return freed

    async def _scored(self, ino: int) -> bool:
        for link in self.links:
            if await link.call("ZSCORE", link.key("prio"), ino) is not None:
                return True
        return False

    @staticmethod
    async def _in_batches(fetch):
        """The items of a cluster-wide order, VICTIM_BATCH more at a time: `fetch(n)` gives
        its first n (read again each time: evictions change it)."""
        seen = 0
        while True:
            batch = await fetch(seen + VICTIM_BATCH)
            fresh = batch[seen:]
            if not fresh:
                return
            seen = len(batch)
            for item in fresh:
                yield item

    def room_for(self, need: int) -> int:
        """The room a block of `need` bytes has where this node may allocate now: free space
        in pieces as long as its largest unit (a stripe unit, or the block itself if smaller);
        shorter pieces take none of its units. The pool's free bytes also count those and the
        space in regions other nodes hold: a pool can have plenty of them and no room."""
        return self.pool.writable_in(stored_length(need, self.pool.unit, 0))

    async def make_room(self, exclude: int, need: int, upto: tuple | None = None) -> bool:
        # (`upto` is for write-back, which a shared pool does not use: it publishes at close)
        if await self.grow(need):
            return True
        if self.knobs.pool_evict == "never":
            return False
        pool = self.pool
        short = need + self.reserved - self.room_for(need) - self.grave_bytes
        if short > 0:
            await self.evict_in_order(exclude, short)
        # Evicted space is free once its grace period is over, and it may lie in a region
        # another node holds until that node gives its idle regions back (within a lease
        # period): wait while the grave, or free space in others' regions, may make room.
        cfg = self.cfg
        elsewhere_until = trio.current_time() + cfg.lease_seconds * 1.5 + 1

        def hopeless() -> bool:
            return not self.grave and (
                pool.free - self.reserved < need or trio.current_time() > elsewhere_until
            )

        if hopeless():
            return False
        began, waited = trio.current_time(), False
        try:
            with trio.move_on_after(self.room_wait):
                while True:
                    await self.purge()
                    if self.room_for(need) - self.reserved >= need or await self.grow(need):
                        return True
                    if hopeless():
                        return False
                    waited = True
                    await trio.sleep(0.1)
            return False
        finally:
            if waited:  # a writer waited: free_target is too small for the load
                self.room_waits += 1
                self.room_wait_seconds += trio.current_time() - began

    async def keep_free(self) -> int:
        """Evict (in the cluster's order) so that `free_target` of the pool stays free (in
        whole stripe units: pieces smaller than one take no unit of a big block) or in its
        grace period, ahead of writers. One node at a time does it."""
        target = int(self.cfg.free_target * self.pool.capacity)
        short = target - self.pool.unit_free - self.grave_bytes
        if short <= 0 or self.knobs.pool_evict == "never":
            return 0
        if not await self.try_lock("cleaner", CLEAN_PERIOD):
            return 0
        return await self.evict_in_order(0, short + target // 2)

    async def _keep_free_periodically(self) -> None:
        while True:
            await trio.sleep(CLEAN_PERIOD)
            try:
                rule = self._rule()
                if rule is not None:  # other nodes' evictions raise the floor
                    floor = await self.link.call("GET", self.link.key("floor"))
                    if floor is not None:
                        rule.evicted(float(floor))
                n = await self.keep_free()
                if n:
                    log.info("cluster: evicted %d bytes to keep the pool's free target", n)
            except KvfsError as e:
                log.debug("cluster: keeping the pool free failed: %s", e)

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._renew_leases)
            nursery.start_soon(self._purge_periodically)
            nursery.start_soon(self._hold_graves)
            nursery.start_soon(self._keep_free_periodically)
            task_status.started()
            await trio.sleep_forever()

    def statistics(self) -> dict:
        regions = self.regions
        out = super().statistics()
        out.update(
            {
                "regions": regions.count,
                "region_size": regions.size,
                "regions_held": len(regions.held()),
                "leases_lost": self.leases_lost,
                "fenced_writes": regions.fenced,
                "evict_order": {"never": "never", "lru": "lru"}.get(
                    self.knobs.pool_evict, "policy"
                ),
                "grave_blocks": len(self.grave),
                "grave_bytes": self.grave_bytes,
                "purged": self.purged_count,
                "purges_skipped": self.purges_skipped,
                "room_waits": self.room_waits,
                "room_wait_seconds": round(self.room_wait_seconds, 3),
            }
        )
        return out
