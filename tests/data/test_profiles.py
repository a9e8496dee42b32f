"""ProfileTable: loading the shipped table and the documented interpolation rules."""

from __future__ import annotations

import pytest

from gshare.profiles import ProfileError, ProfilePoint, ProfileTable


@pytest.fixture(scope="module")
def v100() -> ProfileTable:
    return ProfileTable.shipped_v100()


def test_shipped_table_is_complete(v100: ProfileTable) -> None:
    assert len(v100) == 54_928
    assert len(v100.models()) == 69
    assert v100.latency_ms("resnet50", 50, 100, 1) == pytest.approx(20.334)


def _tiny() -> ProfileTable:
    rows = []
    for sm, lat in [(10, 40.0), (20, 20.0)]:
        for q in (50.0, 100.0):
            for b, f in [(1, 1.0), (2, 1.5)]:
                rows.append(ProfilePoint("m", sm, q, b, lat * f * (2 if q == 50 else 1)))
    return ProfileTable(rows)


@pytest.mark.parametrize(
    ("sm", "q", "b", "expected"),
    [
        (10, 100, 1, 40.0),  # measured
        (15, 100, 1, 30.0),  # halfway between 40 (sm 10) and 20 (sm 20)
        (30, 100, 1, 20.0),  # above the largest SM: the largest's latency
        (10, 75, 1, 60.0),  # halfway between 80 (q 50) and 40 (q 100)
        (10, 25, 1, 160.0),  # below q_min 50: fluid 80 * 50 / 25
        (10, 100, 4, 100.0),  # beyond batch 2: 40 -> 60 is +20 ms per item, so 60 + 2 * 20
    ],
)
def test_interpolation_rules(sm: float, q: float, b: int, expected: float) -> None:
    t = _tiny()
    assert t.latency_ms("m", sm, q, b) == pytest.approx(expected)


def test_throughput_is_batch_over_latency() -> None:
    t = _tiny()
    # batch 2 at sm 20, q 100: 20 * 1.5 = 30 ms -> 2 * 1000 / 30 = 66.7 req/s
    assert t.throughput_rps("m", 20, 100, 2) == pytest.approx(2000 / 30)


def test_errors_name_the_problem() -> None:
    t = _tiny()
    with pytest.raises(ProfileError, match="unknown model 'x'"):
        t.latency_ms("x", 10)
    with pytest.raises(ProfileError, match="below the smallest measured SM share 10"):
        t.latency_ms("m", 5)
    with pytest.raises(ProfileError, match="batch must be >= 1"):
        t.latency_ms("m", 10, 100, 0)
