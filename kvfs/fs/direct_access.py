"""Direct access to files' blocks, bypassing FUSE (kvfs.client.direct, and through it the
LMCache plugin and the engines' tiers), a batch at a time: leases that keep versions' extents
unchanged while a direct reader reads them, and allocations a direct writer fills with O_DIRECT
writes and then commits, each block becoming a file's content as a write, close() and rename()
through the mount would make it (see docs/architecture.md "Direct access").

Every call takes a batch and answers per block: one block's error (a missing file, no
permission, a namespace failed for reads) leaves the others alone. The calls come from the
daemon's direct socket (kvfs/fs/direct_socket.py), which says who asks (`Caller`) and on which
connection (`owner`: leases and allocations belong to the connection that took them); paths are
resolved and checked for the caller as the kernel would check them (kvfs/fs/permissions.py).
"""

from __future__ import annotations

import errno
import os

from kvfs.catalog.interface import Catalog
from kvfs.errors import KvfsError
from kvfs.fs.files import Files
from kvfs.fs.leases import Allocation, Allocations, Lease, Leases
from kvfs.fs.permissions import READ, Caller, Resolver
from kvfs.fs.xattrs import Attributes
from kvfs.pool.layout import Layout
from kvfs.tasks import run_all


class DirectAccess:
    def __init__(
        self,
        catalog: Catalog,
        files: Files,
        leases: Leases,
        allocations: Allocations,
        *,
        mount: bytes | None = None,
    ):
        """`mount`: the mount's path, for absolute symbolic links into it (Resolver)."""
        self.catalog = catalog
        self.files = files
        self.sessions = files.sessions
        self.space = files.space
        self.pool = files.space.pool
        self.leases = leases
        self.allocations = allocations
        self.resolver = Resolver(catalog, mount, files.held_here)
        # a committed block's file is made under a name of its own, then renamed into place:
        # `.kvfs-direct-<token>-<allocation>` (the token tells this daemon's run from others')
        self._token = os.urandom(4).hex()

    # --- direct readers ------------------------------------------------------------------------
    async def inspect(
        self, caller: Caller, paths: list[bytes], xattrs: list[str]
    ) -> list[tuple[int, dict[str, bytes]] | KvfsError]:
        """Each file's size and those of the user.* attributes named that it has, as stat and
        getxattr through the mount would give them (read permission). Per file: what a lease
        would fail with for its path."""
        names = [n.encode() for n in xattrs]
        for name in names:
            Attributes.check(name, b"")
        out: list[tuple[int, dict[str, bytes]] | KvfsError] = []
        for path in paths:
            try:
                node = await self.resolver.file(caller, path, READ)
            except KvfsError as e:
                out.append(e)
                continue
            have = node.xattrs
            found = {n.decode(): have[n] for n in names if n in have}
            out.append((self.files.attr(node).size, found))
        return out

    async def lease(
        self, caller: Caller, owner: int, paths: list[bytes], ttl: float
    ) -> list[Lease | KvfsError]:
        """Lease each file's current version for `ttl` seconds (its extents are not reused
        until the lease is released or expires). Per file: EACCES without read permission,
        ENOENT for a missing file or one with units on a namespace failed for reads (the
        reader would wait for it: kvfs/pool/read_health.py), EAGAIN for one never committed."""
        out: list[Lease | KvfsError] = []
        for path in paths:
            try:
                node = await self.resolver.file(caller, path, READ)
                await self.files.settle(node.ino)  # the version leased is the closed content
                blob = node.blob
                failed = self.pool.failed_among(blob.layout.ns) if blob is not None else []
                if failed:
                    raise KvfsError(
                        errno.ENOENT,
                        f"namespace(s) {', '.join(map(str, failed))} failed for reads "
                        f"(read_timeout_ms): not leased",
                    )
                out.append(self.leases.lease(node, owner, ttl))
            except KvfsError as e:
                out.append(e)
        return out

    def release(self, owner: int, leases: list[int], hits: list[bool]) -> list[KvfsError | None]:
        """End leases; `hits[i]`: lease i's block was read (a hit: counted, and a use in the
        pool's order). Per lease: ESTALE if it was not live (expired: the reader's bytes may
        come from reused extents)."""
        if len(leases) != len(hits):
            raise KvfsError(errno.EINVAL, "a release names as many hits as leases")
        out: list[KvfsError | None] = []
        for lease_id, hit in zip(leases, hits):
            try:
                lease = self.leases.release(lease_id, owner, hit)
            except KvfsError as e:
                out.append(e)
                continue
            out.append(None)
            if hit:
                self.files.hits[lease.ino] += 1
                node = self.catalog.find(lease.ino)
                if node is not None and node.linked:
                    self.space.score_read(node)
                    self.catalog.rescore(node)
        return out

    def stalled(self, owner: int, lease_id: int, namespace: int, offset: int, length: int) -> None:
        """A direct reader of a leased block had no answer from `namespace` within the read
        deadline: the daemon checks that range with a read of its own
        (kvfs/pool/read_health.py), which fails the namespace for reads if it is late too;
        then its blocks are no longer leased (ENOENT), and readers through the mount fail at
        once. The range must be units of the leased block there (EINVAL otherwise)."""
        lease = self.leases.live(lease_id, owner)
        if lease is None:
            raise KvfsError(errno.ESTALE, f"no live lease {lease_id}")
        lay = lease.rec.layout
        there = [k for k in range(lay.nunits) if lay.ns[k] == namespace]
        if not any(lay.offsets[k] == offset for k in there) or length > sum(
            lay.stored(k) for k in there
        ):
            raise KvfsError(
                errno.EINVAL,
                f"no units of the leased block in namespace {namespace}'s {length} bytes at "
                f"{offset}",
            )
        node = self.catalog.find(lease.ino)
        what = self.catalog.path_of(node) if node is not None else f"inode {lease.ino}"
        if not self.pool.suspect(
            namespace, offset, length, f"a direct reader of {what} had no answer in time"
        ):
            raise KvfsError(errno.EINVAL, f"no namespace {namespace} to check")

    def disconnected(self, owner: int) -> int:
        """A connection closed: its leases end (a reader that is gone reads nothing more, and
        one that lost its connection learns at its release, ESTALE). Its allocations stay
        until they expire: a writer may still be writing into them."""
        return self.leases.drop(owner)

    # --- direct writers ------------------------------------------------------------------------
    async def allocate(
        self,
        caller: Caller,
        owner: int,
        targets: list[tuple[bytes, int, int, dict[str, bytes]]],
        ttl: float,
    ) -> list[Allocation | KvfsError]:
        """Place a block for each target (path, size, mode, user.* attributes), as a commit
        would place it; the writer writes the units straight to the namespaces, then
        `commit`s them. Per target: what creating or replacing the file would fail with
        (ENOENT, EACCES, EPERM, EISDIR...), EFBIG past `max_block_size`, ENOSPC."""
        out: list[Allocation | KvfsError] = []
        for path, size, mode, xattrs in targets:
            try:
                await self.resolver.place(caller, path)
                self.files.refuse_setid(mode)  # (as a create through the mount)
                if size > self.pool.max_block_size:
                    raise self.sessions.too_big(size, "a block of")
                attrs = {}
                for name, value in xattrs.items():
                    if name.startswith("user.kvfs."):
                        raise KvfsError(
                            errno.EINVAL, f"{name}: kvfs's own attributes are set through the mount"
                        )
                    Attributes.check(name.encode(), value)
                    attrs[name.encode()] = value
                out.append(await self.allocations.allocate(owner, size, ttl, path, mode, attrs))
            except KvfsError as e:
                out.append(e)
        return out

    async def commit(
        self, caller: Caller, owner: int, items: list[tuple[int, list[int]]]
    ) -> list[KvfsError | None]:
        """Make allocated blocks durable and their files' content, each (allocation, its
        units' xxh3-64) in turn: the units are synced (each namespace once), each block
        becomes a new file under a name of its own in its directory, all of them are recorded
        in one catalog transaction, and each is renamed over its path, atomically as a
        rename through the mount (readers of what it replaces keep that). Per block: ESTALE
        if its allocation expired (its space may have been reused), EINVAL for checksums
        that do not fit it, what the rename would fail with."""
        out: list[KvfsError | None] = [None] * len(items)
        ready: dict[int, tuple[Allocation, Layout]] = {}
        for i, (alloc_id, sums) in enumerate(items):
            try:
                a = self.allocations.take(alloc_id, owner)
            except KvfsError as e:
                out[i] = e
                continue
            try:
                ready[i] = (a, self._sealed(a, sums))
            except KvfsError as e:
                self.pool.release(a.layout)
                out[i] = e
        failed = await self._sync({j for _, layout in ready.values() for j in layout.ns})
        made = []  # (index, directory, temporary name, name, node, layout)
        for i, (a, layout) in ready.items():
            try:
                bad = next((failed[j] for j in layout.ns if j in failed), None)
                if bad is not None:
                    raise bad
                # (checked again: the tree may have changed since the allocation)
                parent, name = await self.resolver.place(caller, a.path)
                gid, mode = self.files.owner_of(parent, caller.gid, a.mode, False)
                tmp = f".kvfs-direct-{self._token}-{a.id}".encode()
                node = self.catalog.create_file(parent.ino, tmp, mode, caller.uid, gid)
            except KvfsError as e:
                self.pool.release(layout)
                out[i] = e
                continue
            for key, value in a.xattrs.items():
                await self.catalog.set_xattr(node, key, value)  # (a new file: in memory)
            if self.files.readahead is not None:
                self.files.readahead.created(node, caller.pid)
            made.append((i, parent.ino, tmp, name, node, layout))
        recs = await self.sessions.publisher.publish([(m[4], m[5]) for m in made])
        placed = []
        for m, rec in zip(made, recs):
            if isinstance(rec, KvfsError):
                out[m[0]] = rec
                await self._discard(m[1], m[2])
            else:
                placed.append(m)

        renamed: list[tuple[int, bytes]] = []  # (directory, name) of the blocks put in place

        async def place(i: int, parent: int, tmp: bytes, name: bytes, size: int) -> None:
            try:
                await self.files.rename(parent, tmp, parent, name, 0)
            except KvfsError as e:
                out[i] = e
                await self._discard(parent, tmp)
                return
            renamed.append((parent, name))
            self.allocations.stats.direct_writes += 1
            self.allocations.stats.direct_write_bytes += size

        # (concurrently: where close is a commit, each rename waits for the catalog's sync,
        # and they share one)
        await run_all((lambda m=m: place(m[0], m[1], m[2], m[3], m[5].size)) for m in placed)
        await self.files.kernel.names_replaced(renamed)  # (what it cached of them is stale)
        return out

    def _sealed(self, a: Allocation, sums: list[int]) -> Layout:
        """The allocation's layout with the writer's checksums, once this node may still
        write where it lies (a shared pool's region lease)."""
        lay = a.layout
        if len(sums) != lay.nunits or not all(
            isinstance(x, int) and 0 <= x < 1 << 64 for x in sums
        ):
            raise KvfsError(
                errno.EINVAL, f"a commit of {lay.nunits} units needs {lay.nunits} 64-bit checksums"
            )
        layout = Layout(lay.size, lay.unit, lay.ns, lay.offsets, tuple(sums))
        for e in layout.unit_extents():
            self.pool.fence(e.offset, e.length)
        return layout

    async def _sync(self, namespaces: set[int]) -> dict[int, KvfsError]:
        """fdatasync each namespace once (what the writers wrote through their own
        descriptors); the errors of those that failed, by namespace."""
        failed: dict[int, KvfsError] = {}

        async def one(j: int) -> None:
            try:
                await self.pool.sync([j])
            except KvfsError as e:
                failed[j] = e

        await run_all((lambda j=j: one(j)) for j in sorted(namespaces))
        return failed

    async def _discard(self, parent: int, tmp: bytes) -> None:
        """Remove a block's file that did not make it into place (its content goes with it)."""
        try:
            await self.files.unlink(parent, tmp)
        except KvfsError:
            pass  # (gone already: someone found the name and removed it)
