from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

from testing.redis_server import RedisServer
from tests.helpers import Mount, can_mount, write_config

# Timings on shared 2-core machines are noisy: no per-example deadlines.
settings.register_profile("kvfs", deadline=None)
settings.load_profile("kvfs")

TESTS = Path(__file__).resolve().parent
# Tests that mount kvfs: everything under these directories, and any test using these fixtures.
MOUNTED_DIRS = ("mounted", "lmcache")
MOUNT_FIXTURES = {"make_mount", "mnt", "cluster_nodes"}


def pytest_collection_modifyitems(config, items):
    """Mark every test that mounts kvfs `mounted`, once, here (not by hand in each file)."""
    for item in items:
        try:
            top = item.path.resolve().relative_to(TESTS).parts[0]
        except ValueError:
            top = ""
        if top in MOUNTED_DIRS or MOUNT_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.mounted)


@pytest.fixture
def pool_config(tmp_path: Path):
    """Make a config with file namespaces under tmp_path: pool_config(n=1, size='256MiB', ...);
    `durability`: "fsync" (the default) or "close" (`mount`: other keys of [mount])."""

    def make(
        n: int = 1,
        size: str = "256MiB",
        dram: str = "64MiB",
        pool: str = "",
        extra: str = "",
        name: str = "kvfs.toml",
        durability: str | None = None,
        mount: str = "",
    ) -> Path:
        namespaces = [{"path": str(tmp_path / f"ns{i}.img"), "size": size} for i in range(n)]
        if durability is not None:
            mount = f'durability = "{durability}"\n' + mount
        return write_config(
            tmp_path / name,
            tmp_path / "state",
            namespaces,
            dram=dram,
            pool=pool,
            extra=extra,
            mount=mount,
        )

    return make


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed mounted test shows the end of each daemon's log (CI keeps nothing else)."""
    report = yield
    mounts = getattr(item, "kvfs_mounts", ())
    if report.failed and call.when == "call":
        for m in mounts:
            report.sections.append((f"kvfs daemon log {m.log.name}", m.log_text()[-3000:]))
    return report


@pytest.fixture
def make_mount(tmp_path: Path, request):
    """Start kvfs mounts that are always stopped (unmounted) at the end of the test."""
    why = can_mount()
    if why:
        pytest.skip(why)
    mounts: list[Mount] = []
    request.node.kvfs_mounts = mounts

    def start(config: Path, name: str = "mnt", nofile: int | None = None) -> Mount:
        m = Mount(tmp_path / name, config, tmp_path / f"{name}.log", nofile=nofile)
        mounts.append(m)
        return m.start()

    yield start
    failed = []
    for m in mounts:
        # A daemon that crashed while the test ran, or exits non-zero (or by a signal) at
        # unmount, fails the test: its exit status, and the end of its log, say why.
        try:
            code = m.stop()
        except Exception as e:  # noqa: BLE001 - keep cleaning up the others
            m.kill()
            failed.append(f"{m.mountpoint}: stopping the daemon failed: {e!r}")
            continue
        if code != 0:
            failed.append(
                f"{m.mountpoint}: the daemon exited with status {code}:\n{m.log_text()[-2000:]}"
            )
    if failed:
        pytest.fail(
            "kvfs daemon(s) did not exit cleanly at unmount:\n" + "\n".join(failed), pytrace=False
        )


@pytest.fixture
def mnt(make_mount, pool_config) -> Mount:
    """A mounted kvfs with one 256 MiB file namespace and a 64 MiB DRAM tier."""
    return make_mount(pool_config())


@pytest.fixture
def redis(tmp_path):
    """A real redis-server (AOF, fsync always) on a free port, stopped at the end."""
    s = RedisServer(tmp_path / "redis").start()
    yield s
    s.stop()


@pytest.fixture
def cluster_nodes(tmp_path, redis, make_mount):
    """cluster_nodes(n, ...) -> n mounted kvfs daemons sharing 4 namespace files and one Redis."""

    def start(
        n: int = 2,
        size: str = "48MiB",
        grace: float = 1.0,
        lease: float = 2.0,
        regions: int = 12,
        dram: str = "32MiB",
    ):
        shared = tmp_path / "shared"
        shared.mkdir(exist_ok=True)
        nss = [{"path": str(shared / f"ns{i}.img"), "size": size} for i in range(4)]
        mounts = []
        for i in range(n):
            extra = (
                f'[cluster]\nredis = "{redis.url}"\nnode_id = "node{i}"\n'
                f"grace_seconds = {grace}\nlease_seconds = {lease}\nregions = {regions}\n"
            )
            cfg = write_config(
                tmp_path / f"node{i}.toml",
                tmp_path / f"state{i}",
                nss,
                dram=dram,
                extra=extra,
                pool='stripe_unit = "256KiB"',
            )
            mounts.append(make_mount(cfg, name=f"mnt{i}"))
        return mounts

    return start


def pytest_terminal_summary(terminalreporter):
    """One line at the end counting the skipped tests by reason (tests/helpers.py and each test
    say why they skip: no GPU, no device throttle, no passthrough...)."""
    reasons: dict[str, int] = {}
    for rep in terminalreporter.stats.get("skipped", []):
        longrepr = rep.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    line = "; ".join(f"{n} x {r}" for r, n in sorted(reasons.items(), key=lambda x: -x[1]))
    terminalreporter.write_line(f"skipped by reason: {line or 'none'}")
