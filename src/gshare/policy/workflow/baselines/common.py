"""Pieces shared by the ESG §4.2 baselines: the SLO split by average service time, DAG paths,
option lookups, the P95 latency model and the minimum-configuration fallback.

Who calls it: the four baseline policies of this package (and their tests). Pure: plain data in,
plain data out; no clock, no I/O, no random numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Final

from gshare.policy.workflow.dispatch import DispatchRequest, InvokerState, Via
from gshare.policy.workflow.replan import StageLike, WorkflowLike
from gshare.policy.workflow.schedulers import StagePlan
from gshare.workflows.config import MIN_CONFIG, ConfigOption, FunctionConfig, minimum_config
from gshare.workflows.dag import kahn_order

Z_P95: Final[float] = 1.6448536269514722
"""Standard normal 95th percentile (``NormalDist().inv_cdf(0.95)``), written out so the policy
does not import ``statistics`` (which pulls in ``random``)."""

FALLBACK_CONFIG: Final[FunctionConfig] = MIN_CONFIG
"""What every baseline returns when nothing meets its target: ESG's minimum configuration
(batch 1, 1 vCPU, 1 vGPU) — the same progress rule ESG applies after its recheck rounds
(§3.1), so no scheduler ever returns an empty candidate list."""


# -- the workflow as plain dicts ----------------------------------------------------------------


def stage_map(workflow: WorkflowLike) -> dict[str, StageLike]:
    """Stage name -> stage, in written order."""
    return {s.name: s for s in workflow.stages}


def topological(workflow: WorkflowLike, within: Sequence[str] | None = None) -> list[str]:
    """Stages (of ``within``, default all) in an execution order: Kahn's algorithm with ties
    in written order; predecessors outside ``within`` are ignored. ``ValueError`` on a cycle."""
    stages = stage_map(workflow)
    keep = set(stages) if within is None else set(within)
    preds = {n: stages[n].after for n in stages if n in keep}
    try:
        return kahn_order(preds)
    except ValueError:
        raise ValueError(f"workflow {workflow.name!r} has a cycle") from None


def source_to_sink_paths(
    workflow: WorkflowLike, within: Sequence[str] | None = None
) -> list[tuple[str, ...]]:
    """Every path from a source to a sink of the sub-DAG on ``within`` (default: all stages),
    each as a tuple of stage names. A chain has one path. (The number of paths can grow
    exponentially with the DAG; ESG's applications are chains.)"""
    order = topological(workflow, within)
    keep = set(order)
    stages = stage_map(workflow)
    preds = {n: [p for p in stages[n].after if p in keep] for n in order}
    succ: dict[str, list[str]] = {n: [] for n in order}
    for n in order:
        for p in preds[n]:
            succ[p].append(n)
    paths: list[tuple[str, ...]] = []
    stack: list[tuple[str, ...]] = [(n,) for n in reversed(order) if not preds[n]]
    while stack:
        path = stack.pop()
        nxt = succ[path[-1]]
        if not nxt:
            paths.append(path)
        for s in reversed(nxt):
            stack.append((*path, s))
    return paths


def stage_options(
    workflow: WorkflowLike, stage: str, options: Mapping[str, Sequence[ConfigOption]]
) -> Sequence[ConfigOption]:
    """The options of ``stage``'s function; ``KeyError`` naming the function otherwise."""
    fn = stage_map(workflow)[stage].function
    try:
        return options[fn]
    except KeyError:
        raise KeyError(f"no options for function {fn!r} (stage {stage!r})") from None


# -- SLO split by average service time ----------------------------------------------------------


def average_service_times_ms(
    workflow: WorkflowLike, options: Mapping[str, Sequence[ConfigOption]]
) -> dict[str, float]:
    """Stage -> the mean ``time_ms`` over every option of its function (each configuration
    counted once). ``ValueError`` if a function has no option."""
    out: dict[str, float] = {}
    for s in workflow.stages:
        opts = stage_options(workflow, s.name, options)
        if not opts:
            raise ValueError(f"function {s.function!r} (stage {s.name!r}) has no option")
        out[s.name] = sum(o.time_ms for o in opts) / len(opts)
    return out


# NOTE (ESG §4.2, INFless and FaST-GShare: "InFless provides no method for distributing an
# application's SLO to its functions. Our experiment follows a prior work (GrandSLAm, Kannan et
# al., 2019) to do the distribution based on the average service times of the functions";
# FaST-GShare: "We apply the same method"). Every stage s gets a fixed share of the end-to-end
# SLO proportional to its average service time a(s):
#     stage_slo(s) = SLO * a(s) / L(s),
# where L(s) is the largest sum of a() along a source-to-sink path through s. On a chain L(s)
# is the sum over all stages, so the shares are a(s) / sum(a) and add up to exactly the SLO.
# On a DAG the stages of the longest (critical) path split the SLO exactly and every other path
# gets at most the SLO (each of its stages has L(s) >= that path's sum), as GrandSLAm's
# per-stage slack does. The split is computed once from the options and never revised: a late
# earlier stage does not give the later stages less time (ESG §5.2's criticism).
# "Average service time" is read as the mean predicted execution time of the function over its
# configuration options (every configuration weighted equally).


def service_time_slo_split(
    workflow: WorkflowLike,
    options: Mapping[str, Sequence[ConfigOption]],
    slo_ms: float | None = None,
) -> dict[str, float]:
    """Stage -> its fixed share of ``slo_ms`` (default ``workflow.slo_ms``), ms (NOTE above).

    What holds: on a chain the shares add up to ``slo_ms`` and are proportional to the stages'
    average service times; along every source-to-sink path of a DAG they add up to at most
    ``slo_ms``, and to exactly ``slo_ms`` along a longest one."""
    total = workflow.slo_ms if slo_ms is None else slo_ms
    avg = average_service_times_ms(workflow, options)
    order = topological(workflow)
    stages = stage_map(workflow)
    down: dict[str, float] = {}  # longest sum ending at s (inclusive)
    for n in order:
        down[n] = max((down[p] for p in stages[n].after), default=0.0) + avg[n]
    succ: dict[str, list[str]] = {n: [] for n in order}
    for n in order:
        for p in stages[n].after:
            succ[p].append(n)
    up: dict[str, float] = {}  # longest sum starting after s (exclusive)
    for n in reversed(order):
        up[n] = max((up[c] + avg[c] for c in succ[n]), default=0.0)
    out: dict[str, float] = {}
    for n in order:
        longest = down[n] + up[n]
        out[n] = total * (avg[n] / longest if longest > 0 else 1.0 / len(order))
    return {s.name: out[s.name] for s in workflow.stages}


# -- latency model ------------------------------------------------------------------------------


def p95_of_paths_ms(
    times_ms: Mapping[str, float],
    paths: Sequence[Sequence[str]],
    sigma_frac: float,
    z: float = Z_P95,
) -> float:
    """P95 end-to-end latency of a plan whose stage ``s`` takes ``times_ms[s]`` on average.

    The performance model's noise (``gshare.workflows.perf``, ESG §4) multiplies each task's
    mean by ``1 + sigma_frac * N(0, 1)``, independently per task, so a stage's time is
    ``N(mu, (sigma_frac * mu)^2)`` (its own P95 is ``mu * (1 + z * sigma_frac)``) and a path —
    a sum of independent stages, Orion's convolution — is ``N(sum mu, sigma_frac^2 sum mu^2)``
    with P95 ``sum mu + z * sigma_frac * sqrt(sum mu^2)``. The DAG's latency is the maximum over
    its source-to-sink paths; we take the largest path P95 (exact for a chain, a slight
    under-estimate when parallel branches are close). The model's floor at 10 % of the mean
    lies 18 standard deviations out at sigma 5 % and is ignored."""
    best = 0.0
    for path in paths:
        mu = sum(times_ms[s] for s in path)
        sq = sum(times_ms[s] ** 2 for s in path)
        best = max(best, mu + z * sigma_frac * math.sqrt(sq))
    return best


# -- dispatch helpers ---------------------------------------------------------------------------


def throughput_rps(option: ConfigOption) -> float:
    """Requests per second of one instance running ``option`` back to back:
    ``batch * 1000 / time_ms`` (``inf`` for a zero time)."""
    return option.config.batch * 1000.0 / option.time_ms if option.time_ms > 0 else math.inf


def landed_via(inv: InvokerState, request: DispatchRequest) -> Via:
    """How a placement chosen by a non-locality rule (INFless, FaST-GShare) relates to ESG's
    locality classes, for the simulator's accounting: the preferred (home / predecessor)
    invoker, else a warm one, else cold. It says where the task landed, not why."""
    if inv.invoker_id in request.preferred:
        return "home" if request.first_stage else "predecessor"
    return "warm" if inv.is_warm(request.function) else "cold"


def candidates_plan(
    policy: str,
    configs: Sequence[FunctionConfig],
    target_ms: float,
    options: Sequence[ConfigOption] = (),
) -> StagePlan:
    """The ``StagePlan`` of a per-function baseline: its feasible ``configs`` in preference
    order, or the function's minimum configuration (``config.minimum_config`` of its
    ``options``) when none meets ``target_ms`` (a note says which)."""
    if not configs:
        return StagePlan(
            (minimum_config(options, FALLBACK_CONFIG),),
            note=f"{policy}: nothing meets stage target {target_ms:.1f} ms: min config fallback",
        )
    return StagePlan(
        tuple(configs),
        note=f"{policy}: {len(configs)} configs meet stage target {target_ms:.1f} ms",
    )
