"""Generative functions in a scenario, in both worlds: ``gshare simulate`` runs their requests on
simulated generative instances (``sim.generative``), ``gshare load`` streams them from a live
server over the OpenAI-compatible API; both report the same figures (``summarise_generative``).

Requests: the scenario's arrivals to a function whose model is a generative built-in
(``spec.GENERATIVE_MODELS``), each with its token counts (``scenario_arrivals.
request_tokens``: the LLM trace's rows, scaled). Its prompt is ``prompt_text``: printable
ASCII, one byte-level token per character after the model's BOS, so the prompt has exactly the
trace's (scaled) token count; it asks for its ``max_tokens`` greedily with ``ignore_eos`` (the
trace's generated count, whatever the random-weight model's end-of-sequence token).

**Simulator** (``run_generative``): ``max(1, min_instances)`` instances of each generative
function, a request to the one with the fewest live sequences; an instance runs the live
engine's step policy with the live instance's configuration (``sim.generative.instance_config``:
``batching.max_batch``, else 16 sequences per step) and the step model of the function's model
(``sim.generative.load_step_profile``: fitted by ``bench/generate_fit.py``); a request joins its
instance ``frontend_ms`` (the profile's: the API exchange and the wire, measured live) after its
arrival, and every step costs the profile's ``step_overhead_ms`` more than in process. Service
noise ``NOISE_SIGMA``.

**Live** (``stream_completion``): ``POST /v1/completions`` with ``stream: true`` and
``stream_options.include_usage``; TTFT is the client's time from sending to the first event
with a choice, TPOT the time from it to the last one over the completion tokens between
(``usage.completion_tokens`` - 1); a status other than 200 is an error (a 429: shed).

Figures per function (``summarise_generative``, over the measured rows): TTFT and TPOT p50 /
p99 (ms), completion tokens per second (over the span from the first arrival to the last
token), and SLO attainment: the share of requests whose TTFT met ``slo.ttft_ms`` and whose TPOT
met ``slo.tpot_ms`` (each when set; an unanswered request is a miss), and each alone.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import numpy as np

from gshare.experiments.scenario_arrivals import Arrival
from gshare.policy.generation_cost import StepCostModel
from gshare.scenario import Scenario, ScenarioError
from gshare.stats import percentile_or_none

NOISE_SIGMA = 0.05
GENERATIVE_COLUMNS = ("ttft_ms", "tpot_ms", "prompt_tokens", "completion_tokens")
"""Request-row columns of a generative request (both worlds), beside ``REQUEST_COLUMNS``."""


def generative_functions(scenario: Scenario) -> list[str]:
    """The functions of the scenario's workloads that are generative built-ins, in order."""
    names = [w.target for w in scenario.function_workloads()]
    return [n for n in dict.fromkeys(names) if scenario.functions[n].is_generative_builtin]


def prompt_text(n_tokens: int, request: int) -> str:
    """A prompt of ``n_tokens`` tokens of the byte-level built-in (BOS + ``n_tokens - 1``
    printable ASCII characters), different per request, the same in both worlds."""
    return "".join(chr(32 + (request * 7919 + j * 31) % 95) for j in range(max(0, n_tokens - 1)))


def _slo(scenario: Scenario, name: str) -> tuple[float | None, float | None]:
    slo = scenario.functions[name].slo
    if slo is None:
        return None, None
    t, p = slo.ttft_ms, slo.tpot_ms
    return (None if t is None else float(t)), (None if p is None else float(p))


def _hit(ttft: float | None, tpot: float | None, slo: tuple[float | None, float | None]) -> bool:
    if ttft is None:
        return False
    return (slo[0] is None or ttft <= slo[0]) and (slo[1] is None or tpot is None or tpot <= slo[1])


