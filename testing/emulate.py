"""Emulated NVMe-oF namespaces for benchmarks and tests: loop devices over files on a private
tmpfs, each throttled by a cgroup: cgroup v1's blkio controller (`blkio.throttle.*`, a hybrid
layout such as this machine's) or cgroup v2's io controller (`io.max`, the unified hierarchy
of a standard Debian 12 server), whichever the machine has, chosen at run time. (This kernel
has no dm-delay, no null_blk.) Everything set up here is torn down by `close()` / the context
manager, also after a failure.

    with Emulation() as emu:
        devs = [emu.loop(f"ns{i}", 256 << 20) for i in range(4)]
        group = emu.cgroup("kvfs-bench")
        for d in devs:
            group.limit(d, read_bps=200e6, write_bps=200e6)
        group.add(pid)

`KVFS_THROTTLE` = `v1`, `v2` or `none` uses only that (`v2` hides v1 blkio: a cgroup-v2-only
run on a hybrid machine); the default, `auto`, takes v1 blkio where it is mounted, else v2.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

BLKIO = Path("/sys/fs/cgroup/blkio")
V2_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))


def throttle_support(
    *, blkio: Path = BLKIO, v2_roots=V2_ROOTS, choice: str | None = None
) -> tuple[str | None, str]:
    """("v1", blkio directory) or ("v2", hierarchy root) where devices can be throttled here,
    else (None, why not). cgroup v2 is chosen only once `+io` is in its root's
    cgroup.subtree_control (written here if need be). An unknown `choice` is a ValueError."""
    choice = choice or os.environ.get("KVFS_THROTTLE", "auto")
    if choice not in ("auto", "v1", "v2", "none"):  # a typo must not skip every test
        raise ValueError(f"KVFS_THROTTLE={choice!r}: not one of auto, v1, v2, none")
    if choice == "none":
        return None, "throttling turned off (KVFS_THROTTLE=none)"
    why = []
    if choice in ("auto", "v1"):
        if (blkio / "blkio.throttle.read_bps_device").exists():
            return "v1", str(blkio)
        why.append(f"no cgroup v1 blkio controller at {blkio}")
    if choice in ("auto", "v2"):
        for root in v2_roots:
            ctl = root / "cgroup.controllers"
            if not ctl.exists():
                continue
            if "io" in ctl.read_text().split():
                sub = root / "cgroup.subtree_control"  # io must be enabled for its children
                try:
                    if "io" not in sub.read_text().split():
                        sub.write_text("+io\n")
                    return "v2", str(root)
                except OSError as e:
                    why.append(
                        f"cgroup v2 at {root} has an io controller, but it cannot be "
                        f"enabled for child groups (+io in {sub}: {e.strerror})"
                    )
                    break
            why.append(
                f"cgroup v2 at {root} has no io controller (it offers: "
                f"{ctl.read_text().strip() or 'nothing'})"
            )
            break
        else:
            why.append("no cgroup v2 hierarchy")
    return None, "; ".join(why)


def warm_memory(gib: float) -> None:
    """Touch `gib` GiB of memory once (a tmpfs file written and removed). On a virtual machine
    the first touch of guest memory is slow (the host backs it then, here about 1 GB/s), which
    would otherwise charge whichever path first needs fresh memory in a benchmark."""
    with tempfile.NamedTemporaryFile(dir="/dev/shm", prefix="kvfs-warm-") as f:
        chunk = bytes(64 << 20)
        for _ in range(int(gib * 16)):
            f.write(chunk)
        f.flush()


def available(throttle: bool = True) -> str | None:
    """None if loop devices (and, with `throttle`, a way to throttle them: cgroup v1 blkio or
    v2 io.max) can be used here, else why not."""
    if os.geteuid() != 0:
        return "needs root"
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices"
    if throttle:
        kind, why = throttle_support()
        if kind is None:
            return f"needs a device throttle: {why}"
    return None


class LoopDevice:
    def __init__(self, path: str, backing: Path):
        self.path = path
        self.backing = backing
        st = os.stat(path)
        self.major, self.minor = os.major(st.st_rdev), os.minor(st.st_rdev)

    @property
    def devno(self) -> str:
        return f"{self.major}:{self.minor}"

    def _stat(self, field: int) -> int:
        """One field of the device's stat in sysfs (Documentation/block/stat.rst)."""
        with open(f"/sys/dev/block/{self.devno}/stat") as f:
            return int(f.read().split()[field])

    def io_ticks(self) -> int:
        """Milliseconds the device has had I/O in flight (the 10th field of its stat in sysfs):
        its busy time, whose share of an interval says how busy the device was."""
        return self._stat(9)

    def bytes_read(self) -> int:
        """Bytes read from the device so far (its sectors read, the 3rd field of its stat).
        Under a throttle, a device's share of its limit over an interval (these bytes over
        limit x time) says how busy the reader kept it: io_ticks does not, since cgroup
        throttling holds the I/O before it reaches the device."""
        return self._stat(2) * 512

    def shrink_to(self, size: int) -> None:
        """Make the device end at `size` bytes: I/O beyond fails, as on a device that is gone.
        Its backing file is cut there: what it held beyond is lost (see `end_at` for a device
        that comes back whole)."""
        os.truncate(self.backing, size)
        subprocess.run(["losetup", "-c", self.path], check=True)

    # struct loop_info64 (linux/loop.h): lo_sizelimit is its fifth u64
    _LOOP_SET_STATUS64, _LOOP_GET_STATUS64, _INFO64, _SIZELIMIT = 0x4C04, 0x4C05, 232, 32

    def end_at(self, size: int | None) -> None:
        """Make the device end at `size` bytes (None: at its backing file's end again) without
        touching the backing file (the loop driver's size limit): I/O beyond fails with EIO
        or ENOSPC while it lasts, and every byte written before is there when it comes back,
        as on an NVMe-oF namespace whose path drops and returns."""
        import fcntl
        import struct

        fd = os.open(self.path, os.O_RDONLY)
        try:
            info = bytearray(fcntl.ioctl(fd, self._LOOP_GET_STATUS64, bytes(self._INFO64)))
            struct.pack_into("<Q", info, self._SIZELIMIT, size or 0)
            fcntl.ioctl(fd, self._LOOP_SET_STATUS64, bytes(info))
        finally:
            os.close(fd)

    def detach(self) -> None:
        subprocess.run(["losetup", "-d", self.path], capture_output=True)


