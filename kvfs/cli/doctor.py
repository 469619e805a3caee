"""kvfs doctor: check a node for kvfs and explain what is wrong and what to do.

Checks FUSE and the kvfs mounts, the inference engines' directories in them and whether their
eviction agrees with kvfs's (doctor_clients.py), each namespace of each mount (block device or
file; for NVMe-oF devices the transport, address and subsystem NQN from /sys/class/nvme), RDMA
devices and ports through pyverbs, kvikio/GDS availability, and the NUMA locality of
namespaces, NICs and GPUs.
Each finding is ok, info, warn or fail; the exit status is 1 when anything failed.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from kvfs.cli.common import CliError, find_mount, stats, table, with_json
from kvfs.cli.doctor_clients import check_clients
from kvfs.cli.findings import Finding

if TYPE_CHECKING:  # (annotations only: the checks import these where they run)
    from pyverbs.device import Context

    from kvfs.config import NamespaceConfig
    from kvfs.pool.superblock import Superblock

SYS = Path("/sys")


def _read(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except OSError:
        return None


def _numa(p: Path) -> int | None:
    v = _read(p)
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


# --- FUSE and mounts -------------------------------------------------------------------------
def check_fuse() -> list[Finding]:
    out = []
    try:
        st = os.stat("/dev/fuse")
        ok = stat.S_ISCHR(st.st_mode)
    except OSError:
        ok = False
    if ok:
        out.append(Finding("ok", "fuse", "/dev/fuse is present"))
    else:
        out.append(
            Finding(
                "fail",
                "fuse",
                "/dev/fuse is missing",
                "load the fuse module (modprobe fuse), or run the container with "
                "--device /dev/fuse",
            )
        )
    if any(
        os.access(os.path.join(d, "fusermount3"), os.X_OK)
        for d in os.environ.get("PATH", "/usr/bin:/bin").split(":")
    ):
        out.append(Finding("ok", "fuse", "fusermount3 is installed (auto_unmount, non-root use)"))
    else:
        out.append(
            Finding(
                "warn",
                "fuse",
                "fusermount3 is not installed",
                "apt-get install fuse3 (needed to unmount as non-root and for auto_unmount)",
            )
        )
    return out


def kvfs_mounts() -> list[str]:
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.split()[0] == "fuse.kvfs":
                out.append(left.split()[4].encode().decode("unicode_escape"))
    return out


def check_mount(mount: str) -> tuple[list[Finding], dict | None]:
    try:
        st = stats(mount)
    except CliError as e:
        return [
            Finding(
                "fail",
                "mount",
                f"{mount}: {e}",
                f"umount {mount}, then mount kvfs again (kvfs mount {mount} ...)",
            )
        ], None
    except OSError as e:
        return [
            Finding(
                "fail",
                "mount",
                f"{mount}: cannot read statistics: {e.strerror}",
                "check the daemon's log in its state_dir",
            )
        ], None
    out = [
        Finding(
            "ok",
            "mount",
            f"{mount}: kvfs {st['kvfs']}, daemon pid {st['pid']}, up {int(st['uptime_s'])} s",
        )
    ]
    pool = st["tiers"]["pool"]
    used = pool["used"] / pool["capacity"] if pool["capacity"] else 0
    if used > 0.95 and pool["evict"] == "never":
        out.append(
            Finding(
                "warn",
                "mount",
                f"{mount}: pool {100 * used:.0f}% full and evict = "
                f'"never": writes will fail with ENOSPC',
                'delete files, add namespaces, or set [pool] evict = "prefix"',
            )
        )
    out += check_data_path(mount, st.get("data_path"))
    out += check_catalog(mount, st.get("catalog"))
    for msg in pool.get("rebuilt_superblocks") or []:
        out.append(
            Finding(
                "warn",
                "namespace",
                f"{mount}: at start-up: {msg}",
                "a torn write hit it (a crash or power loss while formatting, or "
                "something else wrote there): check what else writes to the device",
            )
        )
    out += check_namespace_speed(mount, st.get("namespaces") or [])
    out += check_cluster(mount, st.get("cluster"))
    return out, st


def check_catalog(mount: str, cat: dict | None) -> list[Finding]:
    """A catalog that can no longer commit, or whose log was damaged before this mount."""
    out = []
    if not cat:
        return out
    if cat.get("error"):
        out.append(
            Finding(
                "fail",
                "catalog",
                f"{mount}: {cat['error']}",
                "free space on the state_dir's filesystem (or repair the disk), then "
                "remount (kvfs umount, kvfs mount): every change fails with EIO until "
                "then; reads go on",
            )
        )
    if cat.get("opened_with"):
        out.append(
            Finding(
                "warn",
                "catalog",
                f"{mount}: catalog at start-up: {cat['opened_with']}",
                "if files closed before the last stop are missing, the state_dir's "
                "disk lost writes: check it (dmesg, smartctl)",
            )
        )
    return out


SLOW_FACTOR = 4  # a namespace this many times slower than the median is reported


def check_namespace_speed(mount: str, namespaces: list[dict]) -> list[Finding]:
    """A namespace much slower than the others (measured by the daemon while busy) holds
    every striped read back; adaptive placement gives it fewer units, but say so."""
    rates = [(ns["index"], ns["path"], ns.get("rate_bps") or 0.0) for ns in namespaces]
    measured = sorted(r for _, _, r in rates if r > 0)
    if len(measured) < 2:
        return []
    median = measured[len(measured) // 2]
    return [
        Finding(
            "warn",
            "namespace",
            f"{mount}: namespace {i} ({path}) is slow: {r / 1e6:.1f} MB/s while busy, "
            f"the pool's median is {median / 1e6:.1f} MB/s",
            "check the device and its link (nvme smart-log, the NIC, a throttle); "
            "adaptive placement puts fewer units on it meanwhile",
        )
        for i, path, r in rates
        if 0 < r < median / SLOW_FACTOR
    ]


# --- a config, offline (the mount may be down: say why it does not start) ----------------------
def _check_state_dir(sd: Path) -> list[Finding]:
    """The state_dir's free space: with too little the catalog cannot commit."""
    if not sd.is_dir():
        return []
    v = os.statvfs(sd)
    free = v.f_bavail * v.f_frsize
    if free < 4 << 20:
        return [
            Finding(
                "fail",
                "config",
                f"state_dir {sd}: only {free} bytes free: the "
                f"catalog cannot commit (changes fail with EIO)",
                "free space there, then remount kvfs",
            )
        ]
    return [Finding("ok", "config", f"state_dir {sd}: {free >> 20} MiB free")]


