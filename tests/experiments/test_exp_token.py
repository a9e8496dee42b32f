"""token-share and token-fidelity experiments (--quick), and the launch-gated burst they rely on."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gshare.experiments.registry import run_experiment
from gshare.experiments.results import ExperimentResult, write_result
from gshare.experiments.token_fidelity import Predictor, Protocol, load_points, simulate_closed_loop
from gshare.policy.tokens import ClientSpec
from gshare.profiles import ProfilePoint, ProfileTable
from gshare.sim.engine import EventLoop
from gshare.sim.gpu import InterferenceModel, SimGpu

# -- the launch-gated closed loop (token-fidelity's mechanism) ---------------------------------


@pytest.mark.parametrize(
    ("launch", "device", "quota", "wakeup", "mean_ms"),
    [
        # Device-bound (vgg19, SM 10 %, batch 8): 6 ms of launches go through in the first
        # window (4 ms) and the next (2 ms), long before the 157-ms device time: not slowed.
        (6.0, 157.0, 0.1, 0.0, 157.0),
        # quota 100 %: 20 ms of launches per 25-ms cycle never exhaust 40 ms: exactly L100.
        (20.0, 20.0, 1.0, 0.0, 20.0),
        # launch-bound: 6 ms per request at 4 ms per window -> 1.5 windows = 60 ms a cycle; the
        # 5-ms think time costs no quota, so the mean latency is 60 - 5 = 55.
        (6.0, 6.0, 0.1, 0.0, 55.0),
        # a 2-ms wake-up after every waited-for token leaves 4 - 2 = 2 ms a window: 3 windows
        # a request, 120 - 5 = 115; with 1 ms, 3 ms a window: 2 windows, 80 - 5 = 75.
        (6.0, 6.0, 0.1, 2.0, 115.0),
        (6.0, 6.0, 0.1, 1.0, 75.0),
    ],
)
def test_closed_loop_latency_follows_the_window_arithmetic(
    launch: float, device: float, quota: float, wakeup: float, mean_ms: float
) -> None:
    mean, events = simulate_closed_loop(launch, device, quota, wakeup, Protocol())
    assert mean == pytest.approx(mean_ms, abs=1e-6)
    assert events > 0


def test_launch_gated_burst_holds_a_token_only_while_launching() -> None:
    # One client at quota 0.25 (10 ms a window), 4 ms of launches, 50 ms of device time: the
    # token is released at t = 4 (launches through), the burst completes at 50 (device drained),
    # and the scheduler charged 4 ms, not 50.
    loop = EventLoop()
    log: list[tuple[str, float, float]] = []
    gpu = SimGpu(loop, interference=InterferenceModel(enabled=False), token_log=log)
    gpu.add_client(ClientSpec("a", 100.0, 0.25, 0.25))
    done: list[float] = []
    gpu.run_burst("a", 4.0, lambda: done.append(loop.now_ms), device_ms=50.0)
    loop.run(until_ms=20.0)
    assert gpu.running_clients == []  # draining without a token
    with pytest.raises(RuntimeError, match="already has a burst"):
        gpu.run_burst("a", 1.0, lambda: None)
    loop.run()
    assert done == [pytest.approx(50.0)]
    assert log == [("a", 0.0, pytest.approx(4.0))]
    assert gpu.scheduler.snapshot()["a"].total_used_ms == pytest.approx(4.0)


# -- token-share ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def share() -> ExperimentResult:
    return run_experiment("token-share", quick=True)


def test_token_share_summary_meets_its_targets(share: ExperimentResult) -> None:
    s = share.summary
    for key in ("max_abs_share_error_pp", "max_over_limit_pp", "idle_time_reclaimed_pct"):
        assert key in s and math.isfinite(s[key])
    assert s["max_abs_share_error_pp"] <= 2.0
    assert s["max_over_limit_pp"] == pytest.approx(0.0, abs=1e-9)
    assert s["idle_time_reclaimed_pct"] >= 95.0


def test_token_share_rows_are_consistent(share: ExperimentResult) -> None:
    for r in share.rows:
        # no window above the limit (bursts are preempted at token end)
        assert r["max_window_pct"] <= r["limit_pct"] + 1e-6
        if not r["active"]:
            assert r["achieved_pct"] == pytest.approx(0.0, abs=0.5)  # idle apart from a tail
    # the 10/50/90 % targets of the isolation scenarios, each against a greedy neighbour
    iso = {(r["scenario"], r["client"]): r["achieved_pct"] for r in share.rows if r["phase"] == 1}
    for pct in (10, 50, 90):
        assert iso[(f"iso-{pct}", "T")] == pytest.approx(pct, abs=2.0)
    # spatial sharing: disjoint SM bands (30 + 30 + 40 %) run at once, so their shares add up
    # to 10 + 80 + 90 = 180 % of wall time, which time sharing alone could never give
    spatial = [r for r in share.rows if r["scenario"] == "spatial" and r["phase"] == 1]
    assert sum(r["achieved_pct"] for r in spatial) == pytest.approx(180.0, abs=3.0)


def test_token_share_writes_its_files(share: ExperimentResult, tmp_path: Path) -> None:
    d = write_result(share, tmp_path)
    data = json.loads((d / "results.json").read_text())
    assert data["experiment"] == "token-share"
    assert data["summary"]["max_over_limit_pp"] == pytest.approx(0.0, abs=1e-9)
    assert (d / "rows.csv").exists()
    assert sorted(p.name for p in d.glob("*.png")) == [
        "token_share_bars.png",
        "token_share_windows.png",
    ]


# -- token-fidelity ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fidelity() -> ExperimentResult:
    return run_experiment("token-fidelity", quick=True)


def test_token_fidelity_reports_held_out_mape_below_fluid(fidelity: ExperimentResult) -> None:
    s = fidelity.summary
    for key in ("mape_pct", "fluid_mape_pct", "mape_all_pct", "closed_form_mape_pct"):
        assert math.isfinite(s[key]) and s[key] >= 0.0
    assert s["mape_pct"] < s["fluid_mape_pct"]
    assert s["mape_pct"] <= 40.0
    # every measured quota below 100 % has both errors
    assert set(s["per_quota"]) == {str(q) for q in range(10, 100, 10)}
    for v in s["per_quota"].values():
        assert set(v) == {"sim", "fluid"} and math.isfinite(v["sim"])


def test_token_fidelity_calibrates_on_one_half_and_reports_the_other(
    fidelity: ExperimentResult,
) -> None:
    s = fidelity.summary
    calib = set(s["calibration"]["on_models"])
    held = set(s["held_out_models"])
    assert calib and held and not calib & held
    assert {r["model"] for r in fidelity.rows} == calib | held
    assert {r["model"] for r in fidelity.rows if r["split"] == "held-out"} == held
    # the chosen constants are the grid's best on the calibration half
    grid = s["calibration"]["grid_mape_pct"]
    c = s["constants"]
    best = min(grid.values())
    key = (
        f"k={c['launch_scale']:g} wake={c['token_wakeup_ms']:g}ms p={c['launch_exponent']:g} "
        f"floor=q{c['floor_quantile_pct']:g} us/kernel={c['launch_us_per_kernel']:g}"
    )
    assert grid[key] == best
    # the quick grid, on the capped kernel basis, crosses 2 scales x 2 wake-ups x 1 exponent x
    # 2 costs per kernel
    assert c["launch_basis"] == "kernels-capped"
    assert len(grid) == 8
    assert s["points_held_out"] < s["points_all"]


def test_token_fidelity_writes_its_files(fidelity: ExperimentResult, tmp_path: Path) -> None:
    d = write_result(fidelity, tmp_path)
    data = json.loads((d / "results.json").read_text())
    assert data["summary"]["mape_pct"] == pytest.approx(fidelity.summary["mape_pct"], rel=1e-5)
    assert len(list(d.glob("*.png"))) == 3


def test_token_fidelity_predictor_takes_the_floor_from_quota_100_rows() -> None:
    # the floor at a percentile comes from the table's quota-100 rows; a quota < 100 row (the
    # thing predicted) never moves it
    rows = [ProfilePoint("m", sm, 100.0, 1, lat) for sm, lat in ((50.0, 4.0), (100.0, 8.0))]
    rows.append(ProfilePoint("m", 100.0, 10.0, 1, 1.0))
    table = ProfileTable(rows)
    (pt,) = load_points(table)
    assert (pt.l100_ms, pt.floor_ms, pt.measured_ms) == (8.0, 4.0, 1.0)
    pred = Predictor(Protocol(), table)
    assert pred.floor_ms(pt, 0.0) == 4.0
    assert pred.floor_ms(pt, 50.0) == pytest.approx(6.0)
    # a larger floor gates more launch work: slower at quota 10 %
    assert pred(pt, 1.0, 0.0, 1.0, 50.0) > pred(pt, 1.0, 0.0, 1.0, 0.0)


def test_token_fidelity_points_carry_the_models_kernel_counts() -> None:
    table = ProfileTable.shipped_v100()
    pts = load_points(table, ["resnet18", "resnet50"])
    by_model = {p.model: p.kernels for p in pts}
    assert by_model == {"resnet18": 68, "resnet50": 174}
    # on the kernel basis the gated work is per kernel: resnet50's is 174/68 of resnet18's
    # wherever neither is capped at its device time
    pred = Predictor(Protocol(), table)
    r18 = next(p for p in pts if p.model == "resnet18" and p.quota_pct == 10.0)
    slow = pred(r18, 1.0, 0.0, 1.0, 0.0, 0.09)
    fast = pred(r18, 1.0, 0.0, 1.0, 0.0, 0.03)
    assert slow > fast  # more gated work per kernel: slower at quota 10 %


def test_token_fidelity_refuses_an_unknown_launch_basis() -> None:
    with pytest.raises(ValueError, match="launch_basis"):
        run_experiment("token-fidelity", quick=True, overrides=["launch_basis=flops"])
