"""The superblock at the start of every namespace, and detection of other signatures.

Bytes [0, 4096) of each namespace:

    0   8 bytes  magic b"KVFSPOOL"
    8   u32 LE   format version
    12  u32 LE   length L of the JSON payload
    16  L bytes  JSON: pool_id, ns_index, ns_count, stripe_unit, size, created
    16+L u32 LE  crc32 of bytes [0, 16+L)

The rest of the first MiB is reserved; data extents start at 1 MiB (`layout.DATA_START`).
"""

from __future__ import annotations

import json
import struct
import subprocess
import zlib
from dataclasses import asdict, dataclass

MAGIC = b"KVFSPOOL"
VERSION = 1
SB_SIZE = 4096


@dataclass(frozen=True)
class Superblock:
    pool_id: str
    ns_index: int
    ns_count: int
    stripe_unit: int
    size: int  # bytes of the namespace kvfs uses (a 4 KiB multiple)
    created: str

    def encode(self) -> bytes:
        payload = json.dumps(asdict(self), sort_keys=True).encode()
        head = MAGIC + struct.pack("<II", VERSION, len(payload)) + payload
        raw = head + struct.pack("<I", zlib.crc32(head))
        if len(raw) > SB_SIZE:
            raise ValueError("superblock payload too large")
        return raw + bytes(SB_SIZE - len(raw))


class SuperblockError(ValueError):
    pass


def decode(raw: bytes) -> Superblock | None:
    """Parse a superblock; None if the magic is absent; SuperblockError if it is damaged."""
    if raw[:8] != MAGIC:
        return None
    version, length = struct.unpack_from("<II", raw, 8)
    if version != VERSION:
        raise SuperblockError(
            f"format version {version} is not supported (this kvfs reads {VERSION})"
        )
    if 16 + length + 4 > len(raw):
        raise SuperblockError("superblock is truncated")
    head = raw[: 16 + length]
    (crc,) = struct.unpack_from("<I", raw, 16 + length)
    if zlib.crc32(head) != crc:
        raise SuperblockError("superblock checksum mismatch")
    try:
        fields = json.loads(head[16:])
        return Superblock(**fields)
    except (ValueError, TypeError) as e:
        raise SuperblockError(f"superblock payload is invalid: {e}") from None


# Well-known signatures: (offset, bytes, what). Enough to refuse to overwrite a filesystem,
# swap, an encrypted volume or a partition table by accident; blkid (if present) adds the rest.
_SIGNATURES = [
    (0, MAGIC, "a kvfs namespace"),
    (0x438, b"\x53\xef", "an ext2/3/4 filesystem"),
    (0, b"XFSB", "an XFS filesystem"),
    (0x10040, b"_BHRfS_M", "a btrfs filesystem"),
    (4086, b"SWAPSPACE2", "swap space"),
    (4086, b"SWAP-SPACE", "swap space"),
    (0, b"LUKS\xba\xbe", "a LUKS volume"),
    (512, b"EFI PART", "a GPT partition table"),
    (510, b"\x55\xaa", "a DOS partition table or boot sector"),
    (0x8001, b"CD001", "an ISO9660 filesystem"),
    (0, b"\x56\x44\x4f\x20", "a VDO volume"),
]
PROBE_BYTES = 0x10040 + 8


def foreign_signature(head: bytes, path: str | None = None) -> str | None:
    """Name what `head` (the first PROBE_BYTES of a device) holds, or None if it looks unused."""
    for off, magic, what in _SIGNATURES:
        if head[off : off + len(magic)] == magic:
            return what
    if path is not None:
        try:
            r = subprocess.run(
                ["blkid", "-p", "-o", "export", path], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        if r.returncode == 0:
            fields = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
            kind = fields.get("TYPE") or fields.get("PTTYPE")
            if kind:
                return f"a {kind} signature (blkid)"
    return None