class BlkioGroup:
    """A cgroup v1 blkio group: per-device limits in `blkio.throttle.*`."""

    def __init__(self, name: str, root: Path = BLKIO):
        self.root = root
        self.dir = root / name
        self.dir.mkdir(exist_ok=True)

    def limit(
        self,
        dev: LoopDevice,
        *,
        read_bps: float = 0,
        write_bps: float = 0,
        read_iops: float = 0,
        write_iops: float = 0,
    ) -> None:
        for fname, value in (
            ("read_bps_device", read_bps),
            ("write_bps_device", write_bps),
            ("read_iops_device", read_iops),
            ("write_iops_device", write_iops),
        ):
            (self.dir / f"blkio.throttle.{fname}").write_text(f"{dev.devno} {int(value)}\n")

    def add(self, pid: int) -> None:
        """Put a process in the group, with the processes it started (a kvfs daemon's I/O
        workers, started before the daemon is moved: kvfs/pool/io_workers.py); this process
        alone when it is this one (tests and benches start other things too)."""
        for p in [pid] if pid == os.getpid() else family(pid):
            try:
                (self.dir / "cgroup.procs").write_text(f"{p}\n")
            except ProcessLookupError:
                if p == pid:
                    raise  # (a child may end meanwhile)

    def release(self, pid: int) -> None:
        """Move a process back to the root group (unthrottled)."""
        (self.root / "cgroup.procs").write_text(f"{pid}\n")

    controller = "blkio"  # its field in /proc/PID/cgroup ("" for cgroup v2)

    def contains(self, pid: int) -> bool:
        """Is the process in this group?"""
        with open(f"/proc/{pid}/cgroup") as f:
            return any(
                line.split(":")[1] == self.controller and line.strip().endswith("/" + self.dir.name)
                for line in f
            )

    def remove(self) -> None:
        if not self.dir.exists():
            return
        for pid in (self.dir / "cgroup.procs").read_text().split():
            try:
                self.release(int(pid))
            except OSError:
                pass
        try:
            self.dir.rmdir()
        except OSError:
            pass


