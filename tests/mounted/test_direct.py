"""kvfs.client.direct: blocks read straight from the namespaces, safe against concurrent
rewrites."""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import kvfs.client.direct as kd
from kvfs.client.channel import Channel
from tests.cuda_stub import build as build_cuda_stub
from tests.helpers import ROOT, requires_throttle, wait_until, write_config

MiB = 1 << 20
SIZES = [0, 1, 4095, 4096, 65537, MiB, MiB + 1, 7 * MiB + 123]


@pytest.fixture
def blocks(make_mount, pool_config):
    m = make_mount(pool_config(n=3, dram="64MiB"))
    data = {}
    for i, size in enumerate(SIZES):
        p = m.mountpoint / f"b{i}.pt"
        data[p] = os.urandom(size)
        p.write_bytes(data[p])
    return m, data


def test_bit_exact_reads_of_many_sizes_and_buffer_kinds(blocks):
    m, data = blocks
    with kd.Direct(str(m.mountpoint), verify=True) as d:
        for p, want in data.items():
            aligned = np.empty(max(1, len(want)), dtype=np.uint8)
            assert d.read_into(str(p), aligned) == len(want)
            assert aligned[: len(want)].tobytes() == want
            odd = bytearray(len(want) + 3)  # not 4 KiB aligned: bounce path
            d.read_into(str(p), memoryview(odd)[3:])
            assert bytes(odd[3:]) == want
        paths = [str(p) for p in data]
        bufs = [np.empty(max(1, len(v)), dtype=np.uint8) for v in data.values()]
        d.read_many(paths, bufs)
        assert all(b[: len(v)].tobytes() == v for b, v in zip(bufs, data.values()))
    with kd.open(str(m.mountpoint), str(m.mountpoint / "b7.pt")) as b:
        assert b.size == SIZES[7] and len(b.layout.ns) == 8
        with pytest.raises(ValueError, match="smaller than"):
            b.read_into(bytearray(10))
    st = m.stats()
    assert st["files"]["direct_reads"] >= 3 * len(SIZES) and st["files"]["stale_releases"] == 0
    assert int(os.getxattr(m.mountpoint / "b7.pt", "user.kvfs.hits")) == 3  # reported hits


def test_a_rewrite_during_a_direct_read_never_returns_wrong_bytes(blocks, monkeypatch):
    m, data = blocks
    p = m.mountpoint / "b7.pt"
    old = data[p]
    new = os.urandom(len(old))
    d = kd.Direct(str(m.mountpoint), ttl=0.5)
    real = d._read_unit_host
    state = {"rewritten": 0}

    def rewrite_then_read(lay, k, dest, verify):
        if state["rewritten"] == 0:
            state["rewritten"] = 1
            expired = m.stats()["files"]["expired_leases"]
            wait_until(
                lambda: m.stats()["files"]["expired_leases"] > expired, 30, "the lease to expire"
            )  # the lease expires...
            p.write_bytes(new)  # ...the file gets a new version...
            for i in range(8):  # ...and its old extents are reused by others
                (m.mountpoint / f"filler{i}").write_bytes(os.urandom(MiB))
        return real(lay, k, dest, verify)

    monkeypatch.setattr(d, "_read_unit_host", rewrite_then_read)
    buf = np.empty(len(old), dtype=np.uint8)
    d.read_into(str(p), buf)
    got = buf.tobytes()
    assert got == new  # the stale attempt was detected and redone
    assert m.stats()["files"]["stale_releases"] >= 1
    # with a live lease the old version stays readable even though the file was rewritten
    d2 = kd.Direct(str(m.mountpoint), ttl=30)
    [lay] = d2._lease([str(p)])
    p.write_bytes(old)
    for i in range(8):
        (m.mountpoint / f"more{i}").write_bytes(os.urandom(MiB))
    dest = memoryview(bytearray(lay.size))
    for k in range(len(lay.ns)):
        d2._read_unit_host(lay, k, dest, True)  # checksums of the leased version verify
    assert bytes(dest) == new and d2._release({0: lay}, {0}) == set()  # still live
    d.close()
    d2.close()


