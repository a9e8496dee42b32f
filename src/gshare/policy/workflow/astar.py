"""ESG_1Q: the cheapest configuration path of a group of stages under a target latency.

Who calls it: ``gshare.policy.workflow.replan.plan_remaining`` (before every stage dispatch,
once per SLO group it plans), the overhead experiment (against ``brute_force``) and the tests.
Inputs are plain data: for every stage of the group (in execution order) its ``ConfigLists[j]``
— ``ConfigOption``s with the predicted time of one task and the cost per request — and the
group's target latency. Nothing here reads a clock or draws a random number.

Objective and constraint (ESG §3.3): choose one option per stage minimising the summed cost per
request, subject to the summed time ``<= target_ms`` (a path is feasible when
``fits_target(time, target)``; the tolerance ``1e-9 * max(1, |target|)`` only absorbs float
rounding). ``esg_1q`` and ``brute_force`` share this definition, and their cheapest feasible
path has the same cost (property-tested).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

import numpy as np
import numpy.typing as npt

from gshare.workflows.config import ConfigOption, FunctionConfig

DEFAULT_K_BEST: Final[int] = 5
"""ESG's default number of paths in the configuration priority queue (§5.4)."""

_REL_TOL: Final[float] = 1e-9


def _tol(target_ms: float) -> float:
    return _REL_TOL * max(1.0, abs(target_ms))


def fits_target(time_ms: float, target_ms: float) -> bool:
    """The feasibility test shared by ``esg_1q`` and ``brute_force``: ``time <= target`` up to
    float rounding."""
    return time_ms <= target_ms + _tol(target_ms)


def group_target_ms(slo_ms: float, waiting_ms: float, quota: float) -> float:
    """Appendix B's target latency of a group: ``G_SLO = (SLO - w) * q`` with ``w`` the longest
    waiting time of the queued jobs and ``q`` the group's SLO quota (``slo_split``)."""
    return (slo_ms - waiting_ms) * quota


# -- results -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PathPlan:
    """One configuration path: a config per stage with its predicted time and cost."""

    stages: tuple[str, ...]
    """Stage names of the group, in execution order."""
    configs: tuple[FunctionConfig, ...]
    """``configs[i]`` is the configuration of ``stages[i]``."""
    time_ms: float
    """Sum of the stages' predicted task times."""
    cost_usd: float
    """Sum of the stages' predicted costs per request."""

    def config_of(self, stage: str) -> FunctionConfig:
        return self.configs[self.stages.index(stage)]


@dataclass(frozen=True, slots=True)
class SearchStats:
    """Work done by a search (deterministic counts; no wall-clock time)."""

    generated: int
    """(Partial) paths whose bounds were computed (brute force: complete paths evaluated)."""
    expanded: int
    """Paths taken from the priority queue and extended by one stage."""
    pruned_time: int
    """Time-pruning cuts (each cuts the rest of a sorted config list)."""
    pruned_cost: int
    """Paths dropped by cost pruning."""


@dataclass(frozen=True, slots=True)
class Plans:
    """A feasible search result: ESG's configuration priority queue ``configPQ``."""

    target_ms: float
    paths: tuple[PathPlan, ...]
    """At most ``k_best`` feasible paths, cheapest first (ties: faster first)."""
    stats: SearchStats
    feasible: Literal[True] = True

    @property
    def best(self) -> PathPlan:
        return self.paths[0]


@dataclass(frozen=True, slots=True)
class Infeasible:
    """No path meets the target: even the fastest configuration of every stage is too slow
    (or a stage has no configuration at all)."""

    target_ms: float
    stages: tuple[str, ...]
    fastest: PathPlan | None
    """The fastest path (each stage's fastest option); ``None`` if a stage has no option."""
    reason: str
    stats: SearchStats
    feasible: Literal[False] = False


SearchResult = Plans | Infeasible


# -- ESG_1Q ------------------------------------------------------------------------------------