class IoMaxGroup(BlkioGroup):
    """A cgroup v2 group with the io controller: per-device limits in `io.max`
    ("MAJ:MIN rbps=N wbps=N riops=N wiops=N", `max` for no limit). The io controller is
    enabled for the root's children first (`+io` in its cgroup.subtree_control, which
    `throttle_support` checks before it chooses v2)."""

    controller = ""

    def __init__(self, name: str, root: Path):
        ctl = root / "cgroup.subtree_control"
        if "io" not in ctl.read_text().split():
            ctl.write_text("+io\n")
        super().__init__(name, root)

    def limit(
        self,
        dev: LoopDevice,
        *,
        read_bps: float = 0,
        write_bps: float = 0,
        read_iops: float = 0,
        write_iops: float = 0,
    ) -> None:
        values = " ".join(
            f"{key}={int(v) if v else 'max'}"
            for key, v in (
                ("rbps", read_bps),
                ("wbps", write_bps),
                ("riops", read_iops),
                ("wiops", write_iops),
            )
        )
        (self.dir / "io.max").write_text(f"{dev.devno} {values}\n")


def family(pid: int) -> list[int]:
    """A process and its descendants (the children of each of its threads), from /proc."""
    out = [pid]
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids = [int(c) for c in f.read().split()]
        except OSError:
            continue
        for kid in kids:
            out += family(kid)
    return out


def make_group(name: str) -> BlkioGroup:
    """A throttle group of the kind this machine has (see `throttle_support`)."""
    kind, where = throttle_support()
    if kind == "v1":
        return BlkioGroup(name, Path(where))
    if kind == "v2":
        return IoMaxGroup(name, Path(where))
    raise RuntimeError(f"cannot throttle devices here: {where}")


class Emulation:
    """Owns a tmpfs, the loop devices on it and the cgroups; `close()` removes them all."""

    def __init__(self, tmpfs_size: str = "8g"):
        self.root = Path(tempfile.mkdtemp(prefix="kvfs-emu-"))
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={tmpfs_size}", "kvfs-emu", str(self.root)],
            check=True,
        )
        self.loops: list[LoopDevice] = []
        self.groups: list[BlkioGroup] = []

    def file(self, name: str, size: int, root: Path | None = None) -> Path:
        p = (root or self.root) / name
        with open(p, "wb") as f:
            f.truncate(size)
        return p

    def tmpfs(self, name: str, size: str) -> Path:
        """A tmpfs of its own under the emulation's (unmounted with it): loop devices whose
        backing files sit there fail their writes (EIO) once it fills (`fill`), and heal
        when space comes back (`heal`)."""
        p = self.root / name
        p.mkdir()
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", f"kvfs-emu-{name}", str(p)], check=True
        )
        return p

    @staticmethod
    def fill(root: Path) -> Path:
        """Take every free byte of the file system at `root` (a filler file)."""
        filler = root / "filler"
        fd = os.open(filler, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        try:
            for chunk in (bytes(1 << 20), bytes(4096)):
                with contextlib.suppress(OSError):
                    while os.write(fd, chunk):
                        pass
        finally:
            os.close(fd)
        return filler

    @staticmethod
    def heal(root: Path) -> None:
        (root / "filler").unlink(missing_ok=True)

    def loop(self, name: str, size: int, root: Path | None = None) -> LoopDevice:
        """A loop device (direct I/O) over a sparse file of `size` bytes on the emulation's
        tmpfs, or on `root` (a `tmpfs` of its own)."""
        backing = self.file(name + ".img", size, root)
        r = subprocess.run(
            ["losetup", "-f", "--show", "--direct-io=on", str(backing)],
            capture_output=True,
            text=True,
            check=True,
        )
        dev = LoopDevice(r.stdout.strip(), backing)
        self.loops.append(dev)
        return dev

    def cgroup(self, name: str) -> BlkioGroup:
        """A throttle group (cgroup v1 blkio or v2 io.max, whichever this machine has)."""
        g = make_group(f"{name}-{os.getpid()}")
        self.groups.append(g)
        return g

    def close(self) -> None:
        for g in self.groups:
            g.remove()
        for d in self.loops:
            d.detach()
        subprocess.run(["umount", "-l", str(self.root)], capture_output=True)
        try:
            self.root.rmdir()
        except OSError:
            pass

    def __enter__(self) -> "Emulation":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- the two file systems benchmarks compare ---------------------------------------------------
def drop_kernel_caches() -> None:
    """Page cache, dentries and inodes."""
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


class Ext4Setup:
    """ext4 on one loop device (throttled by `group`, this process in it, when a limit was
    set)."""

    kvfs = None
    raid0 = None  # what ext4_on_raid0 built, when it did

    def __init__(self, root: Path, dev: LoopDevice, group: BlkioGroup):
        self.root, self.dev, self.group = root, dev, group

    def sync(self, threads: int = 8) -> None:
        """Write back what is buffered with an fsync of every file, from this process (which
        is in the device's cgroup when throttled): cgroup v1 throttles only the I/O a process
        of the group submits itself, so the flusher threads' writeback (sync, syncfs) would
        not meet the device's limit."""
        from concurrent.futures import ThreadPoolExecutor

        def fsync(path: str) -> None:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

        paths = [os.path.join(d, f) for d, _, fs in os.walk(self.root) for f in fs]
        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(fsync, paths))
        os.sync()

    def drop(self) -> None:
        os.sync()
        drop_kernel_caches()


