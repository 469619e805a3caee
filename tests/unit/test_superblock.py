import pytest

from kvfs.pool.superblock import (
    MAGIC,
    PROBE_BYTES,
    SB_SIZE,
    Superblock,
    SuperblockError,
    decode,
    foreign_signature,
)


def sb() -> Superblock:
    return Superblock(
        pool_id="ab" * 16,
        ns_index=2,
        ns_count=4,
        stripe_unit=1 << 20,
        size=1 << 30,
        created="2026-11-30T00:00:00+00:00",
    )


def test_roundtrip():
    raw = sb().encode()
    assert len(raw) == SB_SIZE and raw.startswith(MAGIC)
    assert decode(raw) == sb()


def test_blank_is_not_a_superblock():
    assert decode(bytes(SB_SIZE)) is None


def test_damage_is_detected():
    raw = bytearray(sb().encode())
    raw[40] ^= 0xFF
    with pytest.raises(SuperblockError, match="checksum"):
        decode(bytes(raw))
    raw = bytearray(sb().encode())
    raw[8] = 9
    with pytest.raises(SuperblockError, match="version 9"):
        decode(bytes(raw))


@pytest.mark.parametrize(
    "offset, magic, what",
    [
        (0x438, b"\x53\xef", "ext2/3/4"),
        (0, b"XFSB", "XFS"),
        (0x10040, b"_BHRfS_M", "btrfs"),
        (4086, b"SWAPSPACE2", "swap"),
        (0, MAGIC, "kvfs"),
    ],
)
def test_foreign_signatures(offset, magic, what):
    head = bytearray(PROBE_BYTES)
    head[offset : offset + len(magic)] = magic
    assert what in foreign_signature(bytes(head))
    assert foreign_signature(bytes(PROBE_BYTES)) is None
