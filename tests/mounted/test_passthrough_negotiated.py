"""kvfs negotiates FUSE passthrough wherever the kernel offers it. Whether the kernel offers it
is established without kvfs: by the minimal pyfuse3 file system of test_passthrough_kernel.py
(its INIT). A kvfs mount that then serves data through the daemon is a failure, not a skip: the
passthrough tests elsewhere skip when kvfs does not use it, and would hide that regression."""

from __future__ import annotations

import pytest

from tests.mounted.test_passthrough_kernel import Server, _skip_reason

pytestmark = [
    pytest.mark.mounted,
    pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason())),
]


def test_kvfs_negotiates_passthrough_when_the_kernel_offers_it(
    tmp_path, make_mount, pool_config, monkeypatch
):
    server = Server(tmp_path, "probe")
    try:
        offered = server.passthrough
    finally:
        server.stop()
    if not offered:
        pytest.skip(
            "the kernel did not offer FUSE passthrough at INIT (needs Linux >= 6.9 "
            "with CONFIG_FUSE_PASSTHROUGH)"
        )
    monkeypatch.delenv("KVFS_PASSTHROUGH", raising=False)  # the default: passthrough on
    m = make_mount(pool_config())
    path = m.stats()["data_path"]
    assert path["passthrough"], f"the kernel offers FUSE passthrough, kvfs did not take it: {path}"
    assert path.get("parallel_dirops"), f"FUSE_PARALLEL_DIROPS not negotiated: {path}"
