"""Orion's best-first search as an ESG baseline (ESG §4.2; Mahgoub et al., OSDI 2022).

Who calls it: the workflow simulator (later the runtime) through the ``WorkflowPolicy``
protocol. At the first stage of a request ``plan_stage`` searches the configurations of every
stage of the DAG at once and returns the whole plan in ``StagePlan.request_plan``; the
mechanism carries it, and at every later stage ``plan_stage`` returns the carried
configuration unchanged (no adaptation). ``orion_search`` is the search itself (pure; the
tests compare it with brute force).

What holds: ``plan_stage`` returns exactly one candidate; the search is deterministic and
bounded by a count of evaluated states, never by a clock; without a cut-off it returns the
cheapest plan whose P95 latency meets the goal (the brute-force optimum, property-tested), and
when no plan can meet the goal it returns the fastest plan. ``select_invoker`` is ESG_Dispatch
(locality as ESG gives every scheduler but INFless and FaST-GShare), so it only picks invokers with
room.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal

import numpy as np

from gshare.policy.workflow.baselines.common import (
    Z_P95,
    source_to_sink_paths,
    stage_map,
    stage_options,
    topological,
)
from gshare.policy.workflow.dispatch import (
    Dispatch,
    DispatchRequest,
    InvokerState,
    NoInvoker,
    esg_dispatch,
)
from gshare.policy.workflow.replan import WorkflowLike
from gshare.policy.workflow.schedulers import StageContext, StagePlan
from gshare.workflows.config import ConfigOption, FunctionConfig

DEFAULT_MAX_EVALUATIONS: Final[int] = 25_000
"""The cut-off, in evaluated states (a state's P95 latency and cost computed — the unit of
work of Orion's search; a state is evaluated when it is generated, and the search stops
expanding once this many have been). ESG §4.2: the search returns "when [it] exceeds a cut-off
time (e.g., 100ms)". Calibrated, not timed: on the development machine (a shared 2-core VM,
CPython 3.11, ESG's applications over the default 448-configuration grid, every SLO level)
30,000 evaluations took 97-120 ms for the 3-stage applications and 123-130 ms for the 5-stage
one (~3.3-4.3 us each), so 25,000 is ~80-110 ms. The budget is a fixed amount of search work: the
same result on every machine and in virtual time; no clock is read."""
MS_PER_EVALUATION: Final[float] = 0.004
"""Calibrated wall-clock cost of one evaluated state on the development machine (see
``DEFAULT_MAX_EVALUATIONS``; 25,000 x 0.004 ms = 100 ms): converts the deterministic work of a
search into a nominal search time (``OrionResult.nominal_search_ms``), for a simulator that
wants to charge Orion's search to the request as ESG's Fig. 9 does, without reading a clock."""
DEFAULT_NOISE_SIGMA_FRAC: Final[float] = 0.05
"""Default relative standard deviation of a task's time (``PerfParams.noise_sigma_frac``);
the registry passes the performance model's own value."""

Status = Literal["goal", "cut-off", "exhausted", "unreachable"]


