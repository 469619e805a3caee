"""The Redis side of a shared pool's space (kvfs/cluster/space.py): region leases, and the
grave's purges and holds, each one Lua script (lua/acquire.lua, release, renew, purge, hold).

The space layer calls these methods and never names a script: the scripts, their arguments and
the keys they touch stay with the Redis catalog (docs/cluster.md lists them).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kvfs.catalog.redis.scripts import SCRIPTS
from kvfs.cluster.link import ClusterLink


class RegionLeases:
    """Lease calls on `link` under this node's lease token (`link.token`) and epoch
    (`link.epoch`), both read at each call: they are set when the node joins the pool."""

    def __init__(self, link: ClusterLink):
        self.link = link

    async def acquire(self, regions: Iterable[int], lease_ms: int) -> Any:
        """Lease the first of `regions` that nobody holds, for `lease_ms`: the reply
        (region or b'', change-log tail at that moment)."""
        return await self.link.eval(SCRIPTS.acquire, [self.link.token, lease_ms, *regions])

    async def release(self, regions: Iterable[int]) -> Any:
        """Give back those of `regions` this node holds: how many it held."""
        return await self.link.eval(SCRIPTS.release, [self.link.token, *regions])

    async def renew(self, regions: Iterable[int], lease_ms: int) -> Any:
        """Extend this node's leases of `regions` by `lease_ms`: the regions still held."""
        return await self.link.eval(SCRIPTS.renew, [self.link.token, lease_ms, *regions])

    async def purge(self, limit: int) -> Any:
        """Free at most `limit` blocks whose grace period is over (logged as this node's
        change): their ids."""
        return await self.link.eval(SCRIPTS.purge, [self.link.epoch, limit])

    async def hold(self, ids: Iterable[int], grace_ms: int) -> Any:
        """Push back to `grace_ms` from now the grave deadlines of blocks a reader here still
        uses: how many were pushed back."""
        return await self.link.eval(SCRIPTS.hold, [grace_ms, *ids])
