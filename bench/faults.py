#!/usr/bin/env python3
"""Faults injected into a running (or stopped) kvfs, and what each one shows.

Every scenario sets up its own pool (loop devices or files on a private tmpfs), injects one
fault, and reports: the errno the client got, the daemon's log lines that name the problem,
whether the blocks the fault does not touch still read back bit-exact, whether the daemon
still serves (stat, listdir, a new file written and read back cold), what `kvfs doctor` says
(on the mount, or with --config while it is down), and whether a remount recovers.

  shrink_mid_write   a namespace (loop device) ends at 1 MiB while a close() commits to it
  shrink_mid_read    the same while a cold read fetches from it
  detached           losetup -d of a namespace while mounted (the kernel defers it to the
                     last close: the next mount finds no device), then attached again
  enospc_lru         8 writers fill a small pool that keeps evicting (evict = "lru")
  enospc_never       the same with evict = "never": the losers get ENOSPC
  state_dir_full     the state_dir's filesystem (a 2 MiB tmpfs) fills up
  slow_namespace     one namespace throttled to an eighth of the others' bandwidth
  fill_one           one namespace's backing tmpfs fills while writers fsync, then heals
  fill_all           every namespace's backing tmpfs fills (write-backs fail), then heals
  stall              one namespace throttled to 4 KiB/s for 7 s while writers fsync
  stall_read         readers load blocks cold while one namespace is throttled to 4 KiB/s
                     for 10 s: each load waits the read deadline at most, then fails at once
  lost_namespace     the same while one namespace ends at 1 MiB (I/O past it fails), then
                     comes back
  remove_namespace   the same, but it does not come back: `kvfs pool remove` takes it out
                     while the readers run, and a restart finds its device detached
  stop_after_close   SIGTERM right after close(), before the kernel's RELEASE
  torn_superblock    bytes of a namespace's first 4 KiB overwritten while unmounted
  truncated_wal      catalog.sqlite-wal truncated while unmounted, after a kill -9

    python bench/faults.py [--only NAME ...] [--json]

tests/mounted/test_faults.py runs the same scenarios and asserts on their reports.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import dumps, parse, parser  # noqa: E402
from testing.emulate import Emulation  # noqa: E402
from testing.mount import ROOT, MountedKvfs, wait_until, write_config  # noqa: E402

MiB = 1 << 20


# --- what every scenario observes ---------------------------------------------------------------
def ename(e: OSError | None) -> str | None:
    return None if e is None else errno.errorcode.get(e.errno, str(e.errno))


def log_lines(m: MountedKvfs, *needles: str) -> list[str]:
    """The daemon's WARNING/ERROR lines that contain every needle."""
    try:
        text = m.log.read_text(errors="replace")
    except OSError:
        return []
    return [
        ln
        for ln in text.splitlines()
        if (" ERROR " in ln or " WARNING " in ln) and all(n in ln for n in needles)
    ]


