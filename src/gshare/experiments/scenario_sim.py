"""``gshare simulate SCENARIO``: a scenario (``gshare.scenario``) in the simulator.

The arrivals are ``scenario_arrivals.scenario_arrivals`` — the ones ``gshare load`` sends to a
live server for the same seed. Two simulators share them:

* **workflows** run in the workflow simulator (``sim.workflow.WorkflowSim``) as gshare's live
  mechanism runs them (``gshare.workflows.shares``; docs/DESIGN.md §4): the configuration space
  of a stage is ``(batch, time quota)`` at the SM partition of its function's spec
  (``resources.sm_pct``), latencies from the function's profile (``SharePerf``), batches the
  powers of two up to ``batching.max_batch``, quotas the profile's measured ones that are
  multiples of 5 %; an invoker is a device (``cluster.nodes x devices_per_node``) with
  ``shares.QUOTA_UNITS`` quota units and one task slot per instance of a workflow function on
  it; the instances are fixed (``fixed_pools``: ``max(1, ceil(min_instances / devices))`` of
  every workflow function on every device — the largest over the functions, as the simulator
  takes one number), never cold-started; no pre-warming; stage inputs cost
  ``cluster.local_latency_ms`` on the same device, ``remote_latency_ms`` across devices. The
  scheduler is ``policies.workflow`` (``policy.workflow.esg.make_policy``; Aquatope with its
  offline Bayesian optimiser, ``offline_bo.bo_optimiser``).
* **plain function workloads** run in the GPU-cluster simulator (``sim.cluster.SimCluster``),
  as ``autoscale-traces`` runs them: the controller's ``control_step`` with
  ``policies.autoscaler`` every second (its ticks at a phase within the second drawn per
  seed), Maximal Rectangles placement on
  ``cluster.nodes x devices_per_node`` devices, launch-gated bursts with interference, 5 %
  service-time noise, the live fork launcher's cold start; the function's candidate configs
  are the live controller's (``runtime.control.configs.configs_for`` over its profile: the
  spec's own share when ``resources`` is explicit). The load starts when the functions'
  ``min_instances`` are up (``LEAD_MS`` after t = 0, as ``gshare load`` starts after deploying
  and waiting for readiness); reported times are from the load's start.

The two run separately: a workflow and a plain function do not compete for devices in the
simulator (they do on a live server). A **generative** function's workload runs in a third,
``scenario_generate.run_generative`` (the live engine's step policy in virtual time, priced by
the model's fitted step profile), which adds TTFT / TPOT figures to the function's summary.

Profiles, per function (``function_profiles``), in this order: the live rows of
``--profiles-from URL`` (the ``table`` of ``GET /system/profile/{name}``), the scenario's
``profiles`` CSV rows whose model is the function's name or its built-in model, the shipped
V100 table when the built-in model is in it; otherwise an error that says how to get one.

Output (``ExperimentResult``, written by ``results.write_result`` to ``OUT/<name>-simulate/``):
``rows`` are the requests (``scenario_rows.REQUEST_COLUMNS``, a function's with its
``TIMING_COLUMNS``), ``rows.csv`` the same, a latency-CDF PNG per workflow and function with its
SLO, and the summary (``scenario_rows.summarise``) per workflow and function:
requests, answered, slo_hit_rate, p50/p95/p99/mean (answered requests), cost per request
(workflows), devices and instances used (functions). ``scenario_load`` writes the same format
from a live run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from gshare.experiments.results import ExperimentResult
from gshare.experiments.scenario_arrivals import Arrival, request_tokens, scenario_arrivals
from gshare.experiments.scenario_generate import (
    GENERATIVE_COLUMNS,
    generative_functions,
    run_generative,
    summarise_generative,
)
from gshare.experiments.scenario_plots import latency_cdf_plot
from gshare.experiments.scenario_rows import REQUEST_COLUMNS, TIMING_COLUMNS, accounted, summarise
from gshare.profiles import ProfileError, ProfilePoint, ProfileTable
from gshare.scenario import Scenario, ScenarioError
from gshare.spec import FunctionSpec
from gshare.stats import percentile_or_none

if TYPE_CHECKING:
    from gshare.sim.gateway import Gateway
    from gshare.sim.request import SimRequest

Progress = Callable[[str, float, float], None]
"""``(phase, done, total)``: the front end's progress bar (virtual seconds here)."""

