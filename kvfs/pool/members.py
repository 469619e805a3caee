"""The pool's membership: which namespaces it holds now, where the config's list is not the
whole story (issue 58: `kvfs pool remove` and `kvfs pool add` while mounted).

A namespace's number is its place in the pool, for good: block layouts name namespaces by
number. So a removed namespace keeps its number as an empty slot (no space, no reads, no
writes), and an added one takes the next number. The catalog keeps this record (`Members`,
one JSON value in its meta table); at start-up the pool is the config's namespaces and the
added ones, each at the number its superblock holds, with an empty slot at each removed
number. So a restart needs no edit of the config (the embedded default's config is not the
user's to edit), and one that drops a removed namespace's line, lists an added one, or names
a device anew after a reboot is read the same.

    {"removed": {"2": {"path": "/dev/nvme2n1", "size": 1073741824}},
     "added": {"4": "/dev/nvme4n1"}, "dropping": [2]}

`dropping`: a removal whose files are not all dropped yet (the record is made durable before
the first file is dropped, so a crash in between finishes the drop at the next start).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from kvfs.config import NamespaceConfig, PoolConfig
from kvfs.errors import StartupError
from kvfs.pool.alloc import ExtentAllocator
from kvfs.pool.layout import DATA_START
from kvfs.pool.namespace import Namespace, probe
from kvfs.pool.superblock import foreign_signature

log = logging.getLogger("kvfs.pool.pool")


@dataclass
class Members:
    removed: dict[int, tuple[str, int]] = field(default_factory=dict)  # number -> (path, size)
    added: dict[int, str] = field(default_factory=dict)  # number -> path
    dropping: set[int] = field(default_factory=set)

    @property
    def changed(self) -> bool:
        return bool(self.removed or self.added)

    def encode(self) -> str:
        return json.dumps(
            {
                "removed": {str(j): {"path": p, "size": s} for j, (p, s) in self.removed.items()},
                "added": {str(j): p for j, p in self.added.items()},
                "dropping": sorted(self.dropping),
            },
            sort_keys=True,
        )

    @classmethod
    def decode(cls, raw: str | None) -> "Members":
        if not raw:
            return cls()
        d = json.loads(raw)
        return cls(
            {int(j): (r["path"], int(r["size"])) for j, r in d.get("removed", {}).items()},
            {int(j): p for j, p in d.get("added", {}).items()},
            {int(j) for j in d.get("dropping", [])},
        )


# --- the pool's side (`pool`: the Pool; kvfs/pool/pool.py, kvfs/fs/pool_admin.py) -----------
def open_namespace(
    index: int,
    path: Path,
    cfg: PoolConfig,
    nc: NamespaceConfig | None = None,
    create_size: int | None = None,
) -> Namespace:
    """Open the namespace at `path` as the pool's config says (`nc`: its own table there; a
    namespace added while mounted has none and takes the first's queue depth and weight 1)."""
    return Namespace.open(
        index,
        path,
        queue_depth=nc.queue_depth if nc else cfg.namespaces[0].queue_depth,
        weight=nc.weight if nc else 1.0,
        io_engine=cfg.io_engine,
        io_timeout=cfg.io_timeout_ms / 1000,
        read_timeout=cfg.read_timeout_ms / 1000 if cfg.read_timeout_ms else None,
        create_size=create_size,
    )


def open_members(cls, cfg: PoolConfig, pool_id: str | None, members: Members):
    """`open` for a pool whose membership changed while mounted. Each namespace is known by
    the number its superblock holds, not by its place in the config (device names may change
    across reboots, and a config may or may not still list a removed namespace, or list an
    added one): the config's paths and the added ones are opened and sorted by that number;
    a removed number is an empty slot, whatever is (or is no longer) at its path. Refused,
    in one line: a path of another pool, two paths with one number, a number missing."""
    if pool_id is None:
        raise StartupError("the catalog records namespaces removed or added, but no pool")
    listed = {nc.path: nc for nc in cfg.namespaces}
    paths = list(listed) + [Path(p) for p in members.added.values() if Path(p) not in listed]
    removed_paths = {Path(p) for p, _ in members.removed.values()}
    found: dict[int, Namespace] = {}
    try:
        for path in paths:
            nc = listed.get(path)
            try:
                ns = open_namespace(0, path, cfg, nc)
            except StartupError:
                # (a removed one gone, as expected; an added one not where it was added:
                # if no listed path holds its number, that is said below)
                if path in removed_paths or path not in listed:
                    continue
                raise
            j = _number(ns, cfg, pool_id)
            if j in members.removed:
                log.warning("namespace %s: number %d was removed from the pool; not used", path, j)
                ns.close()
                continue
            if j in found:
                ns.close()
                raise StartupError(
                    f"namespaces {found[j].path} and {path} both hold number {j} of pool "
                    f"{pool_id} (a copy?)"
                )
            ns.index = j
            found[j] = ns
        namespaces: list[Namespace] = []
        for j in range(max([*found, *members.removed, *members.added]) + 1):
            if j in members.removed:
                namespaces.append(gone(j, Path(members.removed[j][0]), members.removed[j][1]))
            elif j in found:
                namespaces.append(found[j])
            else:
                added = f" (added as {members.added[j]})" if j in members.added else ""
                raise StartupError(
                    f"namespace {j} of pool {pool_id} is missing: no path the config lists "
                    f"holds it{added}"
                )
        for ns in namespaces:
            sb = None if ns.removed else ns.read_superblock()
            if sb is not None and sb.ns_count != len(namespaces):  # (an add stopped half way)
                ns.write_superblock(dataclasses.replace(sb, ns_count=len(namespaces)))
        pool = cls(
            namespaces,
            pool_id,
            cfg.stripe_unit,
            adaptive=cfg.adaptive_placement,
            io_workers=cfg.io_workers,
            cfg=cfg,
        )
        log.info(
            "pool %s: %d namespace(s), %d removed, %d added while mounted (catalog)",
            pool_id,
            len(namespaces) - len(members.removed),
            len(members.removed),
            len(members.added),
        )
        return pool
    except BaseException:
        for ns in found.values():
            ns.close()
        raise