def doctor(mount: Path | None = None, config: Path | None = None) -> list[str]:
    """kvfs doctor's fail and warn findings, as 'STATUS check: detail' lines."""
    cmd = [sys.executable, "-m", "kvfs", "doctor", "--json"]
    if mount is not None:
        cmd.append(str(mount))
    if config is not None:
        cmd += ["--config", str(config)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    try:
        found = json.loads(r.stdout)["findings"]
    except (ValueError, KeyError):
        return [f"FAIL doctor: no report ({r.returncode}): {r.stderr.strip()[-300:]}"]
    return [
        f"{f['status'].upper()} {f['check']}: {f['detail']}"
        for f in found
        if f["status"] in ("fail", "warn")
    ]


def serving(m: MountedKvfs, name: str = "probe") -> bool:
    """Does the daemon still answer metadata, and write and read back a new file cold?"""
    try:
        os.stat(m.mountpoint)
        os.listdir(m.mountpoint)
        data = os.urandom(3 * MiB)
        (m.mountpoint / name).write_bytes(data)
        m.drop_caches()
        return (m.mountpoint / name).read_bytes() == data
    except OSError:
        return False


def read_errno(path: Path, data: bytes | None = None) -> str | None:
    """None if the file reads back (bit-exact when `data` is given), else the errno (or
    'WRONG' for wrong bytes)."""
    try:
        got = path.read_bytes()
    except OSError as e:
        return ename(e)
    return None if data is None or got == data else "WRONG"


def namespaces_of(path: Path) -> set[int]:
    lay = json.loads(os.getxattr(path, "user.kvfs.layout"))
    return {u[0] for u in lay["unit_map"]}


def formatted(
    tmp: Path,
    paths: list[str],
    *,
    dram: str = "64MiB",
    pool: str = "",
    extra: str = "",
    queue_depth: int | None = None,
) -> Path:
    from kvfs.cli import main as kvfs_main

    nss = [
        {"path": p} if queue_depth is None else {"path": p, "queue_depth": queue_depth}
        for p in paths
    ]
    cfg = write_config(tmp / "k.toml", tmp / "state", nss, dram=dram, pool=pool, extra=extra)
    with contextlib.redirect_stdout(io.StringIO()):
        assert kvfs_main(["format", "--config", str(cfg)]) == 0
    return cfg


def singles(m: MountedKvfs, n: int = 6) -> dict[str, bytes]:
    """Small files, one stripe unit each (the start namespace rotates)."""
    out = {}
    for i in range(n):
        out[f"s{i}"] = os.urandom(4096 + i)
        (m.mountpoint / f"s{i}").write_bytes(out[f"s{i}"])
    m.sync()  # in the pool (durability "fsync": written back now)
    return out


def start(tmp: Path, cfg: Path) -> MountedKvfs:
    return MountedKvfs(tmp / "mnt", cfg, tmp / "kvfs.log").start()


# --- a namespace that goes away mid-write or mid-read ------------------------------------------
_COPY = """
import os, sys
try:
    data = open(sys.argv[1], "rb").read()
    with open(sys.argv[2], "wb") as f:
        f.write(data)             # passthrough: into memory
        f.flush()
        os.fsync(f.fileno())      # the commit (close, with durability "close")
except OSError as e:
    print(e.errno)
    sys.exit(1)
"""


def shrink(tmp: Path, phase: str) -> dict:
    """A namespace ends (its loop device's size limit drops to 1 MiB) while a commit writes to
    it or a cold read fetches from it; it comes back whole for the remount (every byte written
    before the end is there: the backing file is never cut, as it was when this scenario
    truncated it and copied a saved image back, which lost the writes that landed between the
    copy and the cut - a device losing acknowledged writes, not a path that dropped)."""
    with Emulation("2g") as emu:
        devs = [emu.loop(f"ns{i}", 160 * MiB) for i in range(3)]
        # one I/O at a time per namespace: I/Os the kernel already queued when the device
        # shrinks still land (the loop driver extends its file again), later ones fail
        cfg = formatted(tmp, [d.path for d in devs], dram="128MiB", queue_depth=1)
        m = start(tmp, cfg)
        try:
            small = singles(m)
            big = os.urandom(64 * MiB)
            if phase == "read":
                (m.mountpoint / "big").write_bytes(big)
                m.sync()
                m.drop_caches()
            group = emu.cgroup("kvfs-fault")
            for d in devs:  # about 2 s for the big block's I/O
                group.limit(d, read_bps=12e6, write_bps=12e6)
            group.add(m.pid)
            key = "bytes_written" if phase == "write" else "bytes_read"

            def moved() -> int:  # bytes the namespaces moved (counted per I/O)
                return sum(n[key] for n in m.stats()["namespaces"])

            before = moved()
            got: dict = {}

            def client() -> None:
                try:
                    if phase == "write":
                        # in its own process: a fork+exec here (losetup, below) would close
                        # a copy of the writer's descriptor in the child, which is a FUSE
                        # flush - a close() - of a file still being written
                        src = tmp / "big.src"
                        src.write_bytes(big)
                        r = subprocess.run(
                            [sys.executable, "-c", _COPY, str(src), str(m.mountpoint / "big")],
                            capture_output=True,
                            text=True,
                        )
                        if r.returncode:
                            raise OSError(int(r.stdout.strip() or errno.EIO), r.stderr.strip())
                    else:
                        got["data"] = (m.mountpoint / "big").read_bytes()
                    got["errno"] = None
                except OSError as e:
                    got["errno"] = ename(e)

            t = threading.Thread(target=client)
            t.start()
            wait_until(
                lambda: moved() > before + 2 * MiB or not t.is_alive(),
                60,
                f"the {phase} to reach the namespaces",
            )
            in_flight = t.is_alive()
            devs[1].end_at(MiB)
            t.join(120)
            group.remove()
            out = {
                "scenario": f"shrink_mid_{phase}",
                "client_errno": got.get("errno"),
                "in_flight_when_shrunk": in_flight,
            }
            out["log"] = log_lines(m, "marking the namespace failed")
            m.drop_caches()
            affected = {}
            for name, data in small.items():
                on_ns1 = 1 in namespaces_of(m.mountpoint / name)
                affected[name] = {
                    "on_failed_namespace": on_ns1,
                    "read": read_errno(m.mountpoint / name, data),
                }
            out["small_files"] = affected
            out["others_ok"] = all(
                v["read"] is None for v in affected.values() if not v["on_failed_namespace"]
            )
            out["affected_fail_with"] = sorted(
                {v["read"] for v in affected.values() if v["on_failed_namespace"]} - {None}
            )
            out["namespace_states"] = [n["state"] for n in m.stats()["namespaces"]]
            out["log_ok_again"] = log_lines(m, "I/O succeeds again")
            out["serving"] = serving(m, "after")
            out["doctor"] = doctor(m.mountpoint)
            m.stop()
            devs[1].end_at(None)  # the device comes back
            m.start()
            m.drop_caches()
            out["after_remount"] = {
                "namespace_states": [n["state"] for n in m.stats()["namespaces"]],
                "small_files": {n: read_errno(m.mountpoint / n, d) for n, d in small.items()},
                "big": read_errno(m.mountpoint / "big", big)
                if (m.mountpoint / "big").exists()
                else "ENOENT",
                "after": read_errno(m.mountpoint / "after"),
            }
            ar = out["after_remount"]
            out["recovered"] = (
                all(s == "ok" for s in ar["namespace_states"])
                and all(v is None for v in ar["small_files"].values())
                and ar["after"] is None
                and (ar["big"] is None if phase == "read" else ar["big"] in (None, "ENOENT"))
            )
            return out
        finally:
            m.stop()


def shrink_mid_write(tmp: Path) -> dict:
    return shrink(tmp, "write")


def shrink_mid_read(tmp: Path) -> dict:
    return shrink(tmp, "read")


def detached(tmp: Path) -> dict:
    """losetup -d while kvfs holds the device: deferred by the kernel until the last close,
    so I/O goes on; the next mount finds the node without a device."""
    with Emulation("1g") as emu:
        devs = [emu.loop(f"ns{i}", 96 * MiB) for i in range(2)]
        cfg = formatted(tmp, [d.path for d in devs])
        m = start(tmp, cfg)
        try:
            data = os.urandom(6 * MiB)
            (m.mountpoint / "f").write_bytes(data)
            devs[1].detach()
            m.drop_caches()
            out = {
                "scenario": "detached",
                "read_while_mounted": read_errno(m.mountpoint / "f", data),
                "serving": serving(m),
            }
            m.stop()
            (tmp / "mnt2").mkdir()
            r = subprocess.run(
                [sys.executable, "-m", "kvfs", "mount", str(tmp / "mnt2"), "--config", str(cfg)],
                capture_output=True,
                text=True,
                cwd=ROOT,
                timeout=120,
            )
            out["remount_status"] = r.returncode
            out["remount_error"] = r.stderr.strip()
            out["doctor"] = doctor(config=cfg)
            subprocess.run(["losetup", devs[1].path, str(devs[1].backing)], check=True)
            m.start()
            m.drop_caches()
            out["recovered"] = read_errno(m.mountpoint / "f", data) is None
            return out
        finally:
            m.stop()


# --- a full pool: writers racing eviction ---------------------------------------------------------
def enospc(tmp: Path, evict: str, writers: int = 8, files: int = 24) -> dict:
    cfg = write_config(
        tmp / "k.toml",
        tmp / "state",
        [{"path": str(tmp / f"ns{i}.img"), "size": "24MiB"} for i in range(2)],
        dram="16MiB",
        pool=f'evict = "{evict}"',
    )
    m = start(tmp, cfg)
    try:
        errors: dict[str, int] = {}
        closed: dict[str, bytes] = {}
        lock = threading.Lock()

        def writer(w: int) -> None:
            for i in range(files):
                name = f"w{w}-{i}"
                data = os.urandom(3 * MiB + 4096 * w)
                try:
                    with open(m.mountpoint / name, "wb") as f:
                        f.write(data)
                    with lock:
                        closed[name] = data
                except OSError as e:
                    with lock:
                        errors[ename(e)] = errors.get(ename(e), 0) + 1

        ts = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        m.sync()  # (durability "fsync": what closed is written back, its space used)
        st = m.stats()["tiers"]["pool"]
        m.drop_caches()
        present = os.listdir(m.mountpoint)
        reads: dict[str, int] = {}
        for n in present:
            if n in closed:
                r = read_errno(m.mountpoint / n, closed[n])
                reads[r or "ok"] = reads.get(r or "ok", 0) + 1
        # a new file whose write or commit failed is gone (not an empty or partial file)
        failed_present = sorted(n for n in present if n not in closed)
        out = {
            "scenario": f"enospc_{evict}",
            "writes": writers * files,
            "closed_ok": len(closed),
            "client_errnos": errors,
            "evictions": st["evictions"],
            "reserved_after": st["reserved"],
            "used_after": st["used"],
            "capacity": st["capacity"],
            "present": len(present),
            "reads_of_present": reads,
            "failed_present": failed_present,
            "log": log_lines(m, "pool is full")[:3] + log_lines(m, "Traceback"),
            "traceback": "Traceback" in m.log.read_text(errors="replace"),
        }
        if evict == "never":  # a full pool is the point: make room first
            for n in present:
                if n not in closed and n.startswith("w"):
                    os.unlink(m.mountpoint / n)
            victim = next(iter(closed))
            os.unlink(m.mountpoint / victim)
            del closed[victim]
        out["serving"] = serving(m)
        out["doctor"] = doctor(m.mountpoint)
        m.stop()
        m.start()
        out["recovered"] = all(
            read_errno(m.mountpoint / n, closed[n]) is None
            for n in os.listdir(m.mountpoint)
            if n in closed
        )
        return out
    finally:
        m.stop()


def enospc_lru(tmp: Path) -> dict:
    return enospc(tmp, "lru")


def enospc_never(tmp: Path) -> dict:
    return enospc(tmp, "never")


# --- the state_dir's disk fills up ------------------------------------------------------------
def state_dir_full(tmp: Path) -> dict:
    sd = tmp / "state"
    sd.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "kvfs-fault-sd", str(sd)], check=True)
    try:
        cfg = write_config(
            tmp / "k.toml", sd, [{"path": str(tmp / "ns0.img"), "size": "64MiB"}], dram="32MiB"
        )
        m = start(tmp, cfg)
        try:
            before = {f"b{i}": os.urandom(100_000 + i) for i in range(3)}
            for n, d in before.items():
                (m.mountpoint / n).write_bytes(d)
            m.sync()  # (durability "fsync": committed before the disk fills)
            with open(sd / "filler", "wb") as f:  # the disk fills up
                with contextlib.suppress(OSError):
                    while True:
                        f.write(bytes(65536))
                        f.flush()
            out = {"scenario": "state_dir_full", "durability": m.durability}
            # a writer that wants its file durable asks for it (fsync; close commits too with
            # durability "close"), and a mkdir is durable once the directory is fsync'd
            try:
                with open(m.mountpoint / "new", "wb") as f:
                    f.write(os.urandom(5000))
                    f.flush()
                    os.fsync(f.fileno())
                out["client_errno"] = None
            except OSError as e:
                out["client_errno"] = ename(e)
            try:
                os.mkdir(m.mountpoint / "dir")
                m.sync()
                out["mkdir_errno"] = None
            except OSError as e:
                out["mkdir_errno"] = ename(e)
            out["dir_exists"] = (m.mountpoint / "dir").exists()
            out["new_file_reads"] = read_errno(m.mountpoint / "new")
            out["log"] = log_lines(m, "catalog", "a write failed")
            m.drop_caches()
            out["others_ok"] = all(
                read_errno(m.mountpoint / n, d) is None for n, d in before.items()
            )
            out["serving_reads"] = bool(os.listdir(m.mountpoint))
            out["catalog_error"] = m.stats()["catalog"]["error"]
            out["doctor"] = doctor(m.mountpoint)
            (sd / "filler").unlink()  # space again: a remount recovers
            m.stop()
            m.start()
            out["after_remount"] = {
                "files": sorted(os.listdir(m.mountpoint)),
                "before_ok": all(
                    read_errno(m.mountpoint / n, d) is None for n, d in before.items()
                ),
            }
            out["recovered"] = out["after_remount"]["before_ok"] and serving(m)
            return out
        finally:
            m.stop()
    finally:
        subprocess.run(["umount", "-l", str(sd)], capture_output=True)


