import os

from hypothesis import given, settings, strategies as st

from kvfs.buffer import Buffer, zero_chunk

C = 64 * 1024


@settings(max_examples=100)
@given(writes=st.lists(st.tuples(st.integers(0, 5 * C), st.binary(min_size=0, max_size=2 * C)),
                       max_size=10), cut=st.integers(0, 6 * C))
def test_buffer_behaves_like_a_bytearray(writes, cut):
    b = Buffer(C)
    ref = bytearray()
    for off, data in writes:
        b.write(off, data)
        if off + len(data) > len(ref):
            ref.extend(bytes(off + len(data) - len(ref)))
        ref[off:off + len(data)] = data
    assert b.size == len(ref)
    assert bytes(b.view(0, len(ref) + 10)) == bytes(ref)
    b.resize(cut)
    ref = (ref + bytes(max(0, cut - len(ref))))[:cut]
    assert bytes(b.view(0, cut)) == bytes(ref)
    b.resize(cut + C)      # grow again: the tail reads as zeros
    assert bytes(b.view(cut, C)) == bytes(C)
    assert bytes(b.copy().view(0, b.size)) == bytes(b.view(0, b.size))
    end = (b.size + 4095) // 4096 * 4096
    assert b.nbytes == sum(max(0, min(C, end - i * C)) for i, c in enumerate(b.chunks)
                           if c is not None)


def test_views_inside_one_chunk_are_zero_copy():
    b = Buffer(C)
    b.write(0, os.urandom(3 * C))
    v = b.view(C + 10, 100)
    assert isinstance(v, memoryview)
    assert isinstance(b.view(C - 10, 100), bytes)     # straddles: joined


def test_io_views_cover_holes_with_zeros_for_writes():
    b = Buffer(C)
    b.write(2 * C, b"x" * 10)
    z = zero_chunk(C)
    views = b.io_views(0, 3 * C, z)
    assert sum(len(v) for v in views) == 3 * C
    assert bytes(views[0]) == bytes(C)
    assert b.chunks[0] is None       # a hole stays a hole when written out