def test_verify_catches_corruption(blocks, tmp_path):
    m, data = blocks
    p = m.mountpoint / "b7.pt"  # unit 1 is a full MiB of content
    lay = json.loads(os.getxattr(p, "user.kvfs.layout"))
    ns, off = lay["unit_map"][1]
    with open(lay["namespace_paths"][ns], "r+b") as f:
        f.seek(off + 7)
        b = f.read(1)
        f.seek(off + 7)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(OSError, match="checksum mismatch"):  # verified by default
        with kd.open(str(m.mountpoint), str(p)) as blk:
            blk.read_into(bytearray(blk.size))
    with kd.open(str(m.mountpoint), str(p), verify=False) as blk:  # the explicit opt-out
        buf = bytearray(blk.size)
        assert blk.read_into(buf) == blk.size and buf != data[p]


KVIKIO_READ = (
    "import errno, sys, numpy as np, kvfs.client.direct as kd\n"
    "mnt, *paths = sys.argv[1:]\n"
    "try:\n"
    "    with kd.Direct(mnt, use_kvikio=True) as d:\n"
    "        for p in paths:\n"
    "            size = d.layout(p).size\n"
    "            buf = np.empty(max(size, 1), dtype=np.uint8)\n"
    "            assert d.read_into(p, buf) == size\n"
    "            sys.stdout.buffer.write(buf[:size].tobytes())\n"
    "except OSError as e:\n"
    "    print(errno.errorcode[e.errno], e, file=sys.stderr)\n"
    "    sys.exit(3)\n"
)


def _kvikio_read(tmp_path, mnt, paths) -> subprocess.CompletedProcess:
    """Read `paths` with use_kvikio=True in a process that loads the stub CUDA driver."""
    stub = build_cuda_stub(tmp_path / "cuda")
    env = dict(os.environ, LD_LIBRARY_PATH=str(stub), PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-c", KVIKIO_READ, str(mnt), *map(str, paths)],
        capture_output=True,
        env=env,
        timeout=120,
    )


def test_kvikio_host_path_with_a_stub_cuda_driver(blocks, tmp_path):
    """kvikio loads libcuda.so.1 even for host buffers; with no GPU here the test builds a stub
    driver (every call returns CUDA_ERROR_NOT_INITIALIZED) so that kvikio's host path runs."""
    pytest.importorskip("kvikio")
    m, data = blocks
    r = _kvikio_read(tmp_path, m.mountpoint, list(data))
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert r.stdout == b"".join(data.values())


@pytest.mark.parametrize("fault", ["flipped byte", "short read"])
def test_kvikio_host_path_checks_checksums_and_byte_counts(blocks, tmp_path, fault):
    """A unit kvikio reads into host memory is checked like one read by the host path: a
    flipped byte on the device fails its checksum, a unit cut short by the end of the device
    fails its byte count; either is EIO, never wrong or missing bytes in the buffer."""
    pytest.importorskip("kvikio")
    m, data = blocks
    p = m.mountpoint / "b7.pt"
    lay = json.loads(os.getxattr(p, "user.kvfs.layout"))
    k = len(lay["unit_map"]) - 1  # the block's last unit
    ns, off = lay["unit_map"][k]
    dev = lay["namespace_paths"][ns]
    if fault == "flipped byte":
        with open(dev, "r+b") as f:
            f.seek(off + 7)
            b = f.read(1)
            f.seek(off + 7)
            f.write(bytes([b[0] ^ 0xFF]))
        want = "checksum mismatch"
    else:
        os.truncate(dev, off + 100)
        want = "EOF"  # kvikio's word for it
    r = _kvikio_read(tmp_path, m.mountpoint, [p])
    assert r.returncode == 3, (r.returncode, r.stderr.decode()[-2000:])
    err = r.stderr.decode()
    assert err.startswith("EIO") and want in err and f"unit {k}" in err, err[-2000:]
    assert r.stdout == b""


def _gpu_reason() -> str | None:
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return None
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device
        pass
    try:
        import torch

        if torch.cuda.is_available():
            return None
    except Exception:  # noqa: BLE001
        pass
    return "needs a CUDA GPU (and CuPy or a CUDA build of torch)"


