"""What a node records in memory and writes to the shared catalog in batches, every few
seconds: its files' access times and priorities (the cluster's eviction orders) and the
prefix-chain links its readahead learned (merged with every node's). A mixin of RedisCatalog
(kvfs/catalog/redis/catalog.py); each batch is one script call per shard.
"""

from __future__ import annotations

from kvfs.catalog.redis.scripts import SCRIPTS
from kvfs.errors import KvfsError


class Flushes:
    """RedisCatalog's batched writes of access times and chain links."""

    async def flush_atimes(self) -> int:
        """Persist recorded accesses: the cluster-wide LRU order eviction follows."""
        inos, self._dirty_atime = self._dirty_atime, set()
        groups: dict[int, list] = {}  # shard -> its files' arguments
        for i in inos:
            n = self.nodes.get(i)
            if n is not None and n.linked and n.persisted:
                groups.setdefault(self.shard_of_node(n).k, []).extend(
                    [
                        i,
                        n.atime_ns,
                        n.atime_ns // 1_000_000,
                        repr(n.prio) if n.prio is not None else "",
                        n.uses,
                    ]
                )
        try:
            for k, args in groups.items():
                await self.shards[k].link.eval(SCRIPTS.atimes, args, durable=False)
        except KvfsError:
            self._dirty_atime |= inos
            raise
        return sum(len(a) for a in groups.values()) // 5

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
        # per shard of the predecessor's record, and whether the successor's is there too
        groups: dict[tuple[int, bool], list] = {}
        later = {}
        for (pred, succ), (source, weight) in deltas.items():
            p, s = self.nodes.get(pred), self.nodes.get(succ)
            if p is None:
                continue  # (gone: so are its links)
            k = self.shard_of_node(p).k
            both = s is not None and self.shard_of_node(s).k == k
            if weight is None:
                groups.setdefault((k, both), []).extend([pred, succ, 0, "-"])
            elif s is not None and p.persisted and s.persisted:
                groups.setdefault((k, both), []).extend([pred, succ, source, weight])
            elif s is not None and p.linked and s.linked:
                later[(pred, succ)] = [source, weight]  # with their files, later
        self._link_delta.update(later)
        try:
            for (k, both), args in groups.items():
                await self.shards[k].link.eval(
                    SCRIPTS.links, [self.epoch, "1" if both else "0", *args], durable=False
                )
        except KvfsError:
            for k, v in deltas.items():
                self._link_delta.setdefault(k, v)
            raise
        return sum(len(a) for a in groups.values()) // 4
