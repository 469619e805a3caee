"""Direct access to a file's blocks, bypassing FUSE (kvfs.client.direct, the LMCache plugin and the
engines' native backends): leases that keep a version's extents unchanged while a direct
reader reads them, and allocations a direct writer fills with O_DIRECT writes and then commits
with its checksums, atomically like close() (see docs/architecture.md "Direct access").
Reached through the control attributes `user.kvfs.lease`, `.alloc` and `.commit`."""

from __future__ import annotations

import collections
import errno

from kvfs.catalog.interface import Catalog
from kvfs.errors import KvfsError
from kvfs.fs.leases import Allocations, Leases
from kvfs.pool.layout import Layout
from kvfs.space import Space
from kvfs.write.handles import Handles
from kvfs.write.sessions import Sessions


class DirectAccess:
    def __init__(
        self,
        catalog: Catalog,
        handles: Handles,
        sessions: Sessions,
        space: Space,
        leases: Leases,
        allocations: Allocations,
        hits: collections.Counter,
    ):
        self.catalog = catalog
        self.handles = handles
        self.sessions = sessions
        self.space = space
        self.leases = leases
        self.allocations = allocations
        self.hits = hits  # reads per file (Files.hits: a direct read counts too)

    # --- direct writers ------------------------------------------------------------------------
    async def direct_alloc(self, ino: int, size: int, ttl: float) -> dict:
        """Place a `size`-byte block for a direct writer of this file (open for writing); the
        writer writes its units straight to the namespaces, then `direct_commit`s them."""
        node = self.catalog.get(ino)
        if not node.is_file:
            raise KvfsError(errno.EISDIR if node.is_dir else errno.EINVAL, "not a regular file")
        st = self.handles.states.get(ino)
        if st is None or st.writers == 0:
            raise KvfsError(errno.EBADF, "a direct write needs the file open for writing")
        if size > self.sessions.max_block_size:
            raise self.sessions.too_big(size, "a block of")
        return await self.allocations.allocate(ino, size, ttl)

    async def direct_commit(self, ino: int, alloc_id: int, sums: list[int]) -> None:
        """Make a direct writer's block durable and the file's current version, atomically as
        close() does: ESTALE if its allocation expired (the space may be reused)."""
        node = self.catalog.get(ino)
        a = self.allocations.take(alloc_id, ino)
        lay = a.layout
        try:
            if len(sums) != lay.nunits or not all(
                isinstance(x, int) and 0 <= x < 1 << 64 for x in sums
            ):
                raise KvfsError(
                    errno.EINVAL,
                    f"commit of {lay.nunits} units needs {lay.nunits} 64-bit checksums",
                )
            layout = Layout(lay.size, lay.unit, lay.ns, lay.offsets, tuple(sums))
            for e in layout.unit_extents():
                self.space.pool.fence(e.offset, e.length)
            await self.space.pool.sync(sorted(set(lay.ns)))
        except BaseException:
            self.space.pool.release(lay)
            raise
        # a closed version waiting for write-back goes first (then the inode's state may go)
        await self.sessions.settle(self.handles.states.get(ino))
        st = self.handles.state(ino)
        async with st.lock:
            rec = await self.sessions.publish(node, layout)
            self.sessions.end(st)  # what the writer wrote through the mount is superseded
        self.allocations.stats.direct_writes += 1
        self.allocations.stats.direct_write_bytes += layout.size
        await self.sessions.keep_pinned(node, rec)

    # --- direct readers ------------------------------------------------------------------------
    def lease_version(self, ino: int, generation: int, ttl: float) -> None:
        """Lease a version for a direct reader. ENOENT (a miss) if a namespace with units of
        it is failed for reads (kvfs/pool/read_health.py): the reader would wait for it."""
        node = self.catalog.get(ino)
        hit = self.space.pool.failed_among(node.blob.layout.ns) if node.blob is not None else []
        if hit:
            raise KvfsError(
                errno.ENOENT,
                f"namespace(s) {', '.join(map(str, hit))} failed for reads "
                f"(read_timeout_ms): not leased",
            )
        self.leases.lease(node, generation, ttl)

    def suspect(self, ino: int, namespace: int, offset: int, length: int) -> None:
        """A direct reader of this file had no answer from a namespace within the read
        deadline (`user.kvfs.stalled`): the daemon checks that namespace with a read of its
        own (kvfs/pool/read_health.py), which fails it for reads if it is late too; then the
        file's blocks there are no longer leased (ENOENT), and readers through the mount fail
        at once."""
        path = self.catalog.path_of(self.catalog.get(ino))
        if not self.space.pool.suspect(
            namespace, offset, length, f"a direct reader of {path} had no answer in time"
        ):
            raise KvfsError(
                errno.EINVAL,
                f"user.kvfs.stalled: no namespace {namespace} range of {length} bytes at "
                f"{offset} to check",
            )

    def end_lease(self, ino: int, generation: int, hit: bool) -> None:
        self.leases.release(generation, hit)
        if hit:
            self.hits[ino] += 1
            node = self.catalog.find(ino)
            if node is not None and node.linked:
                self.space.score_read(node)
                self.catalog.rescore(node)