# NOTE (ESG §3.3 "A*-search with dual-bladed pruning", Appendix B Algorithm 1 ESG_1Q).
# The configuration space of a group of stages is a layered graph: layer j holds the options of
# stage j, sorted by increasing time (ConfigLists[j]); a path picks one option per layer. The
# search extends paths layer by layer. For a partial path p it computes three bounds:
#   tLow       = time(p)  + sum over the remaining stages of their minimum time,
#   rscLow     = cost(p)  + sum over the remaining stages of their minimum cost,
#   rscFastest = cost(p)  + sum over the remaining stages of the cost of their fastest option.
# Time blade: if tLow exceeds the target, p and — because the list is sorted by time — every
# later option of the same layer are infeasible: `break`. Cost blade: minRSC keeps the K
# smallest rscFastest values seen in the current layer; each is the cost of a concrete feasible
# complete path (p + the fastest options, whose time is exactly tLow <= target), so a prefix
# whose rscLow is >= the K-th of them cannot lead to one of the K cheapest paths: `continue`.
# Surviving prefixes go to the next layer's priority queue ordered by rscLow — A*'s
# f = g + h, with g = cost(p) and the admissible h = the remaining minimum costs — and the next
# layer dequeues them best-first. Complete paths that survive go to configPQ.
# Details the appendix leaves open, resolved here (see also the report in the module tests):
# * minRSC is reset at every layer (as written); an empty slot counts as +infinity.
# * "Remove minRSC[K-1] and insert rscFastest": we insert and keep the K smallest, i.e. we
#   never replace the K-th value by a larger one (the literal reading could loosen the bound).
# * Paths of the next layer go to a new queue (the written loop would otherwise dequeue the
#   paths it has just extended).
# * Best-first early stop: once the dequeued prefix has rscLow >= minRSC[K-1], every option of
#   it and of every later prefix would be cost-pruned, so the layer ends — the same result as
#   scanning them, minus the work.
# * A single-stage group puts its surviving first-layer paths into configPQ (the written loop
#   only fills configPQ from the second layer on).
# * Feasibility is time <= target (the appendix prunes tLow >= target, i.e. demands <); the
#   difference matters only on exact ties.
# Optimality: every pruned prefix is dominated by a kept prefix whose best completion costs no
# more, so the cheapest path in configPQ is the cheapest feasible path (property-tested against
# brute_force). The other K-1 paths are good alternatives for ESG_Dispatch, not necessarily the
# exact 2nd..K-th cheapest.


