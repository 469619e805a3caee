"""Extended attributes (user.* only, as Linux limits them) and pins: a pinned file's block stays
in DRAM, across restarts too (the attribute user.kvfs.pin). An object of its own that `Files`
(kvfs/fs/files.py) holds as `files.xattrs`: the catalog, the store, and the way to wait for a
file's closed content (Files.settle) are all it needs."""

from __future__ import annotations

import errno
import logging
from typing import Awaitable, Callable

from kvfs.catalog.interface import Catalog
from kvfs.errors import KvfsError
from kvfs.tiers.store import BlockStore
from kvfs.write.sessions import PIN_XATTR

log = logging.getLogger("kvfs.fs.files")

XATTR_NAME_MAX = 255
XATTR_SIZE_MAX = 64 * 1024


class Attributes:
    def __init__(self, catalog: Catalog, store: BlockStore, settle: Callable[[int], Awaitable]):
        self.catalog = catalog
        self.store = store
        self.settle = settle  # wait until a closed file's content is its committed version

    @staticmethod
    def check(name: bytes, value: bytes) -> None:
        """Refuse an attribute Linux would not store: not user.*, its name or value too long."""
        if not name.startswith(b"user."):
            raise KvfsError(
                errno.ENOTSUP,
                f"only user.* attributes are supported, not {name.decode(errors='replace')}",
            )
        if len(name) > XATTR_NAME_MAX:
            raise KvfsError(errno.ERANGE, "attribute name too long")
        if len(value) > XATTR_SIZE_MAX:
            raise KvfsError(errno.E2BIG, f"attribute value larger than {XATTR_SIZE_MAX} bytes")

    def getxattr(self, ino: int, name: bytes) -> bytes:
        node = self.catalog.get(ino)
        try:
            return node.xattrs[name]
        except KeyError:
            raise KvfsError(
                errno.ENODATA, f"no attribute {name.decode(errors='replace')}"
            ) from None

    def listxattr(self, ino: int) -> list[bytes]:
        return list(self.catalog.get(ino).xattrs)

    async def setxattr(self, ino: int, name: bytes, value: bytes) -> None:
        self.check(name, value)
        await self.catalog.set_xattr(self.catalog.get(ino), name, value)

    async def removexattr(self, ino: int, name: bytes) -> None:
        await self.catalog.remove_xattr(self.catalog.get(ino), name)

    # --- pinning -------------------------------------------------------------------------------
    async def set_pin(self, ino: int, on: bool) -> None:
        """Keep a file's block in DRAM (fetched now) until unpinned; remembered across
        restarts as the attribute user.kvfs.pin."""
        node = self.catalog.get(ino)
        if not node.is_file:
            raise KvfsError(
                errno.EISDIR if node.is_dir else errno.EINVAL, "only regular files can be pinned"
            )
        if on:
            await self.settle(ino)  # the version to pin is the closed content
            if node.blob is not None:
                await self.store.pin(node.blob)
            await self.catalog.set_xattr(node, PIN_XATTR, b"1")
        else:
            if node.blob is not None:
                self.store.unpin(node.blob)
            if PIN_XATTR in node.xattrs:
                await self.catalog.remove_xattr(node, PIN_XATTR)

    async def warm_pinned(self) -> int:
        """Bring the files pinned before a restart back into DRAM."""
        n = 0
        for node in self.catalog.pinned_files():
            if node.xattrs.get(PIN_XATTR) == b"1" and node.blob is not None:
                try:
                    await self.store.pin(node.blob)
                    n += 1
                except KvfsError as e:
                    log.warning(
                        "%s: cannot pin again after restart: %s", self.catalog.path_of(node), e
                    )
        return n