class KvfsSetup:
    """A kvfs mount over loop namespaces; its daemon in `group` when a limit was set."""

    raid0 = None

    def __init__(self, kvfs, group: BlkioGroup, devices: list[LoopDevice] = ()):
        self.kvfs, self.group = kvfs, group
        self.root = kvfs.mountpoint
        self.devices = list(devices)  # its namespaces

    def sync(self) -> None:
        """Nothing to do: a file is durable when close() returns."""

    def drop(self) -> None:
        """Cold: kvfs's DRAM tier, then the kernel's page cache, dentries and inodes."""
        self.kvfs.control("drop_dram")
        drop_kernel_caches()


@contextlib.contextmanager
def throttled(setup, pid: int):
    """Process `pid` (a client of ours: an engine, LMCache's server) inside the set-up's
    throttle group while the block runs, so its I/O to the set-up's devices meets the limit as
    the kvfs daemon's does; nothing where the set-up is not throttled."""
    if setup.group is None:
        yield
        return
    setup.group.add(pid)
    try:
        yield
    finally:
        setup.group.release(pid)


@contextlib.contextmanager
def _ext4(
    emu: Emulation,
    tmp: Path,
    name: str,
    path: str,
    devs: list[LoopDevice],
    bps: float | None,
    mkfs: tuple[str, ...] = (),
):
    """ext4 made on `path` and mounted at tmp/<name>-mnt; with `bps`, each of `devs` (the loop
    devices under it) throttled to it in a group of their own that this process joins."""
    subprocess.run(["mkfs.ext4", "-q", "-F", *mkfs, path], check=True)
    mnt = tmp / f"{name}-mnt"
    mnt.mkdir(exist_ok=True)
    subprocess.run(["mount", path, str(mnt)], check=True)
    group = None
    try:
        group = emu.cgroup(name) if bps else None  # this process's I/O to ext4 is throttled
        if group is not None:
            for d in devs:
                group.limit(d, read_bps=bps, write_bps=bps)
            group.add(os.getpid())
        yield Ext4Setup(mnt, devs[0], group)
    finally:
        if group is not None:
            group.release(os.getpid())
        subprocess.run(["umount", str(mnt)], check=False)


@contextlib.contextmanager
def ext4_on_loop(emu: Emulation, tmp: Path, name: str, size: int, bps: float | None):
    """ext4 on one loop device; with `bps`, the device throttled in a group of its own that this
    process joins (its I/O to ext4 is a bench's). A process is in one group at a time: a bench
    with two such set-ups runs each one's I/O inside `throttled(setup, os.getpid())`."""
    dev = emu.loop(name, size)
    with _ext4(emu, tmp, name, dev.path, [dev], bps) as setup:
        yield setup


RAID0_CHUNK = 512 << 10  # md's default chunk; dm-stripe's here