LEAD_MS = 2000.0
"""Function workloads: virtual time between t = 0 (the functions deployed) and the load's start
(their ``min_instances`` started and ready: cold start + one control period)."""
NOISE_SIGMA = 0.05
"""Relative noise of a simulated service time (the workflow simulator's default too)."""
TICK_MS = 100.0
"""How often the function simulation samples devices and instances in use."""


# -- policies -----------------------------------------------------------------------------------


def check_policies(scenario: Scenario, override: str | None = None) -> tuple[str, str]:
    """``(workflow scheduler, autoscaler)``: the scenario's, with ``override`` (``--policy``)
    replacing whichever registry it names; ``ScenarioError`` naming the field otherwise."""
    from gshare.policy.autoscale import AUTOSCALERS
    from gshare.policy.workflow.esg import WORKFLOW_POLICIES

    wf, auto = scenario.policies.workflow, scenario.policies.autoscaler
    if override is not None:
        if override in WORKFLOW_POLICIES:
            wf = override
        elif override in AUTOSCALERS:
            auto = override
        else:
            raise ScenarioError(
                f"--policy: unknown policy {override!r} (workflow schedulers: "
                f"{', '.join(WORKFLOW_POLICIES)}; autoscalers: {', '.join(AUTOSCALERS)})"
            )
    if wf not in WORKFLOW_POLICIES:
        raise ScenarioError(
            f"policies.workflow: unknown workflow scheduler {wf!r} (known: "
            f"{', '.join(WORKFLOW_POLICIES)})"
        )
    if auto not in AUTOSCALERS:
        raise ScenarioError(
            f"policies.autoscaler: unknown autoscaler {auto!r} (known: {', '.join(AUTOSCALERS)})"
        )
    return wf, auto


# -- profiles -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FunctionProfile:
    """Where a function's latencies come from."""

    table: ProfileTable
    model: str
    """The function's model name in ``table``."""
    source: str
    """``live``, ``scenario profiles`` or ``shipped V100``."""

    def renamed(self, name: str) -> ProfileTable:
        """The rows of ``model`` as a table whose model is ``name``."""
        return ProfileTable(
            ProfilePoint(name, p.sm_pct, p.quota_pct, p.batch, p.latency_ms)
            for p in self.table.measured(self.model)
        )


def fetch_live_profiles(
    url: str, names: Sequence[str], *, token: str | None = None, state_dir: Path | None = None
) -> dict[str, list[ProfilePoint]]:
    """The live profile rows of ``names`` from a server (``GET /system/profile/{name}``); a
    function without rows (or not deployed) is left out. ``ScenarioError`` naming
    ``--profiles-from`` when the server cannot be asked."""
    from gshare.runtime.client import Client, ClientError

    out: dict[str, list[ProfilePoint]] = {}
    try:
        with Client(url, token, state_dir=state_dir) as c:
            for n in names:
                try:
                    doc = c.profile_status(n)
                except ClientError as e:
                    if e.status == 404:
                        continue
                    raise
                rows = [
                    ProfilePoint(
                        n,
                        float(r["sm_pct"]),
                        float(r["quota_pct"]),
                        int(r["batch"]),
                        float(r["latency_ms"]),
                    )
                    for r in doc.get("table") or []
                ]
                if rows:
                    out[n] = rows
    except ClientError as e:
        raise ScenarioError(f"--profiles-from {url}: {e}") from None
    return out


