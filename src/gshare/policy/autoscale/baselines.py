"""The target-utilisation baseline (Kubernetes-HPA style)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gshare.policy.autoscale.core import (
    AutoscaleError,
    Instance,
    ScaleConfig,
    ScaleContext,
    ScaleDecision,
)
from gshare.policy.autoscale.heuristic import _check_inputs

# -- baseline: Kubernetes-HPA-style target utilisation ------------------------------------------

# NOTE — target-utilisation baseline (Kubernetes Horizontal Pod Autoscaler style).
# Every instance has the same fixed config of throughput T; the desired replica count is
# n = ⌈R / (target_util · T)⌉ so each instance runs at ≤ target_util of its capacity (HPA's
# desiredReplicas = ⌈currentMetric / target⌉ with the metric being rps per replica). Scaling up
# starts n − current instances; scaling down stops the newest first (``running`` is ordered
# oldest first, the order the controller started them). HPA's ±10 % tolerance band is not
# applied: the controller's reconcile period and rate smoothing play that role here.


def target_utilisation_scale(
    function: str,
    predicted_rps: float,
    running: Sequence[Instance],
    config: ScaleConfig,
    target_util: float = 0.7,
    *,
    min_instances: int = 0,
    max_instances: int | None = None,
) -> ScaleDecision:
    """The target-utilisation baseline for one function (see the NOTE above).

    Who calls it: the same controllers as ``heuristic_scale``, through ``AUTOSCALERS``
    ("target-util"). ``running`` is ordered oldest first. After applying the decision the
    function runs ``clamp(⌈R / (target_util · T)⌉, min_instances, max_instances)`` instances
    (counting replicas, whatever their config).
    """
    _check_inputs(function, predicted_rps, running, min_instances, max_instances)
    if not (0.0 < target_util <= 1.0):
        raise AutoscaleError(f"target_util must be in (0, 1], got {target_util}")
    capacity_rps = math.fsum(i.config.throughput_rps for i in running)
    delta_rps = predicted_rps - capacity_rps
    per_instance_rps = target_util * config.throughput_rps
    # The relative tolerance keeps 70 / (0.7 · 100) = 1.0000000000000002 at one replica.
    desired = max(0, math.ceil(predicted_rps / per_instance_rps - 1e-9))
    notes = [f"target {target_util:g} x {config.label()}: desired {desired}"]
    if max_instances is not None and desired > max_instances:
        desired = max_instances
        notes.append(f"capped by max_instances={max_instances}")
    if desired < min_instances:
        desired = min_instances
        notes.append(f"raised to min_instances={min_instances}")
    current = len(running)
    add: tuple[ScaleConfig, ...] = ()
    remove: tuple[str, ...] = ()
    if desired > current:
        add = (config,) * (desired - current)
    elif desired < current:
        remove = tuple(i.instance_id for i in reversed(running[desired:]))
    return ScaleDecision(
        function=function, add=add, remove=remove, delta_rps=delta_rps, reason="; ".join(notes)
    )


def fixed_config(configs: Sequence[ScaleConfig]) -> ScaleConfig:
    """The config the target-util baseline uses: the whole GPU (sm 100 %, quota 100 %) with the
    highest throughput (i.e. the best batch), or the highest-throughput config when no full-GPU
    config meets the SLO. This is the classic one-GPU-per-replica deployment, at its best
    batch, so the baseline is not weakened."""
    if not configs:
        raise AutoscaleError("no candidate configs")
    full = [c for c in configs if c.sm_pct >= 100.0 and c.quota_pct >= 100.0]
    pool = full or list(configs)
    return min(
        pool,
        key=lambda c: (-c.throughput_rps, c.area, c.batch, c.sm_pct, c.quota_pct, c.latency_ms),
    )


@dataclass(frozen=True, slots=True)
class TargetUtil:
    """``target-util``: ``target_utilisation_scale`` at ``target_util`` (the registry's entry:
    0.7) on ``fixed_config`` of the candidates, with the common ``Autoscaler`` signature."""

    target_util: float = 0.7

    def __call__(self, ctx: ScaleContext) -> ScaleDecision:
        return target_utilisation_scale(
            ctx.function,
            ctx.predicted_rps,
            ctx.running,
            fixed_config(ctx.configs),
            self.target_util,
            min_instances=ctx.min_instances,
            max_instances=ctx.max_instances,
        )
