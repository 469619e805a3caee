"""The direct path's messages: what kvfs.client.direct and the daemon's direct socket
(kvfs/fs/direct_socket.py) say to each other, in msgpack (msgspec), one frame each.

A frame is a 4-byte little-endian length and a msgpack body. On connecting, the client reads
`Welcome` (or `Failure`, and the daemon hangs up); then each request gets one reply, in order.
A request carries a batch (at most MAX_BATCH blocks; the client splits larger ones), and its
reply one result per block, in the request's order: a block that fails is a `Failure` in its
place, the others go on. A request the daemon cannot take (malformed, an unknown kind, values
out of range) is answered with one `Failure` (EINVAL) for the whole request; a frame over
MAX_FRAME, or one that is not msgpack framing at all, ends the connection after that reply.

    Inspect(paths, xattrs)     -> Inspected([FileInfo | Failure])  size and user.* attributes
    Lease(paths, ttl)          -> Leased([Block | Failure])        lease and layout, per block
    Release(leases, hits)      -> Results([Failure | None])       ESTALE: expired meanwhile
    Stalled(lease, ns, off, n) -> Results([Failure | None])       a read had no answer in time
    Alloc(targets, ttl)        -> Allocated([Placement | Failure]) room for new blocks
    Commit(allocs, sums)       -> Results([Failure | None])       durable, named, atomically

Paths are bytes, relative to the mount's root ("dir/file.bin"), resolved by the daemon with
the client's credentials as the kernel would resolve them through the mount.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

VERSION = 1
MAX_FRAME = 16 << 20  # bytes of one message, at most
MAX_BATCH = 256  # blocks of one request, at most (a larger batch is several requests)
HEADER = 4  # the length before each frame (little-endian)

Seconds = Annotated[float, msgspec.Meta(gt=0, le=3600)]
Count = Annotated[int, msgspec.Meta(ge=0)]
Path = Annotated[bytes, msgspec.Meta(min_length=1, max_length=4096)]
Batch = msgspec.Meta(max_length=MAX_BATCH)


class Failure(msgspec.Struct, tag="failure", array_like=True, gc=False):
    """A block's error (or a whole request's): an errno and a one-line message."""

    errno: int
    message: str


# --- the daemon's greeting ---------------------------------------------------------------------
class Welcome(msgspec.Struct, tag="welcome", array_like=True, gc=False):
    version: int
    namespace_paths: list[str]  # the devices or files the units are on, by namespace index
    read_timeout: float | None  # the pool's read deadline in seconds (None: none)


# --- requests ------------------------------------------------------------------------------
class Inspect(msgspec.Struct, tag="inspect", array_like=True, gc=False):
    """Each file's size and those of its user.* attributes named in `xattrs` (what stat and
    getxattr through the mount would give): what a reader needs to know before it can
    allocate the buffers of a batch."""

    paths: Annotated[list[Path], Batch]
    xattrs: Annotated[list[str], msgspec.Meta(max_length=16)]


class Lease(msgspec.Struct, tag="lease", array_like=True, gc=False):
    """Lease each file's current version for `ttl` seconds and describe it."""

    paths: Annotated[list[Path], Batch]
    ttl: Seconds


class Release(msgspec.Struct, tag="release", array_like=True, gc=False):
    """End leases; `hits[i]`: lease i's block was read (a hit, counted as one)."""

    leases: Annotated[list[Count], Batch]
    hits: Annotated[list[bool], Batch]


class Stalled(msgspec.Struct, tag="stalled", array_like=True, gc=False):
    """A read of a leased block had no answer from namespace `namespace` within the read
    deadline: the daemon checks that range itself (kvfs/pool/read_health.py)."""

    lease: Count
    namespace: Count
    offset: Count
    length: Count


class Target(msgspec.Struct, array_like=True, gc=False):
    """A block to store as the file `path` (created, or replacing what is there)."""

    path: Path
    size: Count
    mode: Annotated[int, msgspec.Meta(ge=0, le=0o7777)]
    xattrs: dict[str, bytes] = {}  # user.* attributes the file gets


class Alloc(msgspec.Struct, tag="alloc", array_like=True, gc=False):
    """Place each target's units in the pool, for `ttl` seconds."""

    targets: Annotated[list[Target], Batch]
    ttl: Seconds


class Commit(msgspec.Struct, tag="commit", array_like=True, gc=False):
    """Make allocated blocks durable and their files' content (`sums[i]`: the xxh3-64 of
    each unit of allocation `allocs[i]`)."""

    allocs: Annotated[list[Count], Batch]
    sums: Annotated[list[list[Count]], Batch]  # (msgpack has no integer past 64 bits)


Request = Inspect | Lease | Release | Stalled | Alloc | Commit


# --- replies -------------------------------------------------------------------------------
class FileInfo(msgspec.Struct, tag="file", array_like=True, gc=False):
    size: int
    xattrs: dict[str, bytes]  # those of the names asked for that the file has


class Inspected(msgspec.Struct, tag="inspected", array_like=True, gc=False):
    files: list[FileInfo | Failure]


class Block(msgspec.Struct, tag="block", array_like=True, gc=False):
    """A leased version of a file: where each stripe unit lies and its checksum."""

    lease: int
    generation: int  # the version (block id)
    size: int
    unit: int  # stripe unit, bytes
    ns: list[int]  # unit k's namespace
    offsets: list[int]  # unit k's byte offset there
    sums: list[int]  # unit k's xxh3-64


class Leased(msgspec.Struct, tag="leased", array_like=True, gc=False):
    blocks: list[Block | Failure]


class Placement(msgspec.Struct, tag="placement", array_like=True, gc=False):
    """Room for a block: unit k goes to namespace ns[k] at offsets[k]; commit within
    `expires_in` seconds."""

    alloc: int
    unit: int
    ns: list[int]
    offsets: list[int]
    expires_in: float


class Allocated(msgspec.Struct, tag="allocated", array_like=True, gc=False):
    blocks: list[Placement | Failure]


class Results(msgspec.Struct, tag="results", array_like=True, gc=False):
    """One result per block of a Release, Stalled or Commit: None where it went through."""

    results: list[Failure | None]


Reply = Welcome | Inspected | Leased | Allocated | Results | Failure


def frame(body: bytes) -> bytes:
    """A message as it goes on the socket: its length, then itself."""
    return len(body).to_bytes(HEADER, "little") + body


def frame_length(header: bytes) -> int:
    """The length a frame's header announces (ValueError if over MAX_FRAME)."""
    n = int.from_bytes(header, "little")
    if n > MAX_FRAME:
        raise ValueError(f"a frame of {n} bytes (at most {MAX_FRAME})")
    return n
