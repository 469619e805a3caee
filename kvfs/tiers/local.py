"""The local tier: a node-local NVMe device or file that keeps copies of pool blocks.

Between DRAM and the pool. A block evicted from DRAM is demoted here, and a block read from the
pool is promoted here, when the tier's admission policy agrees (by default the second time a
block passes: most KV blocks are read once, and writing them here would cost bandwidth for
nothing). Reads that miss DRAM are served from here before the pool. Every copy is clean (the
pool holds the block), so eviction from this tier simply drops the copy.

The tier is a cache: its index lives in memory and starts empty at every mount (the space is
reused from scratch). A block device used as the local tier must carry a kvfs local superblock
(`kvfs format` writes it), so that kvfs never overwrites a device by a typo; a file is created
and preallocated by kvfs.
"""

from __future__ import annotations

import errno
import logging
import uuid
from dataclasses import asdict

from kvfs.catalog.records import BlobRec
from kvfs.config import LocalConfig
from kvfs.errors import KvfsError, StartupError
from kvfs.pool.buffer import Buffer
from kvfs.pool.layout import DATA_START, Layout
from kvfs.pool.namespace import Namespace, probe
from kvfs.pool.pool import Pool
from kvfs.pool.superblock import Superblock, foreign_signature
from kvfs.tiers.index import TierIndex
from kvfs.tiers.policy import make_admission, make_policy

log = logging.getLogger("kvfs.tiers.local")

LOCAL_PREFIX = "local-"


def _open_namespace(
    cfg: LocalConfig, unit: int, *, format_new: bool = False, force: bool = False
) -> Namespace:
    """Open the local tier's device or file. Anything kvfs did not create itself must carry a
    kvfs local superblock, which only `kvfs format` (`format_new`) writes on an existing
    device, refusing one that holds a filesystem unless `force`."""
    exists, _, _ = probe(cfg.path)
    if not exists and cfg.size is None:
        raise StartupError(
            f"local tier {cfg.path}: does not exist (give a size to have kvfs create it as a file)",
            errno.ENOENT,
        )
    created = not exists
    ns = Namespace.open(
        0, cfg.path, queue_depth=cfg.queue_depth, create_size=cfg.size if created else None
    )
    try:
        if ns.size <= DATA_START:
            raise StartupError(f"local tier {cfg.path}: {ns.size} bytes is too small")
        sb = ns.read_superblock()
        if sb is not None and not sb.pool_id.startswith(LOCAL_PREFIX):
            raise StartupError(f"local tier {cfg.path}: holds a pool namespace, not a local tier")
        if sb is None and not created:
            if not format_new:
                raise StartupError(
                    f"local tier {cfg.path}: not a kvfs local tier (run `kvfs format`)"
                )
            what = foreign_signature(ns.read_head(), str(cfg.path))
            if what and not force:
                raise StartupError(
                    f"local tier {cfg.path}: holds {what}; refusing to overwrite it (use --force)",
                    errno.EEXIST,
                )
        if sb is None or format_new or sb.stripe_unit != unit or sb.size != ns.size:
            ns.write_superblock(_superblock(ns, unit))  # a cache: its geometry may change
    except BaseException:
        ns.close()
        if created:
            cfg.path.unlink(missing_ok=True)
        raise
    return ns


def _superblock(ns: Namespace, unit: int) -> Superblock:
    return Superblock(
        pool_id=LOCAL_PREFIX + uuid.uuid4().hex,
        ns_index=0,
        ns_count=1,
        stripe_unit=unit,
        size=ns.size,
        created="",
    )


def format_local(cfg: LocalConfig, unit: int, force: bool) -> None:
    """Write a local-tier superblock (for `kvfs format`)."""
    _open_namespace(cfg, unit, format_new=True, force=force).close()


class LocalTier:
    def __init__(self, ns: Namespace, unit: int, cfg: LocalConfig):
        self.path = ns.path
        self.pool = Pool([ns], "local", unit, adaptive=False)
        self.queue_depth = ns.queue_depth
        self.index = TierIndex(
            self.pool.capacity, make_policy(cfg.policy, self.pool.capacity, self.pool.chunk)
        )
        self.admission = make_admission(cfg.admission)
        self.layouts: dict[int, Layout] = {}
        self.writing: set[int] = set()

    @classmethod
    def open(cls, cfg: LocalConfig, unit: int) -> "LocalTier":
        return cls(_open_namespace(cfg, unit), unit, cfg)

    def close(self) -> None:
        self.pool.close()

    def has(self, blob_id: int) -> bool:
        return blob_id in self.layouts

    def layout(self, blob_id: int) -> Layout:
        return self.layouts[blob_id]

    def drop(self, blob_id: int) -> None:
        lay = self.layouts.pop(blob_id, None)
        if lay is not None:
            self.index.remove(blob_id)
            self.pool.release(lay)

    async def store(self, rec: BlobRec, buf: Buffer) -> bool:
        """Write a copy of a block (from its DRAM buffer). False if it does not fit."""
        if rec.id in self.layouts or rec.id in self.writing or not rec.size:
            return False
        need = self.pool.stored_size(rec.size)
        if need > self.pool.capacity:
            return False
        victims = self.index.make_room(need, lambda bid: bid in self.layouts)
        for bid in victims:  # out of the index: free them (also when not enough)
            lay = self.layouts.pop(bid, None)
            if lay is not None:
                self.pool.release(lay)
        if not self.index.fits(need):
            return False
        self.writing.add(rec.id)
        try:
            try:
                lay = await self.pool.write_block(buf, rec.size)
            except KvfsError as e:
                if e.errno != errno.ENOSPC:
                    raise
                return False  # fragmented: skip this copy
        finally:
            self.writing.discard(rec.id)
        self.layouts[rec.id] = lay
        self.index.add(rec.id, need)
        return True

    async def read_run(
        self, rec: BlobRec, run: list[int], buf: Buffer, prefetch: bool
    ) -> list[int]:
        """Read a run of the copy's units (see Pool.read_run); the units that failed."""
        self.index.lookup(rec.id)
        return await self.pool.read_run(self.layouts[rec.id], run, buf, prefetch=prefetch)

    def statistics(self) -> dict:
        ns = self.pool.namespaces[0]
        return {
            "path": str(self.path),
            "capacity": self.pool.capacity,
            "used": self.index.used,
            "blocks": len(self.layouts),
            "admission": self.admission.name,
            "policy": self.index.policy.name,
            "device": asdict(ns.stats),
        }
