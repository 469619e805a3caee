"""`kvfs pool remove` and `kvfs pool add`: a namespace leaves or joins the pool while mounted
(issue 58). The pool's side, and the record of who belongs (kept in the catalog), are
kvfs/pool/members.py (`retire`, `prepare`, `join`, `Members`).

Removing namespace j:
1. refused (EBUSY, one line) while it would lose data that can still be read: j answers a
   read of its first page within the read deadline and holds blocks, or blocks with units on
   j are still whole in DRAM or the local tier; `drop` says the operator accepts it (a cache:
   the engines recompute what they miss);
2. j is retired: no new units there from now on, every read there refused at once;
3. the record (j removed, its files being dropped) is made durable: a crash from here on
   finishes the drop at the next start (`resume`);
4. the write-back is flushed (a block written to j before step 2 is committed now, or fails
   with the device), then every file with a unit on j is deleted from the catalog: a miss
   for every engine from then on, a BlockRemoved event for each (issue 47's stream), the
   kernel told; blocks on the other namespaces are not touched. A block committed to j after
   that scan is refused at its commit (`Publisher.publish`, kvfs/write/publish.py, and the
   write-back).
5. the record says the drop is done.

Adding a path: it is formatted as the pool's next number (refused if it holds a file system
or another signature, unless `force`), recorded in the catalog, then joins: placement uses it
at once, the I/O workers are started again to open it, and kvfs.client.direct learns its
path when it first meets a block there.

A shared pool (Redis) refuses both: every node would have to agree on the change and reopen
its namespaces (not built)."""

from __future__ import annotations

import errno
import logging
import time
from pathlib import Path

import trio

from kvfs.catalog.interface import Catalog
from kvfs.errors import KvfsError
from kvfs.fs.files import Files
from kvfs.pool import members as membership
from kvfs.pool.members import Members
from kvfs.pool.pool import Pool
from kvfs.tiers.store import BlockStore

log = logging.getLogger("kvfs.pool")

SCAN_STEP = 1024  # files a scan looks at between two chances for other requests


class PoolAdmin:
    def __init__(
        self,
        catalog: Catalog,
        files: Files,
        pool: Pool,
        store: BlockStore,
        namespace_paths: list[str],
        members: Members | None,
    ):
        """`members`: the catalog's record (kvfs/pool/members.py); None for a shared pool,
        whose namespaces this refuses to change."""
        self.catalog = catalog
        self.files = files
        self.pool = pool
        self.store = store
        self.namespace_paths = namespace_paths  # what direct clients are welcomed with
        self.shared = members is None
        self.members = members if members is not None else Members()
        self._lock = trio.Lock()

    def _refuse_shared(self, what: str) -> None:
        if self.shared:
            raise KvfsError(
                errno.EOPNOTSUPP,
                f"{what}: a shared pool's namespaces are every node's; changing them while "
                f"mounted is not supported on a shared pool",
            )

    # --- removing -------------------------------------------------------------------------------
    async def remove(self, j: int, drop: bool = False) -> dict:
        self._refuse_shared("pool remove")
        nss = self.pool.namespaces
        if not 0 <= j < len(nss):
            raise KvfsError(errno.EINVAL, f"pool remove: no namespace {j} (0 to {len(nss) - 1})")
        ns = nss[j]
        async with self._lock:  # (checked under it: two removals at once see each other)
            if ns.removed:
                raise KvfsError(errno.ENOENT, f"pool remove: namespace {j} was removed already")
            if not any(not o.removed for o in nss if o is not ns):
                raise KvfsError(errno.EBUSY, f"pool remove: namespace {j} is the pool's last")
            files = await self._files_on(j)
            if files and not drop:
                nbytes = sum(n.blob.size for n in files)
                if await ns.health.answers():
                    raise KvfsError(
                        errno.EBUSY,
                        f"pool remove: namespace {j} ({ns.path}) still reads and holds "
                        f"{len(files)} block(s), {nbytes} bytes: removing it would lose "
                        f"them (--drop to drop them; the engines recompute them)",
                    )
                kept = [n for n in files if self.store.tier_of(n.blob) != "pool"]
                if kept:
                    raise KvfsError(
                        errno.EBUSY,
                        f"pool remove: {len(kept)} of the {len(files)} block(s) on namespace "
                        f"{j} ({ns.path}) can still be read from DRAM or the local tier: "
                        f"removing it would lose them (--drop to drop them)",
                    )
            t0 = time.monotonic()
            membership.retire(self.pool, j)
            log.warning("namespace %d (%s): removed from the pool; dropping its blocks", j, ns.path)
            self.members.removed[j] = (str(ns.path), ns.size)
            self.members.dropping.add(j)
            await self.catalog.set_members(self.members.encode())
            dropped, nbytes = await self._drop(j)
            return {
                "removed": j,
                "path": str(ns.path),
                "dropped_files": dropped,
                "dropped_bytes": nbytes,
                "seconds": round(time.monotonic() - t0, 3),
            }

    async def resume(self) -> None:
        """At start-up: finish a removal a crash interrupted (its files not all dropped)."""
        for j in sorted(self.members.dropping):
            async with self._lock:
                dropped, _ = await self._drop(j)
            log.warning("namespace %d: finished its removal (%d file(s) dropped)", j, dropped)

    async def _files_on(self, j: int) -> list:
        """The files whose current block has a unit on namespace j (a scan of the catalog,
        letting other requests in every SCAN_STEP files)."""
        out = []
        for k, n in enumerate(self.catalog.files()):
            if k % SCAN_STEP == SCAN_STEP - 1:
                await trio.lowlevel.checkpoint()
            if j in n.blob.layout.ns:
                node = self.catalog.find(n.ino)
                if node is not None and node.blob is not None and node.blob.id == n.blob.id:
                    out.append(node)
        return out

    async def _drop(self, j: int) -> tuple[int, int]:
        # blocks written to j before it was retired: committed (then dropped below) or failed
        await self.files.sync_all()
        dropped = nbytes = 0
        for node in await self._files_on(j):
            got = await self.files.drop_unreadable(node)
            if got:
                dropped += 1
                nbytes += got
        self.members.dropping.discard(j)
        await self.catalog.set_members(self.members.encode())
        log.warning("namespace %d: %d file(s) (%d bytes) dropped with it", j, dropped, nbytes)
        return dropped, nbytes

    # --- adding ----------------------------------------------------------------------------------
    async def add(self, path: str, size: int | None = None, force: bool = False) -> dict:
        self._refuse_shared("pool add")
        p = Path(path)
        if not p.is_absolute():
            raise KvfsError(errno.EINVAL, f"pool add: {path}: give an absolute path")
        async with self._lock:
            try:
                ns = await trio.to_thread.run_sync(membership.prepare, self.pool, p, size, force)
            except KvfsError as e:
                raise KvfsError(e.errno, f"pool add: {e}") from None
            try:
                self.members.added[ns.index] = str(p)
                await self.catalog.set_members(self.members.encode())
            except BaseException:
                self.members.added.pop(ns.index, None)
                ns.close()
                raise
            membership.join(self.pool, ns)
            self.namespace_paths.append(str(p))
            log.warning("namespace %d (%s): added to the pool, %d bytes", ns.index, p, ns.size)
            return {"added": ns.index, "path": str(p), "size": ns.size}
