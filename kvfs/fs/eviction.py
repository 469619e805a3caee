"""Eviction, the file layer's answer to the space layer (kvfs/space/base.py `Evictor`, reached
through a seam the factory binds: kvfs/service.py): a file may go to make room only when it is
closed, unpinned, unread here and still the block the space chose; deleting it tells the
kernel, which may cache the name.

A part of `Files` (kvfs/fs/files.py): it uses the catalog, the store, the open handles, the
space's ghosts and the kernel's caches that Files holds."""

from __future__ import annotations

import errno
import logging

from kvfs.catalog.records import Node
from kvfs.errors import KvfsError
from kvfs.write.sessions import PIN_XATTR

log = logging.getLogger("kvfs.fs.files")


class Eviction:
    def _evictable(self, node: Node | None, exclude: int, bid: int | None) -> bool:
        if node is None or node.ino == exclude or not node.linked or node.blob is None:
            return False
        if bid is not None and node.blob.id != bid:
            return False
        if node.xattrs.get(PIN_XATTR) == b"1" or self.store.is_held(node.blob.id):
            return False
        st = self.handles.states.get(node.ino)
        return st is None or (st.opens == 0 and st.session is None)

    def evictable(self, ino: int, exclude: int, bid: int | None = None) -> bool:
        """Would `evict` delete this file now (closed, unpinned, unread, still that block)?"""
        return self._evictable(self.catalog.find(ino), exclude, bid)

    def held(self, bid: int) -> bool:
        """Is the block read, fetched or pinned here now (the space layer's question)?"""
        return self.store.is_held(bid)

    async def evict(self, ino: int, exclude: int, bid: int | None = None) -> int:
        """Delete a closed, unpinned, unread file to free pool space; the bytes freed, or 0 if
        it may not go (or changed meanwhile, e.g. on another node)."""
        node = self.catalog.find(ino)
        if not self._evictable(node, exclude, bid):
            return 0
        parent, name, rec = node.parent, node.name, node.blob
        path = self.catalog.path_of(node)
        log.info("pool full: evicting %s (%d bytes)", path, rec.size)
        # A writer that opens the file while the removal is in flight (the catalog's round,
        # a Redis round trip) writes into a file that is going: its close must fail, not
        # return 0 for bytes nobody can read (the cluster torture: "v52 committed, file
        # absent", opened 0.6 ms after the eviction began).
        node.removed_elsewhere = True
        try:
            await self.catalog.remove(node, expect=rec, ghosts=self.space.ghosts())
        except BaseException as e:
            node.removed_elsewhere = False
            if isinstance(e, KvfsError) and e.errno in (errno.ENOENT, errno.ESTALE):
                # changed by another node meanwhile (another node evicting the same file, in
                # the same cluster-wide order): said too, so the log counts what went
                log.info("pool full: not evicting %s after all: %s", path, e)
                return 0
            raise
        self._unlinked(node)
        self.kernel.evicted(parent, name, ino)
        return rec.layout.stored_bytes()

    async def drop_unreadable(self, node: Node) -> int:
        """Delete a file whose block can no longer be read (a namespace it has units on left
        the pool: kvfs/fs/pool_admin.py), open or pinned or not: a reader still holding it
        gets the namespace's refusal, a writer's close fails (`removed_elsewhere`), and the
        name is a miss from now on. The bytes it held; 0 if it was gone already."""
        if not node.linked or node.blob is None:
            return 0
        parent, name, rec = node.parent, node.name, node.blob
        node.removed_elsewhere = True
        await self.catalog.remove(node)
        self._unlinked(node)
        self.kernel.evicted(parent, name, node.ino)
        return rec.size
