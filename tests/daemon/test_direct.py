"""kvfs.client.direct's daemon side without the kernel (kvfs/fs/direct_access.py and the socket
in front of it, kvfs/fs/direct_socket.py): batches of leases, allocations and commits answer
each block on its own, leased versions keep their extents through rewrites, evictions and
unlinks, paths are checked for the caller as the mount would check them, and bad input gets
a one-line error, never the daemon's end."""

from __future__ import annotations

import errno
import os
import socket
import stat

import msgspec
import pytest
import trio
import xxhash

from kvfs.client import wire
from kvfs.errors import KvfsError
from kvfs.fs.leases import Lease
from kvfs.fs.permissions import Caller
from tests.daemon.harness import ROOT, known, run_service

KiB, MiB = 1 << 10, 1 << 20
ALICE = Caller(1, 1000, 1000)
BOB = Caller(2, 1001, 1001, frozenset({1000}))  # in alice's group


def extents(lease: Lease) -> set[tuple[int, int]]:
    lay = lease.rec.layout
    return {(lay.ns[k], lay.offsets[k]) for k in range(lay.nunits)}


async def stored(fs, layout) -> bytes:
    """A block's bytes as the pool has them at its extents now."""
    out = bytearray()
    for k in range(layout.nunits):
        _, length = layout.unit_span(k)
        with open(fs.svc.pool.namespaces[layout.ns[k]].path, "rb") as f:
            f.seek(layout.offsets[k])
            out += f.read(length)
    return bytes(out)


def write_units(fs, placement, data: bytes) -> list[int]:
    """What a direct writer does between allocation and commit: each unit to its place."""
    lay = placement.layout
    sums = []
    for k in range(lay.nunits):
        start, length = lay.unit_span(k)
        unit = data[start : start + length]
        path = fs.svc.pool.namespaces[lay.ns[k]].path
        with open(path, "r+b") as f:
            f.seek(lay.offsets[k])
            f.write(unit)
        sums.append(xxhash.xxh3_64_intdigest(unit))
    return sums


def test_a_lease_batch_answers_each_block_alone(pool_config):
    cfg = pool_config(n=2, pool='stripe_unit = "256KiB"')

    async def body(fs):
        files = {f"/b{i}": os.urandom(300 * KiB * (i + 1)) for i in range(3)}
        for path, data in files.items():
            await fs.write(path, data)
        await fs.mkdir("/d")
        fh = await fs.open("/empty", os.O_CREAT | os.O_WRONLY)  # never committed
        direct, leases = fs.svc.direct, fs.files.leases
        got = await direct.lease(
            ROOT, 7, [b"b0", b"missing", b"d", b"b1", b"empty", b"d/../b2", b"../x"], ttl=30
        )
        errs = {i: g.errno for i, g in enumerate(got) if isinstance(g, KvfsError)}
        assert errs == {1: errno.ENOENT, 2: errno.EISDIR, 4: errno.EAGAIN, 6: errno.EXDEV}
        for i, path in ((0, "/b0"), (3, "/b1"), (5, "/b2")):  # the others' leases: each version
            lay = got[i].rec.layout
            assert got[i].rec is fs.files.catalog.get(fs.ino(path)).blob
            assert await stored(fs, lay) == files[path]
        assert len(leases.held) == 3
        # releases likewise: an unknown lease fails alone
        ids = [got[0].id, 999, got[3].id, got[5].id]
        out = direct.release(7, ids, [True, True, False, True])
        assert [e.errno if e else None for e in out] == [None, errno.ESTALE, None, None]
        assert not leases.held and leases.stats.direct_reads == 2
        assert fs.files.hits[fs.ino("/b0")] == 1 and fs.files.hits[fs.ino("/b1")] == 0
        with pytest.raises(KvfsError) as e:  # a malformed request is one error
            direct.release(7, [1, 2], [True])
        assert e.value.errno == errno.EINVAL
        await fs.close(fh)

    run_service(cfg, body)


def test_an_inspection_gives_each_files_size_and_attributes_as_the_mount_would(pool_config):
    cfg = pool_config()

    async def body(fs):
        cat, direct = fs.files.catalog, fs.svc.direct
        for name, mode in (("/a", 0o644), ("/b", 0o600)):
            await fs.write(name, b"x" * 3000)
            await cat.setattr(cat.get(fs.ino(name)), mode=mode)
            await fs.files.xattrs.setxattr(fs.ino(name), b"user.meta", name.encode())
        await fs.write("/plain", b"y")
        names = ["user.meta", "user.other"]
        got = await direct.inspect(ALICE, [b"a", b"b", b"plain", b"gone"], names)
        assert got[0] == (3000, {"user.meta": b"/a"}) and got[2] == (1, {})
        assert [g.errno for g in got[1::2]] == [errno.EACCES, errno.ENOENT]
        with pytest.raises(KvfsError) as e:  # (through the mount: no such attribute, ever)
            await direct.inspect(ROOT, [b"a"], ["trusted.x"])
        assert e.value.errno == errno.ENOTSUP

    run_service(cfg, body)


