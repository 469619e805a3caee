from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

# Timings on shared 2-core machines are noisy: no per-example deadlines.
settings.register_profile("kvfs", deadline=None)
settings.load_profile("kvfs")

from tests.helpers import Mount, can_mount, write_config


@pytest.fixture
def pool_config(tmp_path: Path):
    """Make a config with file namespaces under tmp_path: pool_config(n=1, size='256MiB', ...)."""
    def make(n: int = 1, size: str = "256MiB", dram: str = "64MiB", pool: str = "",
             extra: str = "", name: str = "kvfs.toml") -> Path:
        namespaces = [{"path": str(tmp_path / f"ns{i}.img"), "size": size} for i in range(n)]
        return write_config(tmp_path / name, tmp_path / "state", namespaces, dram=dram,
                            pool=pool, extra=extra)
    return make


@pytest.fixture
def make_mount(tmp_path: Path):
    """Start kvfs mounts that are always stopped (unmounted) at the end of the test."""
    why = can_mount()
    if why:
        pytest.skip(why)
    mounts: list[Mount] = []

    def start(config: Path, name: str = "mnt") -> Mount:
        m = Mount(tmp_path / name, config, tmp_path / f"{name}.log")
        mounts.append(m)
        return m.start()

    yield start
    for m in mounts:
        try:
            m.stop()
        except Exception:  # noqa: BLE001 - keep cleaning up the others
            m.kill()


@pytest.fixture
def mnt(make_mount, pool_config) -> Mount:
    """A mounted kvfs with one 256 MiB file namespace and a 64 MiB DRAM tier."""
    return make_mount(pool_config())
