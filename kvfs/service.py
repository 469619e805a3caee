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
from kvfs.files import Files
from kvfs.pool import Pool
from kvfs.store import BlockStore

log = logging.getLogger("kvfs.service")

ATIME_FLUSH_SECONDS = 30.0


class Service:
    def __init__(self, cfg: Config, catalog, pool: Pool):
        self.cfg = cfg
        self.catalog = catalog
        self.pool = pool
        self.store = BlockStore(pool, cfg.dram.capacity)
        self.files = Files(catalog, self.store, pool, evict=cfg.pool.evict,
                           max_block_size=cfg.pool.max_block_size)
        self.control = Control(self)
        self.started = time.time()

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run background work until cancelled; started() once reads and writes can be served."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.pool.serve)
            await nursery.start(self.store.serve)
            nursery.start_soon(self._flush_atimes_periodically)
            task_status.started()
            await trio.sleep_forever()

    async def _flush_atimes_periodically(self) -> None:
        while True:
            await trio.sleep(ATIME_FLUSH_SECONDS)
            try:
                await self.catalog.flush_atimes()
            except Exception:  # noqa: BLE001 - logged; the next round retries
                log.exception("persisting access times failed")

    def statistics(self) -> dict:
        """A versioned, JSON-friendly snapshot of what every layer counts."""
        pool = self.pool
        return {
            "version": STATS_VERSION,
            "kvfs": __version__,
            "pid": os.getpid(),
            "uptime_s": round(time.time() - self.started, 3),
            "tiers": {
                "dram": {
                    "capacity": self.store.capacity,
                    "used": self.store.dram_used + self.store.charged,
                    "resident": self.store.dram_used,
                    "write_buffers": self.store.charged,
                    "blocks": len(self.store.dram),
                },
                "pool": {
                    "capacity": pool.capacity,
                    "used": pool.capacity - pool.free,
                    "free": pool.free,
                    "reserved": pool.reserved,
                    "evict": self.cfg.pool.evict,
                    "stripe_unit": pool.unit,
                    "pool_id": pool.pool_id,
                    "io": pool.engine.name,
                    "placement_weights": [round(w, 3) for w in pool.placement_weights()],
                },
            },
            "namespaces": [
                {"index": ns.index, "path": str(ns.path), "size": ns.size,
                 "direct_io": ns.direct, "queue_depth": ns.queue_depth,
                 **dataclasses.asdict(ns.stats)}
                for ns in pool.namespaces],
            "store": dataclasses.asdict(self.store.stats),
            "files": dict(dataclasses.asdict(self.files.stats),
                          open_handles=len(self.files.handles),
                          nodes=len(self.catalog.nodes)),
            "catalog": {"transactions": self.catalog.commits,
                        "statements": self.catalog.statements},
        }
