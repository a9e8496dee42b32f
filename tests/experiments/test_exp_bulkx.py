"""The ``bulkx-sizing`` experiment, quick version: every policy reports every figure, the
invariants of the policies hold, the result files are written, and a seed repeats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gshare.experiments import registry
from gshare.experiments.bulkx_sizing import FIXED_MAX
from gshare.experiments.results import ExperimentResult, write_result

POLICIES = {"fixed-max", "fixed-p99", "bulkx", "bulkx-window", "bulkx-priced"}
BULKX = ("bulkx", "bulkx-window", "bulkx-priced")
PER_POLICY = (
    "memory_waste_pct",
    "kills_per_1k",
    "scale_steps_per_invocation",
    "grown_pct",
    "throughput_gain_vs_fixed_max_pct",
    "throughput_gain_fluid_pct",
    "sustained_rate_per_s",
    "moves_per_1k",
    "app_median_waste_pct",
)


@pytest.fixture(scope="module")
def quick() -> ExperimentResult:
    return registry.run_experiment("bulkx-sizing", quick=True, seed=0)


def test_registered_with_quick_params() -> None:
    exp = registry.get("bulkx-sizing")
    assert exp.params(quick=False)["apps"] is None  # all 990 apps
    assert exp.params(quick=True)["apps"] == 60


def test_every_figure_for_every_policy(quick: ExperimentResult) -> None:
    s = quick.summary
    for key in PER_POLICY:
        assert set(s[key]) == POLICIES, key
    assert s["apps_scored"] + s["apps_skipped_fewer_than_2_invocations"] == 60
    assert s["simulated_invocations_scored"] > 0


def test_policy_invariants(quick: ExperimentResult) -> None:
    s = quick.summary
    waste, kills, steps = s["memory_waste_pct"], s["kills_per_1k"], s["scale_steps_per_invocation"]
    # growing up to the app's maximum never kills; neither does reserving the maximum
    assert kills[FIXED_MAX] == 0
    for b in BULKX:
        assert kills[b] == 0
        # init and every grown limit are capped at the maximum: never more reserved
        assert 0 <= waste[b] <= waste[FIXED_MAX]
        assert s["throughput_gain_fluid_pct"][b] >= 0
        assert steps[b] > 0 and 0 < s["grown_pct"][b] < 100
    # 1 % of the demands lie above p99 (for apps with p99 < p100): p99 kills some
    assert kills["fixed-p99"] > 0
    assert steps[FIXED_MAX] == steps["fixed-p99"] == 0
    # a price per scale-up buys fewer, larger steps at the same init
    assert steps["bulkx-priced"] < steps["bulkx"]
    assert s["throughput_gain_vs_fixed_max_pct"][FIXED_MAX] == 0
    assert s["moves_per_1k"][FIXED_MAX] == 0  # only a growth can need another node
    ratio = waste["bulkx"] / waste[FIXED_MAX]
    assert s["bulkx_waste_over_fixed_max"] == pytest.approx(ratio)
    assert s["done_when"]["bulkx_waste_at_most_half_fixed_max"] == (ratio <= 0.5)
    assert s["done_when"]["bulkx_kills_zero"] == (kills["bulkx"] == 0)
    for row in quick.rows:
        assert row["reject_pct_at_sustained"] <= 1.0 + 1e-9  # the capacity target


def test_files_written(quick: ExperimentResult, tmp_path: Path) -> None:
    folder = write_result(quick, tmp_path)
    data = json.loads((folder / "results.json").read_text())
    assert data["experiment"] == "bulkx-sizing"
    assert set(data["summary"]["memory_waste_pct"]) == POLICIES
    assert (folder / "rows.csv").exists()
    assert (folder / "bulkx_sizing.png").stat().st_size > 0


@pytest.mark.slow
def test_seeded_and_deterministic(quick: ExperimentResult) -> None:
    again = registry.run_experiment("bulkx-sizing", quick=True, seed=0)
    assert again.summary == quick.summary