def _check_catalog_file(catalog_path: Path) -> tuple[list[Finding], str | None]:
    """A node's SQLite catalog: its write-ahead log, and the pool id the namespaces must match."""
    from kvfs.catalog.sqlite_schema import wal_damage

    out = []
    pool_id = None
    damage = wal_damage(catalog_path)
    if damage:
        out.append(
            Finding(
                "warn",
                "config",
                f"catalog {catalog_path}: {damage}",
                "if files closed before the last stop are missing, the disk lost writes",
            )
        )
    try:
        import sqlite3

        db = sqlite3.connect(f"file:{catalog_path}?mode=ro", uri=True)
        try:
            row = db.execute("SELECT value FROM meta WHERE key='pool_id'").fetchone()
        finally:
            db.close()
        pool_id = row[0] if row else None
        out.append(Finding("ok", "config", f"catalog {catalog_path}: pool {pool_id}"))
    except sqlite3.Error as e:
        out.append(
            Finding(
                "fail",
                "config",
                f"catalog {catalog_path}: cannot read: {e}",
                "restore the state_dir from a backup, or start over with kvfs format --force",
            )
        )
    return out, pool_id


def _check_config_namespace(i: int, nc: NamespaceConfig, pool_id: str | None) -> Finding:
    """One namespace of the config: there, readable, and holding a superblock that decodes."""
    from kvfs.errors import KvfsError
    from kvfs.pool.namespace import probe
    from kvfs.pool.superblock import SB_SIZE, SuperblockError, decode

    label = f"namespace {i} ({nc.path})"
    try:
        exists, _, size = probe(nc.path)
        if not exists:  # (a file with a size is created only for a new pool)
            fresh = nc.size is not None and pool_id is None
            return Finding(
                "info" if fresh else "fail",
                "config",
                f"{label}: does not exist" + (" (created at the first mount)" if fresh else ""),
                "" if fresh else "attach the device (nvme connect, losetup), or restore the file",
            )
        with open(nc.path, "rb") as f:
            raw = f.read(SB_SIZE)
    except (KvfsError, OSError) as e:
        return Finding(
            "fail",
            "config",
            f"{label}: {e}",
            "attach the device, or fix the path in the config",
        )
    try:
        sb = decode(raw)
    except SuperblockError as e:
        fixable = pool_id is not None and pool_id.encode() in raw
        return Finding(
            "fail",
            "config",
            f"{label}: {e}"
            + (
                " (it still names this catalog's pool: the next mount rebuilds it)"
                if fixable
                else ""
            ),
            "" if fixable else "restore the device, or reformat the pool",
        )
    return _superblock_finding(label, i, sb, pool_id, size)


