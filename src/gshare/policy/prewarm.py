"""Pre-warming and keep-alive of function containers (ESG §4, §2).

ESG's evaluation platform "use[s] proxy threads to monitor the function call intervals, predict
subsequent invocations, and preemptively warm up instances ... It uses Exponential Weighted
Moving Average (EWMA) to predict the invocation intervals of functions and pre-warms the
function instances accordingly. After pre-warming, ESG uses the same keep-alive policy as
OpenWhisk, to keep the instance alive for 10 minutes." (§4). ESG §4.2 applies the same
pre-warming to every compared scheduler, so this is a platform policy, not part of a scheduler.

Who calls it: the workflow simulator (``gshare.sim.workflow``) — every time a task of a function
starts on an invoker it folds the call into that pool's ``IntervalEwma`` (``observe_call``) and
when the task ends its container hold time into ``hold_ms`` (``ewma``); every ``period_ms`` it
calls ``plan_prewarm`` with a snapshot of every pool and starts the containers it asks for; when
a container goes idle it asks ``keep_alive_deadline_ms`` when to evict it. The GPU functions'
keep-alive and scale to zero (``policy.control.control_step``, both worlds) use the same
``keep_alive_deadline_ms``. Pure: the clock arrives as ``now_ms``; every state is a frozen value
returned anew.

NOTE (the policy, ESG §4; the paper gives only "EWMA of invocation intervals" and "10-minute
keep-alive" — the rest is our reading, chosen to be the simplest rule that uses exactly that):

* A *pool* is the containers of one function on one invoker. Predicting per pool answers
  "where": ESG_Dispatch sends a function back to the same invokers (home / predecessor / warm,
  §3.4), so the invokers a function was called on recently are where it will be called next.
* "When" and "how many": the EWMA of the pool's call intervals gives the call rate; Little's
  law gives the containers busy on average, ``hold_ms / interval_ms`` (a container is held from
  its task's start to its end: transfer + execution). The pool should hold
  ``ceil(busy * headroom) + spare`` containers (the spare absorbs the next call while the others
  are busy), at most ``max_per_pool``. Containers are started now when the next call is
  predicted before ``now + cold_start_ms + period_ms`` (a container started at the next tick
  would come too late); otherwise the decision waits for a later tick.
* While no call arrives, the interval used is ``max(ewma, now - last_call)``: a pool that has
  gone quiet sees its predicted rate fall without waiting for the next call to update the EWMA.
  A pool not called for ``keep_alive_ms`` is not pre-warmed at all (OpenWhisk would have evicted
  its containers by then).
* Keep-alive: an idle container is evicted ``keep_alive_ms`` (10 min) after it last became idle.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

DEFAULT_ALPHA: Final[float] = 0.2
"""Weight of the newest sample in every EWMA (``new = alpha * x + (1 - alpha) * old``)."""
DEFAULT_KEEP_ALIVE_MS: Final[float] = 600_000.0
"""OpenWhisk's fixed keep-alive, which ESG keeps (§2, §4): 10 minutes."""


class PrewarmError(ValueError):
    """An out-of-range parameter; the message names it."""


@dataclass(frozen=True, slots=True)
class IntervalEwma:
    """EWMA of the intervals between the calls of one pool.

    Invariants: ``count >= 0``; ``last_ms`` is set iff ``count >= 1``; ``mean_interval_ms`` is
    set iff ``count >= 2`` (an interval needs two calls)."""

    mean_interval_ms: float | None = None
    """EWMA of the call intervals, ms."""
    last_ms: float | None = None
    """Time of the latest call."""
    count: int = 0
    """Calls observed."""


def ewma(old: float | None, sample: float, alpha: float = DEFAULT_ALPHA) -> float:
    """One EWMA step: ``alpha * sample + (1 - alpha) * old``; the first sample is taken as is."""
    _check_alpha(alpha)
    return sample if old is None else alpha * sample + (1.0 - alpha) * old


def observe_call(est: IntervalEwma, now_ms: float, alpha: float = DEFAULT_ALPHA) -> IntervalEwma:
    """Fold a call at ``now_ms`` into ``est``. ``ValueError`` if time goes backwards."""
    if est.last_ms is None:
        return IntervalEwma(None, now_ms, 1)
    gap = now_ms - est.last_ms
    if gap < 0:
        raise PrewarmError(f"call at {now_ms} ms is before the previous one at {est.last_ms} ms")
    return IntervalEwma(ewma(est.mean_interval_ms, gap, alpha), now_ms, est.count + 1)


def predicted_interval_ms(est: IntervalEwma, now_ms: float) -> float | None:
    """The interval to plan with: ``max(ewma, now - last_call)``; ``None`` before two calls."""
    if est.mean_interval_ms is None or est.last_ms is None:
        return None
    return max(est.mean_interval_ms, now_ms - est.last_ms)


