"""The daemon's open descriptors are bounded by what is in use, not by how many files it holds.

Every block in DRAM lives in a file of the daemon's private memory (a memfd, or a file on its
private tmpfs); a descriptor for each would make the number of files the DRAM tier can hold,
and so a writer creating many small files, run into RLIMIT_NOFILE (EMFILE at the commit)."""

from __future__ import annotations

import os

N_FILES = 10 * 1024
LIMIT = 1024
SIZE = 4096


def content(i: int) -> bytes:
    return i.to_bytes(8, "little") * (SIZE // 8)


def test_ten_times_the_descriptor_limit_in_files(make_mount, pool_config):
    """A daemon allowed 1,024 descriptors takes 10,240 files from one writer, one after
    another, keeps more of them in DRAM than it may open, reads them all back bit-exact, and
    holds far fewer descriptors than its limit throughout."""
    m = make_mount(pool_config(size="256MiB", dram="128MiB"), nofile=LIMIT)
    root = m.mountpoint
    most = 0
    for d in range(N_FILES // 1024):
        os.mkdir(root / f"d{d}")
    for i in range(N_FILES):
        (root / f"d{i // 1024}" / f"f{i}").write_bytes(content(i))
        if i % 1024 == 1023:
            most = max(most, m.open_descriptors())
    st = m.stats()
    resident = st["tiers"]["dram"]["blocks"]
    if st["data_path"]["memory"].startswith("tmpfs"):
        # the daemon's private tmpfs: blocks in DRAM hold no descriptor while unused
        assert resident > LIMIT, f"only {resident} blocks kept in DRAM"
    for i in range(N_FILES):
        assert (root / f"d{i // 1024}" / f"f{i}").read_bytes() == content(i), f"f{i}"
        if i % 1024 == 1023:
            most = max(most, m.open_descriptors())
    assert most < LIMIT // 2, f"the daemon held {most} descriptors (limit {LIMIT})"
    assert "EMFILE" not in m.log_text() and "Too many open files" not in m.log_text()