# -- the lattice of one stage -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StageLattice:
    """The configurations of one stage as Orion's search sees them.

    ``succ[i]`` are the configurations one step up from ``i`` in one dimension (the next
    larger batch, vCPU count or vGPU count among the options with the other two equal);
    ``cone_cost[i]`` / ``cone_time[i]`` are the smallest cost / time over the options at least
    as large as ``i`` in all three dimensions (every configuration reachable from ``i`` is in
    that cone); ``start`` is the minimum configuration (smallest value of every dimension; the
    lexicographically smallest option if that corner is not an option)."""

    configs: tuple[FunctionConfig, ...]
    time_ms: tuple[float, ...]
    cost_usd: tuple[float, ...]
    succ: tuple[tuple[int, ...], ...]
    cone_cost: tuple[float, ...]
    cone_time: tuple[float, ...]
    start: int

    @classmethod
    def build(cls, options: Sequence[ConfigOption]) -> StageLattice:
        """From a stage's options (duplicated configurations: the first one counts).
        ``ValueError`` when there is none."""
        seen: dict[FunctionConfig, ConfigOption] = {}
        for o in options:
            seen.setdefault(o.config, o)
        if not seen:
            raise ValueError("a stage has no configuration option")
        opts = sorted(seen.values(), key=lambda o: o.config)
        cfgs = tuple(o.config for o in opts)
        index = {c: i for i, c in enumerate(cfgs)}
        dims = (
            sorted({c.batch for c in cfgs}),
            sorted({c.vcpus for c in cfgs}),
            sorted({c.vgpus for c in cfgs}),
        )
        succ: list[tuple[int, ...]] = []
        for c in cfgs:
            key = (c.batch, c.vcpus, c.vgpus)
            nxt: list[int] = []
            for d in range(3):
                for v in dims[d]:
                    if v <= key[d]:
                        continue
                    k = list(key)
                    k[d] = v
                    j = index.get(FunctionConfig(*k))
                    if j is not None:
                        nxt.append(j)
                        break
            succ.append(tuple(nxt))
        arr = np.array([[c.batch, c.vcpus, c.vgpus] for c in cfgs], dtype=np.int64)
        cost = np.array([o.cost_usd for o in opts], dtype=np.float64)
        time = np.array([o.time_ms for o in opts], dtype=np.float64)
        cone = np.all(arr[None, :, :] >= arr[:, None, :], axis=2)  # cone[i, j]: j >= i
        cone_cost = np.where(cone, cost[None, :], np.inf).min(axis=1)
        cone_time = np.where(cone, time[None, :], np.inf).min(axis=1)
        corner = FunctionConfig(dims[0][0], dims[1][0], dims[2][0])
        return cls(
            configs=cfgs,
            time_ms=tuple(float(x) for x in time),
            cost_usd=tuple(float(x) for x in cost),
            succ=tuple(succ),
            cone_cost=tuple(float(x) for x in cone_cost),
            cone_time=tuple(float(x) for x in cone_time),
            start=index.get(corner, 0),
        )


def _fastest_index(lat: StageLattice) -> int:
    """The fastest configuration of a lattice (ties: cheaper, then smaller)."""
    return min(range(len(lat.configs)), key=lambda j: (lat.time_ms[j], lat.cost_usd[j], j))


# -- the search ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OrionResult:
    """Orion's plan for a set of stages, with how the search ended."""

    stages: tuple[str, ...]
    configs: tuple[FunctionConfig, ...]
    """``configs[i]`` is the configuration of ``stages[i]``."""
    p95_ms: float
    """The plan's predicted P95 end-to-end latency (``p95_of_paths_ms``)."""
    cost_usd: float
    """Sum of the stages' predicted costs per request."""
    goal_ms: float
    status: Status
    """``goal``: the cheapest plan meeting the goal (search complete); ``cut-off``: the budget
    ran out — the cheapest plan seen that meets the goal, else the plan seen closest to it
    (the fastest); ``exhausted``: every reachable plan was seen and none meets the goal — the
    fastest seen; ``unreachable``: not even the fastest plan meets the goal — that plan."""
    expanded: int
    """States taken from the priority queue and expanded."""
    generated: int
    """States evaluated (latency and cost computed)."""

    @property
    def meets_goal(self) -> bool:
        return self.p95_ms <= self.goal_ms

    def plan(self) -> dict[str, FunctionConfig]:
        return dict(zip(self.stages, self.configs, strict=True))

    @property
    def nominal_search_ms(self) -> float:
        """The search's work as time: ``generated * MS_PER_EVALUATION`` (about 100 ms at the
        default cut-off)."""
        return self.generated * MS_PER_EVALUATION


