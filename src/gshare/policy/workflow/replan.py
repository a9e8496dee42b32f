"""Adaptive re-planning: the SLO split and ESG_1Q for the stages that remain (ESG §3.3).

ESG does not fix a workflow's configuration when its first stage starts (as Orion and Aquatope
do); it "revisits and adjusts the schedules before the dispatch of every serverless function"
(§1, §3.3), so a slow stage, a cold start or a long wait is absorbed by the stages after it.

Who calls it: the controller (simulator or runtime) before it dispatches a stage: with the
stages already done, the time the request has used and the oldest job's wait in the stage's
AFW queue. ``plan_remaining`` then

1. takes the remaining latency budget ``B = slo_ms - elapsed_ms - waiting_ms``;
2. computes ANL labels of the remaining stages from their options (``anl_labels``, normalised
   over the remaining stages) and splits ``B`` among groups of at most ``max_group_size``
   stages (``split_slo``, dominator-based);
3. runs ESG_1Q on every group it is asked to plan (``for_stages``; default all) with target
   ``G_SLO = B * q`` (Appendix B's ``(SLO - w) * q`` with the time already used taken out).

The controller then hands ``RemainingPlan.candidates(stage)`` to ESG_Dispatch. Pure: the
options (times and costs from ``gshare.workflows.perf``) are passed in.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gshare.policy.workflow.astar import DEFAULT_K_BEST, Infeasible, Plans, esg_1q
from gshare.policy.workflow.slo_split import (
    DEFAULT_MAX_GROUP_SIZE,
    SloGroup,
    SloSplit,
    anl_labels,
    split_slo,
)
from gshare.workflows.config import ConfigOption, FunctionConfig


class StageLike(Protocol):
    """What the planner reads of a stage (``gshare.workflows.spec.StageSpec`` satisfies it)."""

    @property
    def name(self) -> str: ...
    @property
    def function(self) -> str: ...
    @property
    def after(self) -> Sequence[str]: ...


class WorkflowLike(Protocol):
    """What the planner reads of a workflow (``gshare.workflows.spec.WorkflowSpec`` satisfies
    it; the policy does not import the pydantic spec)."""

    @property
    def name(self) -> str: ...
    @property
    def slo_ms(self) -> float: ...
    @property
    def stages(self) -> Sequence[StageLike]: ...


@dataclass(frozen=True, slots=True)
class GroupPlan:
    """ESG_1Q's answer for one SLO group."""

    group: SloGroup
    target_ms: float
    """``G_SLO`` of the group: remaining budget x quota."""
    result: Plans | Infeasible


@dataclass(frozen=True, slots=True)
class RemainingPlan:
    """The plan of the remaining stages of one request (or batch of requests)."""

    budget_ms: float
    """``slo_ms - elapsed_ms - waiting_ms`` (may be <= 0: the SLO is already lost)."""
    split: SloSplit | None
    """The SLO split of the remaining stages (``None`` when nothing remains)."""
    groups: tuple[GroupPlan, ...]
    """The planned groups (those containing a stage of ``for_stages``), in split order."""

    def group_plan(self, stage: str) -> GroupPlan:
        for gp in self.groups:
            if stage in gp.group.stages:
                return gp
        raise KeyError(f"stage {stage!r} was not planned")

    def candidates(self, stage: str) -> tuple[FunctionConfig, ...]:
        """ESG_Dispatch's input for ``stage``: its configuration in each path of configPQ,
        best path first, without repeats; ``()`` when the group is infeasible."""
        res = self.group_plan(stage).result
        if isinstance(res, Infeasible):
            return ()
        return tuple(dict.fromkeys(p.config_of(stage) for p in res.paths))

    def config(self, stage: str) -> FunctionConfig | None:
        """The best path's configuration of ``stage`` (``None`` when infeasible)."""
        c = self.candidates(stage)
        return c[0] if c else None


