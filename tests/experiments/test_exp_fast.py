"""fast-spatial and fast-packing (--quick): required keys, invariants, result files."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from gshare.experiments.common import Pod, effective_sm_pct, run_saturated
from gshare.experiments.registry import run_experiment
from gshare.experiments.results import ExperimentResult, write_result
from gshare.profiles import ProfilePoint, ProfileTable
from gshare.resources import GpuShare


@pytest.fixture(scope="module")
def spatial() -> ExperimentResult:
    return run_experiment("fast-spatial", quick=True, seed=0)


@pytest.fixture(scope="module")
def packing() -> ExperimentResult:
    return run_experiment("fast-packing", quick=True, seed=0)


def _row(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
    found = [r for r in rows if all(r[k] == v for k, v in match.items())]
    assert len(found) == 1, match
    return found[0]


# -- fast-spatial -------------------------------------------------------------------------------


@pytest.mark.parametrize("sfx", ["", "_no_interference"])
def test_spatial_summary_keys(spatial: ExperimentResult, sfx: str) -> None:
    s = spatial.summary
    for key in ("throughput_ratio_spatial_vs_time", "p99_ms_spatial", "p99_ms_time"):
        assert math.isfinite(s[key + sfx]) and s[key + sfx] > 0, key + sfx
    assert s["throughput_ratio_spatial_vs_time" + sfx] > 1.0


def test_spatial_beats_racing_at_eight_pods(spatial: ExperimentResult) -> None:
    for interference in (True, False):
        racing = _row(spatial.rows, pods=8, config="racing", interference=interference)
        for cfg in ("sm12", "sm24"):
            part = _row(spatial.rows, pods=8, config=cfg, interference=interference)
            assert part["throughput_rps"] > racing["throughput_rps"]
            assert part["p50_ms"] < racing["p50_ms"]


def test_spatial_interference_costs_throughput(spatial: ExperimentResult) -> None:
    s = spatial.summary
    assert (
        s["throughput_ratio_spatial_vs_time"]
        < s["throughput_ratio_spatial_vs_time_no_interference"]
    )
    # a lone pod has nobody to interfere with
    on = _row(spatial.rows, pods=1, config="sm12", interference=True)
    off = _row(spatial.rows, pods=1, config="sm12", interference=False)
    assert on["throughput_rps"] == pytest.approx(off["throughput_rps"])


def test_spatial_rows_are_sane(spatial: ExperimentResult) -> None:
    for r in spatial.rows:
        assert 0.0 < r["utilisation"] <= 1.0 + 1e-9
        assert 0.0 < r["sm_occupancy"] <= 1.0 + 1e-9
        assert r["sm_effective"] <= r["sm_occupancy"] + 1e-9
        # racing pods hold all SMs while they run
        if r["config"] == "racing":
            assert r["sm_occupancy"] == pytest.approx(r["utilisation"])


def test_spatial_writes_results(spatial: ExperimentResult, tmp_path: Path) -> None:
    folder = write_result(spatial, tmp_path)
    data = json.loads((folder / "results.json").read_text())
    assert data["experiment"] == "fast-spatial"
    assert len(data["rows"]) == len(spatial.rows) == 3 * 3 * 2  # pods x configs x interference
    assert (folder / "rows.csv").exists()
    for png in ("throughput.png", "p99.png", "sm_occupancy.png"):
        assert (folder / png).stat().st_size > 1000


# -- fast-packing -------------------------------------------------------------------------------


def test_packing_gpus_used(packing: ExperimentResult) -> None:
    s = packing.summary
    assert s["gpus_used_mra"] <= s["gpus_used_timeshare"]
    # 2 x (60 x 50) + 2 x (40 x 24) + 4 x (40 x 12) = 9,840 of 10,000: one GPU for MRA; time
    # sharing fits quotas 60 + 40 per GPU and 40 + 40 for the rest: 4 GPUs (paper Fig. 11).
    assert (s["gpus_used_mra"], s["gpus_used_timeshare"]) == (1, 4)


@pytest.mark.parametrize("sfx", ["", "_no_interference"])
def test_packing_summary_keys(packing: ExperimentResult, sfx: str) -> None:
    s = packing.summary
    for key in ("util_ratio", "sm_occupancy_ratio", "sm_allocated_ratio"):
        assert math.isfinite(s[key + sfx]) and s[key + sfx] > 0, key + sfx
    assert s["util_ratio" + sfx] >= 1.0
    assert s["sm_occupancy_ratio" + sfx] > 1.5


def test_packing_rows_match_the_placements(packing: ExperimentResult) -> None:
    mra = [r for r in packing.rows if r["placer"] == "mra" and r["interference"]]
    assert len(mra) == 1 and len(mra[0]["pods"].split()) == 8
    assert mra[0]["sm_alloc_pct"] == pytest.approx(2 * 50 + 2 * 24 + 4 * 12)
    ts = [r for r in packing.rows if r["placer"] == "time-share" and r["interference"]]
    assert sorted(r["quota_sum_pct"] for r in ts) == pytest.approx([80, 80, 100, 100])
    # time-shared GPUs: never more busy than their quota sum (request = limit)
    for r in ts:
        assert r["utilisation"] <= r["quota_sum_pct"] / 100 + 1e-3


def test_packing_writes_results(packing: ExperimentResult, tmp_path: Path) -> None:
    folder = write_result(packing, tmp_path)
    data = json.loads((folder / "results.json").read_text())
    assert data["summary"]["gpus_used_mra"] == 1
    assert (folder / "per_gpu.png").stat().st_size > 1000
    assert (folder / "means.png").stat().st_size > 1000


# -- helpers --------------------------------------------------------------------------------------


def test_effective_sm_pct_on_a_hand_built_profile() -> None:
    # latency 40 / 22 / 21 / 20 ms at 10 / 20 / 30 / 100 % SMs.
    # On 100 %: 5 % tolerance -> <= 21.0 ms: 30 % is the first -> 30.
    # On 20 %: <= 1.05 * 22 = 23.1 ms: 10 % (40 ms) is too slow -> 20.
    t = ProfileTable(
        ProfilePoint("m", sm, 100.0, 1, lat)
        for sm, lat in [(10, 40.0), (20, 22.0), (30, 21.0), (100, 20.0)]
    )
    assert effective_sm_pct(t, "m", 100.0) == 30.0
    assert effective_sm_pct(t, "m", 20.0) == 20.0
    assert effective_sm_pct(t, "m", 25.0) == 20.0  # lat(25) = 21.5 by interpolation; 22 <= 22.6


def test_run_saturated_keeps_a_lone_pod_busy() -> None:
    # one pod, 10 ms per request, 2 users: the GPU is always busy, 100 req/s, each request
    # waits behind one other -> 20 ms latency.
    t = ProfileTable(ProfilePoint("m", sm, 100.0, 1, 10.0) for sm in (10.0, 100.0))
    r = run_saturated(
        [Pod("p", "f", "m", GpuShare(50.0, 1.0, 1.0))],
        profiles=t,
        warmup_ms=100.0,
        measure_ms=1000.0,
    )
    assert r.throughput_rps == pytest.approx(100.0, abs=1.0)
    assert r.p50_ms == pytest.approx(20.0)
    assert r.utilisation == pytest.approx(1.0)
    assert r.sm_occupancy == pytest.approx(0.5)
    assert r.sm_effective == pytest.approx(0.1)  # 10 % SMs run it as fast as 50 %
    assert r.busy_ms["p"] == pytest.approx(1000.0)
    assert r.starved_pods == 0
