"""The launch-gated burst's token-gated work (``LaunchGating.launch_ms``) and its use."""

from __future__ import annotations

import pytest

from gshare.profiles import ProfileError, ProfilePoint, ProfileTable, kernels_per_inference
from gshare.sim.instance import LAUNCH_REF_FLOOR_MS, LaunchGating
from gshare.sim.profiler import ClosedLoopProtocol, simulated_profile


@pytest.mark.parametrize("floor", [0.5, 3.0, 10.0, 40.0])
def test_exponent_one_is_proportional_to_the_floor(floor: float) -> None:
    g = LaunchGating(launch_scale=1.3, launch_exponent=1.0)
    assert g.launch_ms(floor, 1e9) == pytest.approx(1.3 * floor)


@pytest.mark.parametrize("exponent", [0.8, 1.0, 1.6])
def test_the_reference_floor_gets_launch_scale_times_itself(exponent: float) -> None:
    g = LaunchGating(launch_scale=0.9, launch_exponent=exponent)
    assert g.launch_ms(LAUNCH_REF_FLOOR_MS, 1e9) == pytest.approx(0.9 * LAUNCH_REF_FLOOR_MS)


def test_the_kernel_basis_charges_each_kernel_and_ignores_the_floor() -> None:
    g = LaunchGating(launch_ms_per_kernel=0.07)
    assert g.launch_ms(5.0, 1e9, kernels=174) == pytest.approx(0.07 * 174)
    assert g.launch_ms(50.0, 1e9, kernels=174) == pytest.approx(0.07 * 174)  # floor unused
    assert g.launch_ms(5.0, 3.0, kernels=174) == 3.0  # capped at the device time
    # a model without a kernel count falls back to the floor rule
    assert g.launch_ms(5.0, 1e9, kernels=None) == pytest.approx(1.3 * 5.0)
    # and the floor rule (the default) ignores a count it is given
    assert LaunchGating().launch_ms(5.0, 1e9, kernels=174) == pytest.approx(1.3 * 5.0)


def test_every_shipped_model_has_a_kernel_count() -> None:
    counts = kernels_per_inference()
    assert set(counts) == set(ProfileTable.shipped_v100().models())
    assert all(k > 0 for k in counts.values())


def test_launches_never_outlast_the_device_time() -> None:
    g = LaunchGating(launch_scale=2.0, launch_exponent=1.6)
    assert g.launch_ms(30.0, 12.0) == 12.0
    assert g.launch_ms(0.0, 12.0) == 0.0


def test_gated_share_of_the_floor_grows_with_the_floor_above_exponent_one() -> None:
    # exponent > 1: the gated share G / C rises with C (small floors are mostly ungated work)
    g = LaunchGating(launch_scale=1.0, launch_exponent=1.6)
    floors = [2.0, 5.0, 10.0, 20.0, 50.0]
    shares = [g.launch_ms(c, 1e9) / c for c in floors]
    assert shares == sorted(shares)
    assert shares[0] < 1.0 < shares[-1]
    # and G itself is increasing in C
    gs = [g.launch_ms(c, 1e9) for c in floors]
    assert gs == sorted(gs)


def _flat_table(model: str, lat: float) -> ProfileTable:
    return ProfileTable(
        ProfilePoint(model, sm, 100.0, b, lat) for sm in (50.0, 100.0) for b in (1, 2)
    )


def test_simulated_profile_uses_the_gated_work() -> None:
    # A host-bound 4-ms model at quota 10 %: with exponent 1.6 its gated work is
    # 10 x 0.4 ** 1.6 = 2.3 ms instead of 4 ms, so the throttled latency is lower; at quota
    # 100 % both are the measured row.
    table = _flat_table("m", 4.0)
    proto = ClosedLoopProtocol(think_ms=5.0)
    kw = {"sm_values": [100.0], "quota_values": [10.0, 100.0], "batches": [1], "proto": proto}
    lin = simulated_profile(table, "m", launch=LaunchGating(1.0, 1.0), wakeup_ms=0.0, **kw)
    sup = simulated_profile(table, "m", launch=LaunchGating(1.0, 1.6), wakeup_ms=0.0, **kw)
    assert lin.latency_ms("m", 100.0, 100.0, 1) == sup.latency_ms("m", 100.0, 100.0, 1) == 4.0
    assert sup.latency_ms("m", 100.0, 10.0, 1) < lin.latency_ms("m", 100.0, 10.0, 1)
    # 4 ms of launches at 4 ms a window: one window a request, 40 - 5 = 35 ms
    assert lin.latency_ms("m", 100.0, 10.0, 1) == pytest.approx(35.0)


# -- the launch floor: minimum or a robust percentile of the quota-100 rows -----------------------


def _table(lats: list[float]) -> ProfileTable:
    rows = [ProfilePoint("m", 10.0 * (i + 1), 100.0, 1, x) for i, x in enumerate(lats)]
    rows.append(ProfilePoint("m", 10.0, 50.0, 1, 0.5))  # quota < 100: never part of the floor
    return ProfileTable(rows)


def test_launch_floor_is_the_minimum_by_default_and_a_percentile_on_request() -> None:
    t = _table([9.0, 5.0, 7.0, 6.0, 8.0])  # sorted: 5 6 7 8 9
    assert t.launch_floor_ms("m") == 5.0
    assert t.launch_floor_ms("m", 0.0) == 5.0
    assert t.launch_floor_ms("m", 50.0) == pytest.approx(7.0)
    assert t.launch_floor_ms("m", 25.0) == pytest.approx(6.0)
    assert t.launch_floor_ms("m", 10.0) == pytest.approx(5.4)  # linear between 5 and 6
    assert t.launch_floor_ms("m", 100.0) == 9.0


def test_a_percentile_floor_ignores_one_low_outlier() -> None:
    t = _table([2.0] + [10.0] * 9)
    assert t.launch_floor_ms("m") == 2.0
    assert t.launch_floor_ms("m", 25.0) == pytest.approx(10.0)


def test_launch_floor_rejects_a_bad_percentile() -> None:
    with pytest.raises(ProfileError):
        _table([1.0]).launch_floor_ms("m", 101.0)


def test_simulated_profile_reads_the_configured_floor() -> None:
    # rows 2 / 10 / 10 / 10 ms: the minimum floor gates 2 ms of launches, the 50th percentile
    # 10 ms; at quota 10 % the latter is throttled far more
    rows = [ProfilePoint("m", 100.0, 100.0, 1, 10.0), ProfilePoint("m", 100.0, 100.0, 2, 10.0)]
    rows += [ProfilePoint("m", 50.0, 100.0, 1, 2.0), ProfilePoint("m", 50.0, 100.0, 2, 10.0)]
    table = ProfileTable(rows)
    kw = {
        "sm_values": [100.0],
        "quota_values": [10.0],
        "batches": [1],
        "proto": ClosedLoopProtocol(think_ms=5.0),
        "wakeup_ms": 0.0,
    }
    lo = simulated_profile(table, "m", launch=LaunchGating(1.0, 1.0, 0.0), **kw)
    hi = simulated_profile(table, "m", launch=LaunchGating(1.0, 1.0, 50.0), **kw)
    assert lo.latency_ms("m", 100.0, 10.0, 1) < hi.latency_ms("m", 100.0, 10.0, 1)
