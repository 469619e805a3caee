"""The factory: the one place that opens what the daemon runs on (the catalog, the pool, the
local tier), builds every layer over it and passes each the collaborators it uses at
construction. It also runs the layers' background work and composes their statistics into the
versioned snapshot `user.kvfs.stats` reports.

Opening: one path for both kinds of catalog, used by the daemon, the tests and `kvfs format`:

* **sqlite** (no `[cluster]` table): the catalog is `state_dir/catalog.sqlite`; a brand-new
  pool of namespace files (with a size) is created and formatted on first start.
* **redis** (`[cluster]`): the catalog is in Redis, shared by every node; the first node to
  start on fresh namespace files formats them and creates the catalog (under a Redis lock).

`open_layers` runs inside trio and registers every close on the caller's exit stack; if it
fails, everything it created (directories, namespace files, a new catalog) is removed again and
a `StartupError` says why in one line.

Wiring: a layer calls only the layers below it. The few calls that must go the other way (or
round a circle) are each a `Seam`, made here before either end, passed to the lower end's
constructor (typed there by the protocol it needs) and bound to the upper end once that is
built (`Seams`; docs/architecture.md, "Wiring"). Nothing is assigned onto a layer after it is
built, and no layer's kind is probed: the configuration says which kinds are built.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from kvfs import __version__
from kvfs.catalog.groupcommit import CommitHooks
from kvfs.catalog.interface import Catalog
from kvfs.catalog.sqlite import SqliteCatalog
from kvfs.config import Config
from kvfs.errors import KvfsError, StartupError
from kvfs.fs.control import Control
from kvfs.fs.direct_access import DirectAccess
from kvfs.fs.direct_socket import DirectSocket
from kvfs.fs.files import Files
from kvfs.fs.kernel import NO_KERNEL, NoKernel
from kvfs.fs.latency import Latency
from kvfs.fs.leases import Allocations, Leases
from kvfs.fs.operations import FuseOps
from kvfs.fs.pool_admin import PoolAdmin
from kvfs.knobs import Knobs
from kvfs.pool.buffer import MEMORY
from kvfs.pool.members import Members, empty_removed
from kvfs.pool.pool import Pool
from kvfs.space import LocalSpace, Space
from kvfs.tiers.local import LocalTier
from kvfs.tiers.readahead import Readahead
from kvfs.tiers.store import BlockStore
from kvfs.write.durability import CommitAtClose, Durability
from kvfs.write.sessions import Sessions
from kvfs.write.writeback import WriteBack, WriteQueue

if TYPE_CHECKING:  # (ZMQ is imported only where [events] is on: open_events)
    from kvfs.events.publisher import Publisher


class Seam:
    """One call that goes up (or round a circle) between two layers, made explicit: built
    before either end, handed to the lower end's constructor, bound once to the upper end
    when that is built. Attribute access forwards to the bound end; before it is bound it
    raises (a wiring bug, never a state the daemon runs in)."""

    __slots__ = ("name", "_target")

    def __init__(self, name: str):
        self.name = name
        self._target = None

    def bind(self, target: object) -> None:
        if self._target is not None:
            raise RuntimeError(f"seam {self.name}: bound twice")
        self._target = target

    def __getattr__(self, attr: str):
        target = self._target
        if target is None:
            raise RuntimeError(f"seam {self.name}: used before the factory bound it")
        return getattr(target, attr)

    def later(self, method: str):
        """A callable that calls the bound end's `method` when it is called (a hook given
        before the end exists)."""
        return lambda *args, **kw: getattr(self, method)(*args, **kw)


@dataclass
class Seams:
    """Every call that goes up, by the protocol its lower end declares."""

    # the space layer -> the file layer (Files): may a file go, delete it, is a block read
    # here (kvfs/space/base.py `Evictor`)
    evictor: Seam = field(default_factory=lambda: Seam("space -> files (evictor)"))
    # a shared catalog -> Files: another node changed a file (`on_change`)
    changes: Seam = field(default_factory=lambda: Seam("catalog -> files (on_change)"))
    # the group commit -> the commit pipeline (Sessions): wait for commits writing their
    # blocks (`before_commit`)
    writes: Seam = field(default_factory=lambda: Seam("catalog -> sessions (before_commit)"))
    # the group commit -> the write-back queue: a transaction was opened (`on_unsynced`)
    unsynced: Seam = field(default_factory=lambda: Seam("catalog -> write-back (on_unsynced)"))
    # the write-back -> the file layer (Files): a closed file's write-back failed, or settled
    # (kvfs/write/durability.py `Listener`)
    listener: Seam = field(default_factory=lambda: Seam("write-back -> files (listener)"))
    # the control file -> the service: the daemon's statistics, and a flush of what is batched
    service: Seam = field(default_factory=lambda: Seam("control -> service (statistics, flush)"))


def writes_back(cfg: Config) -> bool:
    """When bytes are durable (kvfs/write/durability.py), chosen once: "fsync" (close is not a
    commit: closed files are committed in batches, kvfs/write/writeback.py) or "close"
    (close() commits). A shared pool writes back too: each batch is published in one script
    call (kvfs/catalog/redis/catalog.py `commit_batch`)."""
    return cfg.mount.durability == "fsync"


@dataclass
class Layers:
    """What the daemon runs on, and the seams the layers above it bind."""

    catalog: Catalog  # SqliteCatalog (one node) or RedisCatalog (a shared pool)
    pool: Pool
    space: Space
    local: LocalTier | None
    seams: Seams
    events: Publisher | None = None  # KV events ([events] enabled)


def lock_state_dir(sd: Path) -> int:
    """An exclusive lock on the state directory (one daemon per state_dir); the fd holds it."""
    fd = os.open(sd, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise StartupError(f"state_dir {sd}: in use by another kvfs daemon", errno.EBUSY) from None
    return fd


def _mkdirs(path: Path, undo: contextlib.ExitStack) -> None:
    """Create `path` and missing parents; undo removes the ones created here."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir(mode=0o700)
        undo.callback(_rmdir, d)