def esg_1q(
    options: Sequence[Sequence[ConfigOption]],
    target_ms: float,
    *,
    k_best: int = DEFAULT_K_BEST,
    stages: Sequence[str] | None = None,
    pareto: bool = False,
) -> Plans | Infeasible:
    """ESG_1Q (Appendix B) over a group of stages.

    ``options[j]`` are the options of the j-th stage of the group (any order; sorted here by
    time, then cost, then config); ``target_ms`` is ``G_SLO`` (``group_target_ms``);
    ``stages`` names the stages (default ``s0, s1, ...``). Returns ``Plans`` (configPQ: at most
    ``k_best`` feasible paths, cheapest first) or ``Infeasible``.

    ``pareto=True`` first drops every option that another option of the same stage beats in
    both time (<=) and cost (<=) (``pareto_front``). Not in the paper; it leaves the cheapest
    feasible path's cost unchanged (a dominated option can always be swapped for its
    dominator) and changes only the K-1 alternatives, and it makes the search one to two
    orders of magnitude faster when one stage's fastest option costs much more than its
    cheapest (the rscFastest bound is then loose). Default off: the literal algorithm.
    """
    names, lists = _prepare(options, stages, k_best)
    if pareto:
        lists = [pareto_front(lst) for lst in lists]
    n = len(lists)
    if any(not lst for lst in lists):
        return _no_options(names, lists, target_ms)
    times = [[o.time_ms for o in lst] for lst in lists]
    costs = [[o.cost_usd for o in lst] for lst in lists]
    # rest_*[j]: sums over the stages after j (0 for the last stage)
    rest_min_t = _suffix([row[0] for row in times])
    rest_min_c = _suffix([min(row) for row in costs])
    rest_fast_c = _suffix([row[0] for row in costs])
    limit = target_ms + _tol(target_ms)
    inf = math.inf
    generated = expanded = pruned_time = pruned_cost = 0
    config_pq: list[tuple[float, float, tuple[int, ...]]] = []

    # queue entries: (rscLow, seq, time so far, cost so far, option indices)
    queue: list[tuple[float, int, float, float, tuple[int, ...]]] = []
    seq = itertools.count()
    min_rsc: list[float] = []
    t_rest, c_rest, f_rest = rest_min_t[0], rest_min_c[0], rest_fast_c[0]
    for j, (t, c) in enumerate(zip(times[0], costs[0], strict=True)):
        generated += 1
        if t + t_rest > limit:
            pruned_time += 1
            break
        r_low = c + c_rest
        if r_low >= (min_rsc[k_best - 1] if len(min_rsc) >= k_best else inf):
            pruned_cost += 1
            continue
        bisect.insort(min_rsc, c + f_rest)
        del min_rsc[k_best:]
        queue.append((r_low, next(seq), t, c, (j,)))
        if n == 1:
            config_pq.append((c, t, (j,)))
    heapq.heapify(queue)

    for layer in range(1, n):
        t_row, c_row = times[layer], costs[layer]
        t_rest, c_rest, f_rest = rest_min_t[layer], rest_min_c[layer], rest_fast_c[layer]
        last = layer == n - 1
        min_rsc = []
        nxt: list[tuple[float, int, float, float, tuple[int, ...]]] = []
        while queue:
            r_low_p, _, t_p, c_p, idx = heapq.heappop(queue)
            if r_low_p >= (min_rsc[k_best - 1] if len(min_rsc) >= k_best else inf):
                pruned_cost += 1 + len(queue)
                break
            expanded += 1
            for j in range(len(t_row)):
                generated += 1
                t_new = t_p + t_row[j]
                if t_new + t_rest > limit:
                    pruned_time += 1
                    break
                c_new = c_p + c_row[j]
                r_low = c_new + c_rest
                if r_low >= (min_rsc[k_best - 1] if len(min_rsc) >= k_best else inf):
                    pruned_cost += 1
                    continue
                path = (*idx, j)
                if last:
                    config_pq.append((c_new, t_new, path))
                bisect.insort(min_rsc, c_new + f_rest)
                del min_rsc[k_best:]
                nxt.append((r_low, next(seq), t_new, c_new, path))
        queue = nxt
        heapq.heapify(queue)

    stats = SearchStats(generated, expanded, pruned_time, pruned_cost)
    if not config_pq:
        return _infeasible(names, lists, target_ms, stats)
    config_pq.sort()
    return Plans(
        target_ms=target_ms,
        paths=tuple(_path(names, lists, idx, t, c) for c, t, idx in config_pq[:k_best]),
        stats=stats,
    )


# -- brute force -------------------------------------------------------------------------------


def brute_force(
    options: Sequence[Sequence[ConfigOption]],
    target_ms: float,
    *,
    k_best: int = DEFAULT_K_BEST,
    stages: Sequence[str] | None = None,
) -> Plans | Infeasible:
    """Exhaustive search with ``esg_1q``'s objective and constraint: evaluates every path and
    returns the ``k_best`` cheapest feasible ones (ties: faster, then lower option indices in
    time order). Vectorised with numpy over the last two stages (a loop over the others), so
    it is a strong baseline, not a strawman, for the overhead experiment (ESG §5.3)."""
    names, lists = _prepare(options, stages, k_best)
    n = len(lists)
    if any(not lst for lst in lists):
        return _no_options(names, lists, target_ms)
    times = [np.array([o.time_ms for o in lst], dtype=np.float64) for lst in lists]
    costs = [np.array([o.cost_usd for o in lst], dtype=np.float64) for lst in lists]
    limit = target_ms + _tol(target_ms)
    best: list[tuple[float, float, tuple[int, ...]]] = []
    generated = 0

    def consider(
        block_t: npt.NDArray[np.float64], block_c: npt.NDArray[np.float64], head: tuple[int, ...]
    ) -> None:
        nonlocal best, generated
        generated += block_t.size
        flat_t, flat_c = block_t.ravel(), block_c.ravel()
        ok = np.flatnonzero(flat_t <= limit)
        if ok.size == 0:
            return
        if ok.size > k_best:
            kth = np.partition(flat_c[ok], k_best - 1)[k_best - 1]
            ok = ok[flat_c[ok] <= kth]
        shape = block_t.shape
        for flat in ok.tolist():
            tail = np.unravel_index(flat, shape)
            best.append((float(flat_c[flat]), float(flat_t[flat]), (*head, *map(int, tail))))
        best.sort()
        del best[k_best:]

    if n == 1:
        consider(times[0], costs[0], ())
    else:
        t_a, t_b = times[n - 2], times[n - 1]
        c_a, c_b = costs[n - 2], costs[n - 1]
        for head in itertools.product(*(range(len(lst)) for lst in lists[: n - 2])):
            # left-to-right sums, the same association as esg_1q's running totals
            t_head = c_head = 0.0
            for j, i in enumerate(head):
                t_head = t_head + times[j][i] if j else float(times[j][i])
                c_head = c_head + costs[j][i] if j else float(costs[j][i])
            pre_t = (t_head + t_a) if head else t_a
            pre_c = (c_head + c_a) if head else c_a
            consider(pre_t[:, None] + t_b[None, :], pre_c[:, None] + c_b[None, :], head)

    stats = SearchStats(generated=generated, expanded=0, pruned_time=0, pruned_cost=0)
    if not best:
        return _infeasible(names, lists, target_ms, stats)
    return Plans(
        target_ms=target_ms,
        paths=tuple(_path(names, lists, idx, t, c) for c, t, idx in best),
        stats=stats,
    )


