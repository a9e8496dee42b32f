"""``gshare-burst``, gshare's default autoscaler: Algorithm 1's configurations sized for a
burst-aware demand (peak hold, backlog) with a homogeneous fleet.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from gshare.policy.autoscale.core import (
    _EPS_RPS,
    AutoscaleError,
    Instance,
    LoadSignals,
    ScaleConfig,
    ScaleContext,
    ScaleDecision,
)
from gshare.policy.autoscale.heuristic import (
    _check_inputs,
    _down_key,
    _raise_to_min,
    ideal_for,
    most_efficient,
)

# -- gshare's default: burst-aware scaling on the peak-hold and backlog signals ------------------


class DemandSource(enum.Enum):
    """Which signal set the demand a ``gshare-burst`` decision sized the fleet for."""

    RATE = "rate"
    """The controller's predicted rate (EWMA / short window max × its headroom)."""
    PEAK = "peak"
    """Headroom × the peak per-period rate of the hold window (a recent burst)."""
    BACKLOG = "backlog"
    """Headroom × the last rate plus the queued backlog drained within one period."""


@dataclass(frozen=True, slots=True)
class BurstDemand:
    """The demand ``burst_demand`` computed, and why (typed, for tests and reasons)."""

    demand_rps: float
    """Capacity the fleet is sized to (requests/s)."""
    source: DemandSource
    """The signal that set it (the largest of the three)."""
    backlog: int
    """Requests beyond what the running instances hold in service (Σ batch)."""


def burst_demand(
    predicted_rps: float,
    running: Sequence[Instance],
    signals: LoadSignals | None,
    headroom: float,
) -> BurstDemand:
    """The demand of ``BurstAutoscaler`` (see the NOTE above it): the largest of the predicted
    rate, ``headroom × peak_rps`` and ``headroom × last_rps + backlog / period_s``. Without
    signals, the predicted rate."""
    if signals is None:
        return BurstDemand(predicted_rps, DemandSource.RATE, 0)
    in_service = sum(i.config.batch for i in running)
    backlog = max(0, signals.outstanding - in_service)
    candidates = (
        (predicted_rps, DemandSource.RATE),
        (headroom * signals.peak_rps, DemandSource.PEAK),
        (headroom * signals.last_rps + backlog / signals.period_s, DemandSource.BACKLOG),
    )
    demand, source = max(candidates, key=lambda c: c[0])
    return BurstDemand(demand, source, backlog)


# NOTE — gshare-burst, gshare's default autoscaler (gshare's own design; it follows Algorithm 1
# of FaST-GShare §3.4.1 for the configs — p_eff, p_ideal, least-RPR-first removal — Knative's
# KPA for the idea of holding capacity over a long stable window, and queue-length signals as
# in Knative's panic mode). Why Algorithm 1 fails on real bursts: its rate is an EWMA / 3-period
# maximum, so a fleet is scaled down within seconds of a burst and the next burst of the same
# trace meets a cold start; ⌊ΔRPS/T_eff⌋ + one p_ideal mixes a thin, slow residual partition
# into the fleet, and join-shortest-queue routing (by queue length, not capacity) overloads it.
# The rule, for predicted rate R, the function's signals (``LoadSignals``) and knob h:
# * demand D = max(R, h · peak_rps, h · last_rps + backlog / period_s), where peak_rps is the
#   largest per-period rate of the last ``RatePredictor.hold`` periods (60 s by default) —
#   capacity is held for the recent peak, so scale-down is slow and scale-up instant
#   (asymmetric) — and backlog the requests beyond Σ batch of the running instances;
# * scale up (D > capacity C): a function whose fleet is empty and whose D fits one config gets
#   one p_ideal (the smallest sufficient config: thin partitions pack with other functions);
#   otherwise ⌈(D − C) / T_eff⌉ copies of p_eff (a homogeneous fleet of the most efficient
#   config, no thin residual);
# * scale down (D < C): least-RPR instances first, while the rest still cover D (Algorithm 1's
#   order and stop rule, on the held demand);
# * then the operator's bounds, as ``heuristic_scale`` applies them.
# Without signals (a caller that has none) D = R and the rule above still applies.


@dataclass(frozen=True, slots=True)
class BurstAutoscaler:
    """gshare-burst (see the NOTE above), with the common ``Autoscaler`` signature; it is the
    autoscaler that reads ``signals``. Pure: its knobs are fields, everything else arrives per
    call."""

    headroom: float = 2.0
    """h: multiplier on the peak and the last rate (the knob ``autoscale-traces`` sweeps)."""

    def __post_init__(self) -> None:
        if not (self.headroom >= 1.0 and math.isfinite(self.headroom)):
            raise AutoscaleError(f"headroom must be finite and >= 1, got {self.headroom}")

    def __call__(self, ctx: ScaleContext) -> ScaleDecision:
        function, predicted_rps, running, configs = (
            ctx.function,
            ctx.predicted_rps,
            ctx.running,
            ctx.configs,
        )
        min_instances, max_instances, signals = ctx.min_instances, ctx.max_instances, ctx.signals
        _check_inputs(function, predicted_rps, running, min_instances, max_instances)
        want = burst_demand(predicted_rps, running, signals, self.headroom)
        demand = want.demand_rps
        capacity_rps = math.fsum(i.config.throughput_rps for i in running)
        delta_rps = demand - capacity_rps
        add: list[ScaleConfig] = []
        remove: list[str] = []
        notes = [f"demand {demand:.2f} rps ({want.source.value}, backlog {want.backlog})"]
        if delta_rps > _EPS_RPS:
            if not configs:
                raise AutoscaleError(
                    f"function {function!r} needs {delta_rps:.3f} more rps but has no "
                    "candidate configs"
                )
            p_eff = most_efficient(configs)
            single = ideal_for(configs, demand) if not running else None
            if single is not None:
                add.append(single)
                notes.append(f"scale up: 1 x p_ideal {single.label()}")
            else:
                n = max(1, math.ceil(delta_rps / p_eff.throughput_rps - 1e-9))
                add.extend([p_eff] * n)
                notes.append(f"scale up dRPS={delta_rps:.2f}: {n} x p_eff {p_eff.label()}")
        elif delta_rps < -_EPS_RPS:
            d_r = delta_rps
            for inst in sorted(running, key=_down_key):
                if d_r + inst.config.throughput_rps > _EPS_RPS:
                    break
                remove.append(inst.instance_id)
                d_r += inst.config.throughput_rps
            notes.append(f"scale down dRPS={delta_rps:.2f}: remove {len(remove)}")
        else:
            notes.append("steady")

        if max_instances is not None:
            room = max(0, max_instances - len(running))
            if len(add) > room:
                add = add[:room]
                notes.append(f"capped by max_instances={max_instances}")
        fresh = not running and not add
        add, remove, raised = _raise_to_min(
            function,
            min_instances,
            running,
            add,
            remove,
            configs,
            lambda: (ideal_for(configs, demand) if fresh else None) or most_efficient(configs),
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


DEFAULT_AUTOSCALER: Final[str] = "gshare-burst"
"""The autoscaler both worlds run unless told otherwise (``sim.cluster.ClusterConfig``,
``runtime.control.records.ControllerConfig``, ``gshare serve --autoscaler``)."""
