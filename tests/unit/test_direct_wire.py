"""The direct path's encoding (kvfs/client/wire.py): every message round trips through
msgpack as the daemon and the client decode it, frames carry their length, and what is not a
request is refused with a one-line reason. With the pure parts around it: who may do what
(kvfs/fs/permissions.py `allows`) and how the client names a path to the daemon."""

from __future__ import annotations

import errno
import stat

import msgspec
import pytest

import kvfs.client.direct as kd
from kvfs.catalog.records import Node
from kvfs.client import wire
from kvfs.fs.permissions import READ, SEARCH, WRITE, Caller, allows

ENC = msgspec.msgpack.Encoder()
REQUESTS = msgspec.msgpack.Decoder(wire.Request)


@pytest.mark.parametrize(
    "request_",
    [
        wire.Inspect([b"a", b"b/c"], ["user.lmcache.meta"]),
        wire.Lease([b"a/b.bin", b"\xff\xfe odd name"], 30.0),
        wire.Release([1, 2, 3], [True, False, True]),
        wire.Stalled(7, 1, 1 << 20, 8 << 20),
        wire.Alloc([wire.Target(b"d/x", 5, 0o640, {"user.meta": b"\x00\x01"})], 0.5),
        wire.Commit([4, 5], [[0, (1 << 64) - 1], []]),
    ],
)
def test_every_request_round_trips_and_is_told_apart(request_):
    body = ENC.encode(request_)
    assert REQUESTS.decode(body) == request_
    framed = wire.frame(body)
    assert wire.frame_length(framed[: wire.HEADER]) == len(body) == len(framed) - wire.HEADER


def test_replies_round_trip_with_a_result_or_a_failure_per_block():
    leased = wire.Leased(
        [
            wire.Block(1, 99, 3 << 20, 1 << 20, [0, 1, 2], [4096, 8192, 1 << 30], [1, 2, 3]),
            wire.Failure(errno.ENOENT, "no such file: x"),
        ]
    )
    assert msgspec.msgpack.decode(ENC.encode(leased), type=wire.Leased | wire.Failure) == leased
    done = wire.Results([None, wire.Failure(errno.ESTALE, "expired")])
    assert msgspec.msgpack.decode(ENC.encode(done), type=wire.Results) == done
    seen = wire.Inspected([wire.FileInfo(5, {"user.m": b"{}"}), wire.Failure(errno.EACCES, "no")])
    assert msgspec.msgpack.decode(ENC.encode(seen), type=wire.Inspected) == seen
    placed = wire.Allocated([wire.Placement(3, 1 << 20, [1], [4096], 29.5)])
    assert msgspec.msgpack.decode(ENC.encode(placed), type=wire.Allocated) == placed
    # a whole request's failure decodes where its reply was expected
    fail = ENC.encode(wire.Failure(errno.EINVAL, "bad request"))
    assert msgspec.msgpack.decode(fail, type=wire.Results | wire.Failure).errno == errno.EINVAL


def test_the_largest_batch_fits_a_frame():
    """MAX_BATCH blocks of 256 units each (a 256 MiB block in 1 MiB units), leased: one frame."""
    block = wire.Block(
        1 << 40, 1 << 40, 256 << 20, 1 << 20, [3] * 256, [1 << 40] * 256, [1 << 63] * 256
    )
    body = ENC.encode(wire.Leased([block] * wire.MAX_BATCH))
    assert len(body) < wire.MAX_FRAME
    with pytest.raises(ValueError, match="frame"):
        wire.frame_length((wire.MAX_FRAME + 1).to_bytes(wire.HEADER, "little"))


@pytest.mark.parametrize(
    "bad, why",
    [
        (b"\xc1", "invalid"),  # not msgpack
        (ENC.encode(["lease", [b"a"], 0.0]), "> 0.0"),  # a ttl out of range
        (ENC.encode(["lease", [b"a"], 7200.0]), "<= 3600"),
        (ENC.encode(["lease", [b""], 1.0]), "length >= 1"),  # an empty path
        (ENC.encode(["lease", ["a"], 1.0]), "Expected `bytes`"),  # a path is bytes
        (ENC.encode(["lease", [b"a"] * (wire.MAX_BATCH + 1), 1.0]), "length <= 256"),
        (ENC.encode(["alloc", [[b"a", -1, 0o644, {}]], 1.0]), ">= 0"),  # a negative size
        (ENC.encode(["alloc", [[b"a", 1, 0o17777, {}]], 1.0]), "<= 4095"),  # a mode
        (ENC.encode(["commit", [1], [[-5]]]), ">= 0"),  # a checksum
        (ENC.encode(["unlink", [b"a"]]), "Invalid value 'unlink'"),  # no such request
        (ENC.encode({"lease": 1}), "Expected `array`"),
    ],
)
def test_what_is_not_a_request_is_refused_with_one_line(bad, why):
    with pytest.raises(msgspec.DecodeError) as e:
        REQUESTS.decode(bad)
    assert why in str(e.value) and "\n" not in str(e.value), str(e.value)


def node(mode: int, uid: int = 1000, gid: int = 1000, kind: int = stat.S_IFREG) -> Node:
    return Node(16, 1, b"f", kind | mode, uid, gid, 0, 0, 0)


@pytest.mark.parametrize(
    "mode, caller, want, allowed",
    [
        (0o600, Caller(1, 1000, 1000), READ | WRITE, True),  # the owner's bits
        (0o060, Caller(1, 1000, 1000), READ, False),  # the owner's bits only, for the owner
        (0o640, Caller(1, 1001, 1000), READ, True),  # the group's, by the primary group
        (0o640, Caller(1, 1001, 5, frozenset({1000})), READ, True),  # ... or a supplementary
        (0o640, Caller(1, 1001, 5), READ, False),  # the others'
        (0o604, Caller(1, 1001, 5), READ, True),
        (0o000, Caller(1, 0, 0), READ | WRITE, True),  # root reads and writes anything
        (0o000, Caller(1, 0, 0), SEARCH, False),  # ... but runs nothing nobody may
        (0o100, Caller(1, 0, 0), SEARCH, True),
    ],
)
def test_allows_follows_the_mode_bits_as_the_kernel_does(mode, caller, want, allowed):
    assert allows(node(mode), caller, want) is allowed


def test_root_searches_any_directory():
    assert allows(node(0o000, kind=stat.S_IFDIR), Caller(1, 0, 0), SEARCH)


def test_the_client_names_paths_from_the_mounts_root(tmp_path, monkeypatch):
    mnt = tmp_path / "mnt"
    (mnt / "d").mkdir(parents=True)
    (tmp_path / "link").symlink_to(mnt / "d")
    d = kd.Direct(str(mnt))
    try:
        assert d._relative(str(mnt / "d" / "x.bin")) == b"d/x.bin"
        assert d._relative(f"{mnt}/d/../x") == b"d/../x"  # (the daemon resolves it)
        monkeypatch.chdir(mnt / "d")
        assert d._relative("y") == b"d/y"
        assert d._relative(str(tmp_path / "link" / "z")) == b"d/z"  # a link into the mount
        for outside in (str(tmp_path / "z"), str(mnt)):
            with pytest.raises(OSError) as e:
                d._relative(outside)
            assert e.value.errno == errno.EXDEV
    finally:
        d.close()
