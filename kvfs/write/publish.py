"""Publishing: blocks that are durable in the pool recorded by the catalog as their files'
current versions.

The last step of every commit (kvfs/write/sessions.py: a close, an fsync, a last release), of
the write-back's batches (kvfs/write/writeback.py) and of the direct path's stores
(kvfs/fs/direct_access.py): one catalog transaction for a batch, the new versions' space
counted, the old versions retired, and the space of a block that no file points at released.
"""

from __future__ import annotations

import errno

from kvfs.catalog.interface import Catalog
from kvfs.catalog.records import BlobRec, Node
from kvfs.errors import KvfsError, Unsure
from kvfs.pool.layout import Layout
from kvfs.pool.pool import Pool
from kvfs.space import Space
from kvfs.tiers.store import BlockStore


class Publisher:
    """Records durable blocks in the catalog; `stats` (the sessions' SessionStats) counts
    commits and the errors that kept a block out."""

    def __init__(self, catalog: Catalog, store: BlockStore, pool: Pool, space: Space, stats):
        self.catalog = catalog
        self.store = store
        self.pool = pool
        self.space = space
        self.stats = stats

    async def publish(self, items: list[tuple[Node, Layout]]) -> list[BlobRec | KvfsError]:
        """Record blocks that are durable in the pool, each (node, layout), as their files'
        current versions (one catalog transaction): each one's new version, or the error that
        kept it out; old versions are retired. A block's space is released if the catalog
        refuses it, if its file was unlinked before it was ever published, or if cancelled."""
        out: list = [None] * len(items)  # (each is set below)
        try:
            scores = [
                await self.space.score_stored(node, layout.size) if node.linked else None
                for node, layout in items
            ]
        except BaseException:
            for _, layout in items:
                self.pool.release(layout)  # (cancelled) nothing points at them
            raise
        batch = []  # (index, node, layout, score, published: exactly when the node is linked)
        for i, ((node, layout), score) in enumerate(zip(items, scores)):
            if node.removed_elsewhere:  # while its block was being written
                self.pool.release(layout)
                out[i] = self.removed_elsewhere(node)
            elif why := self.pool.removed_in(layout):  # (kvfs/fs/pool_admin.py)
                self.pool.release(layout)
                out[i] = KvfsError(errno.EIO, f"{self.catalog.path_of(node)}: {why}")
            else:
                batch.append((i, node, layout, score, node.linked))
        if not batch:
            return out
        try:
            results = await self.catalog.commit_batch(
                [(node, layout, score if pub else None) for _, node, layout, score, pub in batch]
            )
        except KvfsError as e:  # (a shared catalog's error for the call: each file's)
            results = [e] * len(batch)
        except BaseException:  # (cancelled)
            for _, _, layout, _, _ in batch:
                self.pool.release(layout)
            self.stats.commit_errors += len(batch)
            raise
        for (i, node, layout, _, pub), got in zip(batch, results):
            out[i] = got if isinstance(got, KvfsError) else got[0]
            if isinstance(got, KvfsError):  # (a shared catalog refuses files one by one)
                if not (isinstance(got, Unsure) and got.maybe_published):  # else read elsewhere
                    self.pool.release(layout)
                self.stats.commit_errors += 1
            else:
                self.published(node, *got, pub)
        return out

    async def score(self, node: Node, layout):
        """The file's place in the pool's order for a commit of `layout` (a shared pool may
        look up the name's ghost); the block's space is released if that is cancelled."""
        try:
            return await self.space.score_stored(node, layout.size) if node.linked else None
        except BaseException:
            self.pool.release(layout)  # (cancelled) nothing points at it
            raise

    def published(self, node: Node, rec: BlobRec, old: BlobRec | None, published: bool) -> None:
        """The catalog recorded `rec` as the file's version (`published`: the node was linked
        then): the space hears of it, and the old version is retired."""
        if published:
            self.space.committed(rec.layout)
        self.stats.commits += 1
        if not node.linked and not published:
            self.pool.release(rec.layout)  # never published: nobody can read it
        # (published, then unlinked while the commit was in flight: the unlink retired it;
        # never published: the node had lost its name, and the unlink retired `old` then)
        if old is not None and published:
            self.store.retire(old)

    def removed_elsewhere(self, node: Node) -> KvfsError:
        """Another node removed the file while it was open for writing here (an eviction there
        cannot know of this node's open files; or an unlink): the writer's bytes are not kept,
        and its close or fsync says so rather than return as if they were committed."""
        self.stats.commit_errors += 1
        return KvfsError(
            errno.ESTALE,
            f"{node.name.decode(errors='replace')}: removed (by "
            f"another node, or evicted) while open for writing "
            f"here; not committed",
        )
