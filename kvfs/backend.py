"""Opening and formatting what the daemon runs on: the catalog, the pool, its space, the local
tier. One path for both kinds of catalog, used by the daemon, the tests and `kvfs format`:

* **sqlite** (no `[cluster]` table): the catalog is `state_dir/catalog.sqlite`; a brand-new
  pool of namespace files (with a size) is created and formatted on first start.
* **redis** (`[cluster]`): the catalog is in Redis, shared by every node; the first node to
  start on fresh namespace files formats them and creates the catalog (under a Redis lock).

`open_layers` runs inside trio and registers every close on the caller's exit stack; if it
fails, everything it created (directories, namespace files, a new catalog) is removed again and
a `StartupError` says why in one line.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from kvfs.catalog.sqlite import SqliteCatalog
from kvfs.config import Config
from kvfs.errors import StartupError
from kvfs.knobs import Knobs
from kvfs.tiers.local import LocalTier
from kvfs.pool.pool import Pool
from kvfs.space import LocalSpace, Space


@dataclass
class Layers:
    """What the daemon runs on."""
    catalog: object             # SqliteCatalog or RedisCatalog
    pool: Pool
    space: Space
    local: LocalTier | None


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
    with contextlib.ExitStack() as undo:       # what to remove again if start-up fails
        if cfg.cluster is None:
            catalog, pool, space = _open_sqlite(cfg, knobs, stack, undo)
        else:
            catalog, pool, space = await _open_redis(cfg, knobs, stack, undo)
        local = None
        if cfg.local is not None:
            local = LocalTier.open(cfg.local, pool.unit)
            stack.callback(local.close)
        undo.pop_all()                          # started: keep everything
    return Layers(catalog, pool, space, local)


def _open_sqlite(cfg: Config, knobs: Knobs, stack, undo):
    sd = cfg.state_dir
    catalog = None
    catalog_exists = cfg.catalog_path.exists()
    if catalog_exists:
        stack.callback(os.close, lock_state_dir(sd))
        catalog = SqliteCatalog.open(cfg.catalog_path)
        stack.callback(catalog.close)
    expect = catalog.pool_id if catalog else None
    for nc in cfg.pool.namespaces:      # the embedded default keeps its pool in state_dir
        if not nc.path.exists() and nc.size is not None and sd in nc.path.parents:
            _mkdirs(nc.path.parent, undo)
    pool = Pool.open(cfg.pool, expect_pool_id=expect, create_new=expect is None)
    stack.callback(pool.close)
    if pool.created:
        undo.callback(_remove_pool_files, cfg)
    if expect is None and not pool.created:
        raise StartupError(f"the namespaces hold pool {pool.pool_id}, but state_dir {sd} has "
                           f"no catalog for it (state_dir lost?); to start over, run "
                           f"`kvfs format --force`")
    if catalog is None:
        _mkdirs(sd, undo)
        stack.callback(os.close, lock_state_dir(sd))
        catalog = SqliteCatalog.open(cfg.catalog_path)
        stack.callback(catalog.close)
        for suffix in ("", "-wal", "-shm"):
            undo.callback(_unlink, str(cfg.catalog_path) + suffix)
    if catalog.pool_id is None:
        catalog.set_pool_id(pool.pool_id)
    pool.attach_extents(*catalog.extents())
    catalog.on_failure = pool.stop_freeing
    return catalog, pool, LocalSpace(pool, knobs)


async def _open_redis(cfg: Config, knobs: Knobs, stack, undo):
    from kvfs.catalog.redis import RedisCatalog
    from kvfs.catalog.redis import bootstrap
    from kvfs.cluster.space import ClusterSpace

    sd = cfg.state_dir
    _mkdirs(sd, undo)
    stack.callback(os.close, lock_state_dir(sd))
    link = await bootstrap.connect(cfg.cluster)
    stack.push_async_callback(link.aclose)

    def open_pool(pool_id: str | None) -> Pool:
        pool = Pool.open(cfg.pool, expect_pool_id=pool_id, create_new=pool_id is None)
        if pool.created:
            undo.callback(_remove_pool_files, cfg)
        return pool

    pool = await bootstrap.join(link, open_pool)
    stack.callback(pool.close)
    space = ClusterSpace(pool, knobs, link, cfg.cluster)
    catalog = RedisCatalog(link, cfg.cluster, space)
    catalog.pool_id = pool.pool_id
    space.catch_up = catalog.catch_up
    await catalog.load()
    link.quiet = False
    return catalog, pool, space


async def format_layers(cfg: Config, *, force: bool) -> tuple[str, str]:
    """`kvfs format`: new superblocks on the namespaces and an empty catalog (SQLite in
    state_dir, or in Redis), and the local tier. Returns (pool id, where the catalog is)."""
    sd = cfg.state_dir
    if cfg.cluster is None and cfg.catalog_path.exists() and not force:
        raise StartupError(f"state_dir {sd} already holds a catalog; refusing to start a new "
                           f"pool over it (use --force to discard it)", errno.EEXIST)
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
                cfg.cluster, lambda: Pool.format(cfg.pool, force=force), force=force)
            where = f"in Redis at {cfg.cluster.where} (cluster {cfg.cluster.name!r})"
        if cfg.local is not None:
            from kvfs.tiers.local import format_local
            format_local(cfg.local, cfg.pool.stripe_unit, force)
    finally:
        os.close(lock)
    return pool_id, where
