"""What the file layer tells the kernel's caches when a file changes without a request of the
kernel's own: a file evicted to make room, a name or new content that another node made (a
shared pool), a commit that failed and dropped what was written.

`KernelCache` invalidates through pyfuse3 (only once a mount is up); `NO_KERNEL` is for the
layers run without a mount (the daemon-object tests), where no kernel caches anything.
"""

from __future__ import annotations

import logging

import pyfuse3
import trio

log = logging.getLogger("kvfs.fuse")


class NoKernel:
    """No mount: nothing is cached, nothing to invalidate."""

    def evicted(self, parent: int, name: bytes, ino: int) -> None:
        """`name` in `parent` is gone (inode `ino`, 0 if it only moved)."""

    def new_name(self, parent: int, name: bytes) -> None:
        """Another node made `name`: a cached "no such file" for it is stale."""

    def new_content(self, ino: int) -> None:
        """The file's attributes (its size) changed behind the kernel's back."""

    async def names_replaced(self, names: list[tuple[int, bytes]]) -> None:
        """Each (directory, name) now leads to a file made without a request of the kernel's
        (kvfs.client.direct's commit): returns once the kernel has forgotten what it cached
        of them, so that an open through the mount right after finds the new file."""


NO_KERNEL = NoKernel()


class KernelCache(NoKernel):
    def evicted(self, parent: int, name: bytes, ino: int) -> None:
        try:
            pyfuse3.invalidate_entry_async(parent, name, deleted=ino, ignore_enoent=True)
        except Exception:  # noqa: BLE001 - the kernel may not know the entry; nothing to undo
            log.debug("invalidate_entry(%d, %r) failed", parent, name, exc_info=True)

    def new_name(self, parent: int, name: bytes) -> None:
        try:
            pyfuse3.invalidate_entry_async(parent, name, ignore_enoent=True)
        except Exception:  # noqa: BLE001 - nothing cached, nothing to undo
            log.debug("invalidate_entry(%d, %r) failed", parent, name, exc_info=True)

    async def names_replaced(self, names: list[tuple[int, bytes]]) -> None:
        # (`new_name` queues the invalidation to pyfuse3's notification thread and returns:
        # a reader told "stored" could still open the name's old inode, or meet a cached
        # "no such file". Waited for here, in a worker thread: the kernel may have to wait
        # for the directory's lock, held by a request this thread must go on serving.)
        def drop() -> None:
            for parent, name in names:
                try:
                    pyfuse3.invalidate_entry(parent, name)
                except OSError:
                    pass  # nothing cached

        if names:
            await trio.to_thread.run_sync(drop)

    def new_content(self, ino: int) -> None:
        """Cached pages go at the next open, which sees a new version (keep_cache is per
        version; an open beside a session keeps none): only the attributes are dropped."""
        try:
            pyfuse3.invalidate_inode(ino, attr_only=True)
        except Exception:  # noqa: BLE001 - the kernel may not know the inode
            log.debug("invalidate_inode(%d) failed", ino, exc_info=True)
