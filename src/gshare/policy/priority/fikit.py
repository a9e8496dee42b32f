"""The FIKIT procedure and BestPrioFit: fill a predicted idle gap with waiting kernels.

Who calls it: ``policy.priority.scheduler.FikitScheduler`` when a kernel of the top priority
class is dispatched (a new gap is predicted) and whenever a lower-class launch arrives while a
gap is open. Both functions are pure apart from dequeuing what they choose (the paper's
BestPrioFit "dequeues" its pick): they take the queues, the gap and a lookup of SK.

What must hold (tested in ``tests/policy/test_priority_fikit.py``): the kernels chosen for one
gap never add up to more than the gap (with ``overhead_ms`` per fill: ``sum(SK + overhead) <=
gap``); a gap shorter than ``min_gap_ms`` gets nothing; each pick is from the highest level that
has a kernel that fits, and within that level the longest that fits (ties: the earliest launch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from gshare.policy.priority.queues import PendingLaunch, PriorityQueues

MIN_GAP_MS: Final[float] = 0.1
"""Gaps shorter than this are not filled (FIKIT §3.2: a kernel launch costs 0.1-2 ms)."""
FIT_EPS_MS: Final[float] = 1e-9

DurationOf = Callable[[PendingLaunch], float | None]
"""SK of a pending launch's kernel; None when unknown (such a launch can never fill a gap)."""


@dataclass(frozen=True, slots=True)
class Fit:
    """A launch chosen for a gap and the duration it was chosen by."""

    launch: PendingLaunch
    duration_ms: float


# NOTE — BestPrioFit (FIKIT §3.2, Algorithm 2, Fig. 10). Scan the levels from the highest
# priority down; at the first level that holds a kernel whose SK (+ the per-fill overhead) fits
# the remaining gap, take the longest such kernel (the one closest to the remaining gap; ties:
# the earliest launch) and dequeue it. Kernels of unknown SK never fit. Invariant: a lower level
# is only considered when no kernel of a higher level fits.
def best_prio_fit(
    queues: PriorityQueues,
    remaining_ms: float,
    duration_of: DurationOf,
    overhead_ms: float = 0.0,
) -> Fit | None:
    """The best-fitting waiting launch for ``remaining_ms`` of idle time, dequeued; or None."""
    if remaining_ms <= 0.0:
        return None
    for _, level in queues.levels():
        best: Fit | None = None
        for launch in level:
            d = duration_of(launch)
            if d is None or d + overhead_ms > remaining_ms + FIT_EPS_MS:
                continue
            if best is None or d > best.duration_ms + FIT_EPS_MS:
                best = Fit(launch, d)
        if best is not None:
            queues.remove(best.launch)
            return best
    return None


# NOTE — the FIKIT procedure (§3.2, Algorithm 1, Fig. 9). When a kernel of the task
# holding the GPU runs, look up the idle time predicted after it (SG); skip gaps under
# ``min_gap_ms`` (0.1 ms); otherwise call BestPrioFit repeatedly, shrinking the gap by every
# chosen kernel's SK (+ overhead), until nothing fits. Invariant: the chosen kernels' SK (+
# overhead) sum to at most the gap.
def fikit_fill(
    queues: PriorityQueues,
    gap_ms: float,
    duration_of: DurationOf,
    *,
    min_gap_ms: float = MIN_GAP_MS,
    overhead_ms: float = 0.0,
) -> list[Fit]:
    """The launches to dispatch into a predicted gap of ``gap_ms``, in dispatch order."""
    if gap_ms < min_gap_ms:
        return []
    return fill_remaining(queues, gap_ms, duration_of, overhead_ms=overhead_ms)


def fill_remaining(
    queues: PriorityQueues,
    remaining_ms: float,
    duration_of: DurationOf,
    *,
    overhead_ms: float = 0.0,
) -> list[Fit]:
    """BestPrioFit until nothing fits ``remaining_ms`` (the rescan of an already open gap when a
    new launch is queued: FIKIT §3.2, "when a kernel is added to any priority queue, the
    scheduler triggers a priority scan")."""
    fills: list[Fit] = []
    left = remaining_ms
    while (fit := best_prio_fit(queues, left, duration_of, overhead_ms)) is not None:
        fills.append(fit)
        left -= fit.duration_ms + overhead_ms
    return fills