def function_profiles(
    scenario: Scenario,
    names: Sequence[str],
    live: Mapping[str, Sequence[ProfilePoint]] | None = None,
) -> dict[str, FunctionProfile]:
    """The profile of every function in ``names`` (module doc: the order of the sources);
    ``ScenarioError`` naming the function and what to do when it has none."""
    out: dict[str, FunctionProfile] = {}
    shipped: ProfileTable | None = None
    for n in names:
        spec = scenario.functions[n]
        rows = (live or {}).get(n)
        if rows:
            out[n] = FunctionProfile(ProfileTable(rows), n, "live")
            continue
        t = scenario.profiles
        if t is not None and t.has_model(n):
            out[n] = FunctionProfile(t, n, "scenario profiles")
            continue
        if t is not None and spec.model is not None and t.has_model(spec.model):
            out[n] = FunctionProfile(t, spec.model, "scenario profiles")
            continue
        if spec.model is not None:
            shipped = shipped or ProfileTable.shipped_v100()
            if shipped.has_model(spec.model):
                out[n] = FunctionProfile(shipped, spec.model, "shipped V100")
                continue
        what = (
            f"model {spec.model!r} is not in the shipped V100 table"
            if spec.model
            else ("it runs a user handler")
        )
        raise ScenarioError(
            f"functions: {n!r} has no profile ({what}): deploy it, run `gshare profile {n}` on "
            "the server and pass --profiles-from URL, or give the scenario a `profiles:` CSV "
            f"(model,sm_pct,quota_pct,batch,latency_ms) with rows for model {n!r}"
        )
    return out


# -- workflows ----------------------------------------------------------------------------------


def _batches(max_batch: int) -> tuple[int, ...]:
    return tuple(2**k for k in range(int(math.log2(max_batch)) + 1))


def share_perf(
    scenario: Scenario, profiles: Mapping[str, FunctionProfile], functions: Sequence[str]
) -> Any:
    """gshare's share model (``workflows.shares.SharePerf``) of the workflow functions."""
    from gshare.workflows.perf import PerfError
    from gshare.workflows.shares import ShareError, ShareFunction, SharePerf, quotas_of

    shares = []
    for n in functions:
        spec = scenario.functions[n]
        if isinstance(spec.resources, str):
            raise ScenarioError(
                f"functions: {n!r} has resources: auto; the workflow simulator needs the SM "
                "partition its instances run with: set resources.sm_pct (and quota_request) "
                "in its spec"
            )
        p = profiles[n]
        try:
            shares.append(
                ShareFunction(
                    name=n,
                    profile_model=p.model,
                    sm_pct=float(spec.resources.sm_pct),
                    batches=_batches(spec.batching.max_batch),
                    quotas_pct=quotas_of(p.table, p.model),
                )
            )
        except ShareError as e:
            raise ScenarioError(f"functions: {e}") from None
    try:
        return SharePerf(shares, {n: profiles[n].table for n in functions})
    except (PerfError, ProfileError) as e:
        raise ScenarioError(f"functions: {e}") from None


def instances_per_device(scenario: Scenario, functions: Sequence[str]) -> dict[str, int]:
    """Per workflow function: ``max(1, ceil(min_instances / devices))``."""
    d = scenario.cluster.devices
    return {n: max(1, math.ceil(scenario.functions[n].min_instances / d)) for n in functions}


def _ticks(loop: Any, horizon_ms: float, step_ms: float, fn: Callable[[], None]) -> None:
    t = step_ms
    while t < horizon_ms:
        loop.at(t, fn)
        t += step_ms