def test_leased_versions_keep_their_extents_through_rewrites_evictions_and_unlinks(pool_config):
    """Mid-batch, one leased file is rewritten, one unlinked, one evicted to make room, and the
    pool filled with new files: no extent of a leased version goes to anything else, and each
    still holds its bytes; released, the space goes back."""
    cfg = pool_config(n=2, size="8MiB", durability="fsync")

    async def body(fs):
        files = {f"/k{i}": os.urandom(2 * MiB) for i in range(4)}
        for path, data in files.items():
            await fs.write(path, data)
        await fs.sync()
        direct = fs.svc.direct
        leases = await direct.lease(ROOT, 1, [b"k0", b"k1", b"k2"], ttl=30)
        held = set().union(*(extents(lease) for lease in leases))
        await fs.write("/k0", os.urandom(2 * MiB))  # rewritten
        await fs.files.unlink(1, b"k1")  # unlinked
        assert await fs.files.evict(fs.ino("/k2"), 0) == 0  # leased: not evicted
        for i in range(8):  # the pool fills: unleased files are evicted, leased ones kept
            await fs.write(f"/new{i}", os.urandom(MiB))
            await fs.sync()
        assert fs.svc.space.evictions >= 1 and not known(fs, "/k3")
        for path in (p for p in ("/k0", "/k2") + tuple(f"/new{i}" for i in range(8))):
            if known(fs, path):
                node = fs.files.catalog.get(fs.ino(path))
                lay = node.blob.layout
                mine = {(lay.ns[k], lay.offsets[k]) for k in range(lay.nunits)}
                assert path == "/k2" or not mine & held, path
        for lease, path in zip(leases, ("/k0", "/k1", "/k2")):
            assert await stored(fs, lease.rec.layout) == files[path], path
        free = fs.svc.space.free
        assert direct.release(1, [x.id for x in leases], [True] * 3) == [None] * 3
        await fs.sync()
        assert fs.svc.space.free == free + 4 * MiB  # k0's and k1's old versions

    run_service(cfg, body)


def test_a_namespace_failed_for_reads_refuses_only_its_blocks_in_a_batch(pool_config):
    cfg = pool_config(n=2, pool='stripe_unit = "256KiB"')

    async def body(fs):
        for i in range(6):
            await fs.write(f"/s{i}", os.urandom(100 * KiB))  # one unit: one namespace each
        fs.svc.pool.namespaces[1].health.fail("a test")
        got = await fs.svc.direct.lease(ROOT, 1, [f"s{i}".encode() for i in range(6)], ttl=30)
        for i, g in enumerate(got):
            on1 = 1 in fs.files.catalog.get(fs.ino(f"/s{i}")).blob.layout.ns
            if on1:
                assert isinstance(g, KvfsError) and g.errno == errno.ENOENT, g
            else:
                assert isinstance(g, Lease), g
        assert {isinstance(g, Lease) for g in got} == {True, False}

    run_service(cfg, body)


def test_a_stalled_report_names_a_range_of_a_block_the_connection_leased(pool_config):
    cfg = pool_config(n=2, pool='stripe_unit = "256KiB"')

    async def body(fs):
        await fs.write("/b", os.urandom(MiB))
        direct = fs.svc.direct
        [lease] = await direct.lease(ROOT, 1, [b"b"], ttl=30)
        lay = lease.rec.layout
        direct.stalled(1, lease.id, lay.ns[0], lay.offsets[0], 256 * KiB)  # checked (in time)
        for owner, lease_id, j, off, n, want in (
            (2, lease.id, lay.ns[0], lay.offsets[0], 4096, errno.ESTALE),  # not its lease
            (1, lease.id, lay.ns[0], lay.offsets[0] + 4096, 4096, errno.EINVAL),  # no unit there
            (1, lease.id, lay.ns[0], lay.offsets[0], 64 * MiB, errno.EINVAL),  # beyond it
        ):
            with pytest.raises(KvfsError) as e:
                direct.stalled(owner, lease_id, j, off, n)
            assert e.value.errno == want
        assert fs.svc.pool.failed_for_reads() == []

    run_service(cfg, body)


