import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvfs.pool.alloc import ExtentAllocator

P = 4096


def free_runs(used: list[bool], lo: int, hi: int) -> list[int]:
    """The lengths, in pages, of the runs of free pages in used[lo:hi]."""
    runs, run = [], 0
    for u in used[lo:hi]:
        if u:
            if run:
                runs.append(run)
            run = 0
        else:
            run += 1
    return runs + ([run] if run else [])


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
            assert not any(used[first : first + npages])
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


@settings(max_examples=200)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from("atf"), st.integers(0, 199), st.integers(1, 30)), max_size=80
    ),
    ranges=st.lists(st.tuples(st.integers(0, 199), st.integers(1, 60)), min_size=1, max_size=4),
)
def test_ranged_alloc_and_take_match_a_page_bitmap(ops, ranges):
    """alloc_in stays inside its ranges, take marks exactly what it names, free_in counts, and
    the free bytes in whole units (of 3 pages here) are what the runs of free pages hold."""
    start, pages, unit = 16 * P, 200, 3
    a = ExtentAllocator(start, start + pages * P, unit * P)
    used = [False] * pages
    spans = sorted({(lo, min(pages, lo + n)) for lo, n in ranges})
    merged: list[list[int]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    allowed = [(start + lo * P, start + hi * P) for lo, hi in merged]
    live = []
    for op, page, n in ops:
        n = min(n, pages - page)
        if op == "a":
            off = a.alloc_in(n * P, allowed)
            if off is None:
                for lo, hi in merged:
                    run = 0
                    for p in range(lo, hi):
                        run = 0 if used[p] else run + 1
                        assert run < n
                continue
            p0 = (off - start) // P
            assert any(lo <= p0 and p0 + n <= hi for lo, hi in merged)
            assert not any(used[p0 : p0 + n])
            used[p0 : p0 + n] = [True] * n
            live.append((off, n * P))
        elif op == "t":
            if any(used[page : page + n]):
                with pytest.raises(ValueError):
                    a.take(start + page * P, n * P)
            else:
                a.take(start + page * P, n * P)
                used[page : page + n] = [True] * n
                live.append((start + page * P, n * P))
        elif live:
            off, length = live.pop(page % len(live))
            a.free(off, length)
            p0 = (off - start) // P
            used[p0 : p0 + length // P] = [False] * (length // P)
        assert a.free_bytes == used.count(False) * P
        lo, hi = merged[0]
        total, largest = a.free_in(start + lo * P, start + hi * P)
        assert total == used[lo:hi].count(False) * P
        best = run = 0
        for p in range(lo, hi):
            run = 0 if used[p] else run + 1
            best = max(best, run)
        assert largest == best * P
        assert a.unit_bytes == sum(r - r % unit for r in free_runs(used, 0, pages)) * P
        assert (
            a.unit_bytes_in(start + lo * P, start + hi * P)
            == sum(r - r % unit for r in free_runs(used, lo, hi)) * P
        )
    # rebuilt from the used extents (as at start-up), the counts are the same
    import numpy as np

    live.sort()
    for b in (
        ExtentAllocator.from_used(start, start + pages * P, live, unit * P),
        ExtentAllocator.from_sorted(
            start,
            start + pages * P,
            np.array([o for o, _ in live], dtype=np.int64),
            np.array([n for _, n in live], dtype=np.int64),
            unit * P,
        ),
    ):
        assert (b.free_bytes, b.unit_bytes) == (a.free_bytes, a.unit_bytes)


def test_take_free_takes_only_the_free_parts_of_a_range():
    a = ExtentAllocator(0, 16 * P)
    a.take(2 * P, 2 * P)  # pages 2-3 used
    a.take(6 * P, P)  # page 6 used
    assert a.take_free(P, 7 * P) == 4 * P  # pages 1, 4, 5, 7 were free
    assert a.free_in(P, 8 * P) == (0, 0)
    assert a.free_bytes == 16 * P - 7 * P
    assert a.take_free(P, 7 * P) == 0  # nothing left to take there