# NOTE (ESG §4.2 "Orion"; Orion §4 right-sizing). ESG: "Its scheduling uses best-first search,
# which creates a priority queue, in which all new states are added. Adding vGPU into the
# algorithm, we expand its state definition to a vector of (batch size, #vCPUs, and #vGPUs),
# one for each stage. The algorithm examines possible states, with each new state increasing
# the current state in one dimension of the configuration vector, and the start state S0 has
# the minimum values for every stage function. The scheduling method decides the schedule for
# all the stages of an application at the invocation of the first stage; no dynamic
# adaptation between stages. As in the original work, P95 latency is used as the search goal.
# The configuration with the closest latency to the SLO is returned when the search exceeds a
# cut-off time (e.g., 100ms) before reaching the goal."
# Our search, over the vector of every remaining stage's configuration:
# * S0: every stage at its minimum configuration; successors of a state: one stage moved one
#   step up in one dimension (``StageLattice.succ``); every new state enters the queue once.
# * Goal: the plan's P95 end-to-end latency (``p95_of_paths_ms``: independent Gaussian noise
#   of the performance model, sigma from the model, convolved along each path, max over paths)
#   <= the remaining SLO (the SLO minus the time the request has already spent when its first
#   stage is dispatched); objective: the cheapest such plan (cost per request, as every
#   scheduler here). The stage being dispatched only considers batches <= its queued jobs;
#   later stages consider every batch (they cannot know their queues — ESG Table 4's misses).
# * Priority ("best first"): f(S) = sum over stages of cone_cost — the cheapest cost any state
#   reachable from S can have (ties: lower P95, then insertion order). When a state meeting the
#   goal is generated, a goal entry with its exact cost joins the queue; popping a goal entry
#   ends the search with a proven cheapest plan, because every other queued state's f bounds
#   what it can still reach from below. (With a cost that never falls when a dimension grows,
#   f(S) = cost(S) and this is plain cheapest-first search; batching makes cost per request
#   fall with the batch, hence the bound.) The priority function is not given by ESG; this one
#   makes the uncut search return the brute-force optimum.
# * Pruning (``prune=True``): a state from which even the fastest reachable times (cone_time)
#   miss the goal is not queued — it cannot lead to a plan meeting it. It changes the work, not
#   the answer. If the fastest plan of all misses the goal, that plan (the closest latency to
#   the SLO there is) is returned at once.
# * Cut-off: once ``max_evaluations`` states have been evaluated (a deterministic count
#   calibrated to ~100 ms, ``DEFAULT_MAX_EVALUATIONS``): the cheapest plan seen that meets the
#   goal; if none was seen, the plan with the closest latency to the goal — all seen plans
#   miss it, so the fastest.
#   (ESG's "closest latency to the SLO" read literally would prefer a plan just above the SLO
#   to a cheaper one below it; a plan known to meet the goal is kept instead.)
# * Orion's bundling of parallel invocations into one VM has no counterpart for ESG's chains;
#   its pre-warming is the shared mechanism's (ESG §4.2).


def p95_ms_of(
    times_ms: Sequence[float], paths: Sequence[Sequence[int]], sigma_frac: float, z: float
) -> float:
    """``p95_of_paths_ms`` over stage indices (the search's hot path)."""
    best = 0.0
    for path in paths:
        mu = 0.0
        sq = 0.0
        for k in path:
            t = times_ms[k]
            mu += t
            sq += t * t
        v = mu + z * sigma_frac * math.sqrt(sq)
        if v > best:
            best = v
    return best


