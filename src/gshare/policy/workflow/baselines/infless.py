"""INFless as an ESG baseline (ESG §4.2; Yang et al., ASPLOS 2022).

Who calls it: the workflow simulator (later the runtime) through the ``WorkflowPolicy``
protocol — ``prepare`` once, then ``plan_stage`` and ``select_invoker`` before every stage
dispatch. Pure: no clock, no I/O; the only state is a memo of the SLO split per application.

What holds: ``plan_stage`` returns at least one candidate (the minimum configuration when no
option meets the stage target); ``select_invoker`` only picks an invoker where the chosen
configuration fits (free vCPUs and vGPUs), and never looks at locality.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import numpy as np

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
from gshare.workflows.config import VGPUS_PER_GPU, ConfigOption, FunctionConfig

INFLESS_GFLOPS_PER_VCPU: Final[float] = 64.0
"""INFless's weight of one CPU core in its resource-efficiency metric (released code,
``estimator.go``: "64 GFLOPs per CPU core")."""
INFLESS_GFLOPS_PER_GPU: Final[float] = 142.0 * 100.0
"""INFless's weight of a whole GPU: 142 GFLOPs per SM percent x 100 %; a vGPU (1/7 of the
GPU) weighs ``14200 / 7``."""
INFLESS_SLACK: Final[float] = 0.001
"""The ``1.001`` of INFless's leftover term: a placement that fills a node exactly still has a
non-zero denominator."""


# NOTE (ESG §4.2 "InFless"; INFless §4 and its released scheduler). INFless "schedules jobs by
# enumerating the configurations for each function without considering the inter-function
# relations. In worker node selection, a resource efficiency metric is used to maximize the
# throughput while reducing resource fragmentation." As a workflow baseline:
# 1. SLO: every stage has a fixed share of the end-to-end SLO by average service time
#    (``service_time_slo_split``, ESG's GrandSLAm-style distribution). INFless is per function:
#    before each dispatch the stage's target is its own share minus the time the oldest job
#    has waited in this stage's queue (INFless's latency = batching/queueing + execution); what
#    earlier stages used is NOT taken into account (no inter-function relation).
# 2. Enumeration: every option of the function with batch <= the jobs queued (INFless only
#    forms batches the arrival rate fills in time; here the batch is taken from the queue) and
#    execution time <= the target. (INFless's own batching queue keeps half the SLO for
#    filling a batch, ``exec <= SLO/2`` when batch > 1; here batching is the shared mechanism
#    and the actual wait is subtracted instead — ``batch_wait_half_slo=True`` restores the
#    halving.) Candidates are listed by throughput (most first), then cost.
# 3. Node selection, jointly with the configuration: over every (candidate, invoker with room)
#    pair, maximise INFless's resource efficiency
#        CRE = throughput / leftover,
#        leftover = [Wc (1.001 - cpu_used_after) + Wg (1.001 - gpu_used_after)] / (Wc + Wg),
#    where *_used_after are the invoker's used fractions after the placement and Wc, Wg the
#    invoker's CPU and GPU capacities weighted by GFLOPs (64 per vCPU, 14,200 per GPU) — the
#    ``tempCRE`` of INFless's ``scheduler.go`` (its division by the function's maximum
#    throughput efficiency is a per-function constant and is dropped: it changes no argmax).
#    A placement that fills an invoker exactly has a tiny leftover and wins: INFless prefers
#    "to utilize all remaining resources in one invoker" (ESG §5.1), which is why it is the
#    most expensive baseline there. Ties: earlier candidate, then lower invoker id.
#    INFless does not follow ESG's locality policy (ESG §4.2).


def infless_candidates(
    options: Sequence[ConfigOption],
    target_ms: float,
    queue_len: int,
    *,
    batch_wait_half_slo: bool = False,
) -> tuple[ConfigOption, ...]:
    """The options INFless enumerates for one stage (NOTE step 2): batch <= ``queue_len`` and
    time <= ``target_ms`` (``<= target_ms / 2`` for batches > 1 with ``batch_wait_half_slo``),
    ordered by throughput (highest first), then cost, then configuration. Empty when none."""
    cap = max(1, queue_len)
    out = [
        o
        for o in options
        if o.config.batch <= cap
        and o.time_ms
        <= (target_ms / 2.0 if batch_wait_half_slo and o.config.batch > 1 else target_ms)
    ]
    out.sort(key=lambda o: (-throughput_rps(o), o.cost_usd, o.config))
    return tuple(out)


def resource_efficiency(
    throughput: float,
    config: FunctionConfig,
    inv: InvokerState,
    *,
    gflops_per_vcpu: float = INFLESS_GFLOPS_PER_VCPU,
    gflops_per_gpu: float = INFLESS_GFLOPS_PER_GPU,
) -> float:
    """INFless's CRE of placing ``config`` (with ``throughput`` rps) on ``inv`` (NOTE step 3).
    The caller checks that it fits."""
    wc = gflops_per_vcpu * inv.vcpus
    wg = gflops_per_gpu / VGPUS_PER_GPU * inv.vgpus
    cpu_after = (inv.vcpus - inv.free_vcpus + config.vcpus) / inv.vcpus
    gpu_after = (inv.vgpus - inv.free_vgpus + config.vgpus) / inv.vgpus
    leftover = (wc * (1 + INFLESS_SLACK - cpu_after) + wg * (1 + INFLESS_SLACK - gpu_after)) / (
        wc + wg
    )
    return throughput / leftover


def infless_select(
    request: DispatchRequest,
    invokers: Sequence[InvokerState],
    throughput_of: Mapping[FunctionConfig, float],
    *,
    gflops_per_vcpu: float = INFLESS_GFLOPS_PER_VCPU,
    gflops_per_gpu: float = INFLESS_GFLOPS_PER_GPU,
) -> Dispatch | NoInvoker:
    """The (candidate, invoker) pair with the highest CRE among those that fit (NOTE step 3).
    ``throughput_of`` gives each candidate's throughput (a candidate missing from it — e.g.
    the minimum-configuration fallback outside the grid — counts 1 rps, so only the leftover
    ranks its invokers). Vectorised over candidates x invokers."""
    cands = request.candidates
    if not cands:
        return NoInvoker("no candidate configuration")
    if not invokers:
        return NoInvoker("no invoker")
    invs = sorted(invokers, key=lambda i: i.invoker_id)
    c = np.array([x.vcpus for x in cands], dtype=np.float64)[:, None]
    g = np.array([x.vgpus for x in cands], dtype=np.float64)[:, None]
    t = np.array([throughput_of.get(x, 1.0) for x in cands], dtype=np.float64)[:, None]
    cap_c = np.array([i.vcpus for i in invs], dtype=np.float64)[None, :]
    cap_g = np.array([i.vgpus for i in invs], dtype=np.float64)[None, :]
    free_c = np.array([i.free_vcpus for i in invs], dtype=np.float64)[None, :]
    free_g = np.array([i.free_vgpus for i in invs], dtype=np.float64)[None, :]
    fits = (c <= free_c) & (g <= free_g)
    if not fits.any():
        return NoInvoker(
            f"none of {len(cands)} candidate configuration(s) of {request.function!r} fits on "
            f"any of {len(invs)} invoker(s)"
        )
    wc = gflops_per_vcpu * cap_c
    wg = gflops_per_gpu / VGPUS_PER_GPU * cap_g
    cpu_after = (cap_c - free_c + c) / cap_c
    gpu_after = (cap_g - free_g + g) / cap_g
    leftover = (wc * (1 + INFLESS_SLACK - cpu_after) + wg * (1 + INFLESS_SLACK - gpu_after)) / (
        wc + wg
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        cre = np.where(fits, t / leftover, -np.inf)
    rank, col = np.unravel_index(int(np.argmax(cre)), cre.shape)  # first max: rank, then id
    inv = invs[int(col)]
    cfg = cands[int(rank)]
    return Dispatch(
        inv.invoker_id, cfg, landed_via(inv, request), inv.is_warm(request.function), int(rank)
    )


class InflessPolicy:
    """INFless as a ``WorkflowPolicy`` (module NOTE). Construct with the defaults (INFless's
    weights) or override the weights / ``batch_wait_half_slo`` for sensitivity studies."""

    name = "infless"

    def __init__(
        self,
        *,
        gflops_per_vcpu: float = INFLESS_GFLOPS_PER_VCPU,
        gflops_per_gpu: float = INFLESS_GFLOPS_PER_GPU,
        batch_wait_half_slo: bool = False,
    ) -> None:
        if gflops_per_vcpu < 0 or gflops_per_gpu < 0 or gflops_per_vcpu + gflops_per_gpu <= 0:
            raise ValueError("INFless weights must be >= 0 and not both 0")
        self.gflops_per_vcpu = gflops_per_vcpu
        self.gflops_per_gpu = gflops_per_gpu
        self.batch_wait_half_slo = batch_wait_half_slo
        self._split: dict[str, dict[str, float]] = {}

    def prepare(
        self,
        workflows: Sequence[tuple[str, WorkflowLike]],
        options: Mapping[str, Sequence[ConfigOption]],
        seed: int,
    ) -> None:
        """Compute every application's fixed SLO split (``seed`` is unused: INFless is
        deterministic)."""
        for app, wf in workflows:
            self._split[app] = service_time_slo_split(wf, options)

    def stage_slo_ms(self, ctx: StageContext) -> float:
        """``ctx.stage``'s fixed share of the SLO (computed on first use if ``prepare`` did
        not see the application)."""
        split = self._split.get(ctx.application)
        if split is None:
            split = self._split[ctx.application] = service_time_slo_split(ctx.workflow, ctx.options)
        return split[ctx.stage]

    def plan_stage(self, ctx: StageContext) -> StagePlan:
        """INFless's feasible configurations for this stage, by throughput (NOTE steps 1-2);
        the minimum configuration when none meets the target."""
        target = self.stage_slo_ms(ctx) - ctx.waiting_ms
        opts = stage_options(ctx.workflow, ctx.stage, ctx.options)
        cands = infless_candidates(
            opts, target, ctx.queue_len, batch_wait_half_slo=self.batch_wait_half_slo
        )
        return candidates_plan("infless", [o.config for o in cands], target, opts)

    def select_invoker(
        self,
        request: DispatchRequest,
        invokers: Sequence[InvokerState],
        ctx: StageContext,
    ) -> Dispatch | NoInvoker:
        """Joint configuration + invoker choice by INFless's CRE (NOTE step 3)."""
        tput = {o.config: throughput_rps(o) for o in ctx.options.get(request.function, ())}
        return infless_select(
            request,
            invokers,
            tput,
            gflops_per_vcpu=self.gflops_per_vcpu,
            gflops_per_gpu=self.gflops_per_gpu,
        )
