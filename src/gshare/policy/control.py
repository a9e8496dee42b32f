"""One reconcile step of one function: rate, keep-alive, scale to zero, queued demand, back-off.

Who calls it: the controllers of both worlds — the simulator's ``SimCluster`` (virtual time)
and the live runtime's ``Controller`` (wall clock) — with nothing but an observation and the
function's ``ControlState``:

* ``control_step`` once per reconcile period per function (a *tick*: ``arrivals`` counted over
  the period), and when a request arrives for a function that has no instance (a *nudge*:
  ``arrivals=None``, no new rate sample; ``cold_start_wanted`` says when);
* ``on_start_failed`` when an instance of the function failed to start, ``on_started`` when
  one became ready (the start back-off);
* ``drain_finished`` for each draining instance (the runtime's drain timeout).

Each returns the new state; the caller keeps it (one per function) and applies the decision:
start ``add`` (placing each with ``policy.placement``), drain ``remove``. Nothing here reads
a clock or does I/O; ``now_s`` is the caller's clock in seconds.

What must hold (tested in ``tests/policy/test_control.py``):

* a function idle (nothing queued or in flight) for ``keep_alive_s`` since the later of its
  last arrival and its last answer is scaled to ``min_instances`` (to zero by default) and its
  rate history is forgotten; before that it keeps at least one instance;
* requests waiting for an instance always get one (``queued > 0`` ⇒ floor of one instance and
  a predicted rate > 0), within ``max_instances``;
* after ``k`` consecutive failed starts no instance is added until
  ``min(max_backoff_s, start_backoff_s · 2^(k−1))`` seconds after the last failure; removals
  are never held back.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

from gshare.policy.autoscale import (
    Autoscaler,
    Instance,
    LoadSignals,
    ScaleConfig,
    ScaleContext,
    ScaleDecision,
)
from gshare.policy.prewarm import keep_alive_deadline_ms
from gshare.policy.rate import RatePredictor

COLD_DEMAND_RPS: Final[float] = 1e-3
"""Rate handed to the autoscaler when requests wait but no arrival rate predicts any: enough to
start one instance of the function's first config."""


class ControlError(ValueError):
    """A bad control parameter or observation; the message names the field and its range."""


class Warmth(enum.Enum):
    """Why a function keeps (or not) a floor of one instance in this step."""

    BUSY = "busy"
    """Requests are queued or in flight."""
    KEPT_ALIVE = "kept-alive"
    """Idle, but for less than ``keep_alive_s``."""
    EXPIRED = "expired"
    """Idle past ``keep_alive_s``: scaled to ``min_instances``, rate history forgotten."""
    NEVER_INVOKED = "never-invoked"
    """No request has arrived yet (or the function has no keep-alive): no floor."""


@dataclass(frozen=True, slots=True)
class ControlParams:
    """Knobs of the step: one set of defaults for both worlds (``sim.cluster.ClusterConfig``
    and ``runtime.control.records.ControllerConfig`` hold one of these)."""

    headroom: float = 1.2
    """The predicted rate is multiplied by this before autoscaling (burst head-room)."""
    rate_alpha: float = 0.5
    """EWMA weight of the newest rate sample."""
    rate_window: int = 3
    """The prediction is max(EWMA, max of the last ``rate_window`` samples) × headroom."""
    hold_window: int = 60
    """Periods of the long window whose peak rate ``gshare-burst`` holds capacity for
    (``policy.rate.RatePredictor.hold``); other autoscalers do not read it."""
    start_backoff_s: float = 2.0
    """First back-off after a failed start; doubles per consecutive failure."""
    max_backoff_s: float = 60.0
    """Longest back-off."""

    def __post_init__(self) -> None:
        if not (
            0.0 <= self.start_backoff_s <= self.max_backoff_s and math.isfinite(self.max_backoff_s)
        ):
            raise ControlError(
                "need 0 <= start_backoff_s <= max_backoff_s < inf, got "
                f"{self.start_backoff_s}, {self.max_backoff_s}"
            )

    def fresh_state(self) -> ControlState:
        """The state of a function the controller has not seen yet (no rate history)."""
        return ControlState(
            RatePredictor.fresh(
                alpha=self.rate_alpha,
                window=self.rate_window,
                headroom=self.headroom,
                hold_window=self.hold_window,
            )
        )


@dataclass(frozen=True, slots=True)
class ControlState:
    """What the controller remembers of one function between steps."""

    predictor: RatePredictor = RatePredictor()
    """Rate history (``policy.rate``)."""
    start_failures: int = 0
    """Consecutive failed starts (0 after an instance became ready)."""
    backoff_until_s: float = 0.0
    """No instance is added before this time."""


@dataclass(frozen=True, slots=True)
class FunctionObservation:
    """One function as its controller sees it now."""

    function: str
    arrivals: int | None
    """Requests that arrived during the last ``interval_s`` (a tick); None for a nudge."""
    interval_s: float
    """Length of the period the arrivals were counted over (> 0; ignored for a nudge)."""
    idle_since_s: float | None
    """Later of the last arrival and the last answer (None: never invoked)."""
    outstanding: int
    """Requests queued or in flight anywhere (gateway and instances)."""
    queued: int
    """Requests waiting at the gateway for an instance to take them."""
    running: Sequence[Instance]
    """Instances of the function that are starting or ready (not draining)."""
    configs: Sequence[ScaleConfig]
    """Candidate configurations, in the autoscaler's order of preference."""
    min_instances: int = 0
    max_instances: int | None = None
    keep_alive_s: float | None = None
    """Idle time before scaling to ``min_instances``; None = no keep-alive rule (the
    autoscaler's rate rules alone, as FaST-GShare's experiments run)."""