def orion_search(
    stages: Sequence[str],
    lattices: Sequence[StageLattice],
    goal_ms: float,
    *,
    paths: Sequence[Sequence[str]] | None = None,
    sigma_frac: float = DEFAULT_NOISE_SIGMA_FRAC,
    z: float = Z_P95,
    max_evaluations: int = DEFAULT_MAX_EVALUATIONS,
    prune: bool = True,
) -> OrionResult:
    """Orion's best-first search (NOTE above) over ``stages`` (``lattices[i]`` for
    ``stages[i]``). ``paths`` are the DAG's source-to-sink paths as stage names (default: the
    stages form one chain in the given order). Deterministic."""
    if len(stages) != len(lattices) or not stages:
        raise ValueError("orion_search needs one lattice per stage and at least one stage")
    if max_evaluations < 1:
        raise ValueError(f"max_evaluations must be >= 1, got {max_evaluations}")
    pos = {s: i for i, s in enumerate(stages)}
    pidx = [[pos[s] for s in p] for p in (paths if paths is not None else [list(stages)])]
    n = len(stages)
    names = tuple(stages)

    def result(
        state: tuple[int, ...],
        status: Status,
        expanded: int,
        generated: int,
        p95: float,
        cost: float,
    ) -> OrionResult:
        return OrionResult(
            names,
            tuple(lattices[k].configs[state[k]] for k in range(n)),
            p95,
            cost,
            goal_ms,
            status,
            expanded,
            generated,
        )

    if prune:
        # every configuration is in the start's cone only on a full grid: use all times
        fastest_t = [min(lat.time_ms) for lat in lattices]
        if p95_ms_of(fastest_t, pidx, sigma_frac, z) > goal_ms:
            state = tuple(_fastest_index(lat) for lat in lattices)
            times = [lattices[k].time_ms[state[k]] for k in range(n)]
            cost = sum(lattices[k].cost_usd[state[k]] for k in range(n))
            return result(state, "unreachable", 0, 0, p95_ms_of(times, pidx, sigma_frac, z), cost)

    seq = itertools.count()
    # entries: (priority, kind, p95, seq, state); kind 0 = goal entry (priority = its cost),
    # kind 1 = a state to expand (priority = f); a goal entry wins ties
    heap: list[tuple[float, int, float, int, tuple[int, ...]]] = []
    best_ok: tuple[float, float, tuple[int, ...]] | None = None  # (cost, p95, state)
    fastest: tuple[float, float, tuple[int, ...]] | None = None  # (p95, cost, state)
    generated = 0

    def consider(state: tuple[int, ...]) -> None:
        nonlocal best_ok, fastest, generated
        generated += 1
        times = [lattices[k].time_ms[state[k]] for k in range(n)]
        p95 = p95_ms_of(times, pidx, sigma_frac, z)
        cost = 0.0
        f = 0.0
        for k in range(n):
            cost += lattices[k].cost_usd[state[k]]
            f += lattices[k].cone_cost[state[k]]
        if fastest is None or (p95, cost) < fastest[:2]:
            fastest = (p95, cost, state)
        if p95 <= goal_ms:
            if best_ok is None or (cost, p95) < best_ok[:2]:
                best_ok = (cost, p95, state)
            heapq.heappush(heap, (cost, 0, p95, next(seq), state))
        if prune:
            lb = [lattices[k].cone_time[state[k]] for k in range(n)]
            if p95_ms_of(lb, pidx, sigma_frac, z) > goal_ms:
                return
        if best_ok is not None and f >= best_ok[0]:
            return  # nothing reachable from here is cheaper than a plan already found
        heapq.heappush(heap, (f, 1, p95, next(seq), state))

    start = tuple(lat.start for lat in lattices)
    visited = {start}
    consider(start)
    expanded = 0
    cut = False
    while heap:
        prio, kind, p95, _, state = heapq.heappop(heap)
        if kind == 0:
            return result(state, "goal", expanded, generated, p95, prio)
        if generated >= max_evaluations:
            cut = True
            break
        expanded += 1
        for k in range(n):
            for j in lattices[k].succ[state[k]]:
                new = (*state[:k], j, *state[k + 1 :])
                if new not in visited:
                    visited.add(new)
                    consider(new)
    if best_ok is not None:
        cost, p95, state = best_ok
        return result(state, "cut-off" if cut else "goal", expanded, generated, p95, cost)
    assert fastest is not None
    p95, cost, state = fastest
    return result(state, "cut-off" if cut else "exhausted", expanded, generated, p95, cost)


# -- the policy ---------------------------------------------------------------------------------


