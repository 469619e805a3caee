"""The daemon's parts, put together: the one place that wires the layers (each gets exactly the
collaborators it uses), runs their background work, and composes their statistics into the
versioned snapshot `user.kvfs.stats` reports."""

from __future__ import annotations

import logging
import os
import time

import trio

from kvfs import __version__
from kvfs.backend import Layers
from kvfs.pool.buffer import MEMORY
from kvfs.config import Config
from kvfs.fs.control import Control
from kvfs.errors import KvfsError
from kvfs.fs.direct_access import DirectAccess
from kvfs.fs.files import Files
from kvfs.knobs import Knobs
from kvfs.fs.latency import Latency
from kvfs.fs.leases import Allocations, Leases
from kvfs.tiers.readahead import Readahead
from kvfs.write.pipeline import Sessions
from kvfs.tiers.store import BlockStore
from kvfs.write.durability import CommitAtClose, Durability
from kvfs.write.writeback import WriteBack, WriteQueue

log = logging.getLogger("kvfs.service")

STATS_VERSION = 1
ATIME_FLUSH_SECONDS = 30.0
CLUSTER_FLUSH_SECONDS = 5.0    # a shared pool's LRU order and chains are shared: flush sooner
RECHARGE_SECONDS = 0.25        # how often passthrough writers' memory is accounted