# --- a slow namespace ----------------------------------------------------------------------------
def slow_namespace(tmp: Path) -> dict:
    # slow, not stalled: readers wait for it here (read_timeout_ms 60 s; with the default 2 s
    # a read queued behind others at 1 MB/s is past its deadline, and the namespace failed
    # for reads: a miss, as `stall_read` shows)
    with Emulation("1g") as emu:
        devs = [emu.loop(f"ns{i}", 128 * MiB) for i in range(4)]
        cfg = formatted(
            tmp,
            [d.path for d in devs],
            pool='stripe_unit = "256KiB"\nread_timeout_ms = 60000',
            dram="32MiB",
        )
        m = start(tmp, cfg)
        try:
            group = emu.cgroup("kvfs-slow")
            for i, d in enumerate(devs):
                bps = 6e6 if i == 3 else 48e6
                group.limit(d, read_bps=bps, write_bps=bps)
            group.add(m.pid)
            blocks = {}
            errs = []
            for i in range(24):
                blocks[f"b{i}"] = os.urandom(4 * MiB)
                try:
                    (m.mountpoint / f"b{i}").write_bytes(blocks[f"b{i}"])
                except OSError as e:
                    errs.append(ename(e))
            # a cold read that waits on the slow namespace (slower still now: 1 MB/s) does
            # not stall other requests
            slow = next(n for n in blocks if 3 in namespaces_of(m.mountpoint / n))
            (m.mountpoint / "small").write_bytes(b"s" * 4096)
            m.drop_caches()
            group.limit(devs[3], read_bps=1e6, write_bps=6e6)
            done = threading.Event()
            slow_read: list = []

            def read_slow() -> None:
                slow_read.append(read_errno(m.mountpoint / slow, blocks[slow]))
                done.set()

            t = threading.Thread(target=read_slow)
            t.start()
            served = 0
            while not done.is_set() and served < 5:
                os.stat(m.mountpoint / "small")
                os.listdir(m.mountpoint)
                served += 1
            slow_read_finished_first = done.is_set()
            t.join(120)
            group.limit(devs[3], read_bps=6e6, write_bps=6e6)
            m.drop_caches()
            bad = [n for n, d in blocks.items() if read_errno(m.mountpoint / n, d) is not None]
            st = m.stats()
            out = {
                "scenario": "slow_namespace",
                "client_errnos": errs,
                "bad_reads": bad,
                "served_during_slow_read": served,
                "slow_read": slow_read[0] if slow_read else "unfinished",
                "slow_read_finished_first": slow_read_finished_first,
                "placement_weights": st["tiers"]["pool"]["placement_weights"],
                "rate_mbps": [round(n["rate_bps"] / 1e6, 1) for n in st["namespaces"]],
                "namespace_states": [n["state"] for n in st["namespaces"]],
                "doctor": doctor(m.mountpoint),
                "serving": serving(m),
            }
            group.remove()
            m.stop()
            m.start()
            out["doctor_after_remount"] = doctor(m.mountpoint)
            out["recovered"] = all(
                read_errno(m.mountpoint / n, d) is None for n, d in blocks.items()
            )
            return out
        finally:
            m.stop()


