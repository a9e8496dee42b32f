"""sim.kernels.device: NVIDIA's default time-slicing between contexts, by hand-computed timelines.

Timeslice 1.0 ms and a context switch of 0.1 ms unless stated; each expectation's arithmetic is
in the comments.
"""

from __future__ import annotations

import pytest

from gshare.sim.engine import EventLoop
from gshare.sim.kernels.device import KernelDevice, KernelJob


def run(jobs: list[tuple[float, str, float]], **kw: float) -> dict[str, list[float]]:
    """Submit ``(at_ms, context, duration_ms)`` jobs; return each context's completion times."""
    loop = EventLoop()
    dev = KernelDevice(loop, timeslice_ms=kw.get("slice", 1.0), switch_ms=kw.get("switch", 0.1))
    done: dict[str, list[float]] = {}
    for at, ctx, d in jobs:

        def submit(ctx: str = ctx, d: float = d) -> None:
            dev.submit(ctx, KernelJob(d, lambda t, c=ctx: done.setdefault(c, []).append(t)))

        loop.at(at, submit)
    loop.run()
    return done


def test_one_context_runs_fifo_and_switches_in_once() -> None:
    # the first kernel pays the switch into A (0.1), then 0.5 + 0.3 back to back: 0.6, 0.9
    assert run([(0.0, "A", 0.5), (0.0, "A", 0.3)])["A"] == pytest.approx([0.6, 0.9])


def test_contexts_with_work_alternate_by_timeslice() -> None:
    # A and B each queue four 0.4-ms kernels at 0. Switch into A (0.1); A's slice [0.1, 1.1)
    # runs 0.5, 0.9; at 0.9 the slice has 0.2 left, so the third starts and is preempted at
    # 1.1; switch to B (1.2): B runs 1.6, 2.0, then is preempted at 2.2 (0.2 done); switch to A
    # (2.3): A's preempted kernel ends 2.5, the fourth 2.9, A is done (its slice ran to 3.3):
    # switch to B (3.0): B's rest 0.2 -> 3.2, then 3.6.
    done = run([(0.0, c, 0.4) for c in "AB" for _ in range(4)])
    assert done["A"] == pytest.approx([0.5, 0.9, 2.5, 2.9])
    assert done["B"] == pytest.approx([1.6, 2.0, 3.2, 3.6])


def test_a_context_without_work_is_skipped_at_once() -> None:
    # A's kernel ends at 0.6; B's arrives at 0.2 and waits only for it (A has no more work):
    # switch 0.6 -> 0.7, B ends at 0.9. Work-conserving: no wait for A's slice to end.
    assert run([(0.0, "A", 0.5), (0.2, "B", 0.2)]) == {
        "A": [pytest.approx(0.6)],
        "B": [pytest.approx(0.9)],
    }


def test_a_newcomer_waits_for_the_running_contexts_slice() -> None:
    # A has a deep queue (ten 0.3-ms kernels); B's one kernel arrives at 0.2. A keeps the GPU
    # for its slice [0.1, 1.1): kernels end 0.4, 0.7, 1.0, the fourth is preempted at 1.1;
    # switch -> 1.2, B runs -> 1.3.
    done = run([(0.0, "A", 0.3) for _ in range(10)] + [(0.2, "B", 0.1)])
    assert done["B"] == [pytest.approx(1.3)]


def test_preempted_work_is_not_lost() -> None:
    # one 3-ms kernel of A, one 0.5-ms kernel of B at 0.5, no switch cost: A runs [0, 1), is
    # preempted; B [1, 1.5); A resumes [1.5, 3.5): the device did exactly 3.5 ms of work.
    loop = EventLoop()
    dev = KernelDevice(loop, timeslice_ms=1.0, switch_ms=0.0)
    ends: list[tuple[str, float]] = []
    dev.submit("A", KernelJob(3.0, lambda t: ends.append(("A", t))))
    loop.at(0.5, lambda: dev.submit("B", KernelJob(0.5, lambda t: ends.append(("B", t)))))
    loop.run()
    assert ends == [("B", pytest.approx(1.5)), ("A", pytest.approx(3.5))]
    assert dev.stats.busy_ms == pytest.approx(3.5)
    assert dev.stats.preemptions == 1 and dev.stats.switches == 3
