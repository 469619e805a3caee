"""What the kernel may answer without asking the daemon, and what makes it ask again.

The fewer requests a file operation costs, the more files a second the daemon serves
(docs/architecture.md, "The per-file budget"). Whatever the kernel caches must never be
stale: every change is either made through the kernel (which updates its cache) or
announced to it (eviction, another node's change)."""

from __future__ import annotations

import os

from testing.mount import wait_until


def requests(m, op: str) -> int:
    return m.stats()["latency"].get(op, {}).get("count", 0)


def test_a_missing_name_is_answered_by_the_kernel_until_it_is_made(mnt):
    """One node: a lookup that finds nothing is cached as a negative entry, so asking again
    (LMCache asks whether a chunk exists before storing it) costs no request, and the store
    that follows goes straight to CREATE; the file is then seen at once."""
    p = mnt.mountpoint / "chunk-absent"
    before = requests(mnt, "lookup")
    for _ in range(50):
        assert not p.exists()
    assert requests(mnt, "lookup") - before == 1
    p.write_bytes(b"made")  # through the mount: the entry is updated
    assert p.read_bytes() == b"made"
    assert requests(mnt, "lookup") - before == 1  # O_CREAT used the cached miss
    os.unlink(p)
    assert not p.exists()


def test_read_only_closes_send_no_flush(mnt):
    """Closing a file opened read-only commits nothing: the daemon asks the kernel not to
    send FLUSH for it (FOPEN_NOFLUSH); a writer's close still flushes (it commits)."""
    p = mnt.mountpoint / "f"
    p.write_bytes(b"x" * 4096)
    flushes = requests(mnt, "flush")
    for _ in range(20):
        assert p.read_bytes() == b"x" * 4096
    assert requests(mnt, "flush") == flushes
    p.write_bytes(b"y" * 4096)
    assert requests(mnt, "flush") == flushes + 1


def test_a_name_made_on_another_node_is_seen_at_once(cluster_nodes):
    """A shared pool: a miss is never cached by the kernel (another node may make the name
    any moment), so a name looked up in vain on one node and then made durable on another
    is found on the first as soon as its mirror has it (at once: "close" looks a miss up in
    Redis; with "fsync" the follower applies the publish within milliseconds)."""
    a, b = cluster_nodes(2)
    pa, pb = a.mountpoint / "late", b.mountpoint / "late"
    assert not pa.exists()
    pb.write_bytes(b"from b")
    b.sync()
    wait_until(pa.exists, 2, "a to see b's file")
    assert pa.read_bytes() == b"from b"


def test_a_file_removed_before_its_write_back_keeps_its_size_while_the_kernel_holds_it(
    make_mount, pool_config
):
    """A stat racing with an unlink reaches the daemon as a GETATTR of the removed inode; an
    O_PATH descriptor makes that race deterministic. A closed file removed before its
    write-back is never written, but its attributes still say what was written (as ext4's
    do), never 0 bytes (the soak saw that once). In "close" mode it was committed at close."""
    m = make_mount(pool_config(mount="writeback_ms = 60000"))
    p = m.mountpoint / "chunk.tmp"
    data = os.urandom(2 * 1024 * 1024 + 3)
    p.write_bytes(data)
    fd = os.open(p, os.O_PATH)
    try:
        os.rename(p, m.mountpoint / "chunk")
        os.unlink(m.mountpoint / "chunk")
        st = os.fstat(fd)
        assert (st.st_size, st.st_nlink) == (len(data), 0)
    finally:
        os.close(fd)


def test_a_passthrough_writers_memory_is_accounted_while_it_writes(mnt):
    """The kernel writes into a passthrough file's memory without asking the daemon: the
    daemon measures open writers' files a few times a second, so the DRAM tier counts their
    memory (and makes room for it) before they close."""

    def charged() -> int:
        return mnt.stats()["tiers"]["dram"]["write_buffers"]

    before = charged()
    with open(mnt.mountpoint / "growing", "wb") as f:
        f.write(os.urandom(8 * 1024 * 1024))
        f.flush()
        wait_until(
            lambda: charged() - before >= 8 * 1024 * 1024,
            5,
            "the writer's 8 MiB counted as write buffers",
        )