def run_workflows(
    scenario: Scenario,
    arrivals: Sequence[Arrival],
    horizon_ms: float,
    policy_name: str,
    profiles: Mapping[str, FunctionProfile],
    *,
    seed: int,
    warmup_ms: float = 0.0,
    progress: Progress | None = None,
    bo_params: Mapping[str, Any] | None = None,
    frontend_jitter_ms: Sequence[float] = (),
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The workflow requests in ``WorkflowSim`` (module doc): request rows and, per workflow,
    the simulator's extra figures. ``bo_params``: Aquatope's ``offline_bo.BoParams`` fields
    (default: ESG's budget); ``frontend_jitter_ms``: ``WorkflowSimConfig.frontend_jitter_ms``."""
    from gshare.policy.workflow.esg import make_share_policy as make_policy
    from gshare.sim.workflow import TransferModel, WorkflowSim, WorkflowSimConfig
    from gshare.workflows.shares import QUOTA_UNITS

    names = [w.target for w in scenario.workflow_workloads()]
    workflows = {n: scenario.workflows[n] for n in dict.fromkeys(names)}
    if not workflows:
        return [], {}
    functions = scenario.workflow_functions()
    perf = share_perf(scenario, profiles, functions)
    per_dev = instances_per_device(scenario, functions)
    cl = scenario.cluster
    cfg = WorkflowSimConfig(
        nodes=cl.devices,
        node_vcpus=sum(per_dev.values()),
        node_vgpus=QUOTA_UNITS,
        prewarm=None,
        initial_warm_per_pool=max(per_dev.values()),
        fixed_pools=True,
        transfer=TransferModel(
            local_latency_ms=float(cl.local_latency_ms),
            remote_latency_ms=float(cl.remote_latency_ms),
        ),
        dispatch_ms=float(cl.dispatch_ms),
        frontend_ms=float(cl.frontend_ms),
        frontend_jitter_ms=tuple(float(x) for x in frontend_jitter_ms),
        warmup_ms=warmup_ms,
        noise_sigma_frac=NOISE_SIGMA,
    )
    kwargs: dict[str, Any] = {}
    if policy_name == "aquatope":
        from gshare.experiments.offline_bo import bo_optimiser

        # SharePerf has PerfModel's surface where the optimiser reads it
        kwargs["optimiser"] = bo_optimiser(cast(Any, perf), **dict(bo_params or {}))
    policy = make_policy(policy_name, perf=perf, seed=seed, **kwargs)
    sim = WorkflowSim(workflows, policy, cfg, perf=perf, seed=seed)
    if progress is not None:
        prog = progress
        _ticks(sim.loop, horizon_ms, 1000.0, lambda: prog("workflows", sim.loop.now_ms, horizon_ms))
    stream = [(a.time_ms, a.target) for a in arrivals if a.kind == "workflow"]
    res = sim.run(stream, horizon_ms)
    if progress is not None:
        progress("workflows", horizon_ms, horizon_ms)
    workload_of = {w.target: i for i, w in enumerate(scenario.workloads) if w.kind == "workflow"}
    rows = [
        {
            "kind": "workflow",
            "name": r.application,
            "workload": workload_of[r.application],
            "request": r.request_id,
            "arrival_ms": r.arrival_ms,
            "latency_ms": r.latency_ms,
            "slo_ms": r.slo_ms,
            "hit": r.hit,
            "status": "ok" if r.latency_ms is not None else "unfinished",
            "measured": r.measured,
            "cost_uusd": r.cost_usd * 1e6,
        }
        for r in sorted(res.requests, key=lambda r: r.request_id)
    ]
    c = res.counters
    extra = {
        n: {
            "devices": cl.devices,
            "instances_per_device": per_dev,
            "tasks": c.get("tasks"),
            "mean_batch": (c["jobs"] / c["tasks"]) if c.get("tasks") else None,
            "config_misses": c.get("config_misses"),
            "no_invoker": c.get("no_invoker"),
            "profiles": {f: profiles[f].source for f in functions},
        }
        for n in workflows
    }
    return rows, extra


# -- plain functions ----------------------------------------------------------------------------


def _sim_configs(spec: FunctionSpec, table: ProfileTable) -> list[Any]:
    """The live controller's candidate configs of ``spec`` over ``table`` (model = its name)."""
    from gshare.runtime.control.configs import configs_for

    try:
        return list(configs_for(spec, table, has_cuda=True, busy_ms_per_request=None).configs)
    except ProfileError as e:
        raise ScenarioError(f"functions: {spec.name}: {e}") from None


def run_functions(
    scenario: Scenario,
    arrivals: Sequence[Arrival],
    horizon_ms: float,
    autoscaler: str,
    profiles: Mapping[str, FunctionProfile],
    *,
    seed: int,
    warmup_ms: float = 0.0,
    progress: Progress | None = None,
    platform_ms: Sequence[float] = (),
    platform_outstanding_share: float = 0.0,
    instance_wakeup_ms: Sequence[float] = (),
    kernels_per_request: Mapping[str, int] | None = None,
    token_release_ms: float = 0.0,
    admission_interval_ms: Mapping[str, float] | None = None,
    batch_gap_ms: Sequence[float] = (),
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The plain function requests in ``SimCluster`` (module doc): request rows and, per
    function, devices and instances used. ``platform_ms``: measured platform latency samples,
    one drawn per request, in place of the scenario's constant;
    ``platform_outstanding_share``, ``instance_wakeup_ms``, ``batch_gap_ms``,
    ``token_release_ms`` and ``admission_interval_ms``: ``ClusterConfig``'s;
    ``kernels_per_request``: ``SimFunction``'s, per function (absent: 0)."""
    from gshare.policy.admission import DEFAULT_MAX_LATENCY_SLO_FACTOR
    from gshare.sim.cluster import ClusterConfig, SimCluster, SimFunction, cpu_runtime_fields
    from gshare.sim.engine import EventLoop
    from gshare.sim.workload import drive_open_loop

    names = list(dict.fromkeys(w.target for w in scenario.function_workloads()))
    names = [n for n in names if not scenario.functions[n].is_generative_builtin]
    if not names:
        return [], {}
    table = ProfileTable(p for n in names for p in profiles[n].renamed(n))
    loop = EventLoop()
    on_cpu = all(scenario.functions[n].device == "cpu" for n in names)
    # a plain request pays the client's exchange and the hop to its instance, as a workflow
    # request pays frontend_ms and each of its stages dispatch_ms
    platform = float(scenario.cluster.frontend_ms + scenario.cluster.dispatch_ms)
    # the live controller's periods fall anywhere against the arrivals: each seed draws where
    # (``SimCluster.start``'s NOTE), so that the seeds' spread covers it
    phase_ms = float(np.random.default_rng([seed, 302]).uniform(0.0, ClusterConfig.period_ms))
    cfg = ClusterConfig(
        max_gpus=scenario.cluster.devices,
        autoscaler=autoscaler,
        control_phase_ms=phase_ms,
        noise_sigma=NOISE_SIGMA,
        admission_slo_factor=DEFAULT_MAX_LATENCY_SLO_FACTOR,  # gshare serve's default
        platform_ms=tuple(platform_ms) or ((platform,) if platform > 0 else ()),
        platform_outstanding_share=platform_outstanding_share,
        instance_wakeup_ms=tuple(float(x) for x in instance_wakeup_ms),
        batch_gap_ms=tuple(float(x) for x in batch_gap_ms),
        token_release_ms=float(token_release_ms),
        admission_interval_ms=dict(admission_interval_ms or {}),
        **(cpu_runtime_fields() if on_cpu else {}),
    )
    cluster = SimCluster(loop, table, cfg, np.random.default_rng([seed, 301]))
    for n in names:
        spec = scenario.functions[n]
        limit = None if isinstance(spec.resources, str) else spec.resources.quota_limit * 100.0
        cluster.add_function(
            SimFunction(
                n,
                n,
                float(spec.slo_ms) if spec.slo_ms is not None else math.inf,
                tuple(_sim_configs(spec, table)),
                min_instances=spec.min_instances,
                max_instances=spec.max_instances,
                max_wait_ms=float(spec.batching.max_wait_ms),
                quota_limit_pct=limit,
                keep_alive_s=float(spec.keep_alive_s),
                priority=spec.priority,
                kernels_per_request=int((kernels_per_request or {}).get(n, 0)),
            )
        )
        times = [LEAD_MS + a.time_ms for a in arrivals if a.kind == "function" and a.target == n]
        drive_open_loop(loop, cluster.gateway, n, times)
    cluster.log.warmup_ms = LEAD_MS + warmup_ms
    end_ms = LEAD_MS + horizon_ms
    samples: dict[str, list[tuple[int, int]]] = {n: [] for n in names}

    def sample() -> None:
        if loop.now_ms < LEAD_MS + warmup_ms:
            return
        for n in names:
            insts = [i for i in cluster.gateway.instances(n) if not i.stopped]
            samples[n].append((len({i.gpu.gpu_id for i in insts}), len(insts)))

    _ticks(loop, end_ms, TICK_MS, sample)
    cluster.start(until_ms=end_ms)
    step = 1000.0
    t = 0.0
    while t < end_ms:
        t = min(end_ms, t + step)
        loop.run(until_ms=t)
        if progress is not None:
            progress("functions", max(0.0, t - LEAD_MS), horizon_ms)
    started = cluster.instances_started
    loop.run()  # drain what is still queued (nothing accepted is dropped)
    workload_of = {w.target: i for i, w in enumerate(scenario.workloads) if w.kind == "function"}
    rows = []
    done_ids = set()
    for r in sorted(cluster.log.completed, key=lambda r: r.request_id):
        done_ids.add(r.request_id)
        rows.append(
            {
                "kind": "function",
                "name": r.function,
                "workload": workload_of[r.function],
                "request": r.request_id,
                "arrival_ms": r.arrival_ms - LEAD_MS,
                "latency_ms": r.latency_ms,
                "slo_ms": r.slo_ms if r.slo_ms is not None and math.isfinite(r.slo_ms) else None,
                "hit": r.slo_met,
                "status": "error" if r.shed else "ok",  # shed: the live 429
                "measured": r.arrival_ms >= LEAD_MS + warmup_ms,
                "cost_uusd": None,
                **_timing(r),
            }
        )
    extra: dict[str, dict[str, Any]] = {}
    for n in names:
        s = samples[n] or [(0, 0)]
        extra[n] = {
            "devices_mean": float(np.mean([d for d, _ in s])),
            "devices_max": max(d for d, _ in s),
            "instances_mean": float(np.mean([k for _, k in s])),
            "instances_max": max(k for _, k in s),
            "instances_started": started,
            "capacity_shortfalls": cluster.capacity_shortfalls,
            "configs": len(cluster.functions[n].configs),
            "profile": profiles[n].source,
            **_admission_figures(cluster.gateway, n),
        }
    return rows, extra


def _timing(r: SimRequest) -> dict[str, float | None]:
    """``TIMING_COLUMNS`` of one simulated function request (None where it has none)."""
    if r.shed or r.instance_finish_ms < 0 or r.queued_ms < 0:
        return dict.fromkeys(TIMING_COLUMNS)
    return {
        "platform_ms": r.finish_ms - r.instance_finish_ms,
        "exec_ms": r.instance_finish_ms - r.start_ms - r.token_wait_ms,
        "queue_ms": r.start_ms - r.queued_ms,
        "token_wait_ms": r.token_wait_ms,
    }


def _admission_figures(gateway: Gateway, fn: str) -> dict[str, Any]:
    """``fn``'s SLO admission at the run's end (``sim.gateway``): its service estimate
    (``admission_interval_ms_end``, None without one) and the gaps it counted
    (``admission_gaps``, their ``admission_gap_p50_ms``; the live gateway exports both)."""
    gaps = gateway.admission_gaps_ms.get(fn, [])
    return {
        "admission_interval_ms_end": gateway.admission_interval_ms(fn),
        "admission_gaps": len(gaps),
        "admission_gap_p50_ms": percentile_or_none(gaps, 50),
    }


# -- the command ----------------------------------------------------------------------------------


def simulate(
    scenario: Scenario,
    *,
    quick: bool = False,
    duration_s: float | None = None,
    seed: int | None = None,
    policy: str | None = None,
    live_profiles: Mapping[str, Sequence[ProfilePoint]] | None = None,
    progress: Progress | None = None,
    bo_params: Mapping[str, Any] | None = None,
    frontend_jitter_ms: Sequence[float] = (),
    platform_ms: Sequence[float] = (),
    platform_outstanding_share: float = 0.0,
    step_profiles: Mapping[str, Any] | None = None,
    instance_wakeup_ms: Sequence[float] = (),
    kernels_per_request: Mapping[str, int] | None = None,
    token_release_ms: float = 0.0,
    admission_interval_ms: Mapping[str, float] | None = None,
    batch_gap_ms: Sequence[float] = (),
) -> ExperimentResult:
    """Run ``scenario`` in the simulator (module doc); ``ScenarioError`` for what the scenario
    cannot run with (a policy name, a function without profile, ...). ``frontend_jitter_ms``:
    measured latency spread added per workflow request (``bench/twin.py``); ``platform_ms``:
    measured platform latency samples, one per plain function request (``bench/fidelity.py``;
    default: the scenario's ``frontend_ms + dispatch_ms``), and ``platform_outstanding_share``
    the part of each during which the gateway still counts the request outstanding (measured
    there too; ``sim.gateway``); ``step_profiles``: generative
    models' step models in place of the shipped ones (``bench/generate.py``);
    ``instance_wakeup_ms``: measured wake-up samples of an idle instance's batching thread,
    ``batch_gap_ms`` its loop's gaps between back-to-back batches, and
    ``kernels_per_request``: each function's module calls per request, its instances'
    preemption points (``sim.instance.InstanceConfig``), and ``token_release_ms``: the delay
    of an idle instance's token release (``sim.gpu``; all three measured and given by
    ``bench/fidelity.py``); ``admission_interval_ms``: the gateway admission's starting service
    estimate per function (``sim.gateway``; the live server's, read by ``bench/fidelity.py``
    before each live run)."""
    wf_policy, autoscaler = check_policies(scenario, policy)
    dur = duration_s if duration_s is not None else scenario.duration_s(quick)
    s = scenario.seed if seed is None else seed
    arrivals = scenario_arrivals(scenario, dur, s)
    names = list(
        dict.fromkeys(
            [*scenario.workflow_functions(), *(w.target for w in scenario.function_workloads())]
        )
    )
    gen = generative_functions(scenario)
    profiles = function_profiles(scenario, [n for n in names if n not in gen], live_profiles)
    horizon_ms = dur * 1000.0
    warmup_ms = min(scenario.doc.warmup_s * 1000.0, horizon_ms)
    wf_rows, wf_extra = run_workflows(
        scenario, arrivals, horizon_ms, wf_policy, profiles, seed=s, warmup_ms=warmup_ms,
        progress=progress, bo_params=bo_params, frontend_jitter_ms=frontend_jitter_ms,
    )  # fmt: skip
    fn_rows, fn_extra = run_functions(
        scenario, arrivals, horizon_ms, autoscaler, profiles, seed=s, warmup_ms=warmup_ms,
        progress=progress, platform_ms=platform_ms,
        platform_outstanding_share=platform_outstanding_share,
        instance_wakeup_ms=instance_wakeup_ms, kernels_per_request=kernels_per_request,
        token_release_ms=token_release_ms, admission_interval_ms=admission_interval_ms,
        batch_gap_ms=batch_gap_ms,
    )  # fmt: skip
    gen_rows, gen_extra = run_generative(
        scenario, arrivals, request_tokens(scenario, arrivals), seed=s, warmup_ms=warmup_ms,
        step_profiles=step_profiles,
    )  # fmt: skip
    rows = [*wf_rows, *fn_rows, *gen_rows]
    rows.sort(key=lambda r: (r["arrival_ms"], r["workload"]))
    summary: dict[str, Any] = {
        "scenario": scenario.name,
        "world": "simulator",
        "file": str(scenario.path),
        "seed": s,
        "duration_s": dur,
        "quick": quick,
        "policies": {"workflow": wf_policy, "autoscaler": autoscaler},
        **accounted(rows, arrivals),
    }
    per = summarise(rows, scenario)
    for name, st in per["workflows"].items():
        st.update(wf_extra.get(name, {}))
    for name, st in per["functions"].items():
        st.update(fn_extra.get(name, {}))
    for name, st in summarise_generative(rows, scenario).items():
        per["functions"][name].update(st, **gen_extra[name])
    summary.update(per)
    exp = f"{scenario.name}-simulate"
    return ExperimentResult(
        experiment=exp,
        seed=s,
        params={
            "scenario": str(scenario.path),
            "duration_s": dur,
            "quick": quick,
            "policies": {"workflow": wf_policy, "autoscaler": autoscaler},
            "cluster": scenario.cluster.model_dump(),
        },
        rows=rows,
        summary=summary,
        plots=[latency_cdf_plot(f"{scenario.name}: simulator ({wf_policy}, {autoscaler})", exp)],
        table_columns=(*REQUEST_COLUMNS, *TIMING_COLUMNS, *(GENERATIVE_COLUMNS if gen else ())),
    )


__all__ = [
    "LEAD_MS",
    "FunctionProfile",
    "check_policies",
    "fetch_live_profiles",
    "function_profiles",
    "instances_per_device",
    "run_functions",
    "run_workflows",
    "share_perf",
    "simulate",
]