# --- a device that fills or stalls, and heals, while writers want their files durable -----------
KiB = 1 << 10
FAULT_SECONDS = 12.0  # how long a stall lasts (a fill lasts until the writers are done):
# longer than the I/O deadline (io_timeout_ms, 5 s)


def _durable_write(path: Path, data: bytes, calls: list) -> str | None:
    """Write, fsync and close a file as an engine that wants it durable does; the errno of
    the first call that failed (None: durable), and each call's time in `calls`."""
    t = time.monotonic()
    try:
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return None
    except OSError as e:
        return ename(e)
    finally:
        calls.append(time.monotonic() - t)


def _fsync_errno(fd: int, calls: list) -> str | None:
    t = time.monotonic()
    try:
        os.fsync(fd)
        return None
    except OSError as e:
        return ename(e)
    finally:
        calls.append(time.monotonic() - t)


def _settled(m: MountedKvfs) -> bool:
    wb = m.stats().get("writeback")
    return wb is None or wb["queued"] == 0 and wb["inflight"] == 0


def device_fault(tmp: Path, kind: str) -> dict:
    """A real device fault while writers store files and fsync them, then the fault heals:

      fill_one   namespace 1's backing tmpfs fills (its loop device fails writes with EIO):
                 what was placed there is written to the other namespaces instead
      fill_all   the tmpfs under every namespace fills: write-backs fail, and fsync must say
                 so (errseq: a descriptor open across the failure, and a new opener)
      stall      namespace 1 throttled to 4 KiB/s for FAULT_SECONDS

    Reports daemon_deaths, durable_lost (a file whose fsync returned 0 that does not read back
    bit-exact, live or after a remount), wrong_reads (a file that reads as neither what was
    written nor what it held before, nor absent where its fsync failed),
    fsync_ok_after_failed_writeback (an fsync that returned 0 while the file held its
    previous version after its write-back failed), recovery_s (the fault healed -> a new
    file written, fsync'd and read back cold) and longest_call_s."""
    with Emulation("2g") as emu:
        shared = (
            emu.tmpfs("small", "200m" if kind == "fill_one" else "420m")
            if kind.startswith("fill")
            else None
        )
        roots = {"fill_one": [None, shared, None], "fill_all": [shared] * 3}.get(kind, [None] * 3)
        devs = [emu.loop(f"ns{i}", 128 * MiB, roots[i]) for i in range(3)]
        cfg = formatted(tmp, [d.path for d in devs], dram="96MiB", pool='stripe_unit = "256KiB"')
        m = start(tmp, cfg)
        out: dict = {"scenario": kind, "durability": m.durability}
        calls: list[float] = []
        expect: dict[str, bytes] = {}  # what an fsync returned 0 for
        before: dict[str, bytes] = {}  # what a file held before the fault
        failed: dict[str, bytes] = {}  # written during the fault, fsync failed
        try:
            for i in range(6):
                data = os.urandom(256 * KiB + i)
                assert _durable_write(m.mountpoint / f"pre{i}", data, calls) is None
                expect[f"pre{i}"] = before[f"pre{i}"] = data
            probes_old = {p: os.urandom(300 * KiB) for p in ("probe_a", "probe_b")}
            for p, d in probes_old.items():
                assert _durable_write(m.mountpoint / p, d, calls) is None
                expect[p] = before[p] = d
            pid = m.pid
            group = timer = None
            healed_at: list[float] = []
            if kind == "stall":
                group = emu.cgroup("kvfs-stall")
                group.limit(devs[1], write_bps=4096)
                group.add(pid)

                def heal() -> None:
                    group.remove()
                    healed_at.append(time.monotonic())

                timer = threading.Timer(FAULT_SECONDS, heal)
                timer.start()
            else:
                emu.fill(shared)
            fault_at = time.monotonic()
            # the errseq probes: two files rewritten and closed without fsync (durability
            # "fsync": written back later); probe_a then opened for reading before its
            # write-back (open across a failure of it), probe_b by nobody
            probes_new = {p: os.urandom(300 * KiB) for p in probes_old}
            closes = {}
            for p, d in probes_new.items():
                t = time.monotonic()
                try:
                    (m.mountpoint / p).write_bytes(d)
                    closes[p] = None
                except OSError as e:
                    closes[p] = ename(e)
                calls.append(time.monotonic() - t)
            across = os.open(m.mountpoint / "probe_a", os.O_RDONLY)
            errs: dict[str, str] = {}
            lock = threading.Lock()

            def writer(w: int) -> None:
                for i in range(8):
                    name = f"w{w}-{i}"
                    data = os.urandom((4 * MiB if i % 4 == 3 else 256 * KiB) + i)
                    e = _durable_write(m.mountpoint / name, data, calls)
                    with lock:
                        if e is None:
                            expect[name] = data
                        else:
                            failed[name] = data
                            errs[name] = e

            threads = [threading.Thread(target=writer, args=(w,)) for w in range(2)]
            for th in threads:
                th.start()
            for th in threads:
                th.join(300)
            with contextlib.suppress(TimeoutError):
                wait_until(lambda: _settled(m), 60, "write-back to settle")
            out["writer_errnos"] = sorted(set(errs.values()))
            out["writes_failed"] = len(errs)
            out["writes_durable"] = sum(1 for n in expect if n.startswith("w"))
            # what the probes hold now, and what fsync says of them: an fsync that returns 0
            # while its file silently lost what a close() returned 0 for is the lie Linux's
            # errseq rules out (for the descriptor open across, and for the first opener of
            # a file whose failure nobody has seen)
            out["probes"] = {}
            out["fsync_ok_after_failed_writeback"] = 0
            for p in probes_new:
                now_new = read_errno(m.mountpoint / p, probes_new[p]) is None
                if p == "probe_a":
                    fd = across
                else:
                    fd = os.open(m.mountpoint / p, os.O_RDONLY)
                got = _fsync_errno(fd, calls)
                os.close(fd)
                out["probes"][p] = {"close": closes[p], "reads_new": now_new, "fsync": got}
                if not now_new and closes[p] is None and got is None:
                    out["fsync_ok_after_failed_writeback"] += 1
                if now_new:
                    expect[p] = probes_new[p]
            out["namespace_states_in_fault"] = [n["state"] for n in m.stats()["namespaces"]]
            out["fault_seconds"] = round(time.monotonic() - fault_at, 2)
            # the fault heals
            if timer is not None:
                timer.join()
                healed = healed_at[0]
            else:
                emu.heal(shared)
                healed = time.monotonic()
            out["recovery_s"] = None
            for i in range(200):
                data = os.urandom(256 * KiB)
                name = f"rec{i}"
                if _durable_write(m.mountpoint / name, data, calls) is None:
                    expect[name] = data
                    m.drop_caches()
                    if read_errno(m.mountpoint / name, data) is None:
                        out["recovery_s"] = round(time.monotonic() - healed, 2)
                        break
                if time.monotonic() - healed > 30:
                    break
                time.sleep(0.1)
            # every namespace in use again (placement tries a failed one after a while)
            out["all_ok_s"] = None
            t0 = time.monotonic()
            while time.monotonic() - t0 < 30:
                if all(n["state"] == "ok" for n in m.stats()["namespaces"]):
                    out["all_ok_s"] = round(time.monotonic() - healed, 2)
                    break
                for i in range(3):
                    _durable_write(m.mountpoint / "again", os.urandom(256 * KiB), calls)
                time.sleep(0.2)
            out["daemon_deaths"] = 0 if m.proc.poll() is None else 1
            out["longest_call_s"] = round(max(calls), 2)
            out["io_timeout_s"] = 5.0  # (the default: not set in this config)
            out["timeouts"] = [n["timeouts"] for n in m.stats()["namespaces"]]

            def check() -> tuple[list[str], list[str]]:
                m.drop_caches()
                lost, wrong = [], []
                for name, data in expect.items():
                    got = read_errno(m.mountpoint / name, data)
                    if got is not None and not (
                        name in probes_new
                        and read_errno(m.mountpoint / name, probes_new[name]) is None
                    ):
                        lost.append(f"{name}: {got}")
                for name, data in failed.items():
                    p = m.mountpoint / name
                    if p.exists() and read_errno(p, data) is not None:
                        wrong.append(name)
                return lost, wrong

            lost, wrong = check()
            out["exit_status"] = m.stop()
            m.start()
            lost2, wrong2 = check()
            out["durable_lost"] = sorted(set(lost) | set(lost2))
            out["wrong_reads"] = sorted(set(wrong) | set(wrong2))
            out["serving"] = serving(m)
            return out
        finally:
            m.stop()