def _superblock_finding(
    label: str, i: int, sb: Superblock | None, pool_id: str | None, size: int
) -> Finding:
    """A decoded superblock against the config: a kvfs one, of this pool, in this position."""
    if sb is None:
        return Finding(
            "fail",
            "config",
            f"{label}: not a kvfs namespace (no superblock)",
            "check the path (a device renamed?), or kvfs format",
        )
    if pool_id is not None and sb.pool_id != pool_id:
        return Finding(
            "fail",
            "config",
            f"{label}: belongs to pool {sb.pool_id}, the catalog to {pool_id}",
            "check the path: another pool's device?",
        )
    if sb.ns_index != i:
        return Finding(
            "fail",
            "config",
            f"{label}: is number {sb.ns_index} of its pool",
            "restore the config's order of namespaces",
        )
    return Finding("ok", "config", f"{label}: superblock of pool {sb.pool_id}, {size >> 20} MiB")


def check_config(path: str) -> list[Finding]:
    """What a kvfs mount of this config would run on, checked without the daemon: the
    state_dir's free space, the catalog's write-ahead log, every namespace's superblock."""
    from kvfs import config as config_mod
    from kvfs.errors import KvfsError

    try:
        cfg = config_mod.load(path)
    except KvfsError as e:
        return [Finding("fail", "config", f"{path}: {e}")]
    out = _check_state_dir(cfg.state_dir)
    pool_id = None
    if cfg.cluster is None and cfg.catalog_path.exists():
        found, pool_id = _check_catalog_file(cfg.catalog_path)
        out += found
    for i, nc in enumerate(cfg.pool.namespaces):
        out.append(_check_config_namespace(i, nc, pool_id))
    return out


def check_data_path(mount: str, dp: dict | None) -> list[Finding]:
    """Which path file data takes (FUSE passthrough, or through the daemon), and why."""
    if not dp:
        return []
    memory = f"; block memory: {dp.get('memory', '?')}"
    if dp.get("passthrough"):
        return [Finding("ok", "data path", f"{mount}: FUSE passthrough: {dp['why']}{memory}")]
    return [
        Finding(
            "warn",
            "data path",
            f"{mount}: reads and writes go through the daemon (slower): {dp['why']}{memory}",
            "use Linux >= 6.9, run make install (it builds the passthrough-capable "
            "libfuse and pyfuse3), keep [mount] passthrough = true",
        )
    ]


