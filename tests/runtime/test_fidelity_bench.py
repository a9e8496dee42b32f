"""The fidelity harness (``bench/fidelity.py --quick``): every scenario runs live twice and
simulated over seeds, and every figure is scored with its basis — what is promised is the
report's completeness and consistency, not the figures themselves (they depend on the machine's
load)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.slow
def test_quick_fidelity_scores_every_figure_of_every_scenario(tmp_path: Path) -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import fidelity
    finally:
        sys.path.remove(str(BENCH))
    s = fidelity.main(["--quick", "--json", str(tmp_path / "fid.json")])
    assert (tmp_path / "fid.json").exists()
    assert set(s["scenarios"]) == set(fidelity.QUICK)
    by = {(r["scenario"], r["metric"]): r for r in s["rows"]}
    assert {m for sc, m in by if sc == "mlp-chain"} == {"p50_ms", "p99_ms", "slo_hit_rate_pct"}
    assert {m for sc, m in by if sc == "share-pair"} == {"share_pct:share-a", "share_pct:share-b"}
    for r in s["rows"]:
        assert len(r["live_runs"]) == fidelity.LIVE_RUNS, r
        assert r["basis"] in ("bound", "interval") and isinstance(r["within"], bool), r
        assert r["sim_p05"] <= r["sim_median"] <= r["sim_p95"], r
        if r["basis"] == "bound":
            assert r["within"] == (abs(r["error"]) <= r["bound"]), r
        else:  # outside its bound, with a live spread larger than the bound
            assert abs(r["error"]) > r["bound"] and r["live_spread"] > r["bound"], r
            assert r["within"] == (r["sim_p05"] <= r["live"] <= r["sim_p95"]), r
    # the share pair's quotas order the shares in both worlds (0.3 < 0.6)
    a, b = by[("share-pair", "share_pct:share-a")], by[("share-pair", "share_pct:share-b")]
    assert a["sim"] < b["sim"] and a["live"] < b["live"]
    assert s["within_bounds_all"] == all(r["within"] for r in s["rows"])
    for sc in s["scenarios"].values():
        assert len(sc["loadavg_1m_live"]) == 2 * fidelity.LIVE_RUNS  # before and after each
