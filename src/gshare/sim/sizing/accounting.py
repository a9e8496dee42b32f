"""What each memory policy reserves for one app's invocations, and what that costs.

Who calls it: ``gshare.experiments.bulkx_sizing`` (per app and policy) and ``sim.sizing.cluster``
(``reservation`` for the capacity model). The sizing is ``policy.sizing.solve_sizing``; the
growth is ``policy.memory.grow_limit`` — the very rule the live runtime's instances follow.

The policies (``PolicyKind``):

* ``FIXED_MAX`` — OpenWhisk-style resource-tuned serverless: every invocation reserves the
  app's maximum (p100) for its whole execution; never killed.
* ``FIXED_P99`` — reserves the app's p99. An invocation whose demand exceeds it is killed
  after ``kill_fraction`` of its execution (its peak comes at a uniformly random point in the
  run, so half on average) and retried once at the app's maximum, which runs to completion:
  the killed attempt's reservation is wasted and counted.
* ``BULKX`` — ``(init, step)`` solved once on the app's training prefix; an invocation starts
  with ``init`` and, when its demand is above, grows to the smallest ``init + k·step`` that
  covers it, capped at the app's maximum (``grow_limit``; a need above the maximum would be a
  kill, which the drawn demands never reach). The grown allocation is charged for the *whole*
  execution (the trace gives the peak, not when it comes), which overstates BulkX's reserved
  memory. Each invocation starts a fresh component, so returning to ``init`` when idle is
  implicit.
* ``BULKX_WINDOW`` — the same, re-solved at every ``window_s`` boundary of the day from the
  most recent ``history_cap`` invocations that started before it (the first window after the
  prefix uses the prefix's sizing). The drawn demands are stationary, so re-solving can only
  help through more data; the trace has no drift to follow.

Metrics (per app; the experiment weighs each app by its real invocation count): reserved MB·s,
used MB·s (demand x execution time: the peak held for the whole run, the same convention for
every policy), kills, scale-up steps, invocations that grew.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gshare.policy.memory import grow_limit
from gshare.policy.sizing import Demand, History, Sizing, solve_sizing
from gshare.sim.sizing.apps import AppTrace

COVER_EPS_MB = 1e-9
"""A demand within this of a limit is covered (``grow_limit``'s slack)."""


class PolicyKind(enum.Enum):
    FIXED_MAX = "fixed-max"
    FIXED_P99 = "fixed-p99"
    BULKX = "bulkx"
    BULKX_WINDOW = "bulkx-window"


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A named policy: its kind and, for BulkX, the solver's knobs."""

    name: str
    kind: PolicyKind
    cost_factor: float = 1.0
    waste_threshold: float = 0.1
    step_cost_mb: float = 0.0
    granularity_mb: float = 1.0

    @property
    def sized(self) -> bool:
        return self.kind in (PolicyKind.BULKX, PolicyKind.BULKX_WINDOW)

    def solve(self, history: History | Sequence[Demand]) -> Sizing:
        return solve_sizing(
            history,
            self.cost_factor,
            self.waste_threshold,
            granularity_mb=self.granularity_mb,
            step_cost_mb=self.step_cost_mb,
        )


@dataclass(frozen=True)
class AppInvocations:
    """One app's simulated invocations in start order, split into training and evaluation."""

    app: AppTrace
    start_s: npt.NDArray[np.float64]
    demand_mb: npt.NDArray[np.float64]
    exec_s: npt.NDArray[np.float64]
    n_train: int
    """The first ``n_train`` are the training prefix (never scored)."""
    weight: float
    """Real invocations each simulated one stands for (``invocations / simulated``)."""

    @property
    def n(self) -> int:
        return int(self.start_s.shape[0])

    def history(self, lo: int, hi: int) -> History:
        """Invocations ``lo``..``hi - 1`` as the solver's columns (no object per invocation)."""
        return History(self.demand_mb[lo:hi], self.exec_s[lo:hi])


def draw_invocations(
    app: AppTrace, cap: int, train_fraction: float, rng: np.random.Generator
) -> AppInvocations | None:
    """Up to ``cap`` invocations of ``app`` (``AppTrace``: times, demands, exec times); the first
    ``max(1, floor(train_fraction · n))`` train. None when the app has fewer than two (nothing
    would be left to score)."""
    start = app.start_times_s(cap, rng)
    n = int(start.shape[0])
    if n < 2:
        return None
    demand = app.demand_mb(rng.uniform(0.0, 1.0, n))
    exec_s = app.exec_s(rng.uniform(0.0, 1.0, n))
    n_train = min(n - 1, max(1, math.floor(train_fraction * n)))
    return AppInvocations(app, start, demand, exec_s, n_train, app.invocations / n)


@dataclass(frozen=True, slots=True)
class Reservation:
    """What one invocation costs under a policy."""

    reserved_mbs: float
    """Reserved MB x s, a killed attempt included."""
    first_mb: float
    """Reservation when it starts (init, or the fixed size)."""
    grown_mb: float
    """Reservation after growing (= ``first_mb`` when it did not grow)."""
    steps: int
    killed: bool
    retry_mb: float = 0.0
    """After a kill: the retry's reservation (the app's maximum)."""


def reservation(
    demand_mb: float,
    exec_s: float,
    kind: PolicyKind,
    app: AppTrace,
    sizing: Sizing | None,
    kill_fraction: float,
) -> Reservation:
    """The module doc's rule for one invocation."""
    top = app.max_mb
    if kind is PolicyKind.FIXED_MAX:
        return Reservation(top * exec_s, top, top, 0, False)
    if kind is PolicyKind.FIXED_P99:
        r = app.p99_mb
        if demand_mb <= r + COVER_EPS_MB:
            return Reservation(r * exec_s, r, r, 0, False)
        return Reservation((r * kill_fraction + top) * exec_s, r, r, 0, True, top)
    if sizing is None:
        raise ValueError(f"policy {kind.value} needs a sizing")
    init = min(sizing.init_mb, top)
    if demand_mb <= init + COVER_EPS_MB:
        return Reservation(init * exec_s, init, init, 0, False)
    grown = grow_limit(init, demand_mb, init, sizing.step_mb, top)
    if grown.limit_mb is None:  # over the app's maximum: killed, retried at the maximum
        return Reservation((init * kill_fraction + top) * exec_s, init, init, 0, True, top)
    return Reservation(grown.limit_mb * exec_s, init, grown.limit_mb, grown.steps, False)


@dataclass
class AppOutcome:
    """Sums over one app's evaluation invocations under one policy (unweighted)."""

    invocations: int = 0
    reserved_mbs: float = 0.0
    used_mbs: float = 0.0
    kills: int = 0
    steps: int = 0
    grown: int = 0
    solves: int = 0
    sizing: Sizing | None = None
    """The last sizing used (BulkX kinds)."""
    inits_mb: list[float] = field(default_factory=list)
    """Every init the policy used (one per solve)."""


def evaluate(
    inv: AppInvocations,
    spec: PolicySpec,
    *,
    kill_fraction: float,
    window_s: float,
    history_cap: int,
) -> AppOutcome:
    """Run ``spec`` over ``inv``'s evaluation invocations (module doc)."""
    out = AppOutcome()
    sizing: Sizing | None = None
    if spec.sized:
        sizing = spec.solve(inv.history(0, inv.n_train))
        out.solves = 1
        out.inits_mb.append(sizing.init_mb)
    boundary = (math.floor(inv.start_s[inv.n_train] / window_s) + 1) * window_s
    for j in range(inv.n_train, inv.n):
        if spec.kind is PolicyKind.BULKX_WINDOW and inv.start_s[j] >= boundary:
            sizing = spec.solve(inv.history(max(0, j - history_cap), j))
            out.solves += 1
            out.inits_mb.append(sizing.init_mb)
            boundary = (math.floor(inv.start_s[j] / window_s) + 1) * window_s
        h, t = float(inv.demand_mb[j]), float(inv.exec_s[j])
        r = reservation(h, t, spec.kind, inv.app, sizing, kill_fraction)
        out.invocations += 1
        out.reserved_mbs += r.reserved_mbs
        out.used_mbs += h * t
        out.kills += int(r.killed)
        out.steps += r.steps
        out.grown += int(r.grown_mb > r.first_mb)
    out.sizing = sizing
    return out
