"""FaST-GShare as an ESG workflow baseline (§4.2; Gu et al., ICPP 2023 = FaST-GShare).

Who calls it: the workflow simulator (later the runtime) through the ``WorkflowPolicy``
protocol — ``prepare`` once, then ``plan_stage`` and ``select_invoker`` before every stage
dispatch. Pure: no clock, no I/O; the only state is a memo of the SLO split per application.

What holds: ``plan_stage`` returns at least one candidate (the minimum configuration when no
option meets the stage target); ``select_invoker`` only picks an invoker where the chosen
configuration fits, and never looks at locality.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gshare.policy.workflow.baselines.common import (
    candidates_plan,
    landed_via,
    service_time_slo_split,
    stage_options,
    throughput_rps,
)
from gshare.policy.workflow.dispatch import Dispatch, DispatchRequest, InvokerState, NoInvoker
from gshare.policy.workflow.replan import WorkflowLike
from gshare.policy.workflow.schedulers import StageContext, StagePlan
from gshare.workflows.config import NODE_VCPUS, NODE_VGPUS, ConfigOption, FunctionConfig

# NOTE (ESG §4.2 "FaST-Gshare"; FaST-GShare §3.4.1 Algorithm 1 and §3.4.2 Algorithm 2). ESG: "an
# enumeration-based scheduling algorithm which enumerates the configurations based on
# throughput performance metrics. Its node selection tries to minimize GPU resource
# fragmentation. It offers no method for distributing an application's SLO either. We apply
# the same method as in INFless." As a workflow baseline:
# 1. SLO: the same fixed split by average service time as INFless; a stage's target is its
#    share minus the oldest job's wait in the stage's queue (per function, not workflow-aware).
# 2. Enumeration by throughput efficiency: FaST-GShare's RPR (RPS per resource) =
#    T_p / (S_p * Q_p), throughput over the spatio-temporal GPU area the configuration holds,
#    transposed to ESG's (batch, vCPU, vGPU) configurations as
#        RPR(b, c, g) = T / (c / NODE_VCPUS + g / NODE_VGPUS),   T = b * 1000 / time_ms,
#    i.e. throughput over the fraction of a node's CPU plus the fraction of its GPU the task
#    holds (a vGPU is 1/7 of the GPU area, as S*Q/10^4 is in FaST-GShare). Algorithm 1 serves
#    the bulk of the load with p_eff = argmax RPR among the configurations that meet the SLO;
#    here the load is the AFW queue, so the candidates are the options with batch <= the jobs
#    queued and time <= the target, most efficient first (ties, as in ``policy.autoscale``:
#    smaller resource, higher throughput, smaller batch). p_ideal (the smallest sufficient
#    configuration for a residual rate) has no counterpart in per-task dispatch: the residual
#    jobs of a queue are a smaller queue, handled by the batch <= queue_len filter.
# 3. Node selection minimises fragmentation: FaST-GShare's Maximal Rectangles picks the free
#    space with the least area left over after the placement (best fit, Algorithm 2 line 1).
#    With (vCPU, vGPU) invokers instead of rectangles, the candidate (in order) goes to the
#    invoker with room whose leftover after placement,
#        (free_vcpus - c) / vcpus + (free_vgpus - g) / vgpus,
#    is smallest (ties: fewer leftover vGPUs — FaST-GShare is GPU-centric — then lower id).
#    The first candidate that fits somewhere wins (the configuration is chosen before the node,
#    as FaST-GShare's autoscaler runs before its node selection). No locality (ESG §4.2).


def rpr(
    option: ConfigOption, *, node_vcpus: int = NODE_VCPUS, node_vgpus: int = NODE_VGPUS
) -> float:
    """FaST-GShare's RPR transposed to (batch, vCPU, vGPU) (NOTE step 2): requests per second
    per node-fraction of resources."""
    return throughput_rps(option) / resource_share(option.config, node_vcpus, node_vgpus)


def resource_share(
    config: FunctionConfig, node_vcpus: int = NODE_VCPUS, node_vgpus: int = NODE_VGPUS
) -> float:
    """The fraction of a node's CPU plus the fraction of its GPU a configuration holds."""
    return config.vcpus / node_vcpus + config.vgpus / node_vgpus


