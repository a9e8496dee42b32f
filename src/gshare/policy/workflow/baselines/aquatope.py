"""Aquatope's static per-stage configurations as an ESG baseline (ESG §4.2; Zhou et al.,
ASPLOS 2023).

Who calls it: the workflow simulator (later the runtime) through the ``WorkflowPolicy``
protocol. The offline part — Bayesian optimisation with scikit-learn Gaussian processes — lives
in ``gshare.experiments.offline_bo`` because the policy layer must not import scikit-learn
(it pulls in ``threading``; docs/DESIGN.md §1). The split:

* ``gshare.experiments.offline_bo.optimise_static_plans(workflows, options, perf, seed)`` runs
  the BO and returns ``{application: {stage: FunctionConfig}}``;
* ``AquatopePolicy(static_plans=...)`` (or ``AquatopePolicy.from_plans``) serves such plans;
* ``AquatopePolicy(optimiser=...)`` takes any callable ``(workflows, options, seed) -> plans``
  and calls it from ``prepare`` — ``offline_bo.bo_optimiser(perf)`` builds the BO one, and
  ``offline_bo.make_aquatope(workflows, options, perf, seed)`` does all of it in one call.

The policy only reads the plans: it never learns online and never adapts (ESG: "it uses the
learned best configurations for the application").

What holds: ``plan_stage`` returns exactly one candidate — the static configuration of the
stage, or the minimum configuration for an application or stage without a plan;
``select_invoker`` is ESG_Dispatch, so it only picks invokers with room.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from gshare.policy.workflow.baselines.common import FALLBACK_CONFIG
from gshare.policy.workflow.dispatch import (
    Dispatch,
    DispatchRequest,
    InvokerState,
    NoInvoker,
    esg_dispatch,
)
from gshare.policy.workflow.replan import WorkflowLike
from gshare.policy.workflow.schedulers import StageContext, StagePlan
from gshare.workflows.config import ConfigOption, FunctionConfig, minimum_config

StaticPlans = Mapping[str, Mapping[str, FunctionConfig]]
"""Application -> stage -> its static configuration."""
StaticPlanOptimiser = Callable[
    [Sequence[tuple[str, WorkflowLike]], Mapping[str, Sequence[ConfigOption]], int], StaticPlans
]
"""The offline phase: ``(workflows, options, seed) -> StaticPlans`` (e.g.
``gshare.experiments.offline_bo.bo_optimiser(perf)``)."""


# NOTE (ESG §4.2 "Aquatope"). "Aquatope relies on an offline training process, in which the
# application of interest is profiled in many sample executions based on Bayesian Optimization
# (BO) ... the training process starts with 100 bootstrapping samples, iterates 50 rounds (we
# sample five configurations in each round), and selects the best configuration. ... In
# deployment, it uses the learned best configurations for the application." So at run time a
# stage of an application always gets the same configuration, whatever the queue, the load or
# the time already spent — including a batch larger than the jobs queued (ESG Table 4: 59-86 %
# "configuration misses"; the note then says ``config-miss`` and the mechanism runs the task
# with the jobs there are). Locality, pre-warming, GPU sharing and batching are the shared
# mechanism's (ESG §4.2), so invokers are chosen by ESG_Dispatch.


class AquatopePolicy:
    """Aquatope as a ``WorkflowPolicy`` (module NOTE): serves precomputed static plans.

    Give ``static_plans`` (already optimised), or an ``optimiser`` that ``prepare`` calls for
    the applications without a plan, or both. Plans are stored read-only."""

    name = "aquatope"

    def __init__(
        self,
        static_plans: StaticPlans | None = None,
        *,
        optimiser: StaticPlanOptimiser | None = None,
    ) -> None:
        self.optimiser = optimiser
        self._plans: dict[str, Mapping[str, FunctionConfig]] = {}
        for app, plan in (static_plans or {}).items():
            self._plans[app] = MappingProxyType(dict(plan))

    @classmethod
    def from_plans(cls, static_plans: StaticPlans) -> AquatopePolicy:
        """A policy serving ``static_plans`` (e.g. ``offline_bo.optimise_static_plans``'s)."""
        return cls(static_plans)

    @property
    def static_plans(self) -> Mapping[str, Mapping[str, FunctionConfig]]:
        """Application -> stage -> configuration (read-only)."""
        return MappingProxyType(self._plans)

    def prepare(
        self,
        workflows: Sequence[tuple[str, WorkflowLike]],
        options: Mapping[str, Sequence[ConfigOption]],
        seed: int,
    ) -> None:
        """The offline phase: optimise the applications that have no plan yet (with the
        ``optimiser``, seeded by ``seed``), then check every application's plan covers all its
        stages. ``ValueError`` naming the applications when plans are missing and there is no
        optimiser, or a plan misses stages."""
        missing = [(app, wf) for app, wf in workflows if app not in self._plans]
        if missing:
            if self.optimiser is None:
                raise ValueError(
                    "aquatope has no static plan for "
                    + ", ".join(app for app, _ in missing)
                    + ": pass static_plans= or optimiser= (gshare.experiments.offline_bo."
                    "bo_optimiser(perf)), or build it with offline_bo.make_aquatope(...)"
                )
            new = self.optimiser(missing, options, seed)
            for app, _ in missing:
                if app not in new:
                    raise ValueError(f"the optimiser returned no plan for {app!r}")
                self._plans[app] = MappingProxyType(dict(new[app]))
        for app, wf in workflows:
            lacking = [s.name for s in wf.stages if s.name not in self._plans[app]]
            if lacking:
                raise ValueError(
                    f"aquatope's plan for {app!r} has no configuration for stage(s) "
                    + ", ".join(lacking)
                )

    def plan_stage(self, ctx: StageContext) -> StagePlan:
        """The stage's static configuration (the whole static plan is carried too)."""
        plan = self._plans.get(ctx.application)
        if plan is None or ctx.stage not in plan:
            fn = next(s.function for s in ctx.workflow.stages if s.name == ctx.stage)
            return StagePlan(
                (minimum_config(ctx.options.get(fn, ()), FALLBACK_CONFIG),),
                note=f"aquatope: no static plan for {ctx.application}/{ctx.stage}: min config",
            )
        cfg = plan[ctx.stage]
        miss = cfg.batch > ctx.queue_len
        return StagePlan(
            (cfg,),
            request_plan=plan,
            note="aquatope: static plan"
            + (f"; config-miss: batch {cfg.batch} > {ctx.queue_len} queued" if miss else ""),
        )

    def select_invoker(
        self,
        request: DispatchRequest,
        invokers: Sequence[InvokerState],
        ctx: StageContext,
    ) -> Dispatch | NoInvoker:
        """ESG_Dispatch: home / predecessor invoker, then warm, then the emptiest cold one."""
        return esg_dispatch(request, invokers)
