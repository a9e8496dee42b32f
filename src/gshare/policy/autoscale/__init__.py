"""Auto-scaling: how many instances of which (SM %, quota %, batch) config a function needs.

Who calls it: ``policy.control.control_step``, the reconcile step the controllers of both
worlds run — the simulator's ``sim.cluster`` in virtual time and the live runtime's
``runtime.control.loop`` with the wall clock — once every reconcile period (and on a cold-start
nudge), for every function, with the predicted request rate (``policy.rate.RatePredictor``,
after keep-alive and the queued-demand floor), the instances the function runs and the floor
``min_instances``. The policy answers with a ``ScaleDecision`` (configs to start, instance ids
to stop); the controller then places the new instances (``policy.placement``) and drains the
removed ones. Every autoscaler has one signature (``Autoscaler``): a ``ScaleContext`` (the
function, its predicted rate, ``LoadSignals``, the current fleet, the candidate configs, the
bounds and the controller's time) in, a ``ScaleDecision`` out. The policy reads no clock, does
no I/O and keeps no state: everything it needs is in its context.

Policies (registry ``AUTOSCALERS``, shared by the CLI, the simulator and the runtime):

* ``"fast-heuristic"`` — FaST-GShare's Heuristic Scaling Algorithm (§3.4.1,
  Algorithm 1): ``FastHeuristic`` over ``heuristic_scale``;
* ``"target-util"`` — a Kubernetes-HPA-style baseline: one fixed config, as many replicas as
  keep each at ``target_util`` of its throughput: ``TargetUtil`` over
  ``target_utilisation_scale``;
* ``"gshare-burst"`` — gshare's default (``DEFAULT_AUTOSCALER``): Algorithm 1's configs sized
  for a burst-aware demand (peak hold, backlog) with a homogeneous fleet: ``BurstAutoscaler``.

What must hold after a controller applies a ``heuristic_scale`` decision (tested by properties
in ``tests/policy/test_autoscale.py``), with ``R`` the predicted rate and ``T`` throughputs:

* coverage — Σ T of the function's instances ≥ R (unless ``max_instances`` capped the
  additions, which the decision's ``reason`` says);
* minimal scale-down — when instances were removed (or R ≤ capacity), removing the next
  instance the rule would pick (least efficient first) would break coverage;
* determinism — the decision does not depend on the order of ``running`` or ``configs``.

Units: ``sm_pct`` and ``quota_pct`` are percentages (0, 100]; throughputs and rates are requests
per second (``_rps``); latencies milliseconds (``_ms``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from gshare.policy.autoscale.baselines import (
    TargetUtil,
    fixed_config,
    target_utilisation_scale,
)
from gshare.policy.autoscale.burst import (
    DEFAULT_AUTOSCALER,
    BurstAutoscaler,
    BurstDemand,
    DemandSource,
    burst_demand,
)
from gshare.policy.autoscale.core import (
    DEFAULT_MAX_WAIT_MS,
    FAST_QUOTA_POINTS_PCT,
    FAST_SM_POINTS_PCT,
    AutoscaleError,
    Autoscaler,
    Instance,
    LoadSignals,
    ScaleConfig,
    ScaleContext,
    ScaleDecision,
    candidate_configs,
)
from gshare.policy.autoscale.heuristic import (
    FastHeuristic,
    heuristic_scale,
    ideal_for,
    most_efficient,
)

# -- registry and the multi-function wrapper ---------------------------------------------------

AUTOSCALERS: Final[Mapping[str, Autoscaler]] = {
    "fast-heuristic": FastHeuristic(),
    "target-util": TargetUtil(),
    "gshare-burst": BurstAutoscaler(),
}
"""Named autoscalers shared by the CLI, the simulator and the runtime."""


def get_autoscaler(name: str) -> Autoscaler:
    """The registered autoscaler ``name``; ``AutoscaleError`` listing the known names otherwise."""
    try:
        return AUTOSCALERS[name]
    except KeyError:
        known = ", ".join(sorted(AUTOSCALERS))
        raise AutoscaleError(f"unknown autoscaler {name!r} (known: {known})") from None


def scale_all(
    predicted: Mapping[str, float],
    running: Sequence[Instance],
    configs_by_function: Mapping[str, Sequence[ScaleConfig]],
    *,
    autoscaler: str | Autoscaler = "fast-heuristic",
    min_instances: int = 0,
    max_instances: int | None = None,
) -> list[ScaleDecision]:
    """Run one autoscaler for every function in ``predicted``, in sorted function order.

    Who calls it: the controllers, every reconcile period. ``running`` may hold instances of any
    function (they are grouped by ``Instance.function``, keeping their order); instances of
    functions without a prediction are left untouched. A function missing from
    ``configs_by_function`` has no candidates (fine unless it must grow). The bounds apply to
    every function alike.
    """
    policy = get_autoscaler(autoscaler) if isinstance(autoscaler, str) else autoscaler
    by_function: dict[str, list[Instance]] = {}
    for inst in running:
        by_function.setdefault(inst.function, []).append(inst)
    return [
        policy(
            ScaleContext(
                fn,
                predicted[fn],
                by_function.get(fn, []),
                configs_by_function.get(fn, ()),
                min_instances=min_instances,
                max_instances=max_instances,
            )
        )
        for fn in sorted(predicted)
    ]


def heuristic_scale_all(
    predicted: Mapping[str, float],
    running: Sequence[Instance],
    configs_by_function: Mapping[str, Sequence[ScaleConfig]],
    *,
    min_instances: int = 0,
    max_instances: int | None = None,
) -> list[ScaleDecision]:
    """Algorithm 1 over every function (its outer ``for F_j`` loop): ``scale_all`` with
    ``heuristic_scale``. One decision per function in ``predicted``, sorted by name."""
    return scale_all(
        predicted,
        running,
        configs_by_function,
        autoscaler=FastHeuristic(),
        min_instances=min_instances,
        max_instances=max_instances,
    )


__all__ = [
    "AUTOSCALERS",
    "DEFAULT_AUTOSCALER",
    "BurstAutoscaler",
    "BurstDemand",
    "DemandSource",
    "LoadSignals",
    "burst_demand",
    "DEFAULT_MAX_WAIT_MS",
    "FAST_QUOTA_POINTS_PCT",
    "FAST_SM_POINTS_PCT",
    "AutoscaleError",
    "Autoscaler",
    "Instance",
    "ScaleConfig",
    "ScaleDecision",
    "candidate_configs",
    "fixed_config",
    "get_autoscaler",
    "heuristic_scale",
    "heuristic_scale_all",
    "ideal_for",
    "most_efficient",
    "scale_all",
    "FastHeuristic",
    "ScaleContext",
    "TargetUtil",
    "target_utilisation_scale",
]
