"""FaST-GShare's Heuristic Scaling Algorithm (§3.4.1, Algorithm 1) and the
configuration orderings and operator bounds the other autoscalers share with it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gshare.policy.autoscale.core import (
    _EPS_RPS,
    AutoscaleError,
    Instance,
    ScaleConfig,
    ScaleContext,
    ScaleDecision,
)

# -- FaST-GShare Algorithm 1 -------------------------------------------------------------------


def _eff_key(c: ScaleConfig) -> tuple[float, float, float, int, float, float, float, float]:
    # p_eff: highest RPR; ties → smaller area, higher T, smaller batch, then the fields.
    return (
        -c.rpr,
        c.area,
        -c.throughput_rps,
        c.batch,
        c.sm_pct,
        c.quota_pct,
        c.latency_ms,
        c.wait_ms,
    )


def _ideal_key(
    c: ScaleConfig, r: float
) -> tuple[float, float, float, int, float, float, float, float]:
    # p_ideal: smallest T − r; ties → higher RPR, smaller area, smaller batch, then the fields.
    return (
        c.throughput_rps - r,
        -c.rpr,
        c.area,
        c.batch,
        c.sm_pct,
        c.quota_pct,
        c.latency_ms,
        c.wait_ms,
    )


def _down_key(i: Instance) -> tuple[float, float, str]:
    # L_j order: ascending RPR (least efficient first); ties → lower T, then id.
    return (i.config.rpr, i.config.throughput_rps, i.instance_id)


def most_efficient(configs: Sequence[ScaleConfig]) -> ScaleConfig:
    """p_eff = argmax RPR (ties: smaller area, higher throughput, smaller batch)."""
    if not configs:
        raise AutoscaleError("no candidate configs")
    return min(configs, key=_eff_key)


def ideal_for(configs: Sequence[ScaleConfig], residual_rps: float) -> ScaleConfig | None:
    """p_ideal = argmin (T − r) over configs with T > r, or None when no config has T > r."""
    fitting = [c for c in configs if c.throughput_rps > residual_rps]
    return min(fitting, key=lambda c: _ideal_key(c, residual_rps)) if fitting else None


def _check_inputs(
    function: str,
    predicted_rps: float,
    running: Sequence[Instance],
    min_instances: int,
    max_instances: int | None,
) -> None:
    if not (predicted_rps >= 0.0 and math.isfinite(predicted_rps)):
        raise AutoscaleError(
            f"predicted_rps of {function!r} must be finite and >= 0, got {predicted_rps}"
        )
    if min_instances < 0:
        raise AutoscaleError(f"min_instances of {function!r} must be >= 0, got {min_instances}")
    if max_instances is not None and max_instances < max(min_instances, 0):
        raise AutoscaleError(
            f"max_instances of {function!r} must be >= min_instances={min_instances}, "
            f"got {max_instances}"
        )
    ids: set[str] = set()
    for inst in running:
        if inst.function != function:
            raise AutoscaleError(
                f"instance {inst.instance_id!r} serves {inst.function!r}, not {function!r}"
            )
        if inst.instance_id in ids:
            raise AutoscaleError(f"duplicate instance id {inst.instance_id!r} of {function!r}")
        ids.add(inst.instance_id)


# NOTE — FaST-GShare's Heuristic Scaling Algorithm (§3.4.1, Algorithm 1).
# For a function F with predicted rate R and running instances J_i of throughput T_i, the gap is
# ΔRPS = R − Σ T_i. Every config p has an efficiency RPR_p = T_p / (S_p · Q_p), requests/s per
# unit of spatio-temporal GPU area.
# * Scale up (ΔRPS > 0): the bulk of the gap goes to the most efficient config p_eff = argmax RPR:
#   n = ⌊ΔRPS / T_eff⌋ instances; the residual r = ΔRPS − n·T_eff (0 ≤ r < T_eff) goes to one
#   instance of the smallest sufficient config p_ideal = argmin (T_p − r) over T_p > r. When r = 0
#   (ΔRPS an exact multiple) no p_ideal is added — line 6 assumes r > 0. Because r < T_eff, p_eff
#   itself always has T > r, so p_ideal always exists (a float-rounding r ≥ T_eff falls back to
#   p_eff). ΔRPS = 0 changes nothing (line 3 tests ≥ 0, but n = 0 and r = 0 add nothing).
# * Scale down (ΔRPS < 0): the running instances form the priority queue L_F sorted ascending by
#   RPR (least efficient first; ties: lower T, then id), and the front is popped while
#   ΔR + T_front ≤ 0, i.e. while removing it keeps Σ T ≥ R, adding T_front to ΔR each time.
#   As printed, the while-loop (line 15: while ΔR < 0) never terminates when the front does not
#   fit (nothing changes); we implement the intent and stop at the first instance whose removal
#   would leave capacity < R. We do not skip it to look for a smaller instance further back:
#   those are more efficient and the paper keeps efficient pods the longest.
# After Algorithm 1, the operator's bounds apply: max_instances caps the additions (dropping
# p_ideal first, then p_eff copies — coverage may then fail and the reason says so; an already
# over-cap set is not trimmed), and min_instances first undoes the last removals and then adds
# p_eff instances (the config Algorithm 1 keeps longest) until the count reaches the minimum.
# Note the algorithm is not a fixed point in one step: new instances may let the next period
# remove old, less efficient ones.


def _raise_to_min(
    function: str,
    min_instances: int,
    running: Sequence[Instance],
    add: list[ScaleConfig],
    remove: list[str],
    configs: Sequence[ScaleConfig],
    pick: Callable[[], ScaleConfig],
) -> tuple[list[ScaleConfig], list[str], bool]:
    """The operator's lower bound after a scaling rule (Algorithm 1's and ``gshare-burst``'s):
    undo removals (instance ids) first, then add ``pick()`` configs; ``(add, remove,
    raised)``."""
    count = len(running) + len(add) - len(remove)
    if count >= min_instances:
        return add, remove, False
    deficit = min_instances - count
    undo = min(deficit, len(remove))
    if undo:
        remove = remove[: len(remove) - undo]
        deficit -= undo
    if deficit:
        if not configs:
            raise AutoscaleError(
                f"function {function!r} needs min_instances={min_instances} but has no "
                "candidate configs"
            )
        add = add + [pick()] * deficit
    return add, remove, True


def heuristic_scale(
    function: str,
    predicted_rps: float,
    running: Sequence[Instance],
    configs: Sequence[ScaleConfig],
    *,
    min_instances: int = 0,
    max_instances: int | None = None,
) -> ScaleDecision:
    """FaST-GShare Algorithm 1 for one function (see the NOTE above).

    Who calls it: ``FastHeuristic`` (the registry's ``fast-heuristic``, which
    ``policy.control.control_step`` calls every reconcile period in both worlds), with
    ``predicted_rps`` from ``policy.rate``, the function's running (and starting) instances,
    and its ``candidate_configs``. ``running`` must only hold instances of ``function`` with
    distinct ids.

    What must hold after the controller applies the decision: Σ T ≥ R (coverage, unless
    ``max_instances`` capped the additions) and, on scale-down, removing the next instance the
    rule would pick would break coverage. The decision does not depend on the order of
    ``running`` or ``configs``. Raises ``AutoscaleError`` when instances must be added but
    ``configs`` is empty.
    """
    _check_inputs(function, predicted_rps, running, min_instances, max_instances)
    capacity_rps = math.fsum(i.config.throughput_rps for i in running)
    delta_rps = predicted_rps - capacity_rps
    add: list[ScaleConfig] = []
    remove: list[str] = []
    notes: list[str] = []

    if delta_rps > _EPS_RPS:
        if not configs:
            raise AutoscaleError(
                f"function {function!r} needs {delta_rps:.3f} more rps but has no candidate configs"
            )
        p_eff = most_efficient(configs)
        t_eff = p_eff.throughput_rps
        n = math.floor(delta_rps / t_eff)
        r = delta_rps - n * t_eff
        add.extend([p_eff] * n)
        notes.append(f"scale up dRPS={delta_rps:.2f}: {n} x p_eff {p_eff.label()}")
        if r > _EPS_RPS:
            p_ideal = ideal_for(configs, r) or p_eff
            add.append(p_ideal)
            notes.append(f"+ p_ideal {p_ideal.label()} for r={r:.2f}")
    elif delta_rps < -_EPS_RPS:
        d_r = delta_rps
        for inst in sorted(running, key=_down_key):
            if d_r >= -_EPS_RPS or d_r + inst.config.throughput_rps > _EPS_RPS:
                break
            remove.append(inst.instance_id)
            d_r += inst.config.throughput_rps
        notes.append(f"scale down dRPS={delta_rps:.2f}: remove {len(remove)} least-RPR instance(s)")
    else:
        notes.append(f"steady: dRPS={delta_rps:.2f}")

    # -- operator bounds, applied after Algorithm 1 --
    if max_instances is not None:
        room = max(0, max_instances - len(running))
        if len(add) > room:
            add = add[:room]
            after = capacity_rps + math.fsum(c.throughput_rps for c in add)
            notes.append(
                f"capped by max_instances={max_instances}: capacity {after:.2f} rps "
                f"< R {predicted_rps:.2f} rps"
            )
    add, remove, raised = _raise_to_min(
        function, min_instances, running, add, remove, configs, lambda: most_efficient(configs)
    )
    if raised:
        notes.append(f"raised to min_instances={min_instances}")

    return ScaleDecision(
        function=function,
        add=tuple(add),
        remove=tuple(remove),
        delta_rps=delta_rps,
        reason="; ".join(notes),
    )


@dataclass(frozen=True, slots=True)
class FastHeuristic:
    """``fast-heuristic``: Algorithm 1 (``heuristic_scale``) with the common ``Autoscaler``
    signature (it reads the rate, the fleet, the configs and the bounds)."""

    def __call__(self, ctx: ScaleContext) -> ScaleDecision:
        return heuristic_scale(
            ctx.function,
            ctx.predicted_rps,
            ctx.running,
            ctx.configs,
            min_instances=ctx.min_instances,
            max_instances=ctx.max_instances,
        )
