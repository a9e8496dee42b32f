"""The esg-* experiments (--quick): required summary keys, sane values, result files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gshare.experiments.esg_common import SCHEDULERS, check_schedulers
from gshare.experiments.esg_overhead import SMALL_GRID, python_brute_force, search_cases
from gshare.experiments.registry import get, run_experiment
from gshare.experiments.results import ExperimentResult, write_result
from gshare.policy.workflow.astar import Plans, brute_force

SETTINGS = ["strict-light", "moderate-normal", "relaxed-heavy"]


@pytest.fixture(scope="module")
def endtoend() -> ExperimentResult:
    return run_experiment("esg-endtoend", quick=True, seed=0)


@pytest.fixture(scope="module")
def overhead() -> ExperimentResult:
    return run_experiment("esg-overhead", quick=True, seed=0)


@pytest.fixture(scope="module")
def ablation() -> ExperimentResult:
    return run_experiment("esg-ablation", quick=True, seed=0)


@pytest.fixture(scope="module")
def trace() -> ExperimentResult:
    return run_experiment("esg-trace", quick=True, seed=0)


def test_registered() -> None:
    for name in ("esg-endtoend", "esg-overhead", "esg-ablation", "esg-trace"):
        exp = get(name)
        assert exp.full_params and exp.quick_params


# -- esg-endtoend --------------------------------------------------------------------------------


def test_endtoend_has_every_cell(endtoend: ExperimentResult) -> None:
    s = endtoend.summary
    have = list(SCHEDULERS)
    assert s["schedulers"] == have
    for key in ("slo_hit_rate", "cost_normalized"):
        assert sorted(s[key]) == sorted(SETTINGS)
        for st in SETTINGS:
            assert sorted(s[key][st]) == sorted(have), (key, st)
    for st in SETTINGS:
        assert s["cost_normalized"][st]["esg"] == pytest.approx(1.0)
        for v in s["slo_hit_rate"][st].values():
            assert 0.0 <= v <= 1.0
        for v in s["cost_normalized"][st].values():
            assert math.isfinite(v) and v > 0.0


def test_unknown_scheduler_is_an_error_naming_the_known_ones() -> None:
    assert check_schedulers(["esg", "orion"]) == ["esg", "orion"]
    with pytest.raises(KeyError, match="unknown workflow scheduler 'nope'.*known: .*esg"):
        check_schedulers(["esg", "nope"])


def test_endtoend_with_all_five_schedulers(endtoend: ExperimentResult) -> None:
    s = endtoend.summary
    assert len([(st, sc) for st in s["slo_hit_rate"] for sc in s["slo_hit_rate"][st]]) == 15
    assert set(s["esg_cost_saving_pct"]["strict-light"]) == set(SCHEDULERS) - {"esg"}


def test_endtoend_rows_and_files(endtoend: ExperimentResult, tmp_path: Path) -> None:
    n_sched = len(endtoend.summary["schedulers"])
    overall = [r for r in endtoend.rows if r["application"] == "all"]
    assert len(overall) == 3 * n_sched
    per_app = [r for r in endtoend.rows if r["application"] != "all"]
    assert len(per_app) == 3 * n_sched * 4
    for r in overall:
        # capacity never exceeded anywhere; the applications' requests add up to the cell's
        assert r["peak_vcpus_max"] <= 16 and r["peak_vgpus_max"] <= 7
        assert r["trace"] == "uniform"
        assert r["requests"] == sum(
            x["requests"]
            for x in per_app
            if (x["setting"], x["scheduler"]) == (r["setting"], r["scheduler"])
        )
    folder = write_result(endtoend, tmp_path)
    data = json.loads((folder / "results.json").read_text())
    assert data["experiment"] == "esg-endtoend" and data["summary"]["slo_hit_rate"]
    assert (folder / "rows.csv").exists()
    assert (folder / "endtoend_slo_cost.png").exists()
    for st in SETTINGS:
        assert (folder / f"endtoend_per_app_{st}.png").exists()


# -- esg-overhead --------------------------------------------------------------------------------


def test_overhead_keys(overhead: ExperimentResult, tmp_path: Path) -> None:
    s = overhead.summary
    assert sorted(s["esg_decision_ms_mean"]) == sorted(SETTINGS)
    for v in s["esg_decision_ms_mean"].values():
        assert math.isfinite(v) and v > 0.0
    for key in (
        "speedup_vs_bruteforce_g3",
        "speedup_vs_numpy_bruteforce_g3",
        "speedup_vs_bruteforce_g3_literal",
        "speedup_vs_numpy_bruteforce_g3_literal",
    ):
        assert math.isfinite(s[key]) and s[key] > 0.0, key
    assert s["astar_equals_bruteforce"] is True
    assert s["search_cases"] == {"g3": 1, "g4": 1}
    assert set(s["k_sensitivity"]) == {"strict-light"}
    assert set(s["k_sensitivity"]["strict-light"]) == {"1", "5"}
    assert s["k_sensitivity"]["strict-light"]["5"]["cost_normalized_k5"] == pytest.approx(1.0)
    folder = write_result(overhead, tmp_path)
    for png in ("overhead_decision_time.png", "overhead_search_ms.png", "overhead_k.png"):
        assert (folder / png).exists()


def test_python_brute_force_matches_numpy() -> None:
    case = search_cases(SMALL_GRID, ["strict"], ["image-classification"])[0]
    cost, n = python_brute_force(case["lists"], case["target_ms"])
    assert n == 32**3
    ref = brute_force(case["lists"], case["target_ms"])
    assert isinstance(ref, Plans) and cost == pytest.approx(ref.best.cost_usd)
    # the g = 4 extrapolation enumerates only the paths of the first first-stage option
    case4 = search_cases(SMALL_GRID, ["strict"], [])[0]
    assert case4["g"] == 4
    _, n4 = python_brute_force(case4["lists"], case4["target_ms"], first_heads=1)
    assert n4 == 32**3


# -- esg-ablation --------------------------------------------------------------------------------


def test_ablation_keys(ablation: ExperimentResult) -> None:
    s = ablation.summary
    variants = {"esg", "esg-no-sharing", "esg-no-batching"}
    assert set(s["slo_hit_rate"]) == variants and set(s["cost"]) == variants
    assert s["details"]["esg-no-batching"]["mean_batch"] == 1.0
    # a task without GPU sharing holds (and pays) all 7 vGPUs of its node
    assert s["cost"]["esg-no-sharing"] > s["cost"]["esg"]
    assert s["cost_normalized"]["esg"] == pytest.approx(1.0)


# -- esg-trace -----------------------------------------------------------------------------------


def test_trace_keys(trace: ExperimentResult) -> None:
    s = trace.summary
    have = s["schedulers"]
    assert set(s["slo_hit_rate"]) == set(have) and set(s["cost_normalized"]) == set(have)
    assert s["cost_normalized"]["esg"] == pytest.approx(1.0)
    assert sorted(s["slo_hit_rate_by_setting"]) == sorted(SETTINGS)
    assert trace.rows and all(r["trace"] == "azure2021" for r in trace.rows)
    assert all(0.0 <= v <= 1.0 for v in s["slo_hit_rate"].values())
