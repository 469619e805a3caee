"""The daemon's parts, put together: catalog, pool, store, files and control, plus background
work (fetches, batched access-time persistence) and the statistics they report."""

from __future__ import annotations

import dataclasses
import logging
import os
import time

import trio

from kvfs import __version__
from kvfs.config import Config
from kvfs.control import STATS_VERSION, Control
from kvfs.errors import KvfsError
from kvfs.files import Files
from kvfs.pool import Pool
from kvfs.readahead import Readahead
from kvfs.store import BlockStore

log = logging.getLogger("kvfs.service")

ATIME_FLUSH_SECONDS = 30.0
CLUSTER_FLUSH_SECONDS = 5.0    # a shared pool's LRU order and chains are shared: flush sooner


class Service:
    def __init__(self, cfg: Config, catalog, pool: Pool, local=None):
        self.cfg = cfg
        self.catalog = catalog
        self.pool = pool
        self.local = local
        self.store = BlockStore(pool, cfg.dram.capacity, policy=cfg.dram.policy, local=local)
        self.readahead = Readahead(catalog, self.store, enabled=cfg.prefetch.enabled,
                                   max_window=cfg.prefetch.max_window)
        self.files = Files(catalog, self.store, pool, evict=cfg.pool.evict,
                           max_block_size=cfg.pool.max_block_size, readahead=self.readahead)
        self.control = Control(self)
        self.latency = None                # set by the FUSE layer: request latencies
        self.started = time.time()

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run background work until cancelled; started() once reads and writes can be served."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.catalog.serve)
            await nursery.start(self.store.serve)
            if self.catalog.shared:
                nursery.start_soon(self._keep_free)
                nursery.start_soon(self._hold_graves)
            nursery.start_soon(self._flush_periodically)
            nursery.start_soon(self._warm_pinned)
            nursery.start_soon(self._expire_leases)
            if self.cfg.metrics_port:
                from kvfs import metrics
                await nursery.start(metrics.serve, self.statistics, self.cfg.metrics_address,
                                    self.cfg.metrics_port)
            task_status.started()
            await trio.sleep_forever()

    async def _flush_periodically(self) -> None:
        while True:
            await trio.sleep(CLUSTER_FLUSH_SECONDS if self.catalog.shared else ATIME_FLUSH_SECONDS)
            await self.flush()

    async def _keep_free(self) -> None:
        while True:
            await trio.sleep(1.0)
            try:
                n = await self.files.keep_free()
                if n:
                    log.info("cluster: evicted %d bytes to keep the pool's free target", n)
            except KvfsError as e:
                log.debug("cluster: keeping the pool free failed: %s", e)

    async def _hold_graves(self) -> None:
        """Shared pool: blocks another node retired stay unpurged while read here."""
        cat = self.catalog
        while True:
            await trio.sleep(max(0.2, cat.cfg.grace_seconds / 4))
            held = [bid for bid in cat.grave if self.store.is_held(bid)]
            try:
                await cat.hold_graves(held)
            except KvfsError as e:
                log.debug("cluster: holding retired blocks that are still read failed: %s", e)

    async def _expire_leases(self) -> None:
        while True:
            await trio.sleep(1.0)
            n = self.files.expire_leases()
            if n:
                log.warning("%d direct-read lease(s) expired unreleased", n)

    async def flush(self) -> dict:
        """Persist what is batched: access times and learned chain links."""
        out = {}
        try:
            out["atimes"] = await self.catalog.flush_atimes()
            out["links"] = await self.catalog.flush_links()
        except KvfsError as e:
            log.warning("persisting access times and chain links failed (retried later): %s", e)
        except Exception:  # noqa: BLE001 - logged; the next round retries
            log.exception("persisting access times and chain links failed")
        return out

    async def _warm_pinned(self) -> None:
        n = await self.files.warm_pinned()
        if n:
            log.info("%d pinned file(s) back in DRAM", n)

    def statistics(self) -> dict:
        """A versioned, JSON-friendly snapshot of what every layer counts."""
        pool, store = self.pool, self.store
        st = store.stats
        tiers = {name: dataclasses.asdict(t) for name, t in st.tiers.items()}
        policy = store.dram.policy
        tiers["dram"].update({
            "capacity": store.capacity,
            "used": store.dram.used + store.charged + store.inflight,
            "resident": store.dram.used,
            "write_buffers": store.charged,
            "fetching": store.inflight,
            "pinned": store.pinned_bytes,
            "blocks": len(store.dram.sizes),
            "policy": policy.name,
            "policy_mode": getattr(policy, "mode_name", policy.name),
        })
        tiers["pool"].update({
            "blocks": len(store.recency),
            "capacity": pool.capacity,
            "used": pool.capacity - pool.free,
            "free": pool.free,
            "reserved": pool.reserved,
            "evict": self.cfg.pool.evict,
            "evictions": self.files.stats.pool_evictions,
            "stripe_unit": pool.unit,
            "pool_id": pool.pool_id,
            "placement_weights": [round(w, 3) for w in pool.placement_weights()],
        })
        if store.local is None:
            del tiers["local"]
        else:
            tiers["local"].update(store.local.statistics())
        counters = dataclasses.asdict(st)
        del counters["tiers"]
        prefetch = {k[len("prefetch_"):]: counters.pop(k) for k in list(counters)
                    if k.startswith("prefetch_")}
        prefetch.update(dataclasses.asdict(self.readahead.stats))
        prefetch["enabled"] = self.readahead.enabled
        out = {
            "version": STATS_VERSION,
            "kvfs": __version__,
            "pid": os.getpid(),
            "uptime_s": round(time.time() - self.started, 3),
            "tiers": tiers,
            "namespaces": [
                {"index": ns.index, "path": str(ns.path), "size": ns.size,
                 "direct_io": ns.direct, "queue_depth": ns.queue_depth,
                 **dataclasses.asdict(ns.stats)}
                for ns in pool.namespaces],
            "store": counters,
            "prefetch": prefetch,
            "files": dict(dataclasses.asdict(self.files.stats),
                          open_handles=len(self.files.handles),
                          nodes=len(self.catalog.nodes)),
            "latency": self.latency.summary() if self.latency is not None else {},
            "catalog": {"kind": "redis" if self.catalog.shared else "sqlite",
                        "transactions": self.catalog.commits,
                        "statements": self.catalog.statements,
                        "commit_seconds": round(self.catalog.commit_seconds, 4)},
        }
        if self.catalog.shared:
            out["cluster"] = self.catalog.statistics()
        return out
