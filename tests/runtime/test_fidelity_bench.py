"""The fidelity harness (``bench/fidelity.py --quick``): every scenario runs live twice and
simulated over seeds, and every figure is scored with its basis — what is promised is the
report's completeness and consistency, not the figures themselves (they depend on the machine's
load)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.slow
def test_quick_fidelity_scores_every_figure_of_every_scenario(tmp_path: Path) -> None:
    fidelity = _fidelity()
    s = fidelity.main(["--quick", "--json", str(tmp_path / "fid.json")])
    assert (tmp_path / "fid.json").exists()
    assert set(s["scenarios"]) == set(fidelity.QUICK)
    by = {(r["scenario"], r["metric"]): r for r in s["rows"]}
    assert {m for sc, m in by if sc == "mlp-chain"} == {"p50_ms", "p99_ms", "slo_hit_rate_pct"}
    assert {m for sc, m in by if sc == "share-pair"} == {"share_pct:share-a", "share_pct:share-b"}
    gpu = [r for r in s["rows"] if r["scenario"] == "gpu-shares"]
    recorded = fidelity.load_share_runs(fidelity.GPU_DATA)
    assert {r["metric"] for r in gpu} == {
        f"share_pct:{scene}/{c}"
        for run in recorded
        for scene, got in run.shares.items()
        for c in got
    }
    for r in gpu:  # the kit's recorded runs are the live ones
        assert set(r["live_from"]) <= {run.run for run in recorded} and r["live_from"], r
        assert len(r["live_runs"]) == len(r["live_from"]), r
    for r in s["rows"]:
        if r["scenario"] != "gpu-shares":
            assert len(r["live_runs"]) == fidelity.LIVE_RUNS, r
        assert r["basis"] in ("bound", "interval") and isinstance(r["within"], bool), r
        assert r["sim_p05"] <= r["sim_median"] <= r["sim_p95"], r
        if r["basis"] == "bound":
            assert r["within"] == (abs(r["error"]) <= r["bound"]), r
        else:  # outside its bound, with a live spread larger than the bound
            assert abs(r["error"]) > r["bound"] and r["live_spread"] > r["bound"], r
            assert r["within"] == (r["sim_p05"] <= r["live"] <= r["sim_p95"]), r
    # calibrations bracket the live runs, each simulated from the two around it: the point
    # scored weighs the inner calibrations twice, the outer ones once
    for m in ("p50_ms", "p99_ms"):
        r = by[("mlp-chain", m)]
        cal = r["sim_per_calibration"]
        assert len(r["twin_inputs"]) == len(cal) == fidelity.LIVE_RUNS + 1, r
        around = [(a + b) / 2 for a, b in zip(cal, cal[1:], strict=False)]
        assert r["sim"] == pytest.approx(sum(around) / fidelity.LIVE_RUNS)
        assert all(t["frontend_ms"] >= 0 and t["calibration_p50_ms"] > 0 for t in r["twin_inputs"])
    # the share pair's quotas order the shares in both worlds (0.3 < 0.6)
    a, b = by[("share-pair", "share_pct:share-a")], by[("share-pair", "share_pct:share-b")]
    assert a["sim"] < b["sim"] and a["live"] < b["live"]
    assert s["within_bounds_all"] == all(r["within"] for r in s["rows"])
    for name, sc in s["scenarios"].items():
        if name != "gpu-shares":  # before and after each live run
            assert len(sc["loadavg_1m_live"]) == 2 * fidelity.LIVE_RUNS


def _fidelity() -> Any:
    sys.path.insert(0, str(BENCH))
    try:
        import fidelity
    finally:
        sys.path.remove(str(BENCH))
    return fidelity


TIMES_MS = [float(t) for t in range(0, 20_000, 50)]  # 20 requests/s for 20 s
CALIBRATION = {
    "busy_ms_under_load_calibration": 0.5, "busy_samples_ms_calibration": [],
    "platform_ms_under_load": [2.0, 2.5, 3.0], "platform_serial_ms": 1.3, "cold_start_ms": 300.0,
}  # fmt: skip
"""A recorded LLM server's calibration (``_autoscale.run_live``'s fields)."""
LIVE = {
    "requests": len(TIMES_MS), "errors": 0, "slo_violation_pct": 0.0, "mean_instances": 1.0,
    "p50_ms": 3.0, "p99_ms": 6.0, "throughput_rps_per_instance": 200.0,
    "busy_ms_per_request": 0.5, "busy_ms_per_request_under_load": 0.5,
    "platform_ms": [2.0], "answers": [], **CALIBRATION,
}  # fmt: skip
"""A recorded LLM server: its figures and its calibration before the segment."""


def _replay(tmp_path: Path, name: str, lives: list[dict[str, Any]], seeds: int) -> dict[str, Any]:
    """``bench/fidelity.py --replay`` of a record of ``TIMES_MS`` and ``lives``."""
    rec = tmp_path / f"{name}.json"
    inputs = {"times_ms": TIMES_MS, "lives": lives}
    rec.write_text(json.dumps({"summary": {"scenarios": {"llm-autoscale": {"inputs": inputs}}}}))
    out = str(tmp_path / f"{name}-out.json")
    result: dict[str, Any] = _fidelity().main(
        ["--replay", str(rec), "--seeds", str(seeds), "--json", out]
    )
    return result


def test_replay_simulates_a_recorded_llm_segment_again(tmp_path: Path) -> None:
    """``--replay``: the LLM segment's recorded live figures and measurements are simulated
    again without a server, and scored against the recorded live figures; a file without a
    record is refused with one line naming it."""
    s = _replay(tmp_path, "rec", [LIVE, {**LIVE, "p99_ms": 8.0}], 2)
    assert set(s["scenarios"]) == {"llm-autoscale"}
    rows = {r["metric"]: r for r in s["rows"]}
    assert set(rows) == {"slo_violation_pct", "mean_instances", "p50_ms", "p99_ms"}
    assert rows["p99_ms"]["live_runs"] == [6.0, 8.0]  # the recorded live figures
    assert rows["p50_ms"]["platform_serial_ms"] == [1.3, 1.3]
    # the simulated requests paid at least the smallest platform sample
    assert rows["p50_ms"]["sim"] >= 2.0
    # the new record holds the same inputs, so a replay can be replayed
    again = json.loads((tmp_path / "rec-out.json").read_text())
    assert again["summary"]["scenarios"]["llm-autoscale"]["inputs"]["times_ms"] == TIMES_MS
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"summary": {}}))
    with pytest.raises(SystemExit, match="no recorded llm-autoscale run"):
        _fidelity().main(["--replay", str(bad)])


def test_a_replay_takes_the_calibrations_after_the_segment_too(tmp_path: Path) -> None:
    """Each server's calibration after its segment (``calibration_after``) is simulated beside
    the one before it: the point scored is the mean over all four calibrations, so slower
    after-calibrations raise it; a record without them simulates the ones before only."""
    slower = {**CALIBRATION, "busy_ms_under_load_calibration": 5.0}

    def p50(lives: list[dict[str, Any]], name: str) -> dict[str, Any]:
        rows: list[dict[str, Any]] = _replay(tmp_path, name, lives, 4)["rows"]
        return next(r for r in rows if r["metric"] == "p50_ms")

    before_only = p50([LIVE, LIVE], "before")
    bracketed = p50([{**LIVE, "calibration_after": slower}] * 2, "bracketed")
    assert bracketed["busy_ms_under_load_calibration_after"] == [5.0, 5.0]
    assert before_only["busy_ms_under_load_calibration_after"] == [None, None]
    # 5 ms a request at quota 0.1 (2 requests/s an instance's share) against 0.5 ms
    assert bracketed["sim"] > before_only["sim"]
    assert bracketed["sim_p95"] > before_only["sim_p95"]


def test_every_seed_simulates_the_median_of_the_calibrations_cold_starts(tmp_path: Path) -> None:
    """A cold start is one request per calibration; a slow one (1.9 s against 0.1 s) must not
    decide its seeds' tail: every seed takes the median of the calibrations' cold starts."""
    lives = [
        {
            **LIVE,
            "cold_start_ms": 100.0,
            "calibration_after": {**CALIBRATION, "cold_start_ms": 120.0},
        },
        {
            **LIVE,
            "cold_start_ms": 1900.0,
            "calibration_after": {**CALIBRATION, "cold_start_ms": 110.0},
        },
    ]
    rows = _replay(tmp_path, "cold", lives, 4)["rows"]
    p99 = next(r for r in rows if r["metric"] == "p99_ms")
    assert sorted(p99["cold_start_ms_calibrations"]) == [100.0, 110.0, 120.0, 1900.0]
    assert p99["cold_start_ms_simulated"] == 115.0


def test_each_simulated_seed_counts_the_segment_on_its_own_phase(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The live controller's periods fall anywhere against the segment, so seed k of K is
    simulated with its controller ticking k/K of a period after the segment's whole seconds,
    and the point scored is the mean over all K seeds."""
    fidelity = _fidelity()
    real = fidelity._autoscale.run_sim
    phases: list[float] = []
    first_ticks: list[float] = []

    def recording(*args: Any, **kwargs: Any) -> dict[str, Any]:
        out: dict[str, Any] = real(*args, **kwargs)
        if "control_phase_ms" in kwargs:
            phases.append(kwargs["control_phase_ms"])
            first_ticks.append(out["sim_instances"][0][0])
        return out

    monkeypatch.setattr(fidelity._autoscale, "run_sim", recording)
    rows = _replay(tmp_path, "phases", [LIVE, LIVE], 4)["rows"]
    assert phases == [0.0, 250.0, 500.0, 750.0]
    # the simulated controller's ticks in the segment fall on those phases
    assert [round(t % 1.0, 3) for t in first_ticks] == [0.0, 0.25, 0.5, 0.75]
    mean = next(r for r in rows if r["metric"] == "mean_instances")
    assert mean["sim"] == pytest.approx(float(sum(mean["sim_runs"])) / len(mean["sim_runs"]))