def raid0_support(misc: Path = Path("/proc/misc")) -> str | None:
    """None if ext4 can go on a real RAID-0 (device-mapper's dm-stripe) over loop devices here,
    else why not. The kernel is asked (`device-mapper` in /proc/misc), not the node
    /dev/mapper/control: `dmsetup` creates that node on its first use even where the kernel
    has no driver behind it."""
    if shutil.which("dmsetup") is None:
        return "no dmsetup (apt package dmsetup)"
    try:
        names = {line.split()[-1] for line in misc.read_text().splitlines() if line.split()}
    except OSError as e:
        return f"cannot ask the kernel for device-mapper ({misc}: {e.strerror})"
    if "device-mapper" not in names:
        return f"this kernel has no device-mapper (not in {misc})"
    return None


@contextlib.contextmanager
def ext4_on_raid0(emu: Emulation, tmp: Path, name: str, count: int, size: int, bps: float | None):
    """What a user with `count` namespaces and no kvfs builds: ext4 on a RAID-0 across them.
    Where the kernel has device-mapper: a dm-stripe (512 KiB chunks, as md's default) over
    `count` loop devices of size/count each, each throttled at `bps`, ext4 told the geometry.
    Where it has neither md nor device-mapper (this development machine): a stand-in, ext4 on
    one loop device whose limit is the sum of the `count` devices' limits. `.raid0` says which."""
    why = raid0_support()
    if why is not None:
        with ext4_on_loop(emu, tmp, name, size, bps * count if bps else None) as setup:
            setup.raid0 = (
                f"stand-in: ext4 on 1 loop device at {count}x the per-device limit "
                f"(no RAID-0 here: {why})"
            )
            yield setup
        return
    per = (size // count + RAID0_CHUNK - 1) // RAID0_CHUNK * RAID0_CHUNK
    devs = [emu.loop(f"{name}-d{i}", per) for i in range(count)]
    chunk = RAID0_CHUNK // 512
    table = f"0 {per * count // 512} striped {count} {chunk} " + " ".join(
        f"{d.path} 0" for d in devs
    )
    dm = f"kvfs-bench-{name}-{os.getpid()}"
    subprocess.run(["dmsetup", "create", dm, "--table", table], check=True)
    stride = RAID0_CHUNK // 4096
    try:
        with _ext4(
            emu,
            tmp,
            name,
            f"/dev/mapper/{dm}",
            devs,
            bps,
            ("-E", f"stride={stride},stripe_width={stride * count}"),
        ) as setup:
            setup.raid0 = f"ext4 on dm-stripe (RAID-0, 512 KiB chunks) over {count} loop devices"
            yield setup
    finally:
        subprocess.run(["dmsetup", "remove", "--retry", dm], check=False)


@contextlib.contextmanager
def kvfs_on_loops(
    emu: Emulation,
    tmp: Path,
    name: str,
    count: int,
    size: int,
    bps: float | None,
    *,
    dram: str = "256MiB",
    extra: str = "",
    pool: str = "",
    env: dict | None = None,
):
    """kvfs over `count` loop namespaces of `size` bytes in all, formatted and mounted; the
    daemon runs in the namespaces' cgroup. `extra`: more of the config (tables); `pool`: keys
    of its [pool] table; `env`: set in the daemon's environment."""
    from kvfs.cli import main as kvfs_main
    from testing.mount import MountedKvfs, write_config

    devs = [emu.loop(f"{name}-ns{i}", size // count + (64 << 20)) for i in range(count)]
    cfg = write_config(
        tmp / f"{name}.toml",
        tmp / f"{name}-state",
        [{"path": d.path} for d in devs],
        dram=dram,
        extra=extra,
        pool=pool,
    )
    with contextlib.redirect_stdout(io.StringIO()):
        if kvfs_main(["format", "--force", "--config", str(cfg)]) != 0:
            raise RuntimeError("kvfs format failed")
    group = emu.cgroup(name) if bps else None
    if group is not None:
        for d in devs:
            group.limit(d, read_bps=bps, write_bps=bps)
    m = MountedKvfs(tmp / f"{name}-mnt", cfg, tmp / f"{name}.log", env=env).start()
    try:
        if group is not None:
            group.add(m.pid)
        yield KvfsSetup(m, group, devs)
    finally:
        m.stop()