def run_generative(
    scenario: Scenario,
    arrivals: Sequence[Arrival],
    tokens: Mapping[int, tuple[int, int]],
    *,
    seed: int,
    warmup_ms: float = 0.0,
    step_profiles: Mapping[str, StepCostModel] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The generative requests in the simulator (module doc): request rows and, per function,
    the instances' counters and the step profile used (``step_profiles``: by model name, in
    place of the shipped ones)."""
    from gshare.policy.generation_cost import StepCostError
    from gshare.sim.engine import EventLoop
    from gshare.sim.generative import (
        SimGeneration,
        SimGenerativeInstance,
        instance_config,
        load_step_profile,
    )

    names = generative_functions(scenario)
    if not names:
        return [], {}
    loop = EventLoop()
    rng = np.random.default_rng([seed, 577])
    done: list[SimGeneration] = []
    pools: dict[str, list[SimGenerativeInstance]] = {}
    costs = {}
    for n in names:
        spec = scenario.functions[n]
        try:
            given = (step_profiles or {}).get(str(spec.model))
            cost = given if given is not None else load_step_profile(str(spec.model))
        except StepCostError as e:
            raise ScenarioError(f"functions: {n!r}: {e}") from None
        costs[n] = cost
        cfg = instance_config(cost, spec.batching.max_batch)
        pools[n] = [
            SimGenerativeInstance(
                loop, f"{n}-{k}", cfg, cost, done.append, rng=rng, noise_sigma=NOISE_SIGMA
            )
            for k in range(max(1, spec.min_instances))
        ]
    for i, a in enumerate(arrivals):
        if i not in tokens:
            continue
        prompt, max_tokens = tokens[i]
        g = SimGeneration(i, a.target, a.time_ms, prompt, max_tokens)

        def arrive(g: SimGeneration = g) -> None:
            min(pools[g.function], key=lambda x: x.outstanding).enqueue(g)

        loop.at(a.time_ms + costs[a.target].frontend_ms, arrive)
    loop.run()
    workload_of = {w.target: i for i, w in enumerate(scenario.workloads) if w.kind == "function"}
    rows = []
    for g in sorted(done, key=lambda g: g.request_id):
        slo = _slo(scenario, g.function)
        ttft, tpot = g.ttft_ms, g.tpot_ms
        ok = g.finish == "length"
        rows.append(
            {
                "kind": "function",
                "name": g.function,
                "workload": workload_of[g.function],
                "request": g.request_id,
                "arrival_ms": g.arrival_ms,
                "latency_ms": g.token_times_ms[-1] - g.arrival_ms if ok else None,
                "slo_ms": None,
                "hit": ok and _hit(ttft, tpot, slo),
                "status": "ok" if ok else "error",
                "measured": g.arrival_ms >= warmup_ms,
                "cost_uusd": None,
                "ttft_ms": ttft,
                "tpot_ms": tpot,
                "prompt_tokens": g.prompt_tokens,
                "completion_tokens": g.generated,
            }
        )
    extra = {
        n: {
            "instances": len(pools[n]),
            "steps": sum(x.steps for x in pools[n]),
            "preemptions": sum(x.preemptions for x in pools[n]),
            "max_decode_batch": max(x.max_batch_seen for x in pools[n]),
            "step_profile": costs[n].measured_on,
        }
        for n in names
    }
    return rows, extra


def summarise_generative(
    rows: Sequence[Mapping[str, Any]], scenario: Scenario
) -> dict[str, dict[str, Any]]:
    """Per generative function, over its measured rows (module doc)."""
    out: dict[str, dict[str, Any]] = {}
    for n in generative_functions(scenario):
        rs = [r for r in rows if r["kind"] == "function" and r["name"] == n and r["measured"]]
        ok = [r for r in rs if r["status"] == "ok" and r.get("ttft_ms") is not None]
        ttft = [float(r["ttft_ms"]) for r in ok]
        tpot = [float(r["tpot_ms"]) for r in ok if r.get("tpot_ms") is not None]
        slo = _slo(scenario, n)
        made = sum(int(r.get("completion_tokens") or 0) for r in ok)
        span_ms = (
            max(float(r["arrival_ms"]) + float(r["latency_ms"]) for r in ok)
            - min(float(r["arrival_ms"]) for r in rs)
            if ok
            else 0.0
        )
        k = len(rs)
        out[n] = {
            "ttft_ms_p50": percentile_or_none(ttft, 50),
            "ttft_ms_p99": percentile_or_none(ttft, 99),
            "tpot_ms_p50": percentile_or_none(tpot, 50),
            "tpot_ms_p99": percentile_or_none(tpot, 99),
            "completion_tokens": made,
            "tokens_per_s": made / (span_ms / 1000.0) if span_ms > 0 else None,
            "ttft_slo_ms": slo[0],
            "tpot_slo_ms": slo[1],
            "slo_attainment": sum(bool(r["hit"]) for r in rs) / k if k else None,
            "ttft_attainment": (
                sum(1 for x in ttft if x <= slo[0]) / k if k and slo[0] is not None else None
            ),
            "tpot_attainment": (
                sum(1 for x in tpot if x <= slo[1]) / k if k and slo[1] is not None else None
            ),
        }
    return out


async def stream_completion(
    http: httpx.AsyncClient,
    row: dict[str, Any],
    function: str,
    prompt_tokens: int,
    max_tokens: int,
    slo: tuple[float | None, float | None],
) -> None:
    """Stream one completion (module doc) and fill ``row`` (its ``request`` picks the prompt):
    status, code, latency, TTFT, TPOT, token counts, hit. ``httpx`` errors propagate."""
    body = {
        "model": function,
        "prompt": prompt_text(prompt_tokens, int(row["request"])),
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    row["prompt_tokens"] = prompt_tokens
    t0 = time.perf_counter()
    first = last = None
    usage: Mapping[str, Any] = {}
    async with http.stream("POST", "/v1/completions", json=body) as r:
        row["code"] = r.status_code
        if r.status_code != 200:
            text = (await r.aread()).decode(errors="replace")
            row["status"], row["error"] = "error", f"HTTP {r.status_code}: {text[:200]}"
            return
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            doc = json.loads(line[len("data: ") :])
            if "error" in doc:
                row["status"], row["error"] = "error", str(doc["error"])[:300]
                return
            if doc.get("choices"):
                last = time.perf_counter()
                first = first if first is not None else last
            if doc.get("usage"):
                usage = doc["usage"]
    end = time.perf_counter()
    n = int(usage.get("completion_tokens", 0))
    if first is None or last is None or n < 1:
        row["status"], row["error"] = "error", "the stream ended without a token"
        return
    ttft = (first - t0) * 1000.0
    tpot = (last - first) * 1000.0 / (n - 1) if n > 1 else None
    row.update(
        status="ok",
        latency_ms=(end - t0) * 1000.0,
        ttft_ms=ttft,
        tpot_ms=tpot,
        completion_tokens=n,
        hit=_hit(ttft, tpot, slo),
    )


def slo_of(scenario: Scenario, name: str) -> tuple[float | None, float | None]:
    """``(ttft_ms, tpot_ms)`` of a function's ``slo`` (None where unset)."""
    return _slo(scenario, name)


__all__ = [
    "GENERATIVE_COLUMNS",
    "generative_functions",
    "prompt_text",
    "run_generative",
    "slo_of",
    "stream_completion",
    "summarise_generative",
]