@pytest.mark.gpu
@pytest.mark.skipif(_gpu_reason() is not None, reason=str(_gpu_reason()))
def test_read_into_gpu_memory(blocks):
    m, data = blocks
    p = m.mountpoint / "b7.pt"
    try:
        import cupy

        buf = cupy.empty(SIZES[7], dtype=cupy.uint8)
        to_host = cupy.asnumpy
    except ImportError:
        import torch

        buf = torch.empty(SIZES[7], dtype=torch.uint8, device="cuda")
        to_host = lambda t: t.cpu().numpy()  # noqa: E731
    with kd.open(str(m.mountpoint), str(p)) as b:
        b.read_into(buf)
    assert to_host(buf).tobytes() == data[p]


def test_direct_writes_are_bit_exact_durable_and_atomic(make_mount, pool_config):
    """Blocks written straight to the namespaces and committed through the mount read back
    bit-exact through the mount and directly, survive a restart, and replace an older version
    atomically (its readers keep it)."""
    m = make_mount(pool_config(n=3, dram="64MiB"))
    data = {m.mountpoint / f"w{i}.pt": os.urandom(size) for i, size in enumerate(SIZES)}
    old = m.mountpoint / "w7.pt"
    old.write_bytes(b"old" * 1000)
    reader = open(old, "rb")
    with kd.Direct(str(m.mountpoint)) as d:
        d.write_many(
            [str(p) for p in data], list(data.values()), xattrs=[{"user.meta": b"x"}] * len(data)
        )
        aligned = np.frombuffer(os.urandom(2 * MiB), dtype=np.uint8)  # aligned, zero-copy
        d.write(str(m.mountpoint / "aligned.pt"), aligned)
        data[m.mountpoint / "aligned.pt"] = aligned.tobytes()
    assert reader.read() == b"old" * 1000  # the version it opened
    reader.close()
    st = m.stats()["files"]
    assert st["direct_writes"] == len(data) and st["direct_write_bytes"] == sum(
        map(len, data.values())
    )
    for p, want in data.items():
        assert p.read_bytes() == want
    assert os.getxattr(m.mountpoint / "w3.pt", "user.meta") == b"x"
    m.restart()  # durable at commit
    with kd.Direct(str(m.mountpoint), verify=True) as d:
        for p, want in data.items():
            buf = bytearray(max(1, len(want)))
            assert d.read_into(str(p), buf) == len(want) and bytes(buf[: len(want)]) == want


def test_direct_write_refusals(make_mount, pool_config, monkeypatch):
    """Each block of a batch is refused on its own, with the errno a write through the mount
    would get; an allocation that runs out before its units are written is not committed,
    and its space goes back."""
    m = make_mount(pool_config(n=2, pool='max_block_size = "1MiB"'))
    mnt = m.mountpoint
    (mnt / "dir").mkdir()
    with kd.Direct(str(mnt)) as d:
        paths = [mnt / "ok", mnt / "nodir" / "x", mnt / "dir", mnt / "big", "/elsewhere/f"]
        bufs = [b"a" * 10, b"b", b"c", bytes(2 * MiB), b"d"]
        got = d.write_many([str(p) for p in paths], bufs, return_exceptions=True)
        want = [None, errno.ENOENT, errno.EISDIR, errno.EFBIG, errno.EXDEV]
        assert [e.errno if e else None for e in got] == want, got
        assert (mnt / "ok").read_bytes() == b"a" * 10 and not (mnt / "big").exists()
        with pytest.raises(IsADirectoryError):  # raised once the others are stored
            d.write_many([str(mnt / "dir"), str(mnt / "ok")], [b"x", b"y"])
        assert (mnt / "ok").read_bytes() == b"y"
    m.sync()  # (the replaced version's space back first)
    free = m.stats()["tiers"]["pool"]["free"]
    d = kd.Direct(str(mnt), ttl=0.3)
    real = d._write_unit

    def late(*args):
        wait_until(
            lambda: m.stats()["files"]["expired_allocations"] >= 1, 30, "the allocation to run out"
        )
        return real(*args)

    monkeypatch.setattr(d, "_write_unit", late)
    with pytest.raises(OSError) as e:
        d.write(str(mnt / "late"), os.urandom(MiB))
    assert e.value.errno == errno.ESTALE
    assert m.stats()["tiers"]["pool"]["free"] == free  # its space went back
    assert not (mnt / "late").exists()  # nothing was committed
    d.close()