# -- helpers -----------------------------------------------------------------------------------


def pareto_front(options: Sequence[ConfigOption]) -> list[ConfigOption]:
    """The options no other option beats in both time and cost, sorted by time: scanning by
    (time, cost, config), keep an option iff it is strictly cheaper than every one kept so
    far."""
    out: list[ConfigOption] = []
    cheapest = math.inf
    for o in sorted(options, key=lambda x: (x.time_ms, x.cost_usd, x.config)):
        if o.cost_usd < cheapest:
            out.append(o)
            cheapest = o.cost_usd
    return out


def _prepare(
    options: Sequence[Sequence[ConfigOption]], stages: Sequence[str] | None, k_best: int
) -> tuple[tuple[str, ...], list[list[ConfigOption]]]:
    if not options:
        raise ValueError("a search needs at least one stage")
    if k_best < 1:
        raise ValueError(f"k_best must be >= 1, got {k_best}")
    names = tuple(stages) if stages is not None else tuple(f"s{i}" for i in range(len(options)))
    if len(names) != len(options):
        raise ValueError(f"{len(names)} stage names for {len(options)} option lists")
    lists = [sorted(o, key=lambda x: (x.time_ms, x.cost_usd, x.config)) for o in options]
    return names, lists


def _suffix(values: list[float]) -> list[float]:
    """``out[j]`` = sum of ``values[j+1:]`` (0.0 for the last index)."""
    out = [0.0] * len(values)
    acc = 0.0
    for j in range(len(values) - 1, 0, -1):
        acc += values[j]
        out[j - 1] = acc
    return out


def _path(
    names: tuple[str, ...],
    lists: list[list[ConfigOption]],
    idx: tuple[int, ...],
    time_ms: float,
    cost_usd: float,
) -> PathPlan:
    return PathPlan(names, tuple(lists[j][i].config for j, i in enumerate(idx)), time_ms, cost_usd)


def _fastest(names: tuple[str, ...], lists: list[list[ConfigOption]]) -> PathPlan:
    t = c = 0.0
    for lst in lists:
        t += lst[0].time_ms
        c += lst[0].cost_usd
    return PathPlan(names, tuple(lst[0].config for lst in lists), t, c)


def _infeasible(
    names: tuple[str, ...], lists: list[list[ConfigOption]], target_ms: float, stats: SearchStats
) -> Infeasible:
    fastest = _fastest(names, lists)
    return Infeasible(
        target_ms=target_ms,
        stages=names,
        fastest=fastest,
        reason=(
            f"the fastest path of {', '.join(names)} takes {fastest.time_ms:.1f} ms, more than "
            f"the target {target_ms:.1f} ms"
        ),
        stats=stats,
    )


def _no_options(
    names: tuple[str, ...], lists: list[list[ConfigOption]], target_ms: float
) -> Infeasible:
    empty = [names[j] for j, lst in enumerate(lists) if not lst]
    return Infeasible(
        target_ms=target_ms,
        stages=names,
        fastest=None,
        reason=f"no configuration for stage {', '.join(empty)}",
        stats=SearchStats(0, 0, 0, 0),
    )