def check_cluster(mount: str, c: dict | None) -> list[Finding]:
    """A node of a shared pool: is Redis there, holding our pool, and is the mirror current?"""
    if not c:
        return []
    where = f"{mount}: cluster node {c['node_id']}, Redis at {c['redis']}"
    if not c["online"]:
        down = ", ".join(c.get("offline") or []) or c["redis"]
        return [
            Finding(
                "fail",
                "cluster",
                f"{mount}: cluster node {c['node_id']}: Redis at {down} is unreachable: "
                f"changes (in its shard's directories) and lookups of unknown names fail "
                f"with EIO",
                "start Redis or fix the network; the node reconnects by itself",
            )
        ]
    if c.get("catalog_lost"):
        return [
            Finding(
                "fail",
                "cluster",
                f"{where} no longer holds this pool's catalog",
                "unmount every node, then kvfs format --force (see docs/cluster.md)",
            )
        ]
    if not c["fresh"]:
        return [
            Finding(
                "warn",
                "cluster",
                f"{where}: the change log is {c['lag_seconds']:.1f} s behind",
                "check Redis's load and the network",
            )
        ]
    return [
        Finding(
            "ok",
            "cluster",
            f"{where}: reachable, catalog current, "
            f"{c['regions_held']}/{c['regions']} regions leased",
        )
    ]


# --- namespaces ------------------------------------------------------------------------------
def _block_sysfs(path: str) -> Path | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISBLK(st.st_mode):
        return None
    p = SYS / "dev" / "block" / f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    return p.resolve() if p.exists() else None


def describe_namespace(ns: dict) -> tuple[list[Finding], int | None]:
    path = ns["path"]
    out: list[Finding] = []
    label = f"namespace {ns['index']} ({path})"
    if ns["state"] == "removed":  # (`kvfs pool remove`: an empty slot, never read again)
        return [Finding("info", "namespace", f"{label}: removed from the pool")], None
    if ns["state"] != "ok":
        out.append(
            Finding(
                "fail",
                "namespace",
                f"{label}: failed: {ns['last_error']}",
                "check the device (dmesg, nvme list); new blocks avoid it until a write "
                "succeeds there again",
            )
        )
    if ns.get("read_state", "ok") != "ok":
        out.append(
            Finding(
                "fail",
                "namespace",
                f"{label}: failed for reads: a read had no answer within read_timeout_ms "
                f"or failed ({ns.get('read_timeouts', 0)} late, "
                f"{ns.get('reads_refused', 0)} refused at once)",
                "check the device and its path (dmesg, nvme list, multipath); loads of "
                "its blocks are misses (ENOENT at open) until a probe answers in time; "
                "gone for good: `kvfs pool remove MOUNT N`",
            )
        )
    sysfs = _block_sysfs(path)
    numa = None
    if sysfs is None:
        try:
            fs = subprocess.run(
                ["stat", "-f", "-c", "%T", path], capture_output=True, text=True, timeout=5
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            fs = "?"
        detail = f"{label}: a file on {fs or '?'}"
        if not ns.get("direct_io", True):
            out.append(
                Finding(
                    "warn",
                    "namespace",
                    detail + ", buffered I/O (no O_DIRECT)",
                    "put namespace files on a filesystem with O_DIRECT (ext4, xfs)",
                )
            )
        else:
            out.append(Finding("ok", "namespace", detail + ", O_DIRECT"))
        return out, None
    name = sysfs.name
    parent = sysfs.parent if (sysfs / "partition").exists() else sysfs
    numa = _numa(parent / "device" / "numa_node") or _numa(
        parent / "device" / "device" / "numa_node"
    )
    ctrl = None
    if name.startswith("nvme"):
        dev = parent / "device"
        ctrl = dev if (dev / "transport").exists() else None
    if ctrl is not None:
        transport = _read(ctrl / "transport") or "?"
        address = _read(ctrl / "address") or "-"
        nqn = _read(ctrl / "subsysnqn") or "-"
        model = _read(ctrl / "model") or "-"
        kind = "NVMe-oF" if transport in ("tcp", "rdma", "fc") else "NVMe"
        out.append(
            Finding(
                "ok",
                "namespace",
                f"{label}: {kind} over {transport}, address "
                f"{address}, subsystem {nqn}, model {model}",
            )
        )
    else:
        out.append(Finding("ok", "namespace", f"{label}: block device {name}"))
    return out, numa


# --- RDMA, kvikio, NUMA ------------------------------------------------------------------------
def _roce_v2_gids(ctx: Context, name: str, port: int, gid_tbl_len: int) -> list[str]:
    """A port's RoCE v2 GIDs (of its first 16): what NVMe-oF over RDMA on Ethernet uses."""
    types = SYS / "class" / "infiniband" / name / "ports" / str(port) / "gid_attrs" / "types"
    gids = []
    for i in range(min(gid_tbl_len, 16)):
        if (_read(types / str(i)) or "").lower().startswith("roce v2"):
            gids.append(str(ctx.query_gid(port, i)))
    return gids


def _rdma_port_finding(ctx: Context, name: str, port: int, numa: int | None) -> Finding:
    """One RDMA port's state, link layer, MTU and GIDs: ok when it is ACTIVE."""
    pa = ctx.query_port(port)
    state = {4: "ACTIVE", 1: "DOWN", 2: "INIT", 3: "ARMED"}.get(pa.state, str(pa.state))
    ll = {1: "InfiniBand", 2: "Ethernet"}.get(pa.link_layer, str(pa.link_layer))
    mtu = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}.get(pa.active_mtu, pa.active_mtu)
    gids = _roce_v2_gids(ctx, name, port, pa.gid_tbl_len)
    status = "ok" if state == "ACTIVE" else "warn"
    fix = (
        ""
        if state == "ACTIVE"
        else f"bring the port up (ip link set ... up; check the cable/switch for {name}/{port})"
    )
    return Finding(
        status,
        "rdma",
        f"{name} port {port}: {state}, {ll}, MTU "
        f"{mtu}, RoCE v2 GIDs: {', '.join(gids) or 'none'}, "
        f"NUMA {numa}",
        fix,
    )