# --- reads under faults: a namespace stalls, or is lost, while readers load blocks cold -----------
READ_FAULT_SECONDS = 10.0  # how long a read stall lasts: longer than the read deadline


def _load(path: Path, data: bytes) -> tuple[str | None, float, float]:
    """Open and read a file whole, as an engine loads a block: (None, 'WRONG' or the errno,
    seconds in open, seconds in the reads)."""
    t0 = time.monotonic()
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        return ename(e), time.monotonic() - t0, 0.0
    t1 = time.monotonic()
    try:
        parts = []
        while chunk := os.read(fd, 4 * MiB):
            parts.append(chunk)
        got = None if b"".join(parts) == data else "WRONG"
    except OSError as e:
        got = ename(e)
    finally:
        os.close(fd)
    return got, t1 - t0, time.monotonic() - t1


def _reader(m, blocks: dict, r: int, stop, calls: list, lock, *, cold: bool = False) -> None:
    """A reader thread of the read-fault scenarios: loads the blocks in turn (starting at
    the r-th) until `stop`, each load's (start, name, _load's answer, open s, read s) added
    to `calls`; with `cold`, the DRAM tier dropped after each."""
    names = sorted(blocks)
    i = r
    while not stop.is_set():
        name = names[i % len(names)]
        i += 1
        t = time.monotonic()
        got, t_open, t_read = _load(m.mountpoint / name, blocks[name])
        with lock:
            calls.append((t, name, got, t_open, t_read))
        if cold:
            with contextlib.suppress(OSError):
                m.control("drop_dram")


