"""What the file layer tells the kernel's caches when a file changes without a request of the
kernel's own: a file evicted to make room, a name or new content that another node made (a
shared pool), a commit that failed and dropped what was written.

`KernelCache` invalidates through pyfuse3 (only once a mount is up); `NO_KERNEL` is for the
layers run without a mount (the daemon-object tests), where no kernel caches anything.
"""

from __future__ import annotations

import logging

import pyfuse3

log = logging.getLogger("kvfs.fuse")


class NoKernel:
    """No mount: nothing is cached, nothing to invalidate."""

    def evicted(self, parent: int, name: bytes, ino: int) -> None:
        """`name` in `parent` is gone (inode `ino`, 0 if it only moved)."""

    def new_name(self, parent: int, name: bytes) -> None:
        """Another node made `name`: a cached "no such file" for it is stale."""

    def new_content(self, ino: int) -> None:
        """The file's attributes (its size) changed behind the kernel's back."""


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

    def new_content(self, ino: int) -> None:
        """Cached pages go at the next open, which sees a new version (keep_cache is per
        version; an open beside a session keeps none): only the attributes are dropped."""
        try:
            pyfuse3.invalidate_inode(ino, attr_only=True)
        except Exception:  # noqa: BLE001 - the kernel may not know the inode
            log.debug("invalidate_inode(%d) failed", ino, exc_info=True)
