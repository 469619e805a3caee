from hypothesis import given, settings
from hypothesis import strategies as st

from kvfs.pool.layout import (
    PAGE,
    Layout,
    align_up,
    place_units,
    stored_length,
    unit_count,
    unit_length,
    units_covering,
)

units = st.sampled_from([4096, 65536, 1 << 20, 4 << 20])


@given(size=st.integers(0, 1 << 30), unit=units)
def test_units_partition_the_block(size, unit):
    n = unit_count(size, unit)
    lengths = [unit_length(size, unit, k) for k in range(n)]
    assert sum(lengths) == size
    assert all(0 < x <= unit for x in lengths)
    assert all(x == unit for x in lengths[:-1])
    assert all(stored_length(size, unit, k) % PAGE == 0 for k in range(n))


@given(size=st.integers(1, 1 << 28), unit=units, data=st.data())
def test_units_covering_is_exactly_the_range(size, unit, data):
    off = data.draw(st.integers(0, size + unit))
    length = data.draw(st.integers(0, 4 << 20))
    ks = units_covering(off, length, size, unit)
    end = min(off + length, size)
    if end <= off:
        assert len(ks) == 0
        return
    # consecutive units whose union contains [off, end) and no unit that misses the range
    assert list(ks) == list(range(ks[0], ks[-1] + 1))
    assert ks[0] * unit <= off < (ks[0] + 1) * unit
    assert ks[-1] * unit <= end - 1 < (ks[-1] + 1) * unit
    assert ks[-1] < unit_count(size, unit)


@given(n=st.integers(1, 8), nunits=st.integers(0, 200), start=st.integers(0, 100))
def test_equal_weights_rotate_from_the_start(n, nunits, start):
    got = place_units(nunits, [1.0] * n, start % n)
    assert got == [(start + k) % n for k in range(nunits)]


@given(
    weights=st.lists(st.integers(1, 10), min_size=1, max_size=6),
    nunits=st.integers(1, 300),
    start=st.integers(0, 5),
)
def test_weighted_placement_is_proportional(weights, nunits, start):
    got = place_units(nunits, [float(w) for w in weights], start % len(weights))
    total = sum(weights)
    for i, w in enumerate(weights):
        ideal = nunits * w / total
        assert abs(got.count(i) - ideal) <= len(weights), (got, weights)


def test_placement_skips_full_and_zero_weight_namespaces():
    assert place_units(4, [1, 0, 1], 0) == [0, 2, 0, 2]
    assert place_units(3, [1, 1], 0, room=[4096, 10 * 4096], unit_bytes=[4096] * 3) == [0, 1, 1]
    try:
        place_units(3, [1, 1], 0, room=[0, 4096], unit_bytes=[4096] * 3)
    except ValueError as e:
        assert "fits on no namespace" in str(e)
    else:
        raise AssertionError("expected ValueError")


@settings(max_examples=50)
@given(size=st.integers(0, 64 << 20), unit=units, n=st.integers(1, 4), start=st.integers(0, 3))
def test_layout_packs_and_coalesces(size, unit, n, start):
    k = unit_count(size, unit)
    ns = place_units(k, [1.0] * n, start % n)
    # lay each namespace's units out back to back, as the pool does for unfragmented space
    pos = [1 << 20] * n
    offs = []
    for i in range(k):
        offs.append(pos[ns[i]])
        pos[ns[i]] += stored_length(size, unit, i)
    lay = Layout(size, unit, tuple(ns), tuple(offs), tuple(range(k)))
    again = Layout.unpack(size, unit, *lay.pack())
    assert again == lay
    ext = lay.extents()
    assert (
        sum(e.length for e in ext)
        == lay.stored_bytes()
        == sum(stored_length(size, unit, i) for i in range(k))
    )
    assert len(ext) == len(set(ns))  # one contiguous extent per namespace used
    assert lay.stored_bytes() == align_up(size)


def test_carried_credit_spreads_one_unit_blocks_by_weight():
    """Blocks of one unit each, one call per block: from a fresh start every call would pick
    the heaviest namespace (whatever the rotation says); with the credit carried from block
    to block they go to each namespace in proportion to its weight."""
    weights = [0.863, 1.0, 0.5, 0.95]
    fresh = {place_units(1, weights, start % 4)[0] for start in range(100)}
    assert fresh == {1}
    credit = [0.0] * 4
    got = [place_units(1, weights, start % 4, credit=credit)[0] for start in range(3313)]
    for j, w in enumerate(weights):
        share = got.count(j) / len(got)
        assert abs(share - w / sum(weights)) < 0.01, (j, share)
    assert abs(sum(credit)) < 1e-6  # (credits stay centred: nothing drifts)
