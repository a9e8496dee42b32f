"""ESG as a ``WorkflowPolicy`` (§3): re-plan before every stage, dispatch with locality.

Who calls it: the workflow simulator (``gshare.sim.workflow``) — and later the live runtime —
through the ``WorkflowPolicy`` protocol (``schedulers``): ``prepare`` once, then for every task
of every AFW queue it serves ``plan_stage`` (ESG_1Q) and ``select_invoker`` (ESG_Dispatch).
``WORKFLOW_POLICIES`` is the registry of every workflow scheduler by name (ESG, its ablation
variants and the baselines: INFless, FaST-GShare, Orion and Aquatope).

NOTE (ESG §3.1 "Two-step design", §3.3, §3.4, Appendix B).
1. ``plan_stage`` re-plans the stages of the request at the head of the AFW queue that have not
   run yet (``replan.plan_remaining``): the remaining budget ``SLO - elapsed - w`` (``w``: how
   long the oldest job has waited in this queue, Appendix B) is split among groups of at most
   ``g`` (3) stages by the dominator-based SLO distribution, and ESG_1Q (A* with dual-blade
   pruning) searches the group of the current stage for the K (5) cheapest paths whose time
   fits the group's share. The current stage's batch is searched only up to the queue length
   (a task batches jobs that are there). The candidates are the current stage's configurations
   in those paths, cheapest path first (configPQ). Times: ``StageContext.elapsed_ms`` is the
   oldest job's age (arrival to now, its wait included) and ``waiting_ms`` its wait in this
   queue; ``plan_remaining`` wants the time until the inputs were ready plus the wait, so ESG
   passes ``elapsed_ms - waiting_ms`` and ``waiting_ms`` (the budget is ``SLO - age``).
2. ``select_invoker`` is ESG_Dispatch with the recheck list (``dispatch.dispatch_with_recheck``):
   the candidates best first, each on the home invoker (first stage) or the predecessors'
   invokers, then warm invokers, then the cold invoker with the most free resources. A queue
   that fits nowhere enters the recheck list; after 3 failed retries it is dispatched with the
   minimum configuration. The recheck list is this object's state (the mechanism retries a
   blocked queue when resources are released; see ``gshare.sim.workflow``).
3. When ESG_1Q finds the group infeasible (even the fastest path misses the group's share: the
   request is predicted to miss its SLO), Appendix B returns an empty configPQ, ESG_Dispatch
   has nothing to place, and after the recheck rounds the queue goes out with the minimum
   configuration. ``plan_stage`` returns that minimum configuration at once (the protocol
   needs a candidate; the rounds in between could not succeed anyway). ``infeasible=
   "cheapest"`` (the cheapest option per request with batch <= queue) and ``"fastest"`` are
   alternatives outside the paper, for experiments.

Interpretation choices: ``pareto=True`` by default — ESG_1Q first drops each stage's options
that another option beats in both time and cost (``astar.pareto_front``). The cheapest path is
unchanged (property-tested), the K-1 alternatives may differ, and a search takes 0.5-9 ms
instead of 5-220 ms for the literal algorithm (the paper reports < 10 ms); the literal search is
``EsgPolicy(pareto=False)``. The ANL labels of the remaining stages depend only on the
profiles, so they are computed once per (application, remaining stages) and cached.

Ablation variants (ESG §5.5): ``gpu_sharing=False`` — a task holds the whole GPU (all 7 vGPU
slices, billed as such): only configurations with ``vgpus = 7`` are searched and the minimum
configuration is ``(1, 1, 7)``; ``batching=False`` — only ``batch = 1``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from gshare.policy.workflow.astar import DEFAULT_K_BEST
from gshare.policy.workflow.baselines import BASELINES
from gshare.policy.workflow.dispatch import (
    DEFAULT_MAX_RECHECK_ROUNDS,
    Dispatch,
    DispatchRequest,
    InvokerState,
    NoInvoker,
    RecheckList,
    dispatch_with_recheck,
)
from gshare.policy.workflow.queues import AfwKey
from gshare.policy.workflow.replan import WorkflowLike, anl_from_options, plan_remaining
from gshare.policy.workflow.schedulers import StageContext, StagePlan, WorkflowPolicy
from gshare.policy.workflow.slo_split import DEFAULT_MAX_GROUP_SIZE
from gshare.workflows.config import (
    MIN_CONFIG,
    NODE_VGPUS,
    ConfigOption,
    FunctionConfig,
    minimum_config,
)


class EsgPolicy:
    """ESG (module NOTE). One instance serves one simulation run (it holds the recheck list)."""

    def __init__(
        self,
        *,
        name: str = "esg",
        k_best: int = DEFAULT_K_BEST,
        max_group_size: int = DEFAULT_MAX_GROUP_SIZE,
        pareto: bool = True,
        max_recheck_rounds: int = DEFAULT_MAX_RECHECK_ROUNDS,
        gpu_sharing: bool = True,
        batching: bool = True,
        infeasible: str = "min",
    ) -> None:
        if k_best < 1:
            raise ValueError(f"k_best must be >= 1, got {k_best}")
        if max_group_size < 1:
            raise ValueError(f"max_group_size must be >= 1, got {max_group_size}")
        if max_recheck_rounds < 0:
            raise ValueError(f"max_recheck_rounds must be >= 0, got {max_recheck_rounds}")
        if infeasible not in ("min", "cheapest", "fastest"):
            raise ValueError(f"infeasible must be min, cheapest or fastest, got {infeasible!r}")
        self.infeasible = infeasible
        self.name = name
        self.k_best = k_best
        self.max_group_size = max_group_size
        self.pareto = pareto
        self.gpu_sharing = gpu_sharing
        self.batching = batching
        self.min_config = replace(MIN_CONFIG, vgpus=MIN_CONFIG.vgpus if gpu_sharing else NODE_VGPUS)
        """The recheck fallback and the answer to an infeasible group."""
        self.recheck = RecheckList(max_rounds=max_recheck_rounds)
        """ESG's recheck list (§3.1): the AFW queues that found no invoker, with their retries."""
        self._filtered_src: Mapping[str, Sequence[ConfigOption]] | None = None
        self._filtered: dict[str, tuple[ConfigOption, ...]] = {}
        self._anl: dict[tuple[str, frozenset[str]], dict[str, float]] = {}

    # -- WorkflowPolicy ---------------------------------------------------------------------------

    def prepare(
        self,
        workflows: Sequence[tuple[str, WorkflowLike]],
        options: Mapping[str, Sequence[ConfigOption]],
        seed: int,
    ) -> None:
        """Reset the per-run state. ESG has no offline phase; ``seed`` is unused."""
        del workflows, seed
        self.recheck = replace(self.recheck, entries=())
        self._filtered_src = None
        self._anl.clear()
        self._options(options)

    def plan_stage(self, ctx: StageContext) -> StagePlan:
        """ESG_1Q for the group of ``ctx.stage`` over the remaining stages (module NOTE 1, 3)."""
        options = self._options(ctx.options)
        rp = plan_remaining(
            ctx.workflow,
            ctx.done_stages,
            ctx.elapsed_ms - ctx.waiting_ms,
            ctx.waiting_ms,
            options=options,
            for_stages=(ctx.stage,),
            queue_len=max(1, ctx.queue_len),
            max_group_size=self.max_group_size,
            k_best=self.k_best,
            anl=self._anl_of(ctx, options),
            pareto=self.pareto,
        )
        candidates = rp.candidates(ctx.stage)
        if candidates:
            return StagePlan(candidates, note=f"budget {rp.budget_ms:.0f} ms")
        fn = next(s.function for s in ctx.workflow.stages if s.name == ctx.stage)
        usable = [o for o in options[fn] if o.config.batch <= max(1, ctx.queue_len)]
        if self.infeasible == "cheapest" and usable:
            best = min(usable, key=lambda o: (o.cost_usd, o.time_ms, o.config)).config
            return StagePlan((best,), note="infeasible: cheapest")
        if self.infeasible == "fastest" and usable:
            best = min(usable, key=lambda o: (o.time_ms, o.cost_usd, o.config)).config
            return StagePlan((best,), note="infeasible: fastest")
        return StagePlan(
            (self.min_config_of(options[fn]),),
            note=f"infeasible (budget {rp.budget_ms:.0f} ms): minimum configuration",
        )

    def select_invoker(
        self,
        request: DispatchRequest,
        invokers: Sequence[InvokerState],
        ctx: StageContext,
    ) -> Dispatch | NoInvoker:
        """ESG_Dispatch with the recheck list (module NOTE 2)."""
        key = AfwKey(ctx.application, ctx.stage)
        options = self._options(ctx.options)
        decision, self.recheck = dispatch_with_recheck(
            key,
            request,
            invokers,
            self.recheck,
            min_config=self.min_config_of(options.get(request.function, ())),
        )
        return decision

    def min_config_of(self, options: Sequence[ConfigOption]) -> FunctionConfig:
        """The function's minimum configuration (``config.minimum_config``: ESG's
        ``self.min_config`` on its grids)."""
        return minimum_config(options, self.min_config)

    # -- internals --------------------------------------------------------------------------------

    def _options(
        self, options: Mapping[str, Sequence[ConfigOption]]
    ) -> Mapping[str, Sequence[ConfigOption]]:
        """The options this variant may use (all of them for plain ESG)."""
        if self.gpu_sharing and self.batching:
            return options
        if self._filtered_src is not options:
            filtered = {
                fn: tuple(o for o in opts if self._allowed(o.config))
                for fn, opts in options.items()
            }
            for fn, opts in filtered.items():
                if not opts:
                    raise ValueError(f"{self.name}: no configuration of {fn!r} is allowed")
            self._filtered, self._filtered_src = filtered, options
            self._anl.clear()
        return self._filtered

    def _allowed(self, config: FunctionConfig) -> bool:
        if not self.batching and config.batch != 1:
            return False
        return self.gpu_sharing or config.vgpus == NODE_VGPUS

    def _anl_of(
        self, ctx: StageContext, options: Mapping[str, Sequence[ConfigOption]]
    ) -> dict[str, float]:
        key = (ctx.application, ctx.done_stages)
        hit = self._anl.get(key)
        if hit is None:
            remaining = {
                s.name: options[s.function]
                for s in ctx.workflow.stages
                if s.name not in ctx.done_stages
            }
            hit = self._anl[key] = anl_from_options(remaining)
        return hit


