"""FIKIT on a live device without a central per-kernel scheduler: the decisions each instance takes
at its preemption points from a shared board.

Who calls it: the live runtime's instance mechanism (``runtime.instance.fikit``) at every
preemption point (a torch module call), with what it reads from its device's board
(``runtime.tokens.board``: the top active priority class, written by the token server from
``plan_classes``; each instance's open gap and pending fill), and the clock in ms. Nothing here
reads a clock or does I/O.

Why not ``FikitScheduler`` itself: the scheduler is a central state machine that sees every
launch and completion; live, one event per kernel would be a socket round trip per op for the
high-priority instance — the cost the paper's measurement/sharing split exists to avoid (paper
002 §2.2, fourth point of view). The live mechanism splits the scheduler's decisions by who can
take them without a round trip:

* task switching and the top class: the token server (``plan_classes``, on token events) —
  published as the board's top priority, read by every instance at its next preemption point;
* the top class's gaps: each top-class instance predicts the gap after its own kernel from its
  profile's SG (``gap_end_after``) and publishes it; its next kernel ends it at once (runtime
  feedback);
* fills: a waiting lower-class instance computes the open window (``window_end_ms``) and runs
  BestPrioFit (``choose_fill``, i.e. ``policy.priority.fikit.best_prio_fit``) over the waiting
  launches the board shows; it dispatches its own launch only when BestPrioFit picks it.

What must hold (tested in ``tests/policy/test_priority_live.py``): ``must_yield`` is true exactly
below the top class; a window exists only while every running top-class task is in a gap, and
ends at the earliest predicted gap end; a fill is chosen only if its SK (+ overhead) fits what
is left of the window, and the choice is BestPrioFit's (highest priority, then the longest that
fits, then the longest waiting); a gap is published only when SG >= ``min_gap_ms``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gshare.policy.priority.fikit import MIN_GAP_MS, best_prio_fit
from gshare.policy.priority.kernel_id import KernelId
from gshare.policy.priority.profile import KernelProfile
from gshare.policy.priority.queues import PendingLaunch, PriorityQueues, check_priority
from gshare.policy.priority.scheduler import TaskPhase


def must_yield(top_priority: int | None, priority: int) -> bool:
    """Task switching at a preemption point: a task of ``priority`` gives the device way when a
    higher class is active (``ClassPlan.revoke`` / ``fill_clients`` of ``plan_classes``)."""
    return top_priority is not None and top_priority > priority


def phase_of(runs: int, measure_runs: int) -> TaskPhase:
    """FIKIT's phase of a function whose profile holds ``runs`` measured runs (T =
    ``measure_runs``; FIKIT §2.2 Fig. 3, ``FikitConfig.measure_runs``)."""
    return TaskPhase.SHARING if runs >= measure_runs else TaskPhase.MEASURING


def fillable_kernels(profile: KernelProfile, min_gap_ms: float = MIN_GAP_MS) -> frozenset[KernelId]:
    """The kernel IDs after which the profile predicts a gap worth filling (SG >= ``min_gap_ms``):
    the only kernels after which a top-class instance publishes a gap."""
    return frozenset(
        s.kernel for s in profile.kernels() if s.gap_count > 0 and s.gap_mean_ms >= min_gap_ms
    )


# NOTE — the gap after a kernel (FIKIT §3.2, Algorithm 1 lines 3-8): the predicted idle time
# after a kernel of ID j is SG_j; gaps under 0.1 ms are skipped. Live, the gap starts when the
# kernel's work is done: at once on a CPU (the op ran in the hook's thread), after the kernel's
# remaining device time on a GPU (the op was only launched): ``kernel_left_ms``.
def gap_end_after(
    now_ms: float,
    sg_ms: float | None,
    *,
    kernel_left_ms: float = 0.0,
    min_gap_ms: float = MIN_GAP_MS,
) -> float | None:
    """Predicted end of the idle gap after a kernel that finishes ``kernel_left_ms`` after
    ``now_ms`` and has gap prediction ``sg_ms``; None when there is no gap worth filling."""
    if sg_ms is None or sg_ms < min_gap_ms:
        return None
    return now_ms + max(0.0, kernel_left_ms) + sg_ms


# NOTE — the idle window of the top class (FIKIT §3.2 "Fill inter-kernel idling time"; the
# same rule as ``FikitScheduler._window_end``): the device is idle only while every running task
# of the top class is in a gap; the window ends at the earliest of their predicted gap ends.
def window_end_ms(top_gap_ends: Iterable[float | None]) -> float | None:
    """End of the idle window the running top-class tasks leave: ``top_gap_ends`` holds, per
    running top-class task, its open gap's predicted end, or None while it runs a kernel (or is
    between kernels with no gap worth filling). None: no window (some task is busy, or none
    runs)."""
    end: float | None = None
    for g in top_gap_ends:
        if g is None:
            return None
        end = g if end is None else min(end, g)
    return end


@dataclass(frozen=True, slots=True)
class FillCandidate:
    """One instance waiting below the top class with one launch held (the board's view)."""

    client_id: str
    priority: int
    sk_ms: float | None
    """SK of its held launch (None: unknown, it cannot fill)."""
    since_ms: float
    """When its launch began to wait (the FIFO order within a priority level)."""


# NOTE — BestPrioFit over the board (FIKIT §3.2, Algorithm 2): the waiting launches of every
# instance below the top class form the priority queues (FIFO by waiting time within a level);
# ``best_prio_fit`` picks the highest level that has a launch whose SK (+ overhead) fits the
# rest of the window, and there the longest. Each waiting instance runs the same choice; only
# the one picked dispatches (the claim is serialised by the board's lock).
def choose_fill(
    candidates: Sequence[FillCandidate],
    remaining_ms: float,
    *,
    overhead_ms: float = 0.0,
) -> FillCandidate | None:
    """The candidate BestPrioFit dispatches into ``remaining_ms`` of idle window, or None."""
    if remaining_ms <= 0.0 or not candidates:
        return None
    queues = PriorityQueues()
    by_seq: dict[int, FillCandidate] = {}
    order = sorted(range(len(candidates)), key=lambda i: (candidates[i].since_ms, i))
    for seq, i in enumerate(order):
        c = candidates[i]
        check_priority(c.priority)
        by_seq[seq] = c
        queues.push(PendingLaunch(c.client_id, _BOARD_LAUNCH, c.priority, seq, c.since_ms))

    def duration_of(p: PendingLaunch) -> float | None:
        return by_seq[p.seq].sk_ms

    fit = best_prio_fit(queues, remaining_ms, duration_of, overhead_ms)
    return None if fit is None else by_seq[fit.launch.seq]


_BOARD_LAUNCH = KernelId.cpu("board-launch", [])
"""The board carries a waiting launch's SK, not its kernel id: a placeholder for the queues."""


__all__ = [
    "FillCandidate",
    "choose_fill",
    "fillable_kernels",
    "gap_end_after",
    "must_yield",
    "phase_of",
    "window_end_ms",
]
