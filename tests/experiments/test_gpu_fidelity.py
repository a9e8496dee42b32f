"""The simulator against the GPU kit's recorded share scenes (``experiments.gpu_fidelity``):
reading the kit's results, leaving out superseded scenes with their reason, and the simulated
scenes' invariants."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gshare.experiments.gpu_fidelity import (
    SUPERSEDED,
    load_share_runs,
    score_gpu_shares,
    simulate_scene,
)

DOCS_GPU = Path(__file__).resolve().parents[2] / "docs" / "gpu"


def _kit_run(root: Path, name: str, notes: dict[str, str], switch_us: float | None) -> None:
    figures = [
        {"name": f"max_abs_share_error_pp_probe_{scene}", "measured": 1.0, "on": "gpu", "note": n}
        for scene, n in notes.items()
    ]
    parts = {"c": {"status": "pass", "figures": figures}}
    if switch_us is not None:
        parts["e"] = {"figures": [{"name": "context_switch_us_median", "measured": switch_us}]}
    (root / name).mkdir(parents=True)
    doc = {"schema": 1, "gpu": "NVIDIA Test", "dry_run": False, "parts": parts}
    (root / name / "results.json").write_text(json.dumps(doc))


def test_the_kits_notes_are_read_back_as_shares(tmp_path: Path) -> None:
    _kit_run(
        tmp_path,
        "run-a",
        {
            "pair": "q03 0.290 (expected 0.300), q06 0.587 (expected 0.600); together 0.877",
            "lone": "lone 0.489 (expected 0.500)",
            "three": "no time left",  # no share in the note: not a scene of this run
        },
        150.0,
    )
    _kit_run(tmp_path, "run-b", {"lone": "lone 0.500 (expected 0.500)"}, None)
    (tmp_path / "dry").mkdir()
    (tmp_path / "dry" / "results.json").write_text(json.dumps({"gpu": None, "dry_run": True}))
    runs = load_share_runs(tmp_path)
    assert [r.run for r in runs] == ["run-a", "run-b"]
    assert runs[0].shares == {
        "pair": {"q03": pytest.approx(29.0), "q06": pytest.approx(58.7)},
        "lone": {"lone": pytest.approx(48.9)},
    }
    assert runs[0].context_switch_us == 150.0 and runs[1].context_switch_us is None
    rows = score_gpu_shares(runs)
    lone = next(r for r in rows if r["metric"] == "share_pct:lone/lone")
    assert lone["live_runs"] == [pytest.approx(48.9), pytest.approx(50.0)]
    assert lone["live_from"] == ["run-a", "run-b"] and lone["context_switch_us"] == 150.0
    assert {r["metric"] for r in rows} == {
        "share_pct:pair/q03", "share_pct:pair/q06", "share_pct:lone/lone",
    }  # fmt: skip


def test_a_superseded_scene_is_left_out_with_its_reason(tmp_path: Path) -> None:
    (run, scene), why = next(iter(SUPERSEDED.items()))
    _kit_run(tmp_path, run, {scene: "e1 0.172 (expected 0.333)"}, None)
    [got] = load_share_runs(tmp_path)
    assert scene not in got.shares and got.skipped == {scene: why}


def test_simulated_scenes_lose_to_kernels_never_exceed_limits_and_order_by_quota() -> None:
    pair = simulate_scene("pair", 152.0)
    before = simulate_scene("pair", 152.0, kernels=False)
    assert pair["q03"] < pair["q06"] and pair["q06"] <= 60.0 and pair["q03"] <= 30.0
    assert sum(pair.values()) < sum(before.values())  # whole kernels and hand-overs cost time
    three = simulate_scene("three", 152.0)
    assert max(three.values()) - min(three.values()) < 2.0  # equal clients, equal shares
    assert sum(three.values()) <= 100.0


def test_the_recorded_gpu_runs_score_every_client() -> None:
    runs = load_share_runs(DOCS_GPU)
    if not runs:
        pytest.skip("docs/gpu holds no GPU kit run with part c")
    rows = score_gpu_shares(runs)
    assert {r["metric"] for r in rows} == {
        f"share_pct:{scene}/{c}" for r in runs for scene, got in r.shares.items() for c in got
    }
    assert all(r["basis"] in ("bound", "interval") and isinstance(r["within"], bool) for r in rows)
