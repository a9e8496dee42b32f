"""Request-rate prediction: the predicted RPS ``R`` the autoscaler sizes a function for.

Who calls it: the controllers (simulator and live runtime), once per reconcile period and per
function: the gateway counted ``count`` arrivals during the last ``interval_s`` seconds; the
controller folds that into the function's predictor state with ``observe`` and asks
``predict`` for the rate to hand to ``policy.autoscale``. The clock is the caller's: the
interval is an argument; nothing here reads time. States are frozen dataclasses, so a
controller keeps one per function and replaces it with the returned one.

Predictors:

* ``EwmaRate`` — exponentially weighted moving average of the per-interval rate;
* ``WindowMaxRate`` — the maximum rate over the last ``k`` intervals (burst head-room: the
  fleet is sized for the recent peak, not the mean);
* ``RatePredictor`` — what both controllers use: ``max(EWMA, window max) × headroom``. It
  also keeps a long *hold* window (``hold``, 60 periods by default) whose maximum
  (``peak_rps``) and newest sample (``last_rps``) are the burst signals the ``gshare-burst``
  autoscaler reads (``policy.autoscale.LoadSignals``); they do not change ``predicted_rps``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import overload


class RateError(ValueError):
    """A bad predictor parameter or observation; the message names the field and its range."""


def _check_observation(count: float, interval_s: float) -> float:
    if not (count >= 0.0 and math.isfinite(count)):
        raise RateError(f"count must be finite and >= 0, got {count}")
    if not (interval_s > 0.0 and math.isfinite(interval_s)):
        raise RateError(f"interval_s must be finite and > 0, got {interval_s}")
    return count / interval_s


@dataclass(frozen=True, slots=True)
class EwmaRate:
    """State of an EWMA rate predictor.

    The rate sample of an interval is ``count / interval_s`` (rps). The first sample is taken
    as is; afterwards ``rate ← alpha · sample + (1 − alpha) · rate``. ``alpha`` is the weight of
    the newest interval per observation (not per second): controllers observe at a fixed
    reconcile period, so this matches a time constant of ``period / alpha``.
    """

    alpha: float = 0.5
    """Weight of the newest sample, in (0, 1]; 1 = the last interval only."""
    rate_rps: float = 0.0
    """Current estimate (requests per second); 0 before any observation."""
    samples: int = 0
    """Number of intervals observed."""

    def __post_init__(self) -> None:
        if not (0.0 < self.alpha <= 1.0):
            raise RateError(f"alpha must be in (0, 1], got {self.alpha}")
        if not (self.rate_rps >= 0.0 and math.isfinite(self.rate_rps)):
            raise RateError(f"rate_rps must be finite and >= 0, got {self.rate_rps}")
        if self.samples < 0:
            raise RateError(f"samples must be >= 0, got {self.samples}")


@dataclass(frozen=True, slots=True)
class WindowMaxRate:
    """State of a window-max predictor: the maximum per-interval rate over the last ``k``
    intervals (0 before any observation)."""

    k: int = 5
    """Window length, in intervals (>= 1)."""
    recent_rps: tuple[float, ...] = ()
    """Rates of the last up to ``k`` intervals, oldest first."""

    def __post_init__(self) -> None:
        if self.k < 1:
            raise RateError(f"k must be >= 1, got {self.k}")
        if len(self.recent_rps) > self.k:
            raise RateError(f"recent_rps holds {len(self.recent_rps)} > k={self.k} samples")


RateState = EwmaRate | WindowMaxRate
"""Any predictor state accepted by ``observe`` and ``predict``."""


@overload
def observe(state: EwmaRate, count: float, interval_s: float) -> EwmaRate: ...
@overload
def observe(state: WindowMaxRate, count: float, interval_s: float) -> WindowMaxRate: ...
def observe(state: RateState, count: float, interval_s: float) -> RateState:
    """Fold ``count`` arrivals observed during ``interval_s`` seconds into ``state``; returns
    the new state (the old one is unchanged). Raises ``RateError`` for a negative count or a
    non-positive interval."""
    sample_rps = _check_observation(count, interval_s)
    if isinstance(state, EwmaRate):
        if state.samples == 0:
            new_rps = sample_rps
        else:
            new_rps = state.alpha * sample_rps + (1.0 - state.alpha) * state.rate_rps
        return replace(state, rate_rps=new_rps, samples=state.samples + 1)
    return replace(state, recent_rps=(*state.recent_rps, sample_rps)[-state.k :])


def predict(state: RateState) -> float:
    """The predicted request rate (rps) for the next period: the EWMA estimate, or the window
    maximum; 0.0 before any observation."""
    if isinstance(state, EwmaRate):
        return state.rate_rps
    return max(state.recent_rps, default=0.0)


@dataclass(frozen=True, slots=True)
class RatePredictor:
    """The controllers' rate estimate of one function: ``max(EWMA, window max) × headroom``.

    Who calls it: ``policy.control.control_step`` (which both the simulator's ``SimCluster``
    and the runtime's ``Controller`` call), never the worlds directly. ``observed`` folds one
    period's arrivals into both predictors; ``predicted_rps`` is the rate handed to the
    autoscaler; ``reset`` forgets the history (a function idle past its keep-alive).
    """

    ewma: EwmaRate = EwmaRate()
    window: WindowMaxRate = WindowMaxRate(k=3)
    headroom: float = 1.2
    """Multiplier on the estimate (burst head-room), >= 1."""
    hold: WindowMaxRate = WindowMaxRate(k=60)
    """Long window of per-interval rates (``peak_rps``, ``last_rps``); not part of
    ``predicted_rps``."""

    def __post_init__(self) -> None:
        if not (self.headroom >= 1.0 and math.isfinite(self.headroom)):
            raise RateError(f"headroom must be finite and >= 1, got {self.headroom}")

    @classmethod
    def fresh(
        cls,
        *,
        alpha: float = 0.5,
        window: int = 3,
        headroom: float = 1.2,
        hold_window: int = 60,
    ) -> RatePredictor:
        """A predictor with no history."""
        return cls(
            EwmaRate(alpha=alpha), WindowMaxRate(k=window), headroom, WindowMaxRate(k=hold_window)
        )

    def observed(self, count: float, interval_s: float) -> RatePredictor:
        """The predictor after ``count`` arrivals during ``interval_s`` seconds."""
        return replace(
            self,
            ewma=observe(self.ewma, count, interval_s),
            window=observe(self.window, count, interval_s),
            hold=observe(self.hold, count, interval_s),
        )

    def peak_rps(self) -> float:
        """The largest per-interval rate of the hold window (rps, no headroom; 0.0 before any
        observation)."""
        return predict(self.hold)

    def last_rps(self) -> float:
        """The rate of the newest interval (rps; 0.0 before any observation)."""
        return self.hold.recent_rps[-1] if self.hold.recent_rps else 0.0

    def predicted_rps(self) -> float:
        """``max(EWMA, window max) × headroom`` (0.0 before any observation)."""
        return max(predict(self.ewma), predict(self.window)) * self.headroom

    def reset(self) -> RatePredictor:
        """The same predictor with its history forgotten."""
        return replace(
            self,
            ewma=EwmaRate(alpha=self.ewma.alpha),
            window=WindowMaxRate(k=self.window.k),
            hold=WindowMaxRate(k=self.hold.k),
        )


__all__ = [
    "EwmaRate",
    "RateError",
    "RatePredictor",
    "RateState",
    "WindowMaxRate",
    "observe",
    "predict",
]
