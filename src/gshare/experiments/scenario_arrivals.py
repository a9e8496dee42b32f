"""The arrival times of a scenario (``gshare.scenario``): ONE function that both worlds call —
``gshare simulate`` feeds them to the simulators, ``gshare load`` sends a request at each — so
a seed gives the very same request stream to both.

Per workload (``Workload``; ``i`` its index in the scenario, ``seed`` the scenario's), times in
milliseconds from the start of the load, in ``[0, duration)``:

* ``poisson: {rate_rps}`` — ``sim.workload.poisson`` with the generator
  ``default_rng([seed, 7919, i])``;
* ``uniform: {interval_ms}`` — one request every ``interval_ms``, the first at ``interval_ms``
  (``sim.workload.uniform``); ``uniform: {lo_ms, hi_ms}`` — intervals drawn uniformly in the
  range (``sim.workflow.workload.uniform_intervals``, ESG §4.1), same generator;
* ``trace`` — ``azure2021`` (``sim.workload.azure2021``: the shipped Azure Functions 2021
  sample, or ``path``), ``llm`` (``sim.workload.azure_llm``: the Azure LLM inference 2023 code
  trace, or ``path``), ``azure2019`` (``sim.workload.azure2019_functions``: the ``rank``-th
  busiest function of minutes ``[start_minute, start_minute + minutes)`` of the shipped
  990-function day, or ``path``; its per-minute counts spread by the same generator; defaults
  minute 0, as many minutes as the duration needs, rank 0). Then, as ``autoscale-traces`` and
  ``esg-trace`` do: time-scaled to ``rate_rps`` (``sim.workload.scale_to_rate``; the shape is
  kept) when given, shifted to start at 0, and with ``repeat`` tiled end to end (the next copy
  one mean interval after the last arrival of the previous, ``sim.workflow.workload.
  azure2021_arrivals``' rule) until the duration is filled.

The scenario's stream is every workload's arrivals merged, sorted by time (ties: workload
order). A generative function's requests also carry token counts (``request_tokens``): the
k-th arrival of its workload takes row k (cycling) of the LLM trace of its ``tokens.path`` (the
shipped code trace by default), its prompt ``ContextTokens / prompt_scale`` rounded and clamped
to ``[min_prompt_tokens, max_prompt_tokens]``, its ``max_tokens`` ``GeneratedTokens /
generated_scale`` rounded and clamped to ``[1, max_tokens]``. Who calls it: ``scenario_sim``
and ``scenario_load``; the tests check both get equal lists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from gshare.scenario import Scenario, ScenarioError, Tokens, Trace, Workload
from gshare.sim import workload as wl
from gshare.sim.workflow.workload import uniform_intervals


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request of the scenario's stream."""

    time_ms: float
    """From the start of the load."""
    kind: Literal["workflow", "function"]
    target: str
    """The workflow's or function's name."""
    workload: int
    """Index of the workload in the scenario."""


def _rng(seed: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, 7919, index])


def _trace_times(t: Trace, duration_ms: float, rng: np.random.Generator, field: str) -> np.ndarray:
    if t.format == "azure2021":
        base = wl.azure2021(t.path)
    elif t.format == "llm":
        base = wl.azure_llm(t.path)
    else:
        start = t.start_minute or 0
        minutes = t.minutes or max(1, min(1440 - start, math.ceil(duration_ms / 60_000.0)))
        rank = t.rank or 0
        streams = wl.azure2019_functions(
            rng, start_minute=start, minutes=minutes, top=rank + 1, path=t.path
        )
        if len(streams) <= rank:
            raise ScenarioError(
                f"{field}.rank: minutes [{start}, {start + minutes}) of the azure2019 trace have "
                f"only {len(streams)} function(s) with invocations, got rank {rank}"
            )
        base = np.sort(list(streams.values())[rank])
    if len(base) == 0:
        raise ScenarioError(f"{field}: the {t.format} trace has no arrivals")
    base = np.sort(base) - float(np.min(base))
    if t.rate_rps is not None:
        base = wl.scale_to_rate(base, float(t.rate_rps))
    if not t.repeat or len(base) < 2:
        out: np.ndarray = base[base < duration_ms]
        return out
    gap = float(base[-1]) / (len(base) - 1)
    period = float(base[-1]) + gap
    copies = int(duration_ms // period) + 1
    tiled = np.concatenate([base + k * period for k in range(copies)])
    out = tiled[tiled < duration_ms]
    return out


def workload_times(w: Workload, index: int, duration_ms: float, seed: int) -> np.ndarray:
    """Sorted arrival times (ms) of workload ``index`` (module doc)."""
    rng = _rng(seed, index)
    field = f"workloads.{index}"
    if w.poisson is not None:
        t = wl.poisson(float(w.poisson.rate_rps), duration_ms, rng)
    elif w.uniform is not None:
        u = w.uniform
        if u.interval_ms is not None:
            t = wl.uniform(1000.0 / float(u.interval_ms), duration_ms)
            t = t[t < duration_ms]
        else:
            assert u.lo_ms is not None and u.hi_ms is not None
            t = uniform_intervals(float(u.lo_ms), float(u.hi_ms), duration_ms, rng)
    else:
        assert w.trace is not None
        t = _trace_times(w.trace, duration_ms, rng, f"{field}.trace")
    return np.asarray(t, dtype=np.float64)


def scenario_arrivals(
    scenario: Scenario, duration_s: float, seed: int | None = None
) -> list[Arrival]:
    """Every arrival of the scenario in ``[0, duration_s)``, sorted (module doc)."""
    if not duration_s > 0:
        raise ScenarioError(f"duration_s: must be a number > 0, got {duration_s}")
    s = scenario.seed if seed is None else seed
    duration_ms = duration_s * 1000.0
    out: list[Arrival] = []
    for i, w in enumerate(scenario.workloads):
        for t in workload_times(w, i, duration_ms, s):
            out.append(Arrival(float(t), w.kind, w.target, i))
    out.sort(key=lambda a: (a.time_ms, a.workload))
    return out


def request_tokens(scenario: Scenario, arrivals: list[Arrival]) -> dict[int, tuple[int, int]]:
    """``(prompt tokens, max_tokens)`` of every arrival (by index in ``arrivals``) to a
    generative function (module doc); the others are left out."""
    gen = {
        i
        for i, w in enumerate(scenario.workloads)
        if w.function is not None and scenario.functions[w.function].is_generative_builtin
    }
    traces: dict[str | None, tuple[np.ndarray, np.ndarray]] = {}
    seen: dict[int, int] = {}
    out: dict[int, tuple[int, int]] = {}
    for k, a in enumerate(arrivals):
        if a.workload not in gen:
            continue
        t = scenario.workloads[a.workload].tokens or Tokens()
        if t.path not in traces:
            traces[t.path] = wl.azure_llm_tokens(t.path)
        ctx, made = traces[t.path]
        j = seen.get(a.workload, 0)
        seen[a.workload] = j + 1
        row = j % len(ctx)
        prompt = max(int(t.min_prompt_tokens), round(int(ctx[row]) / float(t.prompt_scale)))
        if t.max_prompt_tokens is not None:
            prompt = min(prompt, int(t.max_prompt_tokens))
        n = max(1, round(int(made[row]) / float(t.generated_scale)))
        if t.max_tokens is not None:
            n = min(n, int(t.max_tokens))
        out[k] = (prompt, n)
    return out


__all__ = ["Arrival", "request_tokens", "scenario_arrivals", "workload_times"]