def anl_from_options(options_by_stage: Mapping[str, Sequence[ConfigOption]]) -> dict[str, float]:
    """ANL labels of the given stages from their options, over the configurations that every
    stage has (ESG §3.3 averages over configurations ``c`` common to all functions). When the
    stages share none — gshare's spaces differ per function (each its own quotas,
    ``gshare.workflows.shares``) — over the batches they share, a stage's time at a batch being
    the mean over its own configurations of that batch. ``ValueError`` when they share no
    batch either."""
    stages = list(options_by_stage)
    if not stages:
        return {}
    by_cfg = [{o.config: o.time_ms for o in options_by_stage[s]} for s in stages]
    common = [c for c in by_cfg[0] if all(c in d for d in by_cfg[1:])]
    if common:
        common.sort()
        return anl_labels({s: [d[c] for c in common] for s, d in zip(stages, by_cfg, strict=True)})
    by_batch: list[dict[int, list[float]]] = []
    for d in by_cfg:
        per: dict[int, list[float]] = {}
        for c, t in d.items():
            per.setdefault(c.batch, []).append(t)
        by_batch.append(per)
    batches = sorted(b for b in by_batch[0] if all(b in d for d in by_batch[1:]))
    if not batches:
        raise ValueError(
            f"stages {', '.join(stages)} share no configuration and no batch: ANL is undefined"
        )
    return anl_labels(
        {s: [sum(d[b]) / len(d[b]) for b in batches] for s, d in zip(stages, by_batch, strict=True)}
    )


def plan_remaining(
    workflow: WorkflowLike,
    done_stages: Collection[str],
    elapsed_ms: float,
    waiting_ms: float,
    *,
    options: Mapping[str, Sequence[ConfigOption]],
    for_stages: Collection[str] | None = None,
    queue_len: int | None = None,
    max_group_size: int = DEFAULT_MAX_GROUP_SIZE,
    k_best: int = DEFAULT_K_BEST,
    anl: Mapping[str, float] | None = None,
    pareto: bool = False,
) -> RemainingPlan:
    """Re-plan the stages of ``workflow`` not in ``done_stages`` (module doc).

    * ``elapsed_ms`` — time from the request's arrival until the current stage's inputs were
      ready (completed stages, transfers, cold starts); ``waiting_ms`` — Appendix B's ``w``:
      how long the oldest job has waited in the current stage's AFW queue since.
    * ``options`` — function name -> its ``ConfigOption``s (``PerfModel.options``).
    * ``for_stages`` — plan only the groups containing these stages (the controller passes
      the stage it is about to dispatch); ``None`` plans every group.
    * ``queue_len`` — jobs in the current stage's AFW queue: the stages of ``for_stages`` are
      searched only over batches ``<= queue_len`` (a task cannot batch jobs that are not there;
      cf. ESG Table 4's "configuration misses"); later stages keep every batch.
    * ``anl`` — precomputed ANL labels of the remaining stages (default: ``anl_from_options``).
    * ``pareto`` — passed to ``esg_1q``: drop dominated options first (same best path, much
      faster; not in the paper — see ``esg_1q``).

    ``ValueError`` if a done stage has a predecessor that is not done, or a stage is unknown.
    """
    stages = {s.name: s for s in workflow.stages}
    done = set(done_stages)
    for s in done:
        if s not in stages:
            raise ValueError(f"workflow {workflow.name!r} has no stage {s!r}")
        missing = [p for p in stages[s].after if p not in done]
        if missing:
            raise ValueError(
                f"stage {s!r} is done but its predecessor(s) {', '.join(missing)} are not"
            )
    remaining = {
        n: tuple(p for p in st.after if p not in done) for n, st in stages.items() if n not in done
    }
    budget = workflow.slo_ms - elapsed_ms - waiting_ms
    if not remaining:
        return RemainingPlan(budget, None, ())
    wanted = set(remaining) if for_stages is None else set(for_stages)
    unknown = wanted - set(remaining)
    if unknown:
        raise ValueError(f"stages {sorted(unknown)} are not among the remaining stages")

    def opts(stage: str) -> Sequence[ConfigOption]:
        fn = stages[stage].function
        try:
            return options[fn]
        except KeyError:
            raise KeyError(f"no options for function {fn!r} (stage {stage!r})") from None

    labels = anl if anl is not None else anl_from_options({s: opts(s) for s in remaining})
    split = split_slo(remaining, labels, budget, max_group_size=max_group_size)
    planned = []
    for group in split.groups:
        if not wanted.intersection(group.stages):
            continue
        lists = []
        for s in group.stages:
            o = opts(s)
            if queue_len is not None and for_stages is not None and s in wanted:
                o = [x for x in o if x.config.batch <= queue_len]
            lists.append(o)
        target = group.slo_ms
        result = esg_1q(lists, target, k_best=k_best, stages=group.stages, pareto=pareto)
        planned.append(GroupPlan(group, target, result))
    return RemainingPlan(budget, split, tuple(planned))
