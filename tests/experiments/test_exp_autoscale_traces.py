"""autoscale-traces (--quick): required keys, curve and summary invariants, result files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gshare.experiments.autoscale_traces import (
    AUTOSCALER_NAMES,
    DEFAULT_HEADROOM,
    gpus_at_1pct,
    knob_values,
)
from gshare.experiments.registry import get, run_experiment
from gshare.experiments.results import ExperimentResult, write_result


@pytest.fixture(scope="module")
def result() -> ExperimentResult:
    return run_experiment("autoscale-traces", quick=True, seed=0)


def test_every_trace_and_autoscaler_measured(result: ExperimentResult) -> None:
    params = get("autoscale-traces").params(quick=True)
    cases = {f"{t}@{r:g}rps" for t, spec in params["traces"].items() for r in spec["rates_rps"]}
    assert set(result.summary["traces"]) == cases
    for case in cases:
        for name in AUTOSCALER_NAMES:
            rows = [r for r in result.rows if r["case"] == case and r["autoscaler"] == name]
            assert [r["knob"] for r in rows] == knob_values(params["knobs"], name)
            for r in rows:
                assert r["requests"] > 0
                assert 0.0 <= r["slo_violation_pct"] <= 100.0
                assert 0.0 < r["mean_gpus"] <= params["max_gpus"]
                assert r["cold_starts"] >= 0


def test_summary_matches_rows(result: ExperimentResult) -> None:
    s = result.summary
    assert s["default_autoscaler"] == "gshare-burst"
    for case, c in s["traces"].items():
        for name in AUTOSCALER_NAMES:
            rows = [r for r in result.rows if r["case"] == case and r["autoscaler"] == name]
            curve = c["curves"][name]
            assert len(curve) == len(rows)
            assert [p[0] for p in curve] == sorted(p[0] for p in curve)
            assert c["gpus_at_1pct"][name] == gpus_at_1pct(rows)
            assert isinstance(c["cold_starts"][name], int)
        d = c["default"]
        (row,) = [
            r
            for r in result.rows
            if r["case"] == case
            and r["autoscaler"] == "gshare-burst"
            and r["knob"] == d["headroom"]
        ]
        assert d["headroom"] == DEFAULT_HEADROOM
        assert d["slo_violation_pct"] == row["slo_violation_pct"]
        ours = c["gpus_at_1pct"]["gshare-burst"]
        others = [v for k, v in c["gpus_at_1pct"].items() if k != "gshare-burst" and v is not None]
        assert c["default_meets_1pct"] == (ours is not None)
        assert c["default_beats_baselines"] == (
            ours is not None and all(ours <= b + 1e-9 for b in others)
        )
    assert s["default_meets_1pct_all"] == all(c["default_meets_1pct"] for c in s["traces"].values())


def test_knob_values_include_the_default() -> None:
    assert knob_values({"gshare-burst": [1.0, 3.0]}, "gshare-burst") == sorted(
        [1.0, 3.0, DEFAULT_HEADROOM]
    )
    assert knob_values({"target-util": [0.7]}, "target-util") == [0.7]


def test_gpus_at_1pct() -> None:
    pts = [
        {"mean_gpus": 3.0, "slo_violation_pct": 0.5},
        {"mean_gpus": 2.0, "slo_violation_pct": 1.0},
        {"mean_gpus": 1.0, "slo_violation_pct": 4.0},
    ]
    assert gpus_at_1pct(pts) == 2.0
    assert gpus_at_1pct(pts[2:]) is None


def test_files(result: ExperimentResult, tmp_path: Path) -> None:
    d = write_result(result, tmp_path)
    data = json.loads((d / "results.json").read_text())
    assert data["experiment"] == "autoscale-traces"
    assert (d / "rows.csv").exists()
    assert (d / "autoscale_traces_curves.png").stat().st_size > 0