def check_rdma() -> tuple[list[Finding], list[int]]:
    try:
        from pyverbs import device as vdev
        from pyverbs.pyverbs_error import PyverbsRDMAError
    except ImportError:
        return [
            Finding(
                "warn",
                "rdma",
                "pyverbs is not installed: RDMA devices not checked",
                "apt-get install rdma-core python3-pyverbs (make install does it)",
            )
        ], []
    try:
        devices = vdev.get_device_list()
    except PyverbsRDMAError:
        devices = []
    if not devices:
        return [
            Finding("info", "rdma", "no RDMA devices (NVMe-oF over TCP, or local devices only)")
        ], []
    out, numas = [], []
    from pyverbs.device import Context

    for d in devices:
        name = d.name.decode() if isinstance(d.name, bytes) else str(d.name)
        numa = _numa(SYS / "class" / "infiniband" / name / "device" / "numa_node")
        if numa is not None and numa >= 0:
            numas.append(numa)
        try:
            with Context(name=name) as ctx:
                attr = ctx.query_device()
                for port in range(1, attr.phys_port_cnt + 1):
                    out.append(_rdma_port_finding(ctx, name, port, numa))
        except Exception as e:  # noqa: BLE001 - one broken device must not stop the report
            out.append(
                Finding(
                    "warn",
                    "rdma",
                    f"{name}: cannot query: {e}",
                    "check the RDMA driver (ibv_devinfo)",
                )
            )
    return out, numas


def check_kvikio() -> Finding:
    try:
        import kvikio
        import kvikio.defaults as kd
    except ImportError:
        return Finding(
            "info",
            "kvikio",
            "kvikio is not installed: kvfs.client.direct reads with "
            "parallel preads into host memory",
            "pip install kvikio-cu12 for the direct path into GPU memory",
        )
    except Exception as e:  # noqa: BLE001 - a broken CUDA install raises anything
        return Finding("warn", "kvikio", f"kvikio fails to import: {e}")
    version = getattr(kvikio, "__version__", "?")
    try:
        compat = kd.is_compat_mode_preferred()
    except Exception as e:  # noqa: BLE001
        return Finding(
            "info", "kvikio", f"kvikio {version} installed; cannot tell whether GDS is usable ({e})"
        )
    if compat:
        return Finding(
            "info",
            "kvikio",
            f"kvikio {version}: compatibility mode (POSIX reads "
            f"and copies; no GPUDirect Storage here)",
            "for GDS: NVIDIA driver with nvidia-fs, and namespaces on a filesystem "
            "or block device GDS supports",
        )
    return Finding("ok", "kvikio", f"kvikio {version}: GPUDirect Storage usable")