def test_a_seed_ticks_where_its_live_servers_controller_ticked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record with each live server's controller ticks: the seeds simulating a server's
    calibration tick at that server's ticks (a period before the segment, through its end),
    not at the spread phases."""
    fidelity = _fidelity()
    real = fidelity._autoscale.run_sim
    firsts: list[float] = []

    def recording(*args: Any, **kwargs: Any) -> dict[str, Any]:
        out: dict[str, Any] = real(*args, **kwargs)
        assert "control_phase_ms" not in kwargs
        firsts.append(out["sim_instances"][0][0])
        return out

    monkeypatch.setattr(fidelity._autoscale, "run_sim", recording)
    # periods of 1,001 ms from 0.3 s and 0.8 s before the segment: 0.7 / 0.2 s into it first
    ticks_a = [round(-300.0 + 1001.0 * k, 3) for k in range(22)]
    ticks_b = [round(-800.0 + 1001.0 * k, 3) for k in range(22)]
    lives = [{**LIVE, "control_ticks_ms": ticks_a}, {**LIVE, "control_ticks_ms": ticks_b}]
    rows = _replay(tmp_path, "ticks", lives, 4)["rows"]
    # (the fifth: the "before" model, at the whole seconds)
    assert [round(t, 3) for t in firsts] == [0.701, 0.201, 0.701, 0.201, 0.0]
    assert next(r for r in rows if r["metric"] == "p50_ms")["sim_control_phase_ms"] == [None] * 4


def test_a_seed_starts_its_segment_as_its_live_server_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server idle past its keep-alive before the segment (its calibration ran on another
    function) starts it cold, and its calibration's first inference is the simulated
    instances' first batch."""
    fidelity = _fidelity()
    real = fidelity._autoscale.run_sim
    calls: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def recording(*args: Any, **kwargs: Any) -> dict[str, Any]:
        out: dict[str, Any] = real(*args, **kwargs)
        calls.append((kwargs, out))
        return out

    monkeypatch.setattr(fidelity._autoscale, "run_sim", recording)
    idle = fidelity._autoscale.KEEP_ALIVE_S + 10.0
    lives = [{**LIVE, "idle_before_segment_s": idle, "first_busy_ms": 6.0}, LIVE]
    _replay(tmp_path, "start", lives, 2)
    (cold, cold_out), (warm, warm_out) = calls[:2]
    assert (cold["idle_before_s"], cold["first_busy_ms"]) == (idle, 6.0)
    assert (warm["idle_before_s"], warm["first_busy_ms"]) == (0.0, None)
    # the segment's first tick: no instance after the idle time, the warm-up's one without it
    assert cold_out["sim_instances"][0][1] == 0
    assert warm_out["sim_instances"][0][1] == 1
    with pytest.raises(ValueError, match="idle_before_s"):
        real("gshare-burst", np.asarray(TIMES_MS), 4, 200.0, 0, idle_before_s=-1.0)


