"""The Redis side of a shared pool's space (kvfs/cluster/space.py): region leases, and the
grave's purges and holds, each one Lua script (lua/acquire.lua, release, renew, purge, hold).

The space layer calls these methods and never names a script: the scripts, their arguments and
the keys they touch stay with the Redis catalog (docs/cluster.md lists them).
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterable
from typing import Any

import trio

from kvfs.catalog.redis.scripts import SCRIPTS
from kvfs.errors import KvfsError
from kvfs.redis.link import ClusterLink

log = logging.getLogger("kvfs.cluster")


class RegionLeases:
    """Lease calls on `link` under this node's lease token (`link.token`) and epoch
    (`link.epoch`), both read at each call: they are set when the node joins the pool.

    With several shards (`shards`: the links past the first, docs/cluster.md "More than one
    Redis"), the first holds the leases and every other one a copy of each (leasecopy.lua),
    which a publish there checks. A copy never outlives its lease: it is set with what is
    left of the lease's time as measured from before the lease's own call was sent, and it
    is written, on taking a lease, before the node reads any shard's log tail, so a publish
    by the lease's previous holder either reached a shard's log before that tail or is
    refused there. A copy is removed before its lease is given back."""

    def __init__(self, link: ClusterLink, shards: list[ClusterLink] = ()):
        self.link = link
        self.shards = list(shards)
        # the shards (of `shards`) where a renewal of the copies failed: their copies may have
        # run out since, until set again (`recopy`, or the next renewal)
        self.stale: set[ClusterLink] = set()

    async def acquire(self, regions: Iterable[int], lease_ms: int) -> Any:
        """Lease the first of `regions` that nobody holds, for `lease_ms`: the reply
        (region or b'', each shard's change-log tail at that moment)."""
        t = trio.current_time()
        got, tail = await self.link.eval(SCRIPTS.acquire, [self.link.token, lease_ms, *regions])
        tails = [tail]
        if got and self.shards:
            try:
                tails += await self._copy("take", [got], lease_ms, t)
            except BaseException:
                with trio.CancelScope(shield=True):
                    try:
                        await self.release([got])
                    except KvfsError:
                        pass  # it expires instead
                raise
        return got, tails

    async def _copy(self, mode: str, regions: list, lease_ms: int, t: float) -> list:
        left = int(lease_ms - (trio.current_time() - t) * 1000) - 1
        if left <= 0:
            raise KvfsError(errno.EIO, "cluster: a lease ran out before it could be copied")
        if mode == "take":  # every shard, or the lease is not taken
            return [
                await link.eval(SCRIPTS.leasecopy, [mode, self.link.token, left, *regions])
                for link in self.shards
            ]
        # renewed: each shard on its own, so that one shard away does not leave the copies in
        # the shards after it to run out (and their publishes refused) as well
        out = []
        for link in self.shards:
            try:
                out.append(
                    await link.eval(SCRIPTS.leasecopy, [mode, self.link.token, left, *regions])
                )
            except KvfsError as e:
                self.stale.add(link)
                log.warning(
                    "cluster: renewing the copies of this node's leases in %s failed: %s",
                    link.where,
                    e,
                )
            else:
                self.stale.discard(link)
        return out

    async def recopy(self, link: ClusterLink, regions: list[int], left_ms: int) -> None:
        """Set this node's lease copies in `link`'s shard again, with `left_ms` to live (no
        more than is left of the leases), if a renewal there failed since they were last set:
        the shard was away, and a publish there would be refused for a copy run out while its
        lease is still held."""
        if link in self.stale and regions and left_ms > 0:
            await link.eval(SCRIPTS.leasecopy, ["keep", self.link.token, left_ms, *regions])
            self.stale.discard(link)

    async def release(self, regions: Iterable[int]) -> Any:
        """Give back those of `regions` this node holds: how many it held."""
        regions = list(regions)
        for link in self.shards:
            await link.eval(SCRIPTS.release, [self.link.token, *regions])
        return await self.link.eval(SCRIPTS.release, [self.link.token, *regions])

    async def renew(self, regions: Iterable[int], lease_ms: int) -> Any:
        """Extend this node's leases of `regions` by `lease_ms`: the regions still held. (A
        copy that cannot be renewed runs out by itself: the publishes in its shard are
        refused until the next renewal sets it again.)"""
        t = trio.current_time()
        ok = await self.link.eval(SCRIPTS.renew, [self.link.token, lease_ms, *regions])
        if ok and self.shards:
            try:
                await self._copy("keep", ok, lease_ms, t)
            except KvfsError as e:  # (the lease ran out before it could be copied)
                self.stale.update(self.shards)
                log.warning("cluster: renewing the copies of this node's leases failed: %s", e)
        return ok

    async def purge(self, limit: int) -> Any:
        """Free at most `limit` blocks whose grace period is over (logged as this node's
        change), in every shard: their ids."""
        out = []
        for link in [self.link, *self.shards]:
            out += await link.eval(SCRIPTS.purge, [self.link.epoch, limit])
        return out

    async def hold(self, ids: Iterable[int], grace_ms: int) -> Any:
        """Push back to `grace_ms` from now the grave deadlines of blocks a reader here still
        uses (in whichever shard's grave each is): how many were pushed back."""
        ids = list(ids)
        n = 0
        for link in [self.link, *self.shards]:
            n += await link.eval(SCRIPTS.hold, [grace_ms, *ids])
        return n