def test_each_block_of_a_read_batch_succeeds_or_fails_alone(blocks):
    """One missing file, a directory, a buffer too small: errors of their own blocks, in
    their places; the others are read bit-exact. Without return_exceptions the first error
    is raised once every block was read."""
    m, data = blocks
    mnt = m.mountpoint
    (mnt / "dir").mkdir()
    paths = [str(p) for p in data]
    bufs = [bytearray(max(1, len(v))) for v in data.values()]
    odd = [str(mnt / "missing"), str(mnt / "dir"), paths[7]]
    with kd.Direct(str(mnt)) as d:
        got = d.read_many(
            paths + odd, bufs + [bytearray(1), bytearray(1), bytearray(10)], return_exceptions=True
        )
        assert got[: len(paths)] == [len(v) for v in data.values()]
        assert all(bytes(b[: len(v)]) == v for b, v in zip(bufs, data.values()))
        missing, a_dir, small = got[len(paths) :]
        assert isinstance(missing, FileNotFoundError) and missing.filename == odd[0]
        assert isinstance(a_dir, IsADirectoryError)
        assert isinstance(small, ValueError) and "smaller than" in str(small)
        infos = d.inspect(paths[:2] + odd[:1], ["user.none"])  # sizes, before the buffers
        assert [i.size for i in infos[:2]] == [len(v) for v in list(data.values())[:2]]
        assert infos[0].xattrs == {} and isinstance(infos[2], FileNotFoundError)
        bufs = [bytearray(len(data[mnt / n])) for n in ("b5.pt", "b6.pt")]
        with pytest.raises(FileNotFoundError):
            d.read_many([paths[5], odd[0], paths[6]], [bufs[0], bytearray(1), bufs[1]])
        assert bytes(bufs[0]) == data[mnt / "b5.pt"] and bytes(bufs[1]) == data[mnt / "b6.pt"]
    assert m.stats()["files"]["leases_held"] == 0


def test_a_client_outlives_a_restart_of_the_daemon(make_mount, pool_config):
    """A stop closes a client's idle connection and ends cleanly; the client's next batch
    finds the new daemon's socket through the mount and goes on."""
    m = make_mount(pool_config())
    p = str(m.mountpoint / "x")
    with kd.Direct(str(m.mountpoint)) as d:
        d.write(p, b"a" * 5000)
        before = m.stats()["direct"]["socket"]
        assert m.stop() == 0
        m.start()
        buf = bytearray(5000)
        assert d.read_into(p, buf) == 5000 and buf == b"a" * 5000
        d.write(p, b"b" * 10)
        assert m.stats()["direct"]["socket"] != before
    assert (m.mountpoint / "x").read_bytes() == b"b" * 10


def fuse_requests(m) -> collections.Counter:
    """FUSE requests the daemon answered so far, by operation."""
    return collections.Counter({op: v["count"] for op, v in m.stats()["latency"].items()})


def test_a_batch_costs_the_daemon_two_requests_each_way_whatever_its_size(make_mount, pool_config):
    """Storing N blocks is two requests on the direct socket (placements, commits) and loading
    them two more (leases and layouts, releases), for N = 1 as for N = 32; no FUSE request at
    all once the client has found the socket (one getxattr)."""
    m = make_mount(pool_config(n=2))
    mnt = m.mountpoint
    (mnt / "kv").mkdir()
    seen = {}
    with kd.Direct(str(mnt)) as d:
        d.write(str(mnt / "kv" / "first"), b"1")  # (the socket found: user.kvfs.direct)
        for n in (1, 32):
            paths = [str(mnt / "kv" / f"{n}-{i}") for i in range(n)]
            bufs = [os.urandom(64 * 1024) for _ in range(n)]
            before = m.stats()["direct"]["requests"]
            a = fuse_requests(m)
            b = fuse_requests(m)
            asking = b - a  # what a look at the statistics costs
            d.write_many(paths, bufs)
            out = [bytearray(64 * 1024) for _ in range(n)]
            assert d.read_many(paths, out) == [64 * 1024] * n and out == bufs
            c = fuse_requests(m)
            after = m.stats()["direct"]["requests"]
            fuse = sum(((c - b) - asking).values())
            seen[n] = (fuse, {k: after[k] - before.get(k, 0) for k in after})
    assert seen[1] == seen[32] == (0, {"alloc": 1, "commit": 1, "lease": 1, "release": 1}), seen