def _number(ns: Namespace, cfg: PoolConfig, pool_id: str) -> int:
    """The number of pool `pool_id` namespace `ns` holds (StartupError: none, another pool's,
    or its geometry changed)."""
    try:
        sb = ns.read_superblock()
        if sb is None:
            raise StartupError(
                f"namespace {ns.path}: is not one of pool {pool_id}'s (a new one joins a "
                f"mounted pool with `kvfs pool add`)"
            )
        if sb.pool_id != pool_id:
            raise StartupError(
                f"namespace {ns.path}: belongs to pool {sb.pool_id}, not to pool {pool_id}"
            )
        if sb.stripe_unit != cfg.stripe_unit or sb.size != ns.size:
            raise StartupError(
                f"namespace {ns.path}: its geometry changed (stripe unit "
                f"{sb.stripe_unit}, {sb.size} bytes formatted, {ns.size} now)"
            )
    except StartupError:
        ns.close()
        raise
    return sb.ns_index


def gone(index: int, path: Path, size: int) -> Namespace:
    """The empty slot of a namespace removed before this start (never opened)."""
    ns = Namespace(index, path, -1, size, False, False, 1, 0.0)
    ns.retire()
    return ns


def retire(pool, j: int) -> None:
    """Namespace j leaves the pool: no new units there, reads refused at once, its space
    gone from the pool's (the caller drops the blocks with units there)."""
    ns = pool.namespaces[j]
    ns.retire()
    pool.allocators[j] = ExtentAllocator(DATA_START, DATA_START, pool.unit)


def empty_removed(pool) -> None:
    """At start-up, after `attach_extents`: removed namespaces have no space."""
    for ns in pool.namespaces:
        if ns.removed:
            pool.allocators[ns.index] = ExtentAllocator(DATA_START, DATA_START, pool.unit)


def prepare(pool, path: Path, size: int | None, force: bool) -> Namespace:
    """Open (a file with `size`: create) the namespace at `path` and format it as this
    pool's next number (blocking: run in a thread). Refuses a path that holds a file
    system, another pool or any signature unless `force` (StartupError, one line)."""
    j = len(pool.namespaces)
    if any(ns.path == path for ns in pool.namespaces if not ns.removed):
        raise StartupError(f"namespace {path}: is in the pool already", errno.EEXIST)
    exists, _, _ = probe(path)
    if exists and size is not None:
        raise StartupError(f"namespace {path}: exists; a size is for a new file only")
    if not exists and size is None:
        raise StartupError(f"namespace {path}: does not exist (give a size to create a file)")
    ns = open_namespace(j, path, pool.cfg, create_size=size)
    try:
        if ns.size <= DATA_START:
            raise StartupError(f"namespace {path}: {ns.size} bytes is too small")
        if exists and not force:
            what = foreign_signature(ns.read_head(), str(path))
            if what:
                raise StartupError(
                    f"namespace {path}: holds {what}; refusing to overwrite it (--force)",
                    errno.EEXIST,
                )
        sb = next(
            x.read_superblock() for x in pool.namespaces if not x.removed
        )  # (a pool has one namespace at least)
        ns.write_superblock(dataclasses.replace(sb, ns_index=j, ns_count=j + 1, size=ns.size))
    except BaseException:
        ns.close()
        if not exists:
            path.unlink(missing_ok=True)
        raise
    return ns


def join(pool, ns: Namespace) -> None:
    """A new namespace, formatted for this pool with the next number, takes part now:
    its whole space free, placement and reads as for the others; the superblocks of the
    others say how many the pool has. The I/O workers are restarted to open it."""
    assert ns.index == len(pool.namespaces)
    pool.namespaces.append(ns)
    pool.allocators.append(ExtentAllocator(DATA_START, ns.size, pool.unit))
    for name in ("_obs_units", "_busy_until", "_obs_seconds", "_credit"):
        getattr(pool, name).append(0 if name == "_obs_units" else 0.0)
    pool.balance.append(1.0)
    for other in pool.namespaces[:-1]:
        if other.removed:
            continue
        sb = other.read_superblock()
        if sb is not None and sb.ns_count != len(pool.namespaces):
            other.write_superblock(dataclasses.replace(sb, ns_count=len(pool.namespaces)))
    if pool.workers is not None:
        pool.workers.paths.append((str(ns.path), ns.direct))
        pool.workers.restart()