def test_the_calibration_window_follows_the_rate_and_refuses_one_too_thin() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import _autoscale
    finally:
        sys.path.remove(str(BENCH))
    at_10 = _autoscale.calibration_times(10.0)
    assert len(at_10) >= _autoscale.MIN_CALIB_REQUESTS
    # the trace scaled to 30 requests/s ends before 585 s: the window moves with the rate to
    # the same point of the trace, and holds its requests
    assert len(_autoscale.calibration_times(30.0)) > len(at_10)
    # at 0.1 requests/s its 30 s are a sliver of the trace
    with pytest.raises(ValueError, match=r"0\.10 requests/s\) holds \d+ requests, fewer than"):
        _autoscale.calibration_times(0.1)
    with pytest.raises(ValueError, match="rate > 0"):
        _autoscale.calibration_times(0.0)
    with pytest.raises(ValueError, match="busy time of 0.0 ms"):
        _autoscale.sim_inputs({**LIVE, "busy_ms_under_load_calibration": 0.0})


def test_statuses_count_a_workloads_measured_requests_and_name_their_errors() -> None:
    def row(name: str, status: str, measured: bool = True, error: str | None = None) -> Any:
        return {"kind": "function", "name": name, "measured": measured, "status": status,
                "error": error}  # fmt: skip

    rows = [
        row("hi", "ok"),
        row("hi", "error", error="429: would take about 24 ms, over its SLO"),
        row("hi", "error", error="429: would take about 31 ms, over its SLO"),
        row("hi", "error", error="503: no instance"),
        row("hi", "dropped_client"),
        row("hi", "error", measured=False, error="warm-up"),
        row("lo", "error", error="not this one"),
    ]
    got = _fidelity().statuses(rows, "function", "hi")
    assert got["requests"] == 5
    assert (got["ok"], got["error"], got["dropped_client"]) == (1, 3, 1)
    # texts that differ only in their numbers count as one
    assert got["errors_top"] == [
        ["N: would take about N ms, over its SLO", 2],
        ["N: no instance", 1],
    ]