def read_fault(tmp: Path, kind: str) -> dict:
    """Readers load blocks cold (the DRAM tier dropped every second) while namespace 1

      stall_read       is throttled to 4 KiB/s for READ_FAULT_SECONDS, then heals
      lost_namespace   ends at 1 MiB (I/O past it fails) for READ_FAULT_SECONDS, then comes
                       back (the operator's fix: the path is back)

    Reports longest_open_s and longest_read_s (any load during the fault),
    fast_fail_ms (p99 of the loads that failed once namespace 1 was failed for reads, or
    for `lost_namespace` failed), the errnos loads got (`errnos`), wrong_reads (a load
    that returned bytes other than the block's), others_failed (loads of blocks with no
    unit on namespace 1 that failed: must be 0), daemon_deaths, recovery_s (healed -> every
    block loads bit-exact cold) and durable_lost (blocks that do not read back bit-exact
    after the fault, live or after a remount)."""
    with Emulation("1g") as emu:
        devs = [emu.loop(f"ns{i}", 128 * MiB) for i in range(3)]
        cfg = formatted(tmp, [d.path for d in devs], dram="96MiB", pool='stripe_unit = "256KiB"')
        m = start(tmp, cfg)
        out: dict = {"scenario": kind, "read_timeout_s": 2.0}  # (the default)
        try:
            blocks = {f"s{i}": os.urandom(200 * KiB + i) for i in range(12)}
            blocks.update({f"b{i}": os.urandom(2 * MiB + 4096 * i) for i in range(6)})
            for name, data in blocks.items():
                (m.mountpoint / name).write_bytes(data)
            m.sync()
            on1 = {n for n in blocks if 1 in namespaces_of(m.mountpoint / n)}
            m.drop_caches()
            group = None
            if kind == "stall_read":
                group = emu.cgroup("kvfs-rstall")
                group.limit(devs[1], read_bps=4096)
                group.add(m.pid)
            else:
                devs[1].end_at(1 * MiB)
            fault_at = time.monotonic()
            calls: list[tuple[float, str, str | None, float, float]] = []
            lock = threading.Lock()
            stop = threading.Event()

            def cold() -> None:
                while not stop.wait(1.0):
                    with contextlib.suppress(OSError):
                        m.control("drop_dram")

            threads = [
                threading.Thread(target=_reader, args=(m, blocks, r, stop, calls, lock))
                for r in range(2)
            ]
            threads.append(threading.Thread(target=cold))
            for th in threads:
                th.start()
            time.sleep(READ_FAULT_SECONDS)
            states = m.stats()["namespaces"]
            out["read_states_in_fault"] = [n["read_state"] for n in states]
            out["states_in_fault"] = [n["state"] for n in states]
            out["doctor_in_fault"] = doctor(m.mountpoint)
            if group is not None:  # healed: the limit lifted (what it queued goes on)
                group.limit(devs[1], read_bps=0)
                group.remove()
            else:
                devs[1].end_at(None)
            healed = time.monotonic()
            stop.set()
            for th in threads:
                th.join(120)
            during = [c for c in calls if c[0] < healed]
            out["loads"] = len(during)
            out["errnos"] = sorted({c[2] for c in during if c[2] not in (None, "WRONG")})
            out["wrong_reads"] = sorted({c[1] for c in during if c[2] == "WRONG"})
            out["others_failed"] = sum(1 for c in during if c[1] not in on1 and c[2] is not None)
            out["longest_open_s"] = round(max((c[3] for c in during), default=0.0), 3)
            out["longest_read_s"] = round(max((c[4] for c in during), default=0.0), 3)
            # once a load on namespace 1 failed, every later failure must be fast
            first = min((c[0] + c[3] + c[4] for c in during if c[2] is not None), default=None)
            fast = sorted((c[3] + c[4]) * 1000 for c in during if first and c[0] > first and c[2])
            out["failed_loads_after_first"] = len(fast)
            out["fast_fail_ms"] = round(fast[int(0.99 * (len(fast) - 1))], 2) if fast else None
            out["fast_fail_p50_ms"] = round(fast[len(fast) // 2], 2) if fast else None
            out["first_failure_s"] = round(first - fault_at, 2) if first else None
            out["daemon_deaths"] = 0 if m.proc.poll() is None else 1
            out["recovery_s"] = None
            while time.monotonic() - healed < 60:
                m.drop_caches()
                if all(_load(m.mountpoint / n, d)[0] is None for n, d in blocks.items()):
                    out["recovery_s"] = round(time.monotonic() - healed, 2)
                    break
                time.sleep(0.5)
            lost = {n for n, d in blocks.items() if read_errno(m.mountpoint / n, d)}
            out["exit_status"] = m.stop()
            m.start()
            m.drop_caches()
            lost |= {n for n, d in blocks.items() if read_errno(m.mountpoint / n, d)}
            out["durable_lost"] = sorted(lost)
            out["serving"] = serving(m)
            return out
        finally:
            m.stop()


def stall_read(tmp: Path) -> dict:
    return read_fault(tmp, "stall_read")


def lost_namespace(tmp: Path) -> dict:
    return read_fault(tmp, "lost_namespace")


def remove_namespace(tmp: Path) -> dict:
    """Namespace 1 of 3 ends at 1 MiB (a path gone for good) while two readers load blocks
    cold; once reads there have failed, `kvfs pool remove` takes it out (no --drop: it no
    longer reads) with the readers still running. Reports remove_s (the command, its start
    included; remove_daemon_s: the daemon's part), dropped (files), miss_ms (p99 of the
    loads of dropped names after it: ENOENT at the lookup), wrong_reads, others_failed
    (loads of blocks with no unit on namespace 1 that failed at any time: must be 0),
    new_on_removed (new files with a unit on it: must be 0), daemon_deaths, and after a
    restart with the device detached (the config still lists it): durable_lost (blocks off
    namespace 1 that do not read back bit-exact) and states."""
    with Emulation("1g") as emu:
        devs = [emu.loop(f"ns{i}", 128 * MiB) for i in range(3)]
        cfg = formatted(tmp, [d.path for d in devs], dram="96MiB", pool='stripe_unit = "256KiB"')
        m = start(tmp, cfg)
        out: dict = {"scenario": "remove_namespace"}
        try:
            blocks = {f"s{i}": os.urandom(200 * KiB + i) for i in range(12)}
            blocks.update({f"b{i}": os.urandom(2 * MiB + 4096 * i) for i in range(6)})
            for name, data in blocks.items():
                (m.mountpoint / name).write_bytes(data)
            m.sync()
            on1 = {n for n in blocks if 1 in namespaces_of(m.mountpoint / n)}
            m.drop_caches()
            devs[1].end_at(1 * MiB)
            calls: list[tuple[float, str, str | None, float, float]] = []
            lock = threading.Lock()
            stop = threading.Event()

            threads = [
                threading.Thread(
                    target=_reader, args=(m, blocks, r, stop, calls, lock), kwargs={"cold": True}
                )
                for r in range(2)
            ]
            for th in threads:
                th.start()
            wait_until(
                lambda: m.stats()["namespaces"][1]["read_state"] == "failed", 30, "the fault"
            )
            t = time.monotonic()  # (as an operator would: its own process)
            cli = subprocess.run(
                [sys.executable, "-m", "kvfs", "pool", "remove", "--json", str(m.mountpoint), "1"],
                capture_output=True,
                text=True,
                timeout=120,
                cwd=ROOT,
            )
            removed_at = time.monotonic()
            out["remove_s"] = round(removed_at - t, 3)  # (with the CLI's start)
            out["remove_status"] = cli.returncode
            out["dropped"] = json.loads(cli.stdout)["dropped_files"] if not cli.returncode else None
            out["remove_error"] = cli.stderr.strip()[-300:]
            out["remove_daemon_s"] = (
                json.loads(cli.stdout)["seconds"] if not cli.returncode else None
            )
            time.sleep(3.0)
            stop.set()
            for th in threads:
                th.join(120)
            after = [c for c in calls if c[0] > removed_at]
            miss = sorted((c[3] + c[4]) * 1000 for c in after if c[1] in on1)
            out["loads_after"] = len(after)
            out["miss_errnos"] = sorted({c[2] for c in after if c[1] in on1})
            out["miss_ms"] = round(miss[int(0.99 * (len(miss) - 1))], 2) if miss else None
            out["wrong_reads"] = sorted({c[1] for c in calls if c[2] == "WRONG"})
            out["others_failed"] = sum(1 for c in calls if c[1] not in on1 and c[2] is not None)
            new = {f"n{i}": os.urandom(1 * MiB + i) for i in range(6)}
            for name, data in new.items():
                (m.mountpoint / name).write_bytes(data)
            out["new_on_removed"] = sum(1 in namespaces_of(m.mountpoint / n) for n in new)
            m.sync()
            out["daemon_deaths"] = 0 if m.proc.poll() is None else 1
            out["exit_status"] = m.stop()
            devs[1].detach()
            m.start()
            m.drop_caches()
            keep = {**{n: d for n, d in blocks.items() if n not in on1}, **new}
            out["durable_lost"] = sorted(
                n for n, d in keep.items() if read_errno(m.mountpoint / n, d)
            )
            out["dropped_present"] = sorted(n for n in on1 if (m.mountpoint / n).exists())
            out["states"] = [n["state"] for n in m.stats()["namespaces"]]
            out["serving"] = serving(m)
            return out
        finally:
            m.stop()


def fill_one(tmp: Path) -> dict:
    return device_fault(tmp, "fill_one")


def fill_all(tmp: Path) -> dict:
    return device_fault(tmp, "fill_all")


def stall(tmp: Path) -> dict:
    return device_fault(tmp, "stall")


# --- a stop right after close(): the RELEASE may never come --------------------------------------
def stop_after_close(tmp: Path) -> dict:
    """close() returns after FLUSH; the kernel sends RELEASE later (and not at all while a
    duplicate of the descriptor is open, as here): a SIGTERM then must still write back
    what the close accepted."""
    cfg = write_config(
        tmp / "k.toml",
        tmp / "state",
        [{"path": str(tmp / f"ns{i}.img"), "size": "64MiB"} for i in range(2)],
    )
    m = start(tmp, cfg)
    try:
        out = {"scenario": "stop_after_close", "durability": m.durability}
        data = {f"f{i}": os.urandom((3 * MiB if i % 2 else 100 * KiB) + i) for i in range(4)}
        kept = []
        for name, d in data.items():
            fd = os.open(m.mountpoint / name, os.O_CREAT | os.O_WRONLY, 0o644)
            os.write(fd, d)
            kept.append(os.dup(fd))  # no RELEASE while this is open
            os.close(fd)  # FLUSH: close() returns 0
        out["exit_status"] = m.stop()  # SIGTERM
        for fd in kept:
            with contextlib.suppress(OSError):
                os.close(fd)
        m.start()
        m.drop_caches()
        out["reads"] = {n: read_errno(m.mountpoint / n, d) for n, d in data.items()}
        out["lost"] = sorted(n for n, e in out["reads"].items() if e is not None)
        return out
    finally:
        m.stop()


# --- damage while unmounted ----------------------------------------------------------------------
def _flip(path: Path, offset: int, nbytes: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(nbytes)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in old))


def torn_superblock(tmp: Path) -> dict:
    from kvfs.pool.superblock import SB_SIZE

    cfg = write_config(
        tmp / "k.toml",
        tmp / "state",
        [{"path": str(tmp / f"ns{i}.img"), "size": "64MiB"} for i in range(3)],
    )
    m = start(tmp, cfg)
    try:
        data = {f"f{i}": os.urandom(3 * MiB + i) for i in range(4)}
        for n, d in data.items():
            (m.mountpoint / n).write_bytes(d)
        m.stop()
        ns1 = tmp / "ns1.img"
        raw = ns1.read_bytes()[:SB_SIZE]
        out = {"scenario": "torn_superblock"}
        # 1. torn in its payload: rebuilt at the next mount
        _flip(ns1, raw.index(b'"size"'), 12)
        out["doctor_unmounted"] = doctor(config=cfg)
        m.start()
        out["log"] = log_lines(m, str(ns1), "superblock")
        m.drop_caches()
        out["data_ok"] = all(read_errno(m.mountpoint / n, d) is None for n, d in data.items())
        out["doctor"] = doctor(m.mountpoint)
        m.stop()
        # 2. torn in its pool id: the mount is refused, with one line naming it
        _flip(ns1, raw.index(b'"pool_id"') + 14, 6)
        (tmp / "mnt2").mkdir()
        r = subprocess.run(
            [sys.executable, "-m", "kvfs", "mount", str(tmp / "mnt2"), "--config", str(cfg)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
        out["refused_status"] = r.returncode
        out["refused_error"] = r.stderr.strip()
        out["doctor_refused"] = doctor(config=cfg)
        _flip(ns1, raw.index(b'"pool_id"') + 14, 6)  # the bytes restored
        m.start()
        m.drop_caches()
        out["recovered"] = all(read_errno(m.mountpoint / n, d) is None for n, d in data.items())
        out["serving"] = serving(m)
        return out
    finally:
        m.stop()


def truncated_wal(tmp: Path) -> dict:
    cfg = write_config(
        tmp / "k.toml",
        tmp / "state",
        [{"path": str(tmp / f"ns{i}.img"), "size": "64MiB"} for i in range(2)],
        dram="32MiB",
    )
    m = start(tmp, cfg)
    try:
        durability = m.durability
        data = {f"f{i:02d}": os.urandom(100_000 + i) for i in range(20)}
        wal = tmp / "state" / "catalog.sqlite-wal"
        kept_at = 0
        for i, (n, d) in enumerate(data.items()):
            (m.mountpoint / n).write_bytes(d)
            if durability == "close" and i == 9 or durability == "fsync" and i in (9, 19):
                m.sync()  # (durability "fsync": the files' transactions, now)
                kept_at = kept_at or wal.stat().st_size  # the log after f00-f09
        free_before_kill = os.statvfs(m.mountpoint).f_bfree
        m.kill()  # kill -9: the WAL is not checkpointed
        size = wal.stat().st_size
        with open(wal, "r+b") as f:  # cut in the middle of what came after f09
            f.truncate(kept_at + (size - kept_at) // 2 + 100)
        out = {
            "scenario": "truncated_wal",
            "wal_bytes": size,
            "doctor_unmounted": doctor(config=cfg),
        }
        m.start()
        out["log"] = log_lines(m, "catalog", "partial frame")
        out["opened_with"] = m.stats()["catalog"]["opened_with"]
        present = set(os.listdir(m.mountpoint))
        out["files_lost"] = sorted(set(data) - present)
        m.drop_caches()
        out["kept_ok"] = all(read_errno(m.mountpoint / n, data[n]) is None for n in present)
        out["lost_errno"] = sorted({read_errno(m.mountpoint / n) for n in out["files_lost"]})
        out["space_of_lost_files_free"] = os.statvfs(m.mountpoint).f_bfree > free_before_kill
        out["doctor"] = doctor(m.mountpoint)
        out["serving"] = serving(m)
        m.stop()
        m.start()
        out["recovered"] = (
            set(os.listdir(m.mountpoint)) == present | {"probe"}
            and m.stats()["catalog"]["opened_with"] is None
        )
        return out
    finally:
        m.stop()


SCENARIOS = {
    f.__name__: f
    for f in (
        shrink_mid_write,
        shrink_mid_read,
        detached,
        enospc_lru,
        enospc_never,
        state_dir_full,
        slow_namespace,
        fill_one,
        fill_all,
        stall,
        stall_read,
        lost_namespace,
        remove_namespace,
        stop_after_close,
        torn_superblock,
        truncated_wal,
    )
}


def run(name: str) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"kvfs-fault-{name}-") as tmp:
        t = time.monotonic()
        out = SCENARIOS[name](Path(tmp))
        out["seconds"] = round(time.monotonic() - t, 1)
        return out


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--only", nargs="+", choices=sorted(SCENARIOS))
    args = parse(ap, argv)
    report = [run(n) for n in (args.only or SCENARIOS)]
    if args.json:
        print(dumps({"scenarios": report}))
        return 0
    for r in report:
        print(f"== {r['scenario']} ({r['seconds']} s)")
        for k, v in r.items():
            if k not in ("scenario", "seconds"):
                print(f"   {k}: {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