# -- registry -------------------------------------------------------------------------------------

PolicyFactory = Callable[..., WorkflowPolicy]
"""Builds a fresh scheduler. Every factory accepts the keywords of ``baselines.BASELINES``
(``perf``, ``seed``, ``optimiser``, ``static_plans``; ESG ignores them) plus its own parameters
(for ESG: those of ``EsgPolicy``)."""

_UNIFORM_KEYWORDS = frozenset({"perf", "seed", "optimiser", "static_plans"})


def _esg_factory(**fixed: Any) -> PolicyFactory:
    def make(**kwargs: Any) -> WorkflowPolicy:
        own = {k: v for k, v in kwargs.items() if k not in _UNIFORM_KEYWORDS}
        return EsgPolicy(**{**fixed, **own})

    return make


ESG_POLICIES: Mapping[str, PolicyFactory] = {
    "esg": _esg_factory(),
    "esg-no-sharing": _esg_factory(name="esg-no-sharing", gpu_sharing=False),
    "esg-no-batching": _esg_factory(name="esg-no-batching", batching=False),
}
"""ESG and its §5.5 ablation variants."""

BASELINE_NAMES: tuple[str, ...] = ("infless", "fast-gshare", "orion", "aquatope")
"""The four schedulers ESG is compared with (§4.2), as ``baselines.BASELINES`` names them."""