def fast_candidates(
    options: Sequence[ConfigOption],
    target_ms: float,
    queue_len: int,
    *,
    node_vcpus: int = NODE_VCPUS,
    node_vgpus: int = NODE_VGPUS,
) -> tuple[ConfigOption, ...]:
    """Options with batch <= ``queue_len`` and time <= ``target_ms``, highest RPR first (ties:
    smaller resource share, higher throughput, smaller batch, then the configuration)."""
    cap = max(1, queue_len)
    out = [o for o in options if o.config.batch <= cap and o.time_ms <= target_ms]
    out.sort(
        key=lambda o: (
            -rpr(o, node_vcpus=node_vcpus, node_vgpus=node_vgpus),
            resource_share(o.config, node_vcpus, node_vgpus),
            -throughput_rps(o),
            o.config.batch,
            o.config,
        )
    )
    return tuple(out)


def leftover_share(inv: InvokerState, config: FunctionConfig) -> float:
    """Free vCPU fraction + free vGPU fraction of ``inv`` after placing ``config`` (NOTE step
    3); negative when it does not fit."""
    return (inv.free_vcpus - config.vcpus) / inv.vcpus + (inv.free_vgpus - config.vgpus) / inv.vgpus


def fast_select(request: DispatchRequest, invokers: Sequence[InvokerState]) -> Dispatch | NoInvoker:
    """Best-fit node selection (NOTE step 3): candidates in order; for the first one that fits
    anywhere, the invoker with the smallest leftover."""
    for rank, cfg in enumerate(request.candidates):
        fitting = [i for i in invokers if i.fits(cfg)]
        if fitting:
            inv = min(
                fitting,
                key=lambda i: (leftover_share(i, cfg), i.free_vgpus - cfg.vgpus, i.invoker_id),
            )
            return Dispatch(
                inv.invoker_id, cfg, landed_via(inv, request), inv.is_warm(request.function), rank
            )
    if not request.candidates:
        return NoInvoker("no candidate configuration")
    return NoInvoker(
        f"none of {len(request.candidates)} candidate configuration(s) of "
        f"{request.function!r} fits on any of {len(invokers)} invoker(s)"
    )


class FastGSharePolicy:
    """FaST-GShare as a ``WorkflowPolicy`` (module NOTE)."""

    name = "fast-gshare"

    def __init__(self, *, node_vcpus: int = NODE_VCPUS, node_vgpus: int = NODE_VGPUS) -> None:
        if node_vcpus < 1 or node_vgpus < 1:
            raise ValueError("node_vcpus and node_vgpus must be >= 1")
        self.node_vcpus = node_vcpus
        self.node_vgpus = node_vgpus
        self._split: dict[str, dict[str, float]] = {}

    def prepare(
        self,
        workflows: Sequence[tuple[str, WorkflowLike]],
        options: Mapping[str, Sequence[ConfigOption]],
        seed: int,
    ) -> None:
        """Compute every application's fixed SLO split (``seed`` is unused)."""
        for app, wf in workflows:
            self._split[app] = service_time_slo_split(wf, options)

    def stage_slo_ms(self, ctx: StageContext) -> float:
        """``ctx.stage``'s fixed share of the SLO."""
        split = self._split.get(ctx.application)
        if split is None:
            split = self._split[ctx.application] = service_time_slo_split(ctx.workflow, ctx.options)
        return split[ctx.stage]

    def plan_stage(self, ctx: StageContext) -> StagePlan:
        """Configurations meeting the stage target by RPR (NOTE steps 1-2); the minimum
        configuration when none does."""
        target = self.stage_slo_ms(ctx) - ctx.waiting_ms
        opts = stage_options(ctx.workflow, ctx.stage, ctx.options)
        cands = fast_candidates(
            opts, target, ctx.queue_len, node_vcpus=self.node_vcpus, node_vgpus=self.node_vgpus
        )
        return candidates_plan("fast-gshare", [o.config for o in cands], target, opts)

    def select_invoker(
        self,
        request: DispatchRequest,
        invokers: Sequence[InvokerState],
        ctx: StageContext,
    ) -> Dispatch | NoInvoker:
        """Fragmentation-minimising (best-fit) invoker for the first candidate that fits."""
        return fast_select(request, invokers)