class OrionPolicy:
    """Orion as a ``WorkflowPolicy`` (module NOTE).

    ``noise_sigma_frac`` is the performance model's relative noise (the registry passes
    ``perf.params.noise_sigma_frac``); ``max_evaluations`` the cut-off; ``goal_resolution_ms``
    rounds the goal *down* to a multiple of it before searching, so that requests whose
    remaining budgets differ by less than that share one search (memoised; 0 disables it) —
    the plan is then at most that much stricter than needed, never looser. The memo assumes
    the options of a function do not change during the policy's life (the simulator passes
    the same ``PerfModel.options`` throughout).

    Search overhead: a memo hit costs no wall-clock time, so a simulator timing
    ``plan_stage`` sees less than Orion's per-invocation search. The work Orion would have
    done is kept deterministically: ``last_result.nominal_search_ms`` (also in the plan's
    note) and the running total ``nominal_search_ms`` count every first-stage plan, memo hit
    or not."""

    name = "orion"

    def __init__(
        self,
        *,
        noise_sigma_frac: float = DEFAULT_NOISE_SIGMA_FRAC,
        z: float = Z_P95,
        max_evaluations: int = DEFAULT_MAX_EVALUATIONS,
        prune: bool = True,
        goal_resolution_ms: float = 1.0,
    ) -> None:
        if noise_sigma_frac < 0:
            raise ValueError(f"noise_sigma_frac must be >= 0, got {noise_sigma_frac}")
        if max_evaluations < 1:
            raise ValueError(f"max_evaluations must be >= 1, got {max_evaluations}")
        if goal_resolution_ms < 0:
            raise ValueError(f"goal_resolution_ms must be >= 0, got {goal_resolution_ms}")
        self.noise_sigma_frac = noise_sigma_frac
        self.z = z
        self.max_evaluations = max_evaluations
        self.prune = prune
        self.goal_resolution_ms = goal_resolution_ms
        self._lattices: dict[tuple[str, int], tuple[Sequence[ConfigOption], StageLattice]] = {}
        self._memo: dict[tuple[str, tuple[str, ...], str, int, float], OrionResult] = {}
        self.searches = 0
        """Searches run (memo misses), for the simulator's overhead accounting."""
        self.last_result: OrionResult | None = None
        """The result behind the last plan made at a first stage."""
        self.nominal_search_ms = 0.0
        """Sum of ``nominal_search_ms`` over every first-stage plan (memo hits included)."""

    def prepare(
        self,
        workflows: Sequence[tuple[str, WorkflowLike]],
        options: Mapping[str, Sequence[ConfigOption]],
        seed: int,
    ) -> None:
        """Build the stage lattices (Orion is online and deterministic: ``seed`` is unused)."""
        for _, wf in workflows:
            for s in wf.stages:
                self._lattice(s.function, options[s.function], 1 << 30)

    def _lattice(self, function: str, opts: Sequence[ConfigOption], cap: int) -> StageLattice:
        hit = self._lattices.get((function, cap))
        if hit is not None and hit[0] is opts:
            return hit[1]
        use = [o for o in opts if o.config.batch <= cap] or list(opts)
        lat = StageLattice.build(use)
        self._lattices[(function, cap)] = (opts, lat)
        return lat

    def search(self, ctx: StageContext) -> OrionResult:
        """Orion's search for the stages of ``ctx``'s request not yet done, with goal = the
        SLO minus the time the request has spent (``ctx.elapsed_ms``); ``ctx.stage`` only
        batches the ``ctx.queue_len`` jobs that are there."""
        wf = ctx.workflow
        stages = tuple(
            topological(wf, [s.name for s in wf.stages if s.name not in ctx.done_stages])
        )
        goal = wf.slo_ms - ctx.elapsed_ms
        if self.goal_resolution_ms > 0:
            goal = math.floor(goal / self.goal_resolution_ms) * self.goal_resolution_ms
        cap = max(1, ctx.queue_len)
        key = (ctx.application, stages, ctx.stage, cap, goal)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        smap = stage_map(wf)
        lattices = [
            self._lattice(
                smap[s].function,
                stage_options(wf, s, ctx.options),
                cap if s == ctx.stage else 1 << 30,
            )
            for s in stages
        ]
        res = orion_search(
            stages,
            lattices,
            goal,
            paths=source_to_sink_paths(wf, stages),
            sigma_frac=self.noise_sigma_frac,
            z=self.z,
            max_evaluations=self.max_evaluations,
            prune=self.prune,
        )
        self.searches += 1
        self._memo[key] = res
        return res

    def plan_stage(self, ctx: StageContext) -> StagePlan:
        """First stage (no carried plan): search the whole DAG and carry the plan. Later
        stages: the carried configuration, unchanged — even when its batch exceeds the jobs
        queued (ESG Table 4's "configuration miss"; the note then says ``config-miss`` and the
        mechanism runs the task with the jobs there are)."""
        carried = ctx.request_plan
        if carried is not None and ctx.stage in carried:
            cfg = carried[ctx.stage]
            miss = cfg.batch > ctx.queue_len
            return StagePlan(
                (cfg,),
                request_plan=carried,
                note="orion: carried plan"
                + (f"; config-miss: batch {cfg.batch} > {ctx.queue_len} queued" if miss else ""),
            )
        res = self.search(ctx)
        self.last_result = res
        self.nominal_search_ms += res.nominal_search_ms
        plan = MappingProxyType(res.plan())
        return StagePlan(
            (plan[ctx.stage],),
            request_plan=plan,
            note=(
                f"orion: {res.status}, P95 {res.p95_ms:.1f} ms vs goal {res.goal_ms:.1f} ms, "
                f"{res.expanded} expanded / {res.generated} evaluated "
                f"(~{res.nominal_search_ms:.0f} ms nominal)"
            ),
        )

    def select_invoker(
        self,
        request: DispatchRequest,
        invokers: Sequence[InvokerState],
        ctx: StageContext,
    ) -> Dispatch | NoInvoker:
        """ESG_Dispatch: home / predecessor invoker, then warm, then the emptiest cold one."""
        return esg_dispatch(request, invokers)