SHARE_POLICY_NAMES: tuple[str, ...] = ("esg", *BASELINE_NAMES)
"""The schedulers of gshare's share space (``make_share_policy``): what the live runtime runs
(``gshare serve --workflow-policy``); the ablation variants are the simulator's."""

WORKFLOW_POLICIES: Mapping[str, PolicyFactory] = MappingProxyType(
    {**ESG_POLICIES, **{n: f for n, f in BASELINES.items() if n not in ESG_POLICIES}}
)
"""Every workflow scheduler by name: ``esg``, ``esg-no-sharing``, ``esg-no-batching``, then the
baselines of ``baselines.BASELINES`` (``BASELINE_NAMES``)."""


def make_share_policy(name: str, **kwargs: Any) -> WorkflowPolicy:
    """A scheduler for gshare's share space (``gshare.workflows.shares``: a fixed pool of
    instances, one task at a time each), as the live runtime (``runtime.gateway.stages``) and
    the scenario simulator (``experiments.scenario_sim``) both build it: the baselines as
    registered; ESG with ``infeasible="fastest"`` — on a fixed pool the paper's minimum
    configuration for a request predicted late holds the function's instance several times
    longer and makes the requests queued behind it late too (measured live: 39 % of SLOs met
    with "min", see docs/DESIGN.md §15)."""
    if name == "esg":
        kwargs.setdefault("infeasible", "fastest")
    return make_policy(name, **kwargs)


def make_policy(name: str, **kwargs: Any) -> WorkflowPolicy:
    """A fresh scheduler by name (``KeyError`` listing the known names); ``kwargs`` go to its
    factory (see ``PolicyFactory``)."""
    try:
        factory = WORKFLOW_POLICIES[name]
    except KeyError:
        raise KeyError(
            f"unknown workflow scheduler {name!r} (known: {', '.join(WORKFLOW_POLICIES)})"
        ) from None
    return factory(**kwargs)