def test_paths_are_checked_for_the_caller_as_the_mount_checks_them(pool_config):
    cfg = pool_config()

    async def body(fs):
        files, cat = fs.files, fs.files.catalog
        for name, mode in (("/open", 0o644), ("/private", 0o600), ("/group", 0o640)):
            await fs.write(name, b"x" * 5000)
            await cat.setattr(cat.get(fs.ino(name)), mode=mode, uid=1000, gid=1000)
        await fs.mkdir("/closed")
        await fs.write("/closed/f", b"y")
        await cat.setattr(cat.get(fs.ino("/closed")), mode=0o700)
        await files.symlink(1, b"up", b"closed/../open", 0, 0)
        await files.symlink(1, b"away", b"/elsewhere/f", 0, 0)
        await files.symlink(1, b"loop", b"loop", 0, 0)
        paths = [b"open", b"private", b"group", b"closed/f", b"up", b"away", b"loop"]

        async def errnos(caller):
            got = await fs.svc.direct.lease(caller, 1, paths, ttl=30)
            return [g.errno if isinstance(g, KvfsError) else 0 for g in got]

        # alice owns the three files; bob is in her group; root may read anything
        shut, out, loop = errno.EACCES, errno.EXDEV, errno.ELOOP
        assert await errnos(ALICE) == [0, 0, 0, shut, shut, out, loop]
        assert await errnos(BOB) == [0, shut, 0, shut, shut, out, loop]
        assert await errnos(ROOT) == [0, 0, 0, 0, 0, out, loop]

        # writing: write and search permission on the directory; a directory is not replaced;
        # in a sticky directory, another user's file is not replaced
        await fs.mkdir("/shared")
        await cat.setattr(cat.get(fs.ino("/shared")), mode=0o1777)
        await fs.mkdir("/shared/sub")
        await fs.write("/shared/alices", b"a")
        await cat.setattr(cat.get(fs.ino("/shared/alices")), uid=1000, gid=1000)
        targets = [
            (b"new", 10, 0o644, {}),  # root's directory, 0755
            (b"shared/bobs", 10, 0o640, {}),
            (b"shared/alices", 10, 0o644, {}),
            (b"shared/sub", 10, 0o644, {}),
            (b"nowhere/f", 10, 0o644, {}),
            (b"shared/x", 10, 0o644, {"user.kvfs.pin": b"1"}),
            (b"shared/y", 10, 0o644, {"trusted.x": b"1"}),
        ]
        got = await fs.svc.direct.allocate(BOB, 3, targets, ttl=30)
        want = [
            errno.EACCES,
            0,
            errno.EPERM,
            errno.EISDIR,
            errno.ENOENT,
            errno.EINVAL,
            errno.ENOTSUP,
        ]
        assert [g.errno if isinstance(g, KvfsError) else 0 for g in got] == want
        [e] = await fs.svc.direct.commit(BOB, 3, [(got[1].id, write_units(fs, got[1], b"b" * 10))])
        assert e is None
        node = cat.get(fs.ino("/shared/bobs"))
        assert (node.uid, node.gid, stat.S_IMODE(node.mode)) == (1001, 1001, 0o640)
        assert await fs.read("/shared/bobs") == b"b" * 10

    run_service(cfg, body)


def test_a_commit_batch_makes_every_block_a_file_at_once_and_each_failure_stays_its_own(
    pool_config,
):
    """A batch of direct writes: one catalog transaction for the blocks, each renamed over its
    path (a reader of the file it replaces keeps that); a block whose checksums do not fit,
    or whose allocation is unknown, fails alone, and its space goes back."""
    cfg = pool_config(n=3, pool='stripe_unit = "256KiB"', durability="close")

    async def body(fs):
        await fs.mkdir("/kv")
        await fs.write("/kv/b0", b"old" * 1000)
        reader = await fs.open("/kv/b0", os.O_RDONLY)
        data = {f"kv/b{i}": os.urandom(100 * KiB * i + 7) for i in range(5)}
        direct, cat = fs.svc.direct, fs.files.catalog
        targets = [(p.encode(), len(d), 0o600, {"user.meta": p.encode()}) for p, d in data.items()]
        placed = await direct.allocate(ROOT, 1, targets, ttl=30)
        sums = [write_units(fs, a, d) for a, d in zip(placed, data.values())]
        sums[3] = sums[3][:-1]  # one checksum short
        free = fs.svc.space.free
        txns = cat.commits
        items = [(a.id, s) for a, s in zip(placed, sums)] + [(12345, [0])]
        got = await direct.commit(ROOT, 1, items)
        assert [e.errno if e else None for e in got] == [
            None,
            None,
            None,
            errno.EINVAL,
            None,
            errno.ESTALE,
        ]
        # the blocks' transaction, and the renames' (where close is a commit each waits for
        # its sync: the round that one of them starts, and the next, for the others)
        assert cat.commits - txns <= 3
        for i, (path, want) in enumerate(data.items()):
            if i == 3:
                assert not known(fs, "/" + path)
                continue
            assert await fs.read("/" + path) == want, path
            node = cat.get(fs.ino("/" + path))
            assert node.xattrs == {b"user.meta": path.encode()}
        # (no temporary name is left)
        assert sorted(n.name for n in cat.entries(fs.ino("/kv"))) == [b"b0", b"b1", b"b2", b"b4"]
        assert await fs.read_fh(reader, 3000) == b"old" * 1000  # the version it opened
        await fs.close(reader)
        await fs.sync()
        # the refused block's space went back, and the replaced version's once unread
        stored = fs.svc.pool.stored_size
        assert fs.svc.space.free == free + stored(len(data["kv/b3"])) + stored(3000)
        assert fs.files.allocations.stats.direct_writes == 4

    run_service(cfg, body)