def test_the_calibration_scales_each_profile_by_its_busy_time_under_load() -> None:
    fid = _fidelity()
    sc = fid.load_scenario(fid.SCENARIOS / "priority-pair.yaml")

    def row(name: str, exec_ms: float | None, status: str = "ok", measured: bool = True) -> Any:
        return {"kind": "function", "name": name, "status": status, "measured": measured,
                "exec_ms": exec_ms, "latency_ms": 10.0, "platform_ms": 3.0}  # fmt: skip

    rows = [row("prio-hi", 2.2), row("prio-hi", 2.6), row("prio-hi", 9.0, measured=False),
            row("prio-hi", None, status="error"), row("prio-lo", 8.8)]  # fmt: skip
    solo = {f: fid._solo_ms(sc, f) for f in ("prio-hi", "prio-lo")}
    factors = {f: fid._busy_factor(sc, rows, f) for f in ("prio-hi", "prio-lo")}
    assert factors["prio-hi"] == pytest.approx(2.4 / solo["prio-hi"])  # measured answers only
    assert factors["prio-lo"] == pytest.approx(8.8 / solo["prio-lo"])
    assert fid._busy_factor(sc, rows[2:4], "prio-hi") is None
    scaled = fid._busy_profiles(sc, {**factors, "prio-lo": None})
    assert set(scaled) == {"prio-hi"}
    base = fid.function_profiles(sc, ["prio-hi"], None)["prio-hi"].renamed("prio-hi")
    assert [p.latency_ms for p in scaled["prio-hi"]] == pytest.approx(
        [p.latency_ms * factors["prio-hi"] for p in base]
    )
    assert fid._busy_profiles(sc, {"prio-hi": None}) is None
    # the window: every answer of the function (the server's histogram has the warm-up's too)
    got = fid._window(rows, "prio-hi", (1.0, 10.0), (1.0 + 4 * 0.009, 14.0))
    assert got["window_requests"] == [3, 4.0]
    assert got["outstanding_share"] == pytest.approx(1.0 - (10.0 - 9.0) / 3.0)
    assert fid._window(rows, "prio-hi", (1.0, 10.0), (1.0, 10.0))["outstanding_share"] == 0.0