def check_numa(ns_numas: list[int], nic_numas: list[int]) -> list[Finding]:
    nodes = sorted(p.name for p in (SYS / "devices" / "system" / "node").glob("node[0-9]*"))
    gpus = []
    for dev in (SYS / "bus" / "pci" / "devices").glob("*"):
        if _read(dev / "vendor") == "0x10de" and (_read(dev / "class") or "").startswith(
            ("0x0300", "0x0302")
        ):
            gpus.append((dev.name, _numa(dev / "numa_node")))
    nics = [
        (p.name, _numa(p / "device" / "numa_node"))
        for p in (SYS / "class" / "net").glob("*")
        if (p / "device").exists()
    ]
    detail = (
        f"{len(nodes)} NUMA node(s); "
        f"GPUs: {', '.join(f'{n} (node {m})' for n, m in gpus) or 'none'}; "
        f"NICs: {', '.join(f'{n} (node {m})' for n, m in nics) or 'none'}; "
        f"namespaces on node(s): {sorted(set(ns_numas)) or 'unknown'}"
    )
    out = [Finding("info", "numa", detail)]
    gpu_nodes = {m for _, m in gpus if m is not None and m >= 0}
    far = {m for m in ns_numas if m is not None and m >= 0} - gpu_nodes
    if len(nodes) > 1 and gpu_nodes and far:
        out.append(
            Finding(
                "warn",
                "numa",
                f"namespaces on NUMA node(s) {sorted(far)} but GPUs on {sorted(gpu_nodes)}",
                "attach the NVMe-oF namespaces through NICs on the GPUs' node, or "
                "pin the kvfs daemon there (numactl --cpunodebind)",
            )
        )
    return out


# --- the command -----------------------------------------------------------------------------
def run_checks(mounts: list[str]) -> list[Finding]:
    findings = check_fuse()
    if not mounts:
        findings.append(Finding("info", "mount", "no kvfs mount on this node"))
    ns_numas: list[int] = []
    for m in mounts:
        fs, st = check_mount(m)
        findings += fs
        if st is None:
            continue
        findings += check_clients(m, st)  # the engines' directories in the mount
        for ns in st["namespaces"]:
            fs, numa = describe_namespace(ns)
            findings += fs
            if numa is not None:
                ns_numas.append(numa)
    rdma, nic_numas = check_rdma()
    findings += rdma
    findings.append(check_kvikio())
    findings += check_numa(ns_numas, nic_numas)
    return findings


def cmd_doctor(args: argparse.Namespace) -> int:
    if args.config and not args.mount:
        mounts = []  # the config's checks say everything about that pool
    else:
        mounts = [find_mount(args.mount)] if args.mount else kvfs_mounts()
    findings = run_checks(mounts)
    if args.config:
        findings = check_config(args.config) + findings
    bad = any(f.status == "fail" for f in findings)
    if args.json:
        print(json.dumps({"ok": not bad, "findings": [asdict(f) for f in findings]}))
    else:
        rows = [
            [f.status.upper(), f.check, f.detail + (f"\n      -> {f.fix}" if f.fix else "")]
            for f in findings
        ]
        print(table(["", "CHECK", "FINDING"], rows))
        print("\nall checks passed" if not bad else "\nsome checks failed: see the -> lines")
    return 1 if bad else 0


def add_parsers(sub) -> None:
    p = sub.add_parser("doctor", help="check FUSE, mounts, namespaces, RDMA, kvikio, NUMA")
    p.add_argument("mount", nargs="?", help="a kvfs mount (default: every kvfs mount)")
    p.add_argument(
        "--config",
        help="also check this config's pool without its daemon "
        "(state_dir, catalog log, namespaces and superblocks): why a "
        "mount does not start",
    )
    with_json(p)
    p.set_defaults(func=cmd_doctor)