def predicted_next_call_ms(est: IntervalEwma, now_ms: float) -> float | None:
    """When the next call is expected: ``last_call + predicted_interval``; ``None`` before two
    calls."""
    interval = predicted_interval_ms(est, now_ms)
    if interval is None or est.last_ms is None:
        return None
    return est.last_ms + interval


def keep_alive_deadline_ms(
    idle_since_ms: float, keep_alive_ms: float = DEFAULT_KEEP_ALIVE_MS
) -> float:
    """When a container idle since ``idle_since_ms`` is evicted (if it stays idle)."""
    if keep_alive_ms < 0:
        raise PrewarmError(f"keep_alive_ms must be >= 0, got {keep_alive_ms}")
    return idle_since_ms + keep_alive_ms


@dataclass(frozen=True, slots=True)
class PrewarmParams:
    """Knobs of ``plan_prewarm`` (module NOTE). Invariants (checked): ``0 < alpha <= 1``,
    ``headroom >= 1``, ``spare >= 0``, ``max_per_pool >= 1``, ``period_ms > 0``,
    ``keep_alive_ms >= 0``."""

    alpha: float = DEFAULT_ALPHA
    headroom: float = 1.5
    """Multiplier on the mean number of busy containers (calls come in bursts)."""
    spare: int = 1
    """Containers kept on top, for the call that arrives while the others are busy."""
    max_per_pool: int = 7
    """At most this many containers per pool (7: every task holds >= 1 of a node's 7 vGPUs, so
    no more than 7 containers of a node can ever be busy at once)."""
    period_ms: float = 1000.0
    """How often the mechanism calls ``plan_prewarm`` (the proxy thread's period)."""
    keep_alive_ms: float = DEFAULT_KEEP_ALIVE_MS

    def __post_init__(self) -> None:
        _check_alpha(self.alpha)
        if self.headroom < 1.0:
            raise PrewarmError(f"headroom must be >= 1, got {self.headroom}")
        if self.spare < 0:
            raise PrewarmError(f"spare must be >= 0, got {self.spare}")
        if self.max_per_pool < 1:
            raise PrewarmError(f"max_per_pool must be >= 1, got {self.max_per_pool}")
        if self.period_ms <= 0:
            raise PrewarmError(f"period_ms must be > 0, got {self.period_ms}")
        if self.keep_alive_ms < 0:
            raise PrewarmError(f"keep_alive_ms must be >= 0, got {self.keep_alive_ms}")


@dataclass(frozen=True, slots=True)
class PoolView:
    """Snapshot of one pool (one function's containers on one invoker)."""

    function: str
    invoker_id: int
    idle: int
    """Warm containers without a task."""
    busy: int
    """Containers running a task (or cold-starting for one)."""
    starting: int
    """Containers being pre-warmed (not yet warm, no task)."""
    cold_start_ms: float
    """Time to start a container of the function."""
    calls: IntervalEwma
    """The pool's call intervals."""
    hold_ms: float | None
    """EWMA of how long a task holds its container (transfer + execution), ms; ``None`` before
    the first task ended."""

    @property
    def containers(self) -> int:
        return self.idle + self.busy + self.starting


@dataclass(frozen=True, slots=True)
class Prewarm:
    """Start ``count`` containers of ``function`` on ``invoker_id`` now."""

    function: str
    invoker_id: int
    count: int
    target: int
    """The pool size the policy aims at (``containers + count``)."""


def target_containers(pool: PoolView, now_ms: float, params: PrewarmParams) -> int:
    """How many containers the pool should have (module NOTE); 0 when the pool has no call
    history to predict from, or was not called within ``keep_alive_ms``."""
    interval = predicted_interval_ms(pool.calls, now_ms)
    if interval is None or pool.hold_ms is None or pool.calls.last_ms is None:
        return 0
    if now_ms - pool.calls.last_ms > params.keep_alive_ms:
        return 0
    busy = pool.hold_ms / interval if interval > 0 else float(params.max_per_pool)
    want = math.ceil(busy * params.headroom - 1e-9) + params.spare
    return max(0, min(params.max_per_pool, want))


def plan_prewarm(
    pools: Sequence[PoolView], now_ms: float, params: PrewarmParams | None = None
) -> tuple[Prewarm, ...]:
    """The containers to start now, one ``Prewarm`` per pool that is short of its target and
    whose next call is predicted before ``now + cold_start_ms + period_ms`` (module NOTE).
    Deterministic: in the order of ``pools``."""
    params = params if params is not None else PrewarmParams()
    out: list[Prewarm] = []
    for pool in pools:
        target = target_containers(pool, now_ms, params)
        deficit = target - pool.containers
        if deficit <= 0:
            continue
        nxt = predicted_next_call_ms(pool.calls, now_ms)
        if nxt is None or nxt > now_ms + pool.cold_start_ms + params.period_ms:
            continue
        out.append(Prewarm(pool.function, pool.invoker_id, deficit, target))
    return tuple(out)


def _check_alpha(alpha: float) -> None:
    if not 0.0 < alpha <= 1.0:
        raise PrewarmError(f"alpha must be in (0, 1], got {alpha}")