def test_the_calibrations_cold_start_waits_as_long_as_the_segment_idles() -> None:
    """``_autoscale.idle_before_cold_s``: the longest gap that outlasts the keep-alive (the
    function scaled to zero in it) decides how idle the calibration's cold request comes."""
    auto = _fidelity()._autoscale
    times = np.array([0.0, 100.0, 7_300.0, 10_000.0, 46_900.0, 47_000.0])
    assert auto.idle_before_cold_s(times, keep_alive_s=30.0) == pytest.approx(36.9)
    assert auto.idle_before_cold_s(times, keep_alive_s=5.0) == pytest.approx(36.9)
    # no gap scales the function to zero: the least wait after a scale to zero
    assert auto.idle_before_cold_s(times, keep_alive_s=60.0) == auto.SCALED_TO_ZERO_WAIT_S


def test_the_calibrations_cold_start_comes_after_a_scale_to_zero(tmp_path: Path) -> None:
    """``_autoscale.cold_request_ms``: the LLM calibration times its function's first request
    after the function scaled to zero, as the segment's cold starts come (a new function's
    first request took 78 ms where one after a scale to zero took 96-98 ms)."""
    from gshare.testing import ServeProcess

    auto = _fidelity()._autoscale
    with ServeProcess(state_dir=tmp_path / "state", cwd=BENCH.parent) as srv:
        c = srv.client()
        c.deploy(auto.function_spec("cold", 1))
        c.invoke_raw("cold", auto.BODY)
        assert c.get("cold")["availableReplicas"] == 1
        cold_ms = auto.cold_request_ms(c, "cold")
        assert c.get("cold")["availableReplicas"] == 1  # started again for that request
        warm = []
        for _ in range(10):
            t0 = time.perf_counter()
            c.invoke_raw("cold", auto.BODY)
            warm.append((time.perf_counter() - t0) * 1000.0)
        assert cold_ms > 5 * float(np.median(warm))  # it waited for a start


def test_kernels_per_request_come_from_the_kernels_handlers_inputs() -> None:
    fidelity = _fidelity()
    pair = fidelity.load_scenario(fidelity.SCENARIOS / "priority-pair.yaml")
    assert fidelity.kernels_per_request(pair) == {"prio-hi": 2, "prio-lo": 4}
    chain = fidelity.load_scenario(fidelity.SCENARIOS / "mlp-chain.yaml")
    assert fidelity.kernels_per_request(chain) == {}  # no Kernels handler: cut anywhere


