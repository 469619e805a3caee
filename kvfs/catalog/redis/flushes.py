"""What a node records in memory and writes to the shared catalog in batches, every few
seconds: its files' access times and priorities (the cluster's eviction orders) and the
prefix-chain links its readahead learned (merged with every node's). A mixin of RedisCatalog
(kvfs/catalog/redis/catalog.py); each batch is one script call per shard.
"""

from __future__ import annotations

from kvfs.catalog.redis.scripts import SCRIPTS
from kvfs.catalog.tree import LINK_WRITE
from kvfs.errors import KvfsError

# Entries per script call: Redis runs one script at a time, so a call of every link a node
# learned in 5 s (10,000 at 2,000 files/s: about 0.1 s of Redis's time) would stall every other
# node's calls that long; 256 keep a call near 2-3 ms, and cost the same per entry.
PER_CALL = 256


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
                for i in range(0, len(args), 5 * PER_CALL):
                    await self.shards[k].link.eval(
                        SCRIPTS.atimes, args[i : i + 5 * PER_CALL], durable=False
                    )
        except KvfsError:  # (an access time set twice is the same)
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
        s = self.nodes.get(succ)
        if (
            source == LINK_WRITE
            and weight == 1.0
            and before is None
            and s is not None
            and not s.persisted
            and (pred, succ) not in self._link_delta
        ):
            # a new file's link from its writer's previous file goes with the file's first
            # publish, in its record (`w`): no key and no links call of its own (a third of a
            # stored file's cost in Redis, docs/cluster.md)
            self._write_link(succ, {b"w": str(pred).encode()})
            return
        d = self._link_delta.get((pred, succ))
        if d is None or source > d[0]:
            self._link_delta[(pred, succ)] = [source, weight]
        elif source == d[0]:
            d[1] += weight

    def unlink_chain(self, pred: int, succ: int) -> None:
        super().unlink_chain(pred, succ)
        self._link_delta[(pred, succ)] = [0, None]
        if self._wpred.get(succ) == pred:  # carried in succ's record: "w" 0 goes there
            self._write_link(succ, {b"w": b"0"})
            self._unwritten.add(succ)

    async def flush_links(self) -> int:
        """Merge the links learned here into Redis (weights add up across nodes)."""
        self._dirty_links.clear()
        unwritten, self._unwritten = self._unwritten, set()
        for succ in unwritten:
            node = self.nodes.get(succ)
            if node is not None and node.persisted and node.linked:
                try:
                    await self._update(node, [b"w", 0])
                except KvfsError:
                    self._unwritten |= unwritten  # (all of them again: "0" twice is the same)
                    raise
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
                groups.setdefault((k, both), []).append((pred, succ, 0, "-"))
            elif s is not None and p.persisted and s.persisted:
                groups.setdefault((k, both), []).append((pred, succ, source, weight))
            elif s is not None and p.linked and s.linked:
                later[(pred, succ)] = [source, weight]  # with their files, later
        self._link_delta.update(later)
        calls = [
            (k, both, links[i : i + PER_CALL])
            for (k, both), links in groups.items()
            for i in range(0, len(links), PER_CALL)
        ]
        for n, (k, both, links) in enumerate(calls):
            try:
                await self.shards[k].link.eval(
                    SCRIPTS.links,
                    [self.epoch, "1" if both else "0", *(x for link in links for x in link)],
                    durable=False,
                )
            except KvfsError:
                # this call's and the later calls' links are merged next time (weights add
                # up: the calls before this one must not be sent again)
                for _, _, rest in calls[n:]:
                    for pred, succ, *_ in rest:
                        self._link_delta.setdefault((pred, succ), deltas[(pred, succ)])
                raise
        return sum(len(links) for _, _, links in calls)
