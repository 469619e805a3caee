import pytest
from hypothesis import given, settings, strategies as st

from kvfs.alloc import ExtentAllocator

P = 4096


@settings(max_examples=200)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(1, 40)), max_size=80))
def test_allocator_matches_a_page_bitmap(ops):
    start, pages = 16 * P, 200
    a = ExtentAllocator(start, start + pages * P)
    used = [False] * pages
    live = []
    for is_alloc, npages in ops:
        if is_alloc or not live:
            off = a.alloc(npages * P)
            if off is None:
                # first fit found nothing: there must be no run of npages free pages
                run = best = 0
                for u in used:
                    run = 0 if u else run + 1
                    best = max(best, run)
                assert best < npages
                continue
            first = (off - start) // P
            assert not any(used[first:first + npages])
            for i in range(first, first + npages):
                used[i] = True
            live.append((off, npages))
        else:
            off, npages = live.pop(npages % len(live))
            a.free(off, npages * P)
            first = (off - start) // P
            for i in range(first, first + npages):
                used[i] = False
        assert a.free_bytes == used.count(False) * P
    # free extents are maximal (coalesced) and match the bitmap
    ext = a.extents()
    for (s1, l1), (s2, _) in zip(ext, ext[1:]):
        assert s1 + l1 < s2
    rebuilt = ExtentAllocator.from_used(start, start + pages * P, [(o, n * P) for o, n in live])
    assert rebuilt.extents() == ext


def test_double_free_and_overlap_are_refused():
    a = ExtentAllocator(0, 100 * P)
    off = a.alloc(10 * P)
    a.free(off, 10 * P)
    with pytest.raises(ValueError, match="double free"):
        a.free(off, P)
    with pytest.raises(ValueError, match="overlaps"):
        ExtentAllocator.from_used(0, 100 * P, [(0, 2 * P), (P, P)])
    with pytest.raises(ValueError):
        a.alloc(100)