def _rmdir(d: Path) -> None:
    try:
        d.rmdir()
    except OSError:
        pass


def _unlink(path: str | Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _remove_pool_files(cfg: Config) -> None:
    for nc in cfg.pool.namespaces:
        _unlink(nc.path)


async def open_layers(cfg: Config, knobs: Knobs, stack: contextlib.AsyncExitStack) -> Layers:
    """Open (or create) the catalog, the pool and its space, and the local tier."""
    seams = Seams()
    events = open_events(cfg)
    if events is not None:
        stack.callback(events.close)
    with contextlib.ExitStack() as undo:  # what to remove again if start-up fails
        if cfg.cluster is None:
            catalog, pool, space = _open_sqlite(cfg, knobs, stack, undo, seams, events)
        else:
            catalog, pool, space = await _open_redis(cfg, knobs, stack, undo, seams, events)
        local = None
        if cfg.local is not None:
            local = LocalTier.open(cfg.local, pool.unit)
            stack.callback(local.close)
        undo.pop_all()  # started: keep everything
    return Layers(catalog, pool, space, local, seams, events)


def open_events(cfg: Config) -> Publisher | None:
    """The KV events' publisher ([events] enabled; StartupError if its sockets cannot open)."""
    ec = cfg.events
    if not ec.enabled:
        return None
    from kvfs.events.naming import NamingRule
    from kvfs.events.publisher import Publisher

    cl = cfg.cluster
    node = ec.node or (cl.node_id if cl is not None else os.uname().nodename)
    locality = ec.locality or (f"pool:{cl.name}" if cl is not None else node)
    try:
        return Publisher(
            endpoint=ec.endpoint,
            replay_endpoint=ec.replay_endpoint,
            rule=NamingRule.named(ec.layout, ec.pattern),
            node=node,
            locality=locality,
            topic=ec.topic,
            model=ec.model,
            buffer_steps=ec.buffer_steps,
            hwm=ec.hwm,
        )
    except ValueError as e:
        raise StartupError(str(e), errno.EADDRINUSE) from None


def _open_sqlite(cfg: Config, knobs: Knobs, stack, undo, seams: Seams, events=None):
    sd = cfg.state_dir
    write_back = writes_back(cfg)
    # the catalog may be opened before the pool (it names the pool to expect): a failure of
    # the catalog's reaches the pool through a seam (it then frees no extent until a restart)
    failures = Seam("catalog -> pool (on_failure)")
    hooks = CommitHooks(
        sync_changes=not write_back,
        before_commit=seams.writes.later("writes_settled"),
        on_unsynced=seams.unsynced.later("kick") if write_back else None,
        on_failure=failures.later("stop_freeing"),
        announcer=events,
    )
    catalog = None
    catalog_exists = cfg.catalog_path.exists()
    if catalog_exists:
        stack.callback(os.close, lock_state_dir(sd))
        catalog = SqliteCatalog.open(cfg.catalog_path, hooks)
        stack.callback(catalog.close)
    expect = catalog.pool_id if catalog else None
    for nc in cfg.pool.namespaces:  # the embedded default keeps its pool in state_dir
        if not nc.path.exists() and nc.size is not None and sd in nc.path.parents:
            _mkdirs(nc.path.parent, undo)
    members = Members.decode(catalog.members) if catalog else None
    pool = Pool.open(cfg.pool, expect_pool_id=expect, create_new=expect is None, members=members)
    stack.callback(pool.close)
    if pool.created:
        undo.callback(_remove_pool_files, cfg)
    if expect is None and not pool.created:
        raise StartupError(
            f"the namespaces hold pool {pool.pool_id}, but state_dir {sd} has "
            f"no catalog for it (state_dir lost?); to start over, run "
            f"`kvfs format --force`"
        )
    if catalog is None:
        _mkdirs(sd, undo)
        stack.callback(os.close, lock_state_dir(sd))
        catalog = SqliteCatalog.open(cfg.catalog_path, hooks)
        stack.callback(catalog.close)
        for suffix in ("", "-wal", "-shm"):
            undo.callback(_unlink, str(cfg.catalog_path) + suffix)
    if catalog.pool_id is None:
        catalog.set_pool_id(pool.pool_id)
    pool.attach_extents(*catalog.extents())
    empty_removed(pool)
    failures.bind(pool)
    # in "fsync" mode space is freed once the change that released it is durable (in "close"
    # mode every change is durable before its space is retired: freed at once, and a free
    # never waits for an unrelated later transaction)
    space = LocalSpace(
        pool,
        knobs,
        seams.evictor,
        order=catalog,
        after_release=catalog.after_release if write_back else None,
    )
    return catalog, pool, space


async def _open_redis(cfg: Config, knobs: Knobs, stack, undo, seams: Seams, events=None):
    from kvfs.catalog.redis import RedisCatalog, bootstrap
    from kvfs.cluster.space import ClusterSpace

    sd = cfg.state_dir
    _mkdirs(sd, undo)
    stack.callback(os.close, lock_state_dir(sd))
    link = await bootstrap.connect(cfg.cluster)
    stack.push_async_callback(link.aclose)
    shards = await bootstrap.connect_shards(cfg.cluster)  # ([cluster] shards: the others)
    for other in shards:
        stack.push_async_callback(other.aclose)

    def open_pool(pool_id: str | None) -> Pool:
        pool = Pool.open(cfg.pool, expect_pool_id=pool_id, create_new=pool_id is None)
        if pool.created:
            undo.callback(_remove_pool_files, cfg)
        return pool

    pool = await bootstrap.join(link, open_pool, shards)
    stack.callback(pool.close)
    # the shared space and the catalog in Redis call each other: the space's side is a seam
    order = Seam("shared space -> catalog (order, change log)")
    space = ClusterSpace(pool, knobs, link, cfg.cluster, seams.evictor, order, shards)
    catalog = RedisCatalog(
        link,
        cfg.cluster,
        space,
        pool_id=pool.pool_id,
        on_change=seams.changes.later("changed_elsewhere"),
        announcer=events,
        confirm_misses=cfg.mount.durability == "close",
        shards=shards,
    )
    order.bind(catalog)
    await catalog.load()
    for x in (link, *shards):
        x.started()
    return catalog, pool, space


async def format_layers(cfg: Config, *, force: bool) -> tuple[str, str]:
    """`kvfs format`: new superblocks on the namespaces and an empty catalog (SQLite in
    state_dir, or in Redis), and the local tier. Returns (pool id, where the catalog is)."""
    sd = cfg.state_dir
    if cfg.cluster is None and cfg.catalog_path.exists() and not force:
        raise StartupError(
            f"state_dir {sd} already holds a catalog; refusing to start a new "
            f"pool over it (use --force to discard it)",
            errno.EEXIST,
        )
    sd.mkdir(parents=True, exist_ok=True, mode=0o700)
    for nc in cfg.pool.namespaces:
        if not nc.path.exists() and nc.size is not None and sd in nc.path.parents:
            nc.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = lock_state_dir(sd)
    try:
        if cfg.cluster is None:
            pool_id = Pool.format(cfg.pool, force=force)
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(str(cfg.catalog_path) + suffix)
            cat = SqliteCatalog.open(cfg.catalog_path)
            cat.set_pool_id(pool_id)
            cat.close()
            where = str(cfg.catalog_path)
        else:
            from kvfs.catalog.redis import bootstrap

            pool_id = await bootstrap.format_catalog(
                cfg.cluster, lambda: Pool.format(cfg.pool, force=force), force=force
            )
            where = f"in Redis at {cfg.cluster.where} (cluster {cfg.cluster.name!r})"
        if cfg.local is not None:
            from kvfs.tiers.local import format_local

            format_local(cfg.local, cfg.pool.stripe_unit, force)
    finally:
        os.close(lock)
    return pool_id, where


log = logging.getLogger("kvfs.service")

STATS_VERSION = 1
ATIME_FLUSH_SECONDS = 30.0
CLUSTER_FLUSH_SECONDS = 5.0  # a shared pool's LRU order and chains are shared: flush sooner
RECHARGE_SECONDS = 0.25  # how often passthrough writers' memory is accounted


class Service:
    def __init__(
        self,
        cfg: Config,
        layers: Layers,
        knobs: Knobs,
        kernel: NoKernel = NO_KERNEL,
        mount: str | None = None,
    ):
        """`kernel`: what to tell the kernel's caches (kvfs/fs/kernel.py; the daemon passes
        `KernelCache` once it mounts, the daemon-object tests run without a kernel). `mount`:
        the mount's path (direct clients' paths may lead through absolute symbolic links
        into it)."""
        self.cfg = cfg
        self.knobs = knobs
        self.catalog = catalog = layers.catalog
        # one node or a shared pool: decided here, once, by the catalog the layers opened
        # (nothing else asks: tests/unit/test_structure.py)
        self._catalog_kind = "redis" if catalog.shared else "sqlite"
        self._flush_period = CLUSTER_FLUSH_SECONDS if catalog.shared else ATIME_FLUSH_SECONDS
        self.pool = pool = layers.pool
        self.space = space = layers.space
        self.events = layers.events
        self.store = store = BlockStore(
            pool,
            cfg.dram.capacity,
            policy=cfg.dram.policy,
            local=layers.local,
            on_free=space.retired,
        )
        self.readahead = Readahead(catalog, store, knobs)
        self.leases = Leases(store)
        self.allocations = Allocations(pool, space)
        seams = layers.seams
        self.files = files = self._files(layers, kernel)
        seams.evictor.bind(files)
        seams.changes.bind(files)
        self.durability = files.durability
        self.direct = DirectAccess(
            catalog,
            files,
            self.leases,
            self.allocations,
            mount=os.fsencode(mount) if mount is not None else None,
        )
        namespace_paths = [str(ns.path) for ns in pool.namespaces]
        # a direct reader's deadline (kvfs.client.direct), as the daemon's readers'
        read_timeout = cfg.pool.read_timeout_ms / 1000 or None
        self.direct_socket = DirectSocket(
            self.direct,
            allow_other=cfg.mount.allow_other,
            namespace_paths=namespace_paths,
            read_timeout=read_timeout,
        )
        self.pool_admin = self._pool_admin(namespace_paths)
        self.latency = Latency()
        self.control = Control(
            catalog,
            store,
            files,
            self.direct_socket,
            knobs,
            service=seams.service,
            pool_admin=self.pool_admin,
            pool_info={
                "pool_id": pool.pool_id,
                "namespace_paths": namespace_paths,
                "read_timeout": read_timeout,
            },
        )
        seams.service.bind(self)
        self.ops = FuseOps(
            files,
            self.control,
            self.latency,
            cfg.mount.attr_timeout,
            passthrough=cfg.mount.passthrough,
        )
        self.started = time.time()

    def _pool_admin(self, namespace_paths: list[str]) -> PoolAdmin:
        """`kvfs pool remove` / `add`, with the catalog's record of the pool's members (one
        node's catalog only: a shared pool's namespaces are not changed while mounted)."""
        local = self._catalog_kind == "sqlite"
        members = Members.decode(self.catalog.members) if local else None
        return PoolAdmin(self.catalog, self.files, self.pool, self.store, namespace_paths, members)

    def _files(self, layers: Layers, kernel: NoKernel) -> Files:
        """The write pipeline (its write-back queue where durability is "fsync") and the file
        layer over it, with the durability seam the mode calls for."""
        cfg, catalog, pool, space, seams = (
            self.cfg,
            self.catalog,
            self.pool,
            self.space,
            layers.seams,
        )
        queue = None
        if writes_back(cfg):
            # (a writer waits for the dirty limit at most two I/O deadlines and the delay)
            queue = WriteQueue(
                catalog,
                delay=cfg.mount.writeback_ms / 1000,
                dirty_limit=cfg.mount.dirty_limit,
                dirty_wait_max=2 * cfg.pool.io_timeout_ms / 1000 + cfg.mount.writeback_ms / 1000,
            )
            seams.unsynced.bind(queue)
        sessions = Sessions(
            catalog,
            self.store,
            pool,
            space,
            pending=queue,
            write_behind=queue is None,
        )
        seams.writes.bind(sessions)

        durability: Durability = CommitAtClose(sessions)
        if queue is not None:
            # (a shared pool: written batches grouped, for one publish per shard)
            shards = len(catalog.shards) if catalog.shared else 0
            durability = WriteBack(queue, sessions, seams.listener, group_shards=shards)
        files = Files(
            catalog,
            self.store,
            space,
            sessions,
            self.leases,
            self.allocations,
            durability=durability,
            readahead=self.readahead,
            kernel=kernel,
            misses_cacheable=not catalog.shared,
        )
        seams.listener.bind(files)
        return files

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run background work until cancelled; started() once reads and writes can be served."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.catalog.serve)
            await nursery.start(self.pool.serve)
            await nursery.start(self.store.serve)
            await nursery.start(self.space.serve)
            await nursery.start(self.durability.serve)
            if self.events is not None:
                # the inventory first: every change from now on is announced after it
                self.events.resync(self.catalog.announced_keys())
                await nursery.start(self.events.serve)
            nursery.start_soon(self._flush_periodically)
            if self.pool_admin.members.dropping:  # a removal a crash interrupted
                nursery.start_soon(self.pool_admin.resume)
            nursery.start_soon(self._warm_pinned)
            nursery.start_soon(self._recharge_periodically)
            nursery.start_soon(self.leases.expire_periodically, self.allocations, log)
            if self.cfg.metrics_port:
                from kvfs import metrics

                await nursery.start(
                    metrics.serve, self.statistics, self.cfg.metrics_address, self.cfg.metrics_port
                )
            task_status.started()
            await trio.sleep_forever()

    async def stop(self) -> int:
        """Unmounting (umount, SIGTERM): the direct socket answers the requests it is
        answering and takes no more, then write back closed files (also those whose RELEASE
        never came: `Files.closed_at_stop`), persist what is batched, give back shared
        space, close the catalog's connections (bounded: a shared catalog may be
        unreachable). Returns how many files' content could not be written back: those
        failing now, and earlier failures no fsync has reported (logged; the daemon then
        exits non-zero)."""
        await self.direct_socket.stop()
        n = await self.files.closed_at_stop()
        if n:
            log.info("%d closed file(s) whose release had not come: written back now", n)
        lost = await self.durability.stop()
        await self.flush()
        unseen = self.files.write_errors.unseen()
        if lost or unseen:
            log.error(
                "%d file(s) could not be written back at the stop, and %d earlier "
                "write-back failure(s) no fsync reported: those files keep their previous "
                "version (or have no name)",
                lost,
                unseen,
            )
        with trio.move_on_after(5):
            await self.space.stop()
            await self.catalog.stop()
        return lost + unseen

    async def _flush_periodically(self) -> None:
        while True:
            await trio.sleep(self._flush_period)
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
            log.log(
                logging.DEBUG if self.catalog.failure else logging.WARNING,
                "persisting access times and chain links failed (retried later): %s",
                e,
            )
        except Exception:  # noqa: BLE001 - logged; the next round retries
            log.exception("persisting access times and chain links failed")
        return out

    async def _recharge_periodically(self) -> None:
        while True:
            await trio.sleep(RECHARGE_SECONDS)
            self.files.recharge()

    async def _warm_pinned(self) -> None:
        n = await self.files.xattrs.warm_pinned()
        if n:
            log.info("%d pinned file(s) back in DRAM", n)

    def dirty_files(self) -> int:
        """Files open for writing with bytes not committed (reported at shutdown)."""
        return sum(
            1
            for st in self.files.handles.states.values()
            if st.session is not None and st.session.dirty and st.session.writeback is None
        )

    def data_path(self) -> dict:
        """Which path serves file data, and why (the FUSE layer knows once INIT is answered)."""
        ops = self.ops
        return {
            **ops.data_path,
            "backing_ids": ops.backings.opened - ops.backings.closed,
            "backing_ids_in_use": ops.backings.in_use,
            "backing_ids_opened": ops.backings.opened,
        }

    def statistics(self) -> dict:
        """A versioned, JSON-friendly snapshot of what every layer counts."""
        store = self.store.statistics()
        pool = self.pool.statistics()
        space = self.space.statistics()
        tiers = store["tiers"]
        tiers["pool"].update(pool["tier"])
        tiers["pool"].update(
            reserved=space["reserved"],
            evict=space["evict"],
            evictions=space["evictions"],
            blocks=self.catalog.file_count,
        )
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
            "data_path": {
                **self.data_path(),
                "memory": MEMORY.kind,
                "dram_memfd_bytes": self.store.memfd_bytes(),
            },
            "latency": self.latency.summary(),
            "direct": self.direct_socket.statistics(),
            "catalog": {
                "kind": self._catalog_kind,
                "transactions": cat.commits,
                "statements": cat.statements,
                "commit_seconds": round(cat.commit_seconds, 4),
                "error": cat.failure,
                "opened_with": cat.opened_with,
                **cat.cache_statistics(),
            },
        }
        if self._catalog_kind == "redis":  # (a shared pool: its catalog's and space's figures)
            out["cluster"] = {**cat.statistics(), **space}
        if self.events is not None:
            out["events"] = self.events.statistics()
        return out
