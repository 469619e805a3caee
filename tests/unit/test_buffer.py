import os

from hypothesis import given, settings
from hypothesis import strategies as st

from kvfs.pool.buffer import Buffer, zero_chunk

C = 64 * 1024


@settings(max_examples=100)
@given(
    writes=st.lists(
        st.tuples(st.integers(0, 5 * C), st.binary(min_size=0, max_size=2 * C)), max_size=10
    ),
    cut=st.integers(0, 6 * C),
)
def test_buffer_behaves_like_a_bytearray(writes, cut):
    b = Buffer(C)
    ref = bytearray()
    for off, data in writes:
        b.write(off, data)
        if off + len(data) > len(ref):
            ref.extend(bytes(off + len(data) - len(ref)))
        ref[off : off + len(data)] = data
    assert b.size == len(ref)
    assert bytes(b.view(0, len(ref) + 10)) == bytes(ref)
    b.resize(cut)
    ref = (ref + bytes(max(0, cut - len(ref))))[:cut]
    assert bytes(b.view(0, cut)) == bytes(ref)
    b.resize(cut + C)  # grow again: the tail reads as zeros
    assert bytes(b.view(cut, C)) == bytes(C)
    assert bytes(b.copy().view(0, b.size)) == bytes(b.view(0, b.size))
    assert b.nbytes <= b.reserved_bytes  # memory: never more than the content's pages


def test_views_of_blocks_larger_than_a_chunk_are_zero_copy():
    b = Buffer(C)
    data = os.urandom(3 * C)
    b.write(0, data)
    v = b.view(C - 10, 100)
    assert isinstance(v, memoryview) and bytes(v) == data[C - 10 : C + 90]
    small = Buffer(C)
    small.write(0, b"abc")
    assert small.view(1, 10) == b"bc"  # a small block: a copy, no mapping kept


def test_io_views_cover_holes_with_zeros_for_writes():
    b = Buffer(C)
    b.write(2 * C, b"x" * 10)
    z = zero_chunk(C)
    views = b.io_views(0, 3 * C, z)
    assert sum(len(v) for v in views) == 3 * C
    assert bytes(views[0]) == bytes(C)
    assert b.nbytes == 4096  # a hole stays a hole when written out


def test_io_views_pad_the_last_unit_with_zeros_past_the_content():
    b = Buffer(C)
    b.write(0, b"y" * (C + 100))
    z = zero_chunk(C)
    views = b.io_views(C, C, z)  # the last unit: 100 bytes, then padding
    data = b"".join(bytes(v) for v in views)
    assert data == b"y" * 100 + bytes(C - 100)
    views = b.io_views(0, C, z)
    assert b"".join(bytes(v) for v in views) == b"y" * C


def test_the_kernel_sees_the_same_bytes_through_the_memfd():
    """What passthrough serves is the memfd itself: the daemon's writes and the fd agree."""
    b = Buffer(C)
    b.write(100, b"abc")
    assert os.pread(b.fd, 3, 100) == b"abc"
    os.pwrite(b.fd, b"xyz", 2 * C)  # a write the daemon did not see (passthrough)
    assert b.sync_size() == 2 * C + 3
    assert bytes(b.view(2 * C, 3)) == b"xyz"
    b.seal()
    import pytest

    with pytest.raises(OSError):
        os.ftruncate(b.fd, 10)  # sealed: the size is final