@dataclass(frozen=True, slots=True)
class ControlDecision:
    """What to change for one function now (``add`` after the back-off, ``remove``)."""

    function: str
    predicted_rps: float
    """Rate the autoscaler sized for (after keep-alive and the queued-demand floor)."""
    min_instances: int
    """Floor given to the autoscaler (``min_instances``, or 1 while warm or with demand)."""
    warmth: Warmth
    add: tuple[ScaleConfig, ...]
    """Configs of instances to start now (empty during a start back-off)."""
    remove: tuple[str, ...]
    """Ids of instances to drain."""
    held_back: int
    """Additions the autoscaler asked for that the start back-off withheld."""
    scale: ScaleDecision
    """The autoscaler's own decision (its ``reason`` explains it)."""

    @property
    def changes(self) -> bool:
        return bool(self.add or self.remove)


# NOTE — the reconcile step (gshare's own; FaST-GShare §3.4.1 and ESG §4 for the parts it
# composes). The rate sample of a tick feeds ``RatePredictor`` (max(EWMA, window max) ×
# headroom). Keep-alive as in ESG's container model (``policy.prewarm.keep_alive_deadline_ms``)
# but counted from the later of the last arrival and the last answer, so a request that waited
# through a cold start longer than the keep-alive does not see its instance scaled away the
# moment it answers; requests in flight keep a function warm. Past the deadline the
# prediction is 0 (the autoscaler removes every instance above ``min_instances``) and the
# history is forgotten, so a later request starts from a cold estimate. Requests waiting with
# no instance are demand the rate has not seen yet: a floor of one instance.
def control_step(
    obs: FunctionObservation,
    state: ControlState,
    now_s: float,
    autoscaler: Autoscaler,
    params: ControlParams = ControlParams(),
) -> tuple[ControlDecision, ControlState]:
    """One step for ``obs.function`` (module doc). Raises ``ControlError`` for a bad
    observation and lets the autoscaler's ``AutoscaleError`` through."""
    if obs.outstanding < 0 or obs.queued < 0:
        raise ControlError(f"{obs.function}: outstanding and queued must be >= 0")
    if obs.keep_alive_s is not None and not obs.keep_alive_s >= 0:
        raise ControlError(f"{obs.function}: keep_alive_s must be >= 0, got {obs.keep_alive_s}")
    predictor = state.predictor
    if obs.arrivals is not None:
        if obs.arrivals < 0:
            raise ControlError(f"{obs.function}: arrivals must be >= 0, got {obs.arrivals}")
        predictor = predictor.observed(obs.arrivals, obs.interval_s)
    predicted = predictor.predicted_rps()

    if obs.keep_alive_s is None or obs.idle_since_s is None:
        warmth = Warmth.NEVER_INVOKED
    elif obs.outstanding > 0:
        warmth = Warmth.BUSY
    elif now_s * 1000.0 >= keep_alive_deadline_ms(
        obs.idle_since_s * 1000.0, obs.keep_alive_s * 1000.0
    ):
        warmth = Warmth.EXPIRED
        predicted = 0.0
        predictor = predictor.reset()
    else:
        warmth = Warmth.KEPT_ALIVE

    if obs.queued > 0 and predicted <= 0.0:
        predicted = COLD_DEMAND_RPS
    floor = 1 if (warmth in (Warmth.BUSY, Warmth.KEPT_ALIVE) or obs.queued > 0) else 0
    min_eff = max(obs.min_instances, floor)
    if obs.max_instances is not None:
        min_eff = min(min_eff, obs.max_instances)

    signals = LoadSignals(
        period_s=obs.interval_s,
        last_rps=predictor.last_rps(),
        peak_rps=predictor.peak_rps(),
        outstanding=obs.outstanding,
    )
    scale = autoscaler(
        ScaleContext(
            obs.function,
            predicted,
            obs.running,
            obs.configs,
            min_instances=min_eff,
            max_instances=obs.max_instances,
            signals=signals,
            now_s=now_s,
        )
    )
    add = scale.add if now_s >= state.backoff_until_s else ()
    decision = ControlDecision(
        function=obs.function,
        predicted_rps=predicted,
        min_instances=min_eff,
        warmth=warmth,
        add=tuple(add),
        remove=tuple(scale.remove),
        held_back=len(scale.add) - len(add),
        scale=scale,
    )
    return decision, replace(state, predictor=predictor)


def cold_start_wanted(queued: int, live_instances: int) -> bool:
    """A nudge is worth a step: requests wait and the function has no instance at all."""
    return queued > 0 and live_instances == 0


def on_start_failed(
    state: ControlState, now_s: float, params: ControlParams = ControlParams()
) -> ControlState:
    """An instance of the function failed to start at ``now_s``: back off, doubling per
    consecutive failure."""
    failures = state.start_failures + 1
    backoff_s = min(params.max_backoff_s, params.start_backoff_s * 2.0 ** (failures - 1))
    return replace(state, start_failures=failures, backoff_until_s=now_s + backoff_s)


def on_started(state: ControlState) -> ControlState:
    """An instance of the function became ready: the failure count starts over."""
    return replace(state, start_failures=0)


def drain_finished(in_flight: int, drain_since_s: float, now_s: float, timeout_s: float) -> bool:
    """A draining instance may stop: nothing in flight, or it drained for ``timeout_s``."""
    return in_flight == 0 or now_s - drain_since_s > timeout_s


__all__ = [
    "COLD_DEMAND_RPS",
    "ControlDecision",
    "ControlError",
    "ControlParams",
    "ControlState",
    "FunctionObservation",
    "Warmth",
    "cold_start_wanted",
    "control_step",
    "drain_finished",
    "on_start_failed",
    "on_started",
]