@pytest.fixture
def open_dir():
    """A directory every user may reach (a mount and namespaces another user's process uses)."""
    d = Path(tempfile.mkdtemp(prefix="kvfs-users-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def as_user(uid: int, fn):
    """fn() in a child process with another user's credentials (no supplementary groups);
    its result, through a pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # (the child: never returns to pytest)
        code = 0
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            out = {"result": fn()}
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            out, code = {"error": repr(e)}, 1
        os.write(w, json.dumps(out).encode())
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        raw = f.read()
    os.waitpid(pid, 0)
    out = json.loads(raw)
    assert "error" not in out, out["error"]
    return out["result"]


def test_another_users_batch_is_checked_as_the_mount_checks_it(open_dir, make_mount):
    """The daemon knows who asks from the socket (SO_PEERCRED) and checks each path for that
    user as the kernel would through the mount: another user reads what it may read and not
    a file of mode 0600, and writes into a directory it may write to (the file is its own)
    and not into root's. Without allow_other the socket refuses it, as the mount does."""
    nobody = 65534
    cfg = write_config(
        open_dir / "kvfs.toml",
        open_dir / "state",
        [{"path": str(open_dir / f"ns{i}.img"), "size": "64MiB"} for i in range(2)],
        mount="allow_other = true",
    )
    m = make_mount(cfg, name=str(open_dir / "mnt"))
    mnt = m.mountpoint
    for ns in open_dir.glob("ns*.img"):
        ns.chmod(0o666)  # (the other user reads and writes the namespaces itself)
    secret, public = os.urandom(70000), os.urandom(70000)
    (mnt / "secret").write_bytes(secret)
    (mnt / "secret").chmod(0o600)
    (mnt / "public").write_bytes(public)
    (mnt / "drop").mkdir()
    (mnt / "drop").chmod(0o777)

    def batch():
        with kd.Direct(str(mnt)) as d:
            bufs = [bytearray(70000), bytearray(70000)]
            read = d.read_many(
                [str(mnt / "secret"), str(mnt / "public")], bufs, return_exceptions=True
            )
            wrote = d.write_many(
                [str(mnt / "mine"), str(mnt / "drop" / "mine")],
                [b"no", b"yes"],
                return_exceptions=True,
            )
        return [
            [r if isinstance(r, int) else r.errno for r in read],
            bytes(bufs[1]) == public,
            [r.errno if r else 0 for r in wrote],
        ]

    assert as_user(nobody, batch) == [[errno.EACCES, 70000], True, [errno.EACCES, 0]]
    st = os.stat(mnt / "drop" / "mine")
    assert (st.st_uid, st.st_gid) == (nobody, nobody) and (
        mnt / "drop" / "mine"
    ).read_bytes() == b"yes"
    assert not (mnt / "mine").exists()

    # without allow_other: the socket's own refusal (the kernel keeps the user off the mount)
    m2 = make_mount(
        write_config(
            open_dir / "k2.toml",
            open_dir / "state2",
            [{"path": str(open_dir / "ns9.img"), "size": "64MiB"}],
        ),
        name=str(open_dir / "mnt2"),
    )
    where = json.loads(os.getxattr(m2.mountpoint, "user.kvfs.direct"))

    def connect():
        try:
            Channel(where["socket"].replace("@", "\0", 1), where["pid"])
        except OSError as e:
            return [e.errno, str(e)]
        return None

    code, why = as_user(nobody, connect)
    assert code == errno.EACCES and "allow_other" in why
    assert m2.stats()["direct"]["refused"] == 1


@requires_throttle
def test_a_stalled_namespace_costs_a_direct_reader_one_deadline(make_mount, tmp_path):
    """Issue 58, the direct path: a direct reader (reading the namespaces itself) whose read
    has no answer within the pool's read deadline tells the daemon, which checks that range
    itself and fails the namespace for reads; with `abandon` the reader has ReadTimeout at
    the deadline (its buffers held until the late reads end), and from then on the blocks on
    that namespace are not leased (ENOENT: a miss, at once) while the others read bit-exact.
    Healed, every block reads again."""
    import time

    from bench.faults import formatted, namespaces_of
    from testing.emulate import Emulation

    with Emulation("1g") as emu:
        devs = [emu.loop(f"d{i}", 96 * MiB) for i in range(2)]
        m = make_mount(formatted(tmp_path, [d.path for d in devs], pool='stripe_unit = "256KiB"'))
        data = {f"b{i}": os.urandom(2 * MiB) for i in range(3)}
        data.update({f"s{i}": os.urandom(128 * 1024) for i in range(4)})
        for name, d in data.items():
            (m.mountpoint / name).write_bytes(d)
        m.sync()
        paths = {n: str(m.mountpoint / n) for n in data}
        on1 = {n for n in data if 1 in namespaces_of(m.mountpoint / n)}
        off1 = set(data) - on1
        assert on1 >= {"b0", "b1", "b2"} and off1, (on1, off1)
        group = emu.cgroup("kvfs-direct-stall")
        group.limit(devs[1], read_bps=4096)
        group.add(os.getpid())  # (this process reads the namespaces)
        group.add(m.pid)  # (and the daemon, which checks what it says)
        bufs = {n: np.zeros(len(d), np.uint8) for n, d in data.items()}
        r = kd.Direct(str(m.mountpoint))
        try:
            t0 = time.monotonic()
            with pytest.raises(kd.ReadTimeout) as e:
                r.read_many([paths["b0"]], [bufs["b0"]], abandon=True)
            took = time.monotonic() - t0
            assert 2.0 <= took <= 2.0 + 2 * MiB / 64e6 + 0.5, took
            assert e.value.errno == errno.ETIMEDOUT and e.value.pending
            # the daemon checks it (one more deadline), then refuses leases of its blocks
            wait_until(
                lambda: m.stats()["namespaces"][1]["read_state"] == "failed", 10, "the check"
            )
            for n in sorted(on1):
                t = time.monotonic()
                with pytest.raises(FileNotFoundError):
                    r.read_into(paths[n], bufs[n])
                assert time.monotonic() - t < 0.1, n
            for n in sorted(off1):
                assert r.read_into(paths[n], bufs[n]) == len(data[n])
                assert bufs[n].tobytes() == data[n], n
        finally:
            group.limit(devs[1])
            group.release(os.getpid())
            group.remove()  # (the daemon too)
        ended = []
        e.value.on_end(lambda: ended.append(1))
        wait_until(lambda: ended, 30, "the late read to end")
        wait_until(lambda: m.stats()["namespaces"][1]["read_state"] == "ok", 15, "the heal")
        for n in sorted(data):
            assert r.read_into(paths[n], bufs[n]) == len(data[n])
            assert bufs[n].tobytes() == data[n], n
        r.close()


def test_a_name_stored_directly_opens_at_once_through_the_mount(make_mount, pool_config):
    """A direct commit returns once the kernel has forgotten what it cached of the names it
    made or replaced: an open through the mount right after finds the new file, never the
    replaced inode (ENOENT: deleted behind the kernel's back) nor a cached "no such file"."""
    m = make_mount(pool_config(n=2))
    mnt = m.mountpoint
    with kd.Direct(str(mnt)) as d:
        for i in range(40):
            p = mnt / f"b{i % 4}"
            with contextlib.suppress(FileNotFoundError):
                p.read_bytes()  # (the kernel caches the name: the old file, or its absence)
            d.write_many([str(p)], [b"%d" % i * 100])
            assert p.read_bytes() == b"%d" % i * 100, i