def test_each_live_run_is_simulated_from_the_calibrations_around_it() -> None:
    pairs = _fidelity().calibration_pairs
    a, b, c = {"n": 0}, {"n": 1}, {"n": 2}
    assert pairs(2, [a, b, c]) == [(0, a), (0, b), (1, b), (1, c)]
    assert pairs(2, []) == [(0, None), (1, None)]
    with pytest.raises(ValueError, match="2 calibrations around 2 live runs: need 3"):
        pairs(2, [a, b])


def test_every_calibration_draws_from_all_their_spreads_pooled_in_its_own_order() -> None:
    pooled = _fidelity().pooled_spreads
    spreads = [[-1.0, 0.0, 2.0], [-2.0, 0.0, 40.0], [0.0, 1.0]]
    medians = [5.0, 10.0, 5.0]
    got = pooled(spreads, medians, 7)
    assert len(got) == 3
    # as fractions of the medians: -0.2, 0, 0.4 | -0.2, 0, 4.0 | 0, 0.2; each scaled by its own
    fractions = sorted([-0.2, 0.0, 0.4, -0.2, 0.0, 4.0, 0.0, 0.2])
    for g, m in zip(got, medians, strict=True):
        assert np.allclose(sorted(g), [f * m for f in fractions])  # every sample, once
    assert got[0] != got[2]  # same median, another order
    assert pooled(spreads, medians, 7) == got  # the seed decides them
    assert pooled([[1.0], []], [0.0, 4.0], 7) == [[], []]  # no median: nothing to pool
    with pytest.raises(ValueError, match="2 spreads but 1 medians"):
        pooled([[], []], [1.0], 7)


def test_the_live_gaps_are_the_difference_of_two_readings_and_their_median_interpolated() -> None:
    fidelity, inf = _fidelity(), float("inf")
    before = {0.002: 1.0, 0.004: 1.0, 0.008: 2.0, inf: 2.0}
    # 4 gaps counted in between: 1 in (0, 2 ms], 2 in (4, 8 ms], 1 over 8 ms
    after = {0.002: 2.0, 0.004: 2.0, 0.008: 5.0, inf: 6.0}
    got = fidelity.gap_figures(before, after)
    # rank 2 of 4 is halfway through (4, 8 ms]'s two (Prometheus's histogram_quantile)
    assert got["gaps"] == 4 and got["gap_p50_ms"] == pytest.approx(6.0)
    assert fidelity.gap_figures(after, after) == {"gaps": 0, "gap_p50_ms": None}
    assert fidelity.gap_figures({}, {}) == {"gaps": 0, "gap_p50_ms": None}
    # a first reading before the function had any series counts from zero
    assert fidelity.gap_figures({}, {0.002: 1.0, inf: 1.0}) == {"gaps": 1, "gap_p50_ms": 1.0}


def test_token_waits_split_the_requests_that_found_the_instance_idle_from_the_queued() -> None:
    fidelity = _fidelity()

    def row(queue: float | None, wait: float | None, status: str = "ok") -> dict[str, Any]:
        return {"kind": "function", "name": "hi", "measured": True, "status": status,
                "queue_ms": queue, "token_wait_ms": wait}  # fmt: skip

    rows = [row(0.1, 4.0), row(0.2, 6.0), row(3.0, 0.0), row(fidelity.QUEUED_MS, 9.0),
            row(None, None), row(5.0, 50.0, "error")]  # fmt: skip
    got = fidelity.token_waits(rows, "hi")
    assert (got["idle"]["n"], got["idle"]["mean"]) == (2, 5.0)
    assert (got["queued"]["n"], got["queued"]["mean"]) == (2, 4.5)