def test_spares_keep_only_memory_nothing_else_can_see(tmp_path):
    """A dead buffer's file is kept for reuse only on the private tmpfs, only while nothing
    else has it open or mapped (asked of the kernel with a write lease), and only within the
    room it is given; a fetch then gets it (one of its size first)."""
    import mmap

    from kvfs.pool.buffer import MemorySource, Spares

    if os.geteuid() != 0:
        import pytest

        pytest.skip("the private tmpfs needs root")
    src = MemorySource()
    assert src.use_private_tmpfs(64 << 20) is None
    room = [16 << 20]
    spares = Spares(lambda: room[0], src)

    def filled(size: int) -> tuple[int, bytes]:
        fd, name = src.new_file()
        os.pwrite(fd, b"x" * size, 0)
        return fd, name

    def names() -> set[bytes]:
        return {os.fsencode(n) for n in os.listdir(src.dirfd)}

    (a, an), (b, bn) = filled(1 << 20), filled(2 << 20)
    spares.give(a, an)
    src.close(b)
    spares.give(None, bn)  # a buffer that died with its file closed (parked)
    assert spares.kept == 2 and spares.bytes == 3 << 20
    assert src.open_files == 0  # spares are kept by name, no descriptor open
    got_a, got_b = spares.take(1 << 20), spares.take(5)
    assert got_a[1] == an and got_b[1] == bn and spares.take(5) is None
    assert os.pread(got_a[0], 1, 0) == b"x"  # reopened: the same file
    assert spares.bytes == 0 and spares.reused == 2
    src.close(got_b[0])
    a = got_a[0]

    # another open file (a FUSE passthrough open is one), or a mapping made through one that
    # outlives it: the memory is not kept (and the file is removed)
    other = os.open(f"/proc/self/fd/{a}", os.O_RDONLY)
    spares.give(a, an)
    assert spares.kept == 2 and an not in names()
    os.close(other)
    c, cn = filled(1 << 20)
    other = os.open(f"/proc/self/fd/{c}", os.O_RDONLY)
    m = mmap.mmap(other, 1 << 20, prot=mmap.PROT_READ)
    os.close(other)
    spares.give(c, cn)
    assert spares.kept == 2 and cn not in names()
    m.close()
    # no room, or memory of a memfd (not on the private tmpfs): closed
    room[0] = 1 << 20
    spares.give(*filled(2 << 20))
    memfd = os.memfd_create("x")
    os.pwrite(memfd, b"y", 0)
    Spares(lambda: 1 << 30).give(memfd, None)
    assert spares.kept == 2 and spares.bytes == 0
    d, dn = filled(1 << 20)
    spares.give(d, dn)
    assert spares.kept == 3 and dn in names()
    spares.close()
    assert spares.bytes == 0 and dn not in names() and src.open_files == 0


def test_a_parked_buffer_keeps_its_bytes_and_reopens_by_name():
    """On the private tmpfs a buffer nobody uses can close its descriptor (the daemon then
    holds none for it) and is reopened by name when used; a memfd cannot be parked."""
    from kvfs.pool import buffer as buffer_mod
    from kvfs.pool.buffer import MemorySource

    if os.geteuid() != 0:
        import pytest

        pytest.skip("the private tmpfs needs root")
    import gc

    # buffers earlier tests left in reference cycles die in the collection below, and a dead
    # buffer with spares is released through the MEMORY of that moment: not this test's src
    gc.collect()
    src = MemorySource()
    assert src.use_private_tmpfs(64 << 20) is None
    saved = buffer_mod.MEMORY
    buffer_mod.MEMORY = src
    try:
        b = Buffer(C)
        b.write(0, b"z" * (C + 7))
        assert src.open_files == 1
        assert b.park() and b.parked and src.open_files == 0
        assert b.nbytes >= C + 7 and b.sync_size() == C + 7  # stat by name, not reopened
        assert b.parked
        assert bytes(b.view(C, 100)) == b"z" * 7 and not b.parked and src.open_files == 1
        name = b._box[1]
        del b
        gc.collect()
        assert src.open_files == 0 and os.fsdecode(name) not in os.listdir(src.dirfd)
    finally:
        buffer_mod.MEMORY = saved
    m = Buffer(C)  # a memfd (this process has no private tmpfs): stays open
    assert not m.park() and not m.parked


def test_a_buffer_that_dies_inside_a_lock_of_its_module_is_released_after_it():
    """The cyclic collector runs a dead buffer's finalizer at any allocation, on whichever
    thread makes it: also inside the spares' own locked region (here, their room check). The
    finalizer waited there for the lock its own thread held, forever (the daemon hung so);
    now the buffer is released as the thread leaves the lock."""
    import gc
    import threading
    import weakref

    from kvfs.pool.buffer import MemorySource, Spares, _release

    if os.geteuid() != 0:
        import pytest

        pytest.skip("the private tmpfs needs root")
    src = MemorySource()
    assert src.use_private_tmpfs(64 << 20) is None
    collect = [False]

    def room() -> int:
        if collect[0]:
            collect[0] = False
            gc.collect()  # the collector, run inside give's locked region
        return 1 << 30

    spares = Spares(room, src)

    class Node:
        pass

    def filled() -> tuple[int, bytes]:
        fd, name = src.new_file()
        os.pwrite(fd, b"x" * 4096, 0)
        return fd, name

    was_enabled = gc.isenabled()
    gc.disable()  # only the collection in room() frees the cycle
    try:
        dead = Node()
        dead.me = dead  # a cycle: only the collector frees it
        weakref.finalize(dead, _release, [*filled(), spares, src])  # as a Buffer's
        del dead
        collect[0] = True
        t = threading.Thread(target=spares.give, args=filled(), daemon=True)
        t.start()
        t.join(30)
        assert not t.is_alive(), "a finalizer run inside the spares' lock waited for it"
    finally:
        if was_enabled:
            gc.enable()
    assert not collect[0]  # the collection did run inside the lock
    assert spares.kept == 2 and src.open_files == 0  # both files kept, none left open
    spares.close()