class Service:
    def __init__(self, cfg: Config, layers: Layers, knobs: Knobs):
        self.cfg = cfg
        self.knobs = knobs
        self.catalog = catalog = layers.catalog
        self.pool = pool = layers.pool
        self.space = space = layers.space
        self.store = store = BlockStore(pool, cfg.dram.capacity, policy=cfg.dram.policy,
                                        local=layers.local, on_free=space.retired)
        self.readahead = Readahead(catalog, store, knobs)
        self.leases = Leases(store)
        self.allocations = Allocations(pool, space)
        # When bytes are durable (kvfs/write/durability.py), chosen here once: "fsync" (close is not
        # a commit: closed files are committed in batches, kvfs/write/writeback.py) or "close"
        # (close() commits; always with a shared pool)
        write_back = cfg.mount.durability == "fsync" and not catalog.shared
        queue = None
        if write_back:
            # (a writer waits for the dirty limit at most two I/O deadlines and the delay)
            queue = WriteQueue(
                catalog, delay=cfg.mount.writeback_ms / 1000, dirty_limit=cfg.mount.dirty_limit,
                dirty_wait_max=2 * cfg.pool.io_timeout_ms / 1000 + cfg.mount.writeback_ms / 1000)
            catalog.sync_changes = False
            # space is freed once the change that released it is durable (in "close" mode
            # every change is durable before its space is retired: freed at once, and a free
            # never waits for an unrelated later transaction)
            space.after_release = catalog.after_release
        sessions = Sessions(catalog, store, pool, space,
                            max_block_size=cfg.pool.max_block_size or pool.capacity,
                            pending=queue, write_behind=not write_back)
        if hasattr(catalog, "before_commit"):      # group commit waits for writing commits
            catalog.before_commit = sessions.writes_settled

        def durability(listener) -> Durability:
            if queue is not None:
                return WriteBack(queue, sessions, listener)
            return CommitAtClose(sessions)
        self.files = files = Files(catalog, store, space, sessions, self.leases,
                                   self.allocations, durability=durability,
                                   readahead=self.readahead)
        self.durability = files.durability
        self.direct = DirectAccess(catalog, files.handles, sessions, space, self.leases,
                                   self.allocations, files.hits)
        space.store = store
        space.evictor = files.evict
        if hasattr(catalog, "lru_files"):       # one node: the catalog keeps the pool's order
            space.lru, space.scored = catalog.lru_files, catalog.scored_files
            space.last_use = catalog.last_use
            space.lowest, space.unscored = catalog.lowest_priority, catalog.score_unscored
            space.evictable = files.evictable

            async def take_ghost(parent: int, name: bytes) -> int | None:
                return catalog.take_ghost(parent, name)
            space.take_ghost = take_ghost
        elif hasattr(catalog, "take_ghost"):    # a shared pool: ghosts and floor in Redis
            space.take_ghost = catalog.take_ghost
            space.raise_floor = catalog.raise_floor
        space.file_count = lambda: catalog.file_count
        catalog.on_change = files.changed_elsewhere     # other nodes' changes (shared pool)
        self.latency = Latency()
        self.control = Control(catalog, store, files, self.direct, knobs,
                               statistics=self.statistics,
                               flush=self.flush,
                               pool_info={"pool_id": pool.pool_id, "namespace_paths":
                                          [str(ns.path) for ns in pool.namespaces]})
        self.started = time.time()
        # which path serves file data, and why (the FUSE layer knows once INIT is answered)
        self.data_path = lambda: {"passthrough": False, "why": "not mounted"}

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run background work until cancelled; started() once reads and writes can be served."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.catalog.serve)
            await nursery.start(self.store.serve)
            await nursery.start(self.space.serve)
            await nursery.start(self.durability.serve)
            nursery.start_soon(self._flush_periodically)
            nursery.start_soon(self._warm_pinned)
            nursery.start_soon(self._recharge_periodically)
            nursery.start_soon(self.leases.expire_periodically, self.allocations, log)
            if self.cfg.metrics_port:
                from kvfs import metrics
                await nursery.start(metrics.serve, self.statistics, self.cfg.metrics_address,
                                    self.cfg.metrics_port)
            task_status.started()
            await trio.sleep_forever()

    async def stop(self) -> int:
        """Unmounting (umount, SIGTERM): write back closed files (also those whose RELEASE
        never came: `Files.closed_at_stop`), persist what is batched, give back shared
        space, close the catalog's connections (bounded: a shared catalog may be
        unreachable). Returns how many files' content could not be written back: those
        failing now, and earlier failures no fsync has reported (logged; the daemon then
        exits non-zero)."""
        n = await self.files.closed_at_stop()
        if n:
            log.info("%d closed file(s) whose release had not come: written back now", n)
        lost = await self.durability.stop()
        await self.flush()
        unseen = self.files.write_errors.unseen()
        if lost or unseen:
            log.error("%d file(s) could not be written back at the stop, and %d earlier "
                      "write-back failure(s) no fsync reported: those files keep their previous "
                      "version (or have no name)", lost, unseen)
        with trio.move_on_after(5):
            await self.space.stop()
            await self.catalog.stop()
        return lost + unseen

    async def _flush_periodically(self) -> None:
        period = CLUSTER_FLUSH_SECONDS if self.catalog.shared else ATIME_FLUSH_SECONDS
        while True:
            await trio.sleep(period)
            await self.flush()

    async def flush(self) -> dict:
        """Persist what is batched: closed files waiting for write-back, access times and
        learned chain links."""
        out = {}
        try:
            out.update(await self.durability.flush())
            out["atimes"] = await self.catalog.flush_atimes()
            out["links"] = await self.catalog.flush_links()
        except KvfsError as e:
            # after a catalog failure (logged once where it happened) every round fails: debug
            log.log(logging.DEBUG if self.catalog.failure else logging.WARNING,
                    "persisting access times and chain links failed (retried later): %s", e)
        except Exception:  # noqa: BLE001 - logged; the next round retries
            log.exception("persisting access times and chain links failed")
        return out

    async def _recharge_periodically(self) -> None:
        while True:
            await trio.sleep(RECHARGE_SECONDS)
            self.files.recharge()

    async def _warm_pinned(self) -> None:
        n = await self.files.warm_pinned()
        if n:
            log.info("%d pinned file(s) back in DRAM", n)

    def dirty_files(self) -> int:
        """Files open for writing with bytes not committed (reported at shutdown)."""
        return sum(1 for st in self.files.handles.states.values()
                   if st.session is not None and st.session.dirty
                   and st.session.writeback is None)

    def statistics(self) -> dict:
        """A versioned, JSON-friendly snapshot of what every layer counts."""
        store = self.store.statistics()
        pool = self.pool.statistics()
        space = self.space.statistics()
        tiers = store["tiers"]
        tiers["pool"].update(pool["tier"])
        tiers["pool"].update(reserved=space["reserved"], evict=space["evict"],
                             evictions=space["evictions"], blocks=self.catalog.file_count)
        if "evict_mode" in space:  # evicting by the policy: the credit it follows now
            tiers["pool"]["evict_mode"] = space["evict_mode"]
        prefetch = store["prefetch"]
        prefetch.update(vars(self.readahead.stats))
        prefetch["enabled"] = self.knobs.prefetch_enabled
        prefetch["max_window"] = self.knobs.prefetch_max_window
        cat = self.catalog
        out = {
            "version": STATS_VERSION,
            "kvfs": __version__,
            "pid": os.getpid(),
            "uptime_s": round(time.time() - self.started, 3),
            # CPU time of the thread that serves every request (this snapshot runs on it)
            "trio_thread_cpu_s": round(time.thread_time(), 6),
            "tiers": tiers,
            "namespaces": pool["namespaces"],
            "store": store["store"],
            "prefetch": prefetch,
            "files": self.files.statistics(),
            **({"writeback": wb} if (wb := self.durability.statistics()) is not None else {}),
            "data_path": {**self.data_path(), "memory": MEMORY.kind,
                          "dram_memfd_bytes": self.store.memfd_bytes()},
            "latency": self.latency.summary(),
            "catalog": {"kind": "redis" if cat.shared else "sqlite",
                        "transactions": cat.commits, "statements": cat.statements,
                        "commit_seconds": round(cat.commit_seconds, 4),
                        "error": cat.failure,
                        "opened_with": getattr(cat, "opened_with", None),
                        **(cat.cache_statistics() if hasattr(cat, "cache_statistics") else {})},
        }
        if self.space.kind == "cluster":
            out["cluster"] = {**cat.statistics(), **space}
        return out
