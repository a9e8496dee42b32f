"""The live half of ``bench/generate.py``: a real ``gshare serve`` and the twin (one LLM-trace
segment run live and simulated; the simulator's live constants fitted on its first half, its
predictions compared on its second half).

Who calls it: ``bench/generate.py`` (``live_twin``). What runs:

1. a ``gshare serve`` (``gshare.testing.ServeProcess``) with one CPU instance of the built-in
   ``causal-lm-tiny``, 16 sequences per step;
2. **the segment live**: ``gshare load`` (``scenario_load.run_load``) of a scenario written to
   a temporary folder — the LLM code trace's arrivals scaled to ``rate_rps``, each request's
   prompt ÷ 64 (4 to 200 tokens) and generated tokens (at most 128), streamed over the
   OpenAI-compatible API with ``ignore_eos``. Its first ``WARMUP_S`` are served, not
   measured; the requests of the next ``SPAN_S`` are split by their number: the even ones
   calibrate, the odd ones are predicted (the same moments of the machine: the constants
   absorb its load then; what is tested is the simulator's batching and queueing);
3. **calibration** on the even requests (``calibrate``): the simulator runs the scenario with
   the shipped in-process step fit (``bench/generate_fit.py``) plus a live ``step_overhead_ms``
   on a grid, keeping the one whose median TPOT is nearest the live median of the window; then
   ``frontend_ms`` is their live median TTFT beyond the simulated one. Those are the
   two things the in-process fit cannot know: the instance's time per step beyond the engine
   (the token gate, the chunk frames, the gateway and the load generator on the same CPUs) and
   a request's time outside the steps (HTTP, the gateway, the wire);
4. **prediction** on the odd requests: TTFT and TPOT p50 / p99, tokens/s and SLO attainment,
   simulated with those constants and measured live. Steps 2-4 run ``reps`` times on the
   same server (each ``gshare load`` redeploys: a fresh instance); each figure is the median.

Summary: ``ttft_p50_ratio_sim_over_live``, ``tpot_p50_ratio_sim_over_live`` (and p99) of the
predicted requests, both worlds' figures, the constants, the machine load. ``--write-profile``
stores the constants in the shipped step profile.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from gshare.experiments.scenario_generate import summarise_generative
from gshare.experiments.scenario_load import run_load
from gshare.experiments.scenario_sim import simulate
from gshare.policy.generation_cost import StepCostModel
from gshare.scenario import load_scenario
from gshare.sim.generative import STEP_PROFILE, load_step_profile
from gshare.testing import ServeProcess

MODEL = "causal-lm-tiny"
WARMUP_S = 3.0
"""The trace scaled to 20 requests/s: 12 arrivals in its first second (they warm the fresh
instance up: torch's first forwards), none until 3 s, then about 50 in 3 s (measured)."""
SPAN_S = 3.0
FIGURES = ("ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99", "tokens_per_s",
           "slo_attainment")  # fmt: skip


def write_scenario(folder: Path, rate_rps: float, duration_s: float, slo: dict[str, float]) -> Path:
    (folder / "gen.yaml").write_text(
        json.dumps(
            {
                "name": "gen",
                "model": MODEL,
                "device": "cpu",
                "resources": {"sm_pct": 100, "quota_request": 1.0, "quota_limit": 1.0},
                "batching": {"max_batch": 16},
                "slo": slo,
                "min_instances": 1,
            }
        )
    )
    sc = {
        "name": "generate-twin",
        "duration_s": duration_s + WARMUP_S,
        "warmup_s": WARMUP_S,
        "functions": ["gen.yaml"],
        "workloads": [
            {
                "function": "gen",
                "trace": {"format": "llm", "rate_rps": rate_rps},
                "tokens": {
                    "prompt_scale": 64,
                    "min_prompt_tokens": 4,
                    "max_prompt_tokens": 200,
                    "max_tokens": 128,
                },
            }  # fmt: skip
        ],
    }
    path = folder / "twin.yaml"
    path.write_text(json.dumps(sc))
    return path


def _window(rows: list[dict[str, Any]], lo_ms: float, parity: int) -> list[dict[str, Any]]:
    """The rows with ``measured`` set to whether they arrived after ``lo_ms`` and their request
    number has ``parity`` (0: the calibration half, 1: the predicted half)."""
    return [
        {**r, "measured": lo_ms <= float(r["arrival_ms"]) and int(r["request"]) % 2 == parity}
        for r in rows
    ]


def _median(rows: list[dict[str, Any]], key: str) -> float:
    xs = [float(r[key]) for r in rows if r["measured"] and r.get(key) is not None]
    return statistics.median(xs) if xs else math.nan


def calibrate(
    sc: Any, live_rows: list[dict[str, Any]], lo_ms: float, grid: int
) -> tuple[StepCostModel, dict[str, float]]:
    """The live constants fitted on the calibration window's live rows (module doc):
    ``step_overhead_ms`` on a grid matching the median TPOT, then ``frontend_ms`` the median
    TTFT left over; the in-process coefficients stay the shipped fit's."""
    base = dataclasses.replace(
        load_step_profile(MODEL), frontend_ms=0.0, step_overhead_ms=0.0, token_overhead_ms=0.0
    )
    live = _window(live_rows, lo_ms, 0)
    want_tpot, want_ttft = _median(live, "tpot_ms"), _median(live, "ttft_ms")

    def sim_rows(cost: StepCostModel) -> list[dict[str, Any]]:
        return _window(simulate(sc, step_profiles={MODEL: cost}).rows, lo_ms, 0)

    best: tuple[float, float] = (math.inf, 0.0)
    for x in np.linspace(0.0, 4.0, grid):
        got = _median(sim_rows(dataclasses.replace(base, step_overhead_ms=float(x))), "tpot_ms")
        err = abs(math.log(got / want_tpot))
        best = min(best, (err, float(x)))
    cost = dataclasses.replace(base, step_overhead_ms=best[1])
    shift = want_ttft - _median(sim_rows(cost), "ttft_ms")
    cost = dataclasses.replace(cost, frontend_ms=max(0.0, shift))
    return cost, {"calib_live_tpot_ms_p50": want_tpot, "calib_live_ttft_ms_p50": want_ttft}


def live_twin(
    rate_rps: float, reps: int, slo: dict[str, float], *, quick: bool,
    write_profile: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Run steps 1-4 of the module doc ``reps`` times on one server; the summary keys (each
    figure the median over the repetitions)."""
    runs: list[dict[str, Any]] = []
    out: dict[str, Any] = {"twin_rate_rps": rate_rps, "twin_reps": reps,
                           "twin_loadavg_before": os.getloadavg()[0]}  # fmt: skip
    lo = WARMUP_S * 1e3
    with tempfile.TemporaryDirectory(prefix="gshare-gen-twin-") as tmp:
        sc = load_scenario(write_scenario(Path(tmp), rate_rps, SPAN_S, slo))
        with ServeProcess(state_dir=Path(tmp) / "state") as srv:
            lives = [
                run_load(sc, srv.url, token=srv.token, state_dir=srv.state_dir) for _ in range(reps)
            ]
        out["twin_loadavg_live"] = os.getloadavg()[0]
        for live in lives:
            cost, calib = calibrate(sc, live.rows, lo, 9 if quick else 17)
            sim = simulate(sc, step_profiles={MODEL: cost})
            lw, sw = _window(live.rows, lo, 1), _window(sim.rows, lo, 1)
            lv, sm = summarise_generative(lw, sc)["gen"], summarise_generative(sw, sc)["gen"]
            run: dict[str, Any] = {f"twin_{k}": v for k, v in calib.items()}
            run.update(
                twin_requests=sum(1 for r in lw if r["measured"]),
                twin_frontend_ms=cost.frontend_ms,
                twin_step_overhead_ms=cost.step_overhead_ms,
            )
            for k in FIGURES:
                run[f"twin_live_{k}"] = lv.get(k)
                run[f"twin_sim_{k}"] = sm.get(k)
            for q in ("ttft", "tpot"):
                for p in ("p50", "p99"):
                    a, b = sm.get(f"{q}_ms_{p}"), lv.get(f"{q}_ms_{p}")
                    run[f"{q}_{p}_ratio_sim_over_live"] = a / b if a is not None and b else None
            runs.append(run)
    for k in runs[0]:
        xs = [r[k] for r in runs if r[k] is not None]
        out[k] = statistics.median(xs) if xs else None
    out["twin_ratios_per_rep"] = {
        k: [r[k] for r in runs] for k in runs[0] if k.endswith("_ratio_sim_over_live")
    }
    out["twin_loadavg_after"] = os.getloadavg()[0]
    if write_profile:
        doc = json.loads(STEP_PROFILE.read_text())
        entry = doc["models"][MODEL]
        for k in ("frontend_ms", "step_overhead_ms"):
            entry[k] = round(float(out[f"twin_{k}"]), 4)
        STEP_PROFILE.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return out
