"""ESG's four comparison schedulers (§4.2), each a ``WorkflowPolicy``.

=================  =========================================  ==================================
name               configuration                              invoker
=================  =========================================  ==================================
``infless``        per stage: options meeting the stage's     joint (config, invoker) with the
                   fixed SLO share (split by average service  best INFless resource efficiency
                   time), by throughput                       (throughput / weighted leftover)
``fast-gshare``    per stage: same split, by FaST-GShare's    best fit: least leftover after
                   RPR (throughput per resource)              placement (fragmentation)
``orion``          at the first stage, best-first search of   ESG_Dispatch (locality)
                   the whole DAG for the P95 goal, cut off
                   after a fixed number of evaluated states;
                   carried unchanged
``aquatope``       static per stage, from offline Bayesian    ESG_Dispatch (locality)
                   optimisation (``gshare.experiments.
                   offline_bo``)
=================  =========================================  ==================================

GPU sharing, batching and pre-warming are the simulator's and the same for all (ESG §4.2);
INFless and FaST-GShare use their fragmentation rules instead of ESG's locality policy, Orion and
Aquatope use ESG's (§4.2: "the same data locality and pre-warming policy proposed in this work
are also used ... INFless and FaST-GShare do not follow the data locality policy").

Registry (``BASELINES``): name -> factory. Every factory takes the same keyword arguments, so
the simulator and the experiments can build any of them the same way::

    from gshare.policy.workflow.baselines import BASELINES
    from gshare.experiments.offline_bo import bo_optimiser    # scikit-learn lives there

    policy = BASELINES[name](perf=perf, seed=seed, optimiser=bo_optimiser(perf))
    policy.prepare(workflows, options, seed)                  # aquatope runs its BO here

* ``perf`` — the performance model (anything with ``params.noise_sigma_frac``); Orion takes its
  noise for the P95; the others ignore it;
* ``seed`` — accepted for uniformity; the seed that counts is ``prepare``'s (only Aquatope's
  offline optimisation draws random numbers);
* ``optimiser`` / ``static_plans`` — Aquatope's offline phase (see ``aquatope``); required by
  ``aquatope`` (one of them), ignored by the others. ``offline_bo.make_aquatope(workflows,
  options, perf, seed)`` is the one-call alternative;
* any other keyword is passed to the policy's constructor (e.g. ``max_evaluations=`` for Orion).

Everything here is pure (docs/DESIGN.md §1): no clock, no I/O, no scikit-learn.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from gshare.policy.workflow.baselines.aquatope import (
    AquatopePolicy,
    StaticPlanOptimiser,
    StaticPlans,
)
from gshare.policy.workflow.baselines.common import (
    FALLBACK_CONFIG,
    Z_P95,
    average_service_times_ms,
    p95_of_paths_ms,
    service_time_slo_split,
    source_to_sink_paths,
)
from gshare.policy.workflow.baselines.fast_gshare import (
    FastGSharePolicy,
    fast_candidates,
    fast_select,
    leftover_share,
    rpr,
)
from gshare.policy.workflow.baselines.infless import (
    InflessPolicy,
    infless_candidates,
    infless_select,
    resource_efficiency,
)
from gshare.policy.workflow.baselines.orion import (
    DEFAULT_MAX_EVALUATIONS,
    MS_PER_EVALUATION,
    OrionPolicy,
    OrionResult,
    StageLattice,
    orion_search,
)
from gshare.policy.workflow.schedulers import WorkflowPolicy


class _NoiseParams(Protocol):
    @property
    def noise_sigma_frac(self) -> float: ...


class PerfLike(Protocol):
    """What the registry reads of a performance model (``gshare.workflows.perf.PerfModel``
    satisfies it)."""

    @property
    def params(self) -> _NoiseParams: ...


def make_infless(
    *,
    perf: PerfLike | None = None,
    seed: int = 0,
    optimiser: StaticPlanOptimiser | None = None,
    static_plans: StaticPlans | None = None,
    **params: Any,
) -> InflessPolicy:
    """Registry factory of ``"infless"`` (``perf``, ``seed``, ``optimiser``, ``static_plans``
    are accepted for uniformity and unused)."""
    return InflessPolicy(**params)


def make_fast_gshare(
    *,
    perf: PerfLike | None = None,
    seed: int = 0,
    optimiser: StaticPlanOptimiser | None = None,
    static_plans: StaticPlans | None = None,
    **params: Any,
) -> FastGSharePolicy:
    """Registry factory of ``"fast-gshare"`` (uniform keywords unused)."""
    return FastGSharePolicy(**params)


def make_orion(
    *,
    perf: PerfLike | None = None,
    seed: int = 0,
    optimiser: StaticPlanOptimiser | None = None,
    static_plans: StaticPlans | None = None,
    **params: Any,
) -> OrionPolicy:
    """Registry factory of ``"orion"``: the noise of the P95 comes from ``perf`` unless
    ``noise_sigma_frac=`` is given."""
    if perf is not None and "noise_sigma_frac" not in params:
        params["noise_sigma_frac"] = perf.params.noise_sigma_frac
    return OrionPolicy(**params)


def make_aquatope_policy(
    *,
    perf: PerfLike | None = None,
    seed: int = 0,
    optimiser: StaticPlanOptimiser | None = None,
    static_plans: StaticPlans | None = None,
    **params: Any,
) -> AquatopePolicy:
    """Registry factory of ``"aquatope"``: needs ``static_plans`` or an ``optimiser``
    (``gshare.experiments.offline_bo.bo_optimiser(perf)``); ``TypeError`` otherwise."""
    if optimiser is None and static_plans is None:
        raise TypeError(
            "BASELINES['aquatope'] needs optimiser= (gshare.experiments.offline_bo.bo_optimiser"
            "(perf)) or static_plans=; or call gshare.experiments.offline_bo.make_aquatope(...)"
        )
    return AquatopePolicy(static_plans, optimiser=optimiser, **params)


BASELINES: dict[str, Callable[..., WorkflowPolicy]] = {
    "infless": make_infless,
    "fast-gshare": make_fast_gshare,
    "orion": make_orion,
    "aquatope": make_aquatope_policy,
}
"""ESG §4.2's baselines by name (module doc for the keyword arguments)."""


def make_baseline(name: str, **kwargs: Any) -> WorkflowPolicy:
    """``BASELINES[name](**kwargs)``; ``KeyError`` naming the known baselines otherwise."""
    try:
        factory = BASELINES[name]
    except KeyError:
        raise KeyError(f"unknown baseline {name!r} (known: {', '.join(BASELINES)})") from None
    return factory(**kwargs)


__all__ = [
    "BASELINES",
    "DEFAULT_MAX_EVALUATIONS",
    "FALLBACK_CONFIG",
    "MS_PER_EVALUATION",
    "Z_P95",
    "AquatopePolicy",
    "FastGSharePolicy",
    "InflessPolicy",
    "OrionPolicy",
    "OrionResult",
    "PerfLike",
    "StageLattice",
    "StaticPlanOptimiser",
    "StaticPlans",
    "average_service_times_ms",
    "fast_candidates",
    "fast_select",
    "infless_candidates",
    "infless_select",
    "leftover_share",
    "make_baseline",
    "orion_search",
    "p95_of_paths_ms",
    "resource_efficiency",
    "rpr",
    "service_time_slo_split",
    "source_to_sink_paths",
]