def test_the_socket_answers_batches_and_survives_bad_input(pool_config):
    """The direct socket end to end, in the daemon's trio loop: a batch is one frame each
    way; malformed requests get one EINVAL line and the connection goes on; a frame too
    large ends only that connection; a connection that closes ends its leases; a stop
    closes the connections waiting for a request and ends the socket."""
    cfg = pool_config()

    async def body(fs):
        sock = fs.svc.direct_socket
        for i in range(3):
            await fs.write(f"/f{i}", os.urandom(5000))
        enc = msgspec.msgpack.Encoder().encode

        async with trio.open_nursery() as nursery:
            await nursery.start(sock.serve)
            assert sock.listening

            async def connect():
                s = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                await s.connect(sock.address.replace("@", "\0", 1))
                return trio.SocketStream(s)

            async def receive(stream, kind):
                buf = b""
                while len(buf) < 4 or len(buf) < 4 + wire.frame_length(buf[:4]):
                    chunk = await stream.receive_some(1 << 16)
                    if not chunk:
                        return None
                    buf += chunk
                return msgspec.msgpack.decode(buf[4:], type=kind)

            stream = await connect()
            welcome = await receive(stream, wire.Welcome)
            assert welcome.version == wire.VERSION and len(welcome.namespace_paths) == 1
            await stream.send_all(wire.frame(enc(wire.Lease([b"f0", b"nope", b"f2"], 30.0))))
            got = (await receive(stream, wire.Leased)).blocks
            assert [type(b).__name__ for b in got] == ["Block", "Failure", "Block"]
            assert got[1].errno == errno.ENOENT and got[0].size == 5000
            assert len(fs.files.leases.held) == 2
            for bad, what in (
                (b"\xc1", "bad request"),  # not msgpack
                (enc(["lease", [b"f0"], 0.0]), "> 0.0"),  # a ttl out of range
                (enc(["shutdown"]), "Invalid value"),  # no such request
                (enc(["release", [1], []]), "as many hits as leases"),
            ):
                await stream.send_all(wire.frame(bad))
                reply = await receive(stream, wire.Failure)
                assert reply.errno == errno.EINVAL and what in reply.message, reply
            # the connection still serves: release one lease, then close it with one held
            await stream.send_all(wire.frame(enc(wire.Release([got[0].lease], [True]))))
            assert (await receive(stream, wire.Results)).results == [None]
            await stream.aclose()
            with trio.fail_after(5):
                while fs.files.leases.held:  # its last lease ended with it
                    await trio.sleep(0.01)
            # a frame too large: answered, then that connection ends
            stream = await connect()
            await receive(stream, wire.Welcome)
            await stream.send_all((wire.MAX_FRAME + 1).to_bytes(4, "little"))
            reply = await receive(stream, wire.Failure)
            assert reply.errno == errno.EINVAL and "frame" in reply.message
            assert await receive(stream, wire.Failure) is None  # closed
            await stream.aclose()
            st = sock.statistics()
            assert st["requests"] == {"lease": 1, "release": 2}, st
            assert st["blocks"] == {"lease": 3, "release": 2} and st["bad_requests"] == 3 + 1
            assert st["connections"] == 2 and st["connections_open"] == 0
            # unmounting: a connection waiting for its next request is closed, and the
            # socket stops (the nursery ends without being cancelled)
            stream = await connect()
            await receive(stream, wire.Welcome)
            with trio.fail_after(5):
                while not sock._idle:  # (until it waits for a request)
                    await trio.sleep(0.001)
            await sock.stop()
            assert await receive(stream, wire.Failure) is None and not sock.listening
            await stream.aclose()

    run_service(cfg, body)
