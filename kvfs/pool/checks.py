"""Whether a set of namespaces is the pool the config and the catalog describe: each path
exists (or may be created), every superblock names the same pool in the same order with the
same geometry, and a torn superblock is rebuilt when nothing is in doubt (kvfs/pool/pool.py
`Pool.open`); and a new pool's superblocks."""

from __future__ import annotations

import datetime
import errno
import logging
import uuid
from pathlib import Path

from kvfs.config import PoolConfig
from kvfs.errors import StartupError
from kvfs.pool.layout import DATA_START
from kvfs.pool.namespace import Namespace, probe
from kvfs.pool.superblock import SB_SIZE, Superblock, SuperblockError, decode, foreign_signature

log = logging.getLogger("kvfs.pool.pool")


def check_paths(cfg: PoolConfig) -> list[tuple[bool, bool, int]]:
    found = []
    for nc in cfg.namespaces:
        exists, is_block, size = probe(nc.path)
        if not exists:
            if nc.size is None:
                raise StartupError(
                    f"namespace {nc.path}: does not exist (give a size to "
                    f"have kvfs create it as a file)",
                    errno.ENOENT,
                )
            parent = nc.path.parent
            if not parent.is_dir():
                raise StartupError(
                    f"namespace {nc.path}: directory {parent} does not exist", errno.ENOENT
                )
        elif nc.size is not None and not is_block and size != nc.size:
            raise StartupError(
                f"namespace {nc.path}: the file has {size} bytes but the "
                f"config says size = {nc.size} (changed geometry)"
            )
        if exists and is_block and nc.size is not None:
            raise StartupError(
                f"namespace {nc.path}: is a block device; size applies to files only"
            )
        found.append((exists, is_block, size))
    return found


def validate(
    namespaces: list[Namespace],
    cfg: PoolConfig,
    expect: str | None,
    rebuilt: list[str] | None = None,
) -> str:
    sbs: list[Superblock | None] = []
    damaged: dict[int, tuple[bytes, SuperblockError]] = {}
    for ns in namespaces:
        raw = ns.read_head()[:SB_SIZE]
        try:
            sbs.append(decode(raw))
        except SuperblockError as e:
            sbs.append(None)
            damaged[ns.index] = (raw, e)
    good = [sb for sb in sbs if sb is not None]
    for i, (raw, e) in damaged.items():
        sbs[i] = _rebuilt(namespaces[i], raw, e, good, cfg, expect, len(namespaces))
    formatted = [sb for sb in sbs if sb is not None]
    if not formatted:
        raise StartupError(
            f"namespace {namespaces[0].path}: not a kvfs namespace "
            f"(run `kvfs format` to create a pool)"
        )
    pool_id = expect or formatted[0].pool_id
    for ns, sb in zip(namespaces, sbs):
        if sb is None:
            raise StartupError(
                f"namespace {ns.path}: not a kvfs namespace, but the others "
                f"belong to pool {pool_id}"
            )
        if sb.pool_id != pool_id:
            whose = "the catalog" if expect else f"namespace {namespaces[0].path}"
            raise StartupError(
                f"namespace {ns.path}: belongs to pool {sb.pool_id}, but {whose} to pool {pool_id}"
            )
    for ns, sb in zip(namespaces, sbs):
        if sb.ns_count != len(namespaces):
            raise StartupError(
                f"pool {pool_id} has {sb.ns_count} namespaces, but the config "
                f"lists {len(namespaces)} (missing or extra namespace?)"
            )
        if sb.ns_index != ns.index:
            raise StartupError(
                f"namespace {ns.path}: is number {sb.ns_index} of pool "
                f"{pool_id} but is listed as number {ns.index} (reordered?)"
            )
        if sb.stripe_unit != cfg.stripe_unit:
            raise StartupError(
                f"pool {pool_id} was formatted with stripe_unit "
                f"{sb.stripe_unit}, but the config says {cfg.stripe_unit} "
                f"(changed geometry)"
            )
        if sb.size != ns.size:
            raise StartupError(
                f"namespace {ns.path}: was formatted with {sb.size} bytes but "
                f"now has {ns.size} (changed geometry)"
            )
    for i, (_, e) in damaged.items():  # everything else checked: write them back
        ns = namespaces[i]
        ns.write_superblock(sbs[i])
        source = " and the other namespaces' superblocks" if good else ""
        msg = (
            f"namespace {ns.path}: its superblock was damaged ({e}); rebuilt from the "
            f"catalog's pool id{source}"
        )
        log.warning(msg)
        if rebuilt is not None:
            rebuilt.append(msg)
    return pool_id


def _rebuilt(
    ns: Namespace,
    raw: bytes,
    e: SuperblockError,
    good: list[Superblock],
    cfg: PoolConfig,
    expect: str | None,
    count: int,
) -> Superblock:
    """The superblock a namespace whose own is damaged (its checksum fails: a torn write)
    must have, when nothing is in doubt: the catalog names the pool, the damaged bytes
    still carry that pool id, and the other superblocks agree. Else start-up is refused."""
    others = {(sb.pool_id, sb.ns_count, sb.stripe_unit, sb.created) for sb in good}
    if (
        expect is None
        or expect.encode() not in raw
        or len(others) > 1
        or any(o[0] != expect or o[1] != count for o in others)
    ):
        raise StartupError(
            f"namespace {ns.path}: {e}, and it cannot be rebuilt safely (it "
            f"does not name this catalog's pool, or the other namespaces "
            f"disagree)"
        )
    if others:
        _, _, unit, created = next(iter(others))
    else:
        unit = cfg.stripe_unit
        created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return Superblock(
        pool_id=expect,
        ns_index=ns.index,
        ns_count=count,
        stripe_unit=unit,
        size=ns.size,
        created=created,
    )


def write_superblocks(namespaces: list[Namespace], unit: int) -> str:
    pool_id = uuid.uuid4().hex
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    for ns in namespaces:
        ns.write_superblock(
            Superblock(
                pool_id=pool_id,
                ns_index=ns.index,
                ns_count=len(namespaces),
                stripe_unit=unit,
                size=ns.size,
                created=created,
            )
        )
    return pool_id


def format_pool(cfg: PoolConfig, *, force: bool) -> str:
    """Write new superblocks on every namespace (creating files that have a size).

    Refuses a namespace that holds a kvfs pool or another signature unless `force`.
    Returns the new pool id.
    """
    found = check_paths(cfg)
    opened: list[Namespace] = []
    created: list[Path] = []
    try:
        for i, (nc, (exists, _, _)) in enumerate(zip(cfg.namespaces, found)):
            ns = Namespace.open(
                i,
                nc.path,
                queue_depth=nc.queue_depth,
                weight=nc.weight,
                io_engine=cfg.io_engine,
                create_size=None if exists else nc.size,
            )
            opened.append(ns)
            if not exists:
                created.append(nc.path)
            if ns.size <= DATA_START:
                raise StartupError(f"namespace {nc.path}: {ns.size} bytes is too small")
            if exists and not force:
                what = foreign_signature(ns.read_head(), str(nc.path))
                if what:
                    raise StartupError(
                        f"namespace {nc.path}: holds {what}; refusing to "
                        f"overwrite it (use --force)",
                        errno.EEXIST,
                    )
        return write_superblocks(opened, cfg.stripe_unit)
    except BaseException:
        for p in created:
            try:
                p.unlink()
            except OSError:
                pass
        raise
    finally:
        for ns in opened:
            ns.close()
