"""Catalog records shared by every catalog implementation.

A `Node` is a file, directory or symlink with exactly one name (kvfs has no hard links). A file's
content is a `BlobRec`: one immutable, committed version with its stripe layout. A rewrite
commits a new BlobRec and retires the old one; the generation (`BlobRec.id`) is never reused.

A node that was created but never committed is *pending*: it exists only in memory, so after a
crash it is absent, as a file whose writer never closed it must be.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass, field

import xxhash

from kvfs.pool.layout import Layout

ROOT_INO = 1
CONTROL_INO = 2  # the hidden control file (see kvfs/fs/control.py)
FIRST_INO = 16  # inodes below this are reserved
NAME_MAX = 255


class BlobRec:
    """A committed block version: its id (the generation: unique for the life of the pool),
    layout and creation time. Immutable. Read from a catalog row it keeps the layout packed
    until something needs it (`BlobRec.packed`): a lookup or stat needs only the size."""

    __slots__ = ("id", "created_ns", "size", "_layout", "_packed")

    def __init__(self, id: int, layout: Layout, created_ns: int):
        self.id = id
        self.created_ns = created_ns
        self.size = layout.size
        self._layout = layout
        self._packed = None

    @classmethod
    def packed(
        cls, id: int, size: int, unit: int, ns: bytes, offsets: bytes, sums: bytes, created_ns: int
    ) -> "BlobRec":
        rec = cls.__new__(cls)
        rec.id, rec.created_ns, rec.size = id, created_ns, size
        rec._layout, rec._packed = None, (size, unit, ns, offsets, sums)
        return rec

    @property
    def layout(self) -> Layout:
        lay = self._layout
        if lay is None:
            lay = self._layout = Layout.unpack(*self._packed)
            self._packed = None
        return lay

    def __eq__(self, other) -> bool:
        if not isinstance(other, BlobRec):
            return NotImplemented
        return (self.id, self.created_ns, self.layout) == (other.id, other.created_ns, other.layout)

    def __hash__(self) -> int:
        return hash((self.id, self.created_ns, self.layout))

    def __repr__(self) -> str:
        return f"BlobRec(id={self.id}, size={self.size}, created_ns={self.created_ns})"

    @property
    def checksum(self) -> int:
        """xxh3-64 over the per-unit checksums: one number that names this content."""
        return xxhash.xxh3_64_intdigest(self.layout.pack()[2])


def ghost_key(parent: int, name: bytes) -> int:
    """A name (its directory's inode and the name) as a signed 64-bit key: how the catalogs
    remember evicted names' uses for the pool's policy (kvfs.tiers.scoring.PrefixScore)."""
    return xxhash.xxh3_64_intdigest(parent.to_bytes(8, "little") + name) - (1 << 63)


@dataclass(eq=False, slots=True, weakref_slot=True)
class Node:
    ino: int
    parent: int
    name: bytes
    mode: int
    uid: int
    gid: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    cookie: int = 0  # readdir position within the parent
    blob: BlobRec | None = None  # files: the committed version
    target: bytes | None = None  # symlinks
    xattrs: dict[bytes, bytes] = field(default_factory=dict)
    children: dict[bytes, int] | None = None  # directories of a memory tree: name -> ino
    subdirs: int = 0  # directories: how many children are directories
    persisted: bool = False  # False while pending (created, never committed)
    linked: bool = True  # False once unlinked (kept while open)
    removed_elsewhere: bool = False  # removed while open for writing here: by
    # another node, or by an eviction here
    prio: float | None = None  # files: place in the pool's eviction order
    uses: int = 0  # and stores + reads (pool.evict = "prefix")

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.mode)

    @property
    def is_symlink(self) -> bool:
        return stat.S_ISLNK(self.mode)

    @property
    def nlink(self) -> int:
        if not self.linked:
            return 0
        return 2 + self.subdirs if self.is_dir else 1

    @property
    def committed_size(self) -> int:
        if self.blob is not None:
            return self.blob.size
        if self.target is not None:
            return len(self.target)
        return 0
