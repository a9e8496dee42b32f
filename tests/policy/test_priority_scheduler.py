"""policy.priority.scheduler: FIKIT's state machine, table-driven (§3.2).

Every test drives ``FikitScheduler`` directly with the time passed in. Profiles are built from
synthetic runs so that each kernel has a chosen SK and SG (``prof``); the arithmetic of each
expectation is in the comments. Service ``A`` is the high-priority one (9), ``B`` / ``C`` are
lower. ``T`` (``measure_runs``) is 1 so a one-run profile is complete.
"""

from __future__ import annotations

import pytest

from gshare.policy.priority import (
    Dispatch,
    DispatchReason,
    FikitConfig,
    FikitScheduler,
    KernelId,
    KernelProfile,
    KernelSpan,
    SchedulerError,
    TaskPhase,
)


def k(name: str) -> KernelId:
    return KernelId.gpu(name, (1, 1, 1), (1, 1, 1))


def prof(name: str, stats: dict[str, tuple[float, float]], runs: int = 1) -> KernelProfile:
    """A profile where kernel ``n`` has SK ``stats[n][0]`` and SG ``stats[n][1]``: each run is
    every kernel followed by its gap, then a last kernel ``end`` (which carries no gap)."""
    p = KernelProfile(name)
    for _ in range(runs):
        spans, t = [], 0.0
        for n, (sk, sg) in stats.items():
            spans.append(KernelSpan(k(n), t, t + sk))
            t += sk + sg
        spans.append(KernelSpan(k("end"), t, t + 0.01))
        p.add_run(spans)
    return p


def sched(**cfg: object) -> FikitScheduler:
    cfg.setdefault("measure_runs", 1)
    return FikitScheduler(FikitConfig(**cfg))  # type: ignore[arg-type]


def names(ds: list[Dispatch]) -> list[tuple[str, str, DispatchReason]]:
    return [(d.task_id, d.kernel.name, d.reason) for d in ds]


TOP, FILL, RES = DispatchReason.TOP_CLASS, DispatchReason.GAP_FILL, DispatchReason.RESUMED


def two(**cfg: object) -> FikitScheduler:
    """A (9): a1 SK 1.0 then a gap of 2.0; a2 SK 1.0 then 0.05. B (2): b1 0.8, b2 0.5, b3 1.5."""
    s = sched(**cfg)
    s.add_service("A", 9, prof("A", {"a1": (1.0, 2.0), "a2": (1.0, 0.05)}))
    s.add_service("B", 2, prof("B", {"b1": (0.8, 0.0), "b2": (0.5, 0.0), "b3": (1.5, 0.0)}))
    s.begin_task("A#0", "A", 0.0)
    s.begin_task("B#0", "B", 0.0)
    return s


def test_high_runs_at_once_low_waits_then_fills_the_gap() -> None:
    s = two()
    # A is the top class: a1 goes at once, predicted to end at 0 + 1.0
    d = s.launch("A#0", k("a1"), 0.0)
    assert names(d) == [("A#0", "a1", TOP)] and d[0].predicted_end_ms == pytest.approx(1.0)
    # B's b1 waits: A holds the GPU and is not in a gap (a1 runs)
    assert s.launch("B#0", k("b1"), 0.1) == []
    # a1 completes at 1.0: gap SG(a1) = 2.0 opens; BestPrioFit: b1 (0.8) fits (left 1.2)
    d = s.complete("A#0", 1.0)
    assert names(d) == [("B#0", "b1", FILL)]
    assert d[0].predicted_end_ms == pytest.approx(1.8)
    # B's next launch at 1.3 while b1 runs: the gap ends at 3.0, the device is busy until 1.8:
    # 3.0 - 1.8 = 1.2 left; b2 (0.5) fits -> device busy until 2.3
    assert names(s.launch("B#0", k("b2"), 1.3)) == [("B#0", "b2", FILL)]
    s.complete("B#0", 1.8)
    s.complete("B#0", 2.3)
    # b3 (1.5) does not fit the 3.0 - 2.4 = 0.6 left at 2.4: it waits
    assert s.launch("B#0", k("b3"), 2.4) == []
    c = s.snapshot().services
    assert c["B"].counters.fills == 2 and c["A"].counters.gaps_filled == 1


def test_a_gap_under_min_gap_is_skipped() -> None:
    s = two()
    s.add_service("C", 1, prof("C", {"c1": (0.01, 0.0)}))
    s.begin_task("C#0", "C", 0.0)
    s.launch("A#0", k("a2"), 0.0)
    s.launch("C#0", k("c1"), 0.0)
    # SG(a2) = 0.05 < 0.1: the gap is skipped although c1 (0.01) would fit it
    assert s.complete("A#0", 1.0) == []
    assert s.snapshot().services["A"].counters.gaps_skipped == 1


def test_runtime_feedback_the_next_high_launch_ends_the_gap() -> None:
    s = two()
    s.launch("A#0", k("a1"), 0.0)
    s.launch("B#0", k("b2"), 0.0)
    assert names(s.complete("A#0", 1.0)) == [("B#0", "b2", FILL)]  # gap 1.0-3.0, b2 till 1.5
    # A launches a2 at 1.2, long before the predicted 3.0: dispatched at once (behind b2 on the
    # device: predicted end 1.5 + 1.0 = 2.5) ...
    d = s.launch("A#0", k("a2"), 1.2)
    assert names(d) == [("A#0", "a2", TOP)] and d[0].predicted_end_ms == pytest.approx(2.5)
    # ... and the gap is over: B's next launch is not filled although 3.0 was predicted
    assert s.launch("B#0", k("b1"), 1.3) == []
    assert s.snapshot().services["A"].counters.gaps_cut == 1  # b2 was still on the device


@pytest.mark.parametrize(
    ("alpha", "corrected"),
    [
        (0.0, 2.0),  # no learning: SG(a1) stays the profile's 2.0
        (0.5, 1.1),  # observed gap 1.2 - 1.0 = 0.2: 0.5 x 2.0 + 0.5 x 0.2 = 1.1
        (1.0, 0.2),  # the last observation
    ],
)
def test_runtime_feedback_corrects_the_gap_prediction(alpha: float, corrected: float) -> None:
    s = two(gap_feedback_alpha=alpha)
    s.launch("A#0", k("a1"), 0.0)
    s.complete("A#0", 1.0)
    s.launch("A#0", k("a2"), 1.2)
    assert s.sg_ms("A", k("a1")) == pytest.approx(corrected)


def test_task_switching_a_later_high_task_goes_before_the_low_tasks_next_kernel() -> None:
    s = sched(backlog_horizon_ms=10.0)
    s.add_service("A", 9, prof("A", {"a1": (1.0, 0.0)}))
    s.add_service("B", 2, prof("B", {"b1": (0.5, 0.0), "b2": (0.5, 0.0)}))
    s.begin_task("B#0", "B", 0.0)
    # B alone is the top class: b1 goes at once
    assert names(s.launch("B#0", k("b1"), 0.0)) == [("B#0", "b1", TOP)]
    # A begins at 0.2: the top class is now 9; B's next launch is held (a preemption)
    s.begin_task("A#0", "A", 0.2)
    assert s.launch("B#0", k("b2"), 0.3) == []
    assert s.snapshot().services["B"].counters.preemptions == 1
    # A's launch goes at once, queued on the device behind b1 only (ends 0.5, then 1.5)
    d = s.launch("A#0", k("a1"), 0.4)
    assert names(d) == [("A#0", "a1", TOP)] and d[0].predicted_end_ms == pytest.approx(1.5)
    s.complete("B#0", 0.5)
    s.complete("A#0", 1.5)
    # A ends: B is the top class again and its held launch resumes
    assert names(s.end_task("A#0", 1.5)) == [("B#0", "b2", RES)]


def test_equal_priorities_interleave_in_launch_order() -> None:
    s = sched()
    for n in ("A", "B"):
        s.add_service(n, 5, prof(n, {"x": (1.0, 5.0)}))
        s.begin_task(f"{n}#0", n, 0.0)
    order = []
    for t, who in enumerate(["A#0", "B#0", "B#0", "A#0"]):
        d = s.launch(who, k("x"), float(t))
        assert [x.reason for x in d] == [TOP]  # one class: every launch at once (FIFO)
        order.append(d[0].task_id)
    assert order == ["A#0", "B#0", "B#0", "A#0"]


def test_the_window_is_the_shortest_gap_of_the_top_class() -> None:
    # Two top tasks: A in a gap of 2.0, A2 in a gap of 0.6 -> the window is 0.6: b1 (0.8) does
    # not fit, b2 (0.5) does.
    s = sched()
    s.add_service("A", 9, prof("A", {"a1": (1.0, 2.0)}))
    s.add_service("A2", 9, prof("A2", {"c1": (1.0, 0.6)}))
    s.add_service("B", 2, prof("B", {"b1": (0.8, 0.0), "b2": (0.5, 0.0)}))
    s.add_service("C", 2, prof("C", {"b1": (0.8, 0.0), "b2": (0.5, 0.0)}))
    for t, svc in (("A#0", "A"), ("A2#0", "A2"), ("B#0", "B"), ("C#0", "C")):
        s.begin_task(t, svc, 0.0)
    s.launch("A#0", k("a1"), 0.0)
    s.launch("A2#0", k("c1"), 0.0)  # FIFO behind a1: ends at 2.0
    s.launch("B#0", k("b1"), 0.0)
    s.launch("C#0", k("b2"), 0.0)
    assert s.complete("A#0", 1.0) == []  # A2's kernel still runs: no window yet
    assert names(s.complete("A2#0", 2.0)) == [("C#0", "b2", FILL)]  # window 2.0 .. 2.6


def test_measuring_services_neither_fill_nor_get_filled() -> None:
    s = sched(measure_runs=2)
    s.add_service("A", 9, prof("A", {"a1": (1.0, 2.0)}, runs=1))  # 1 of 2 runs: measuring
    s.add_service("B", 2, prof("B", {"b1": (0.1, 0.0)}, runs=2))
    s.add_service("C", 3, None)  # no profile at all
    assert s.phase("A") is TaskPhase.MEASURING and s.phase("B") is TaskPhase.SHARING
    for t, svc in (("A#0", "A"), ("B#0", "B"), ("C#0", "C")):
        s.begin_task(t, svc, 0.0)
    s.launch("A#0", k("a1"), 0.0)
    s.launch("B#0", k("b1"), 0.0)
    s.launch("C#0", k("c1"), 0.0)
    assert s.complete("A#0", 1.0) == []  # A's gap is unknown while it measures
    assert s.snapshot().services["A"].counters.gaps_skipped == 1
    # the mechanism adds A's second measured run: A is profiled, its next gap is filled by B
    # (C's kernel has no SK: it never fills)
    s.profile("A").add_run([KernelSpan(k("a1"), 0.0, 1.0), KernelSpan(k("end"), 3.0, 3.1)])
    assert s.phase("A") is TaskPhase.SHARING
    s.launch("A#0", k("a1"), 1.5)
    assert names(s.complete("A#0", 2.5)) == [("B#0", "b1", FILL)]


def test_the_backlog_horizon_bounds_a_best_effort_task_running_alone() -> None:
    # B (2) runs alone but A (9) is registered: B may keep at most 0.2 ms queued on the device.
    s = sched(backlog_horizon_ms=0.2)
    s.add_service("A", 9, prof("A", {"a1": (1.0, 0.0)}))
    s.add_service("B", 2, prof("B", {"b1": (0.15, 0.0), "b2": (0.15, 0.0)}))
    s.begin_task("B#0", "B", 0.0)
    assert names(s.launch("B#0", k("b1"), 0.0)) == [("B#0", "b1", TOP)]  # backlog 0 -> 0.15
    # at 0.0 the backlog is 0.15 <= 0.2: b2 goes too (backlog 0.30)
    assert names(s.launch("B#0", k("b2"), 0.0)) == [("B#0", "b2", TOP)]
    # a third at 0.05: backlog 0.30 - 0.05 = 0.25 > 0.2: held
    assert s.launch("B#0", k("b1"), 0.05) == []
    # the first completes at 0.15: backlog now 0.15 (the second's): released
    assert [x.reason for x in s.complete("B#0", 0.15)] == [DispatchReason.BACKLOG]
    # the highest registered class is never held, whatever the backlog
    s.begin_task("A#0", "A", 0.2)
    assert [x.reason for x in s.launch("A#0", k("a1"), 0.2)] == [TOP]


def test_protocol_errors_are_named() -> None:
    s = two()
    with pytest.raises(SchedulerError, match="unknown task"):
        s.launch("X", k("a1"), 0.0)
    with pytest.raises(SchedulerError, match="unknown service"):
        s.begin_task("X#0", "X", 0.0)
    with pytest.raises(SchedulerError, match="already running"):
        s.begin_task("A#0", "A", 0.0)
    s.launch("B#0", k("b1"), 0.0)
    with pytest.raises(SchedulerError, match="waits"):
        s.launch("B#0", k("b2"), 0.0)
    with pytest.raises(SchedulerError, match="not dispatched"):
        s.complete("A#0", 0.0)
    s.launch("A#0", k("a1"), 0.0)
    with pytest.raises(SchedulerError, match="in flight"):
        s.end_task("A#0", 0.5)
    with pytest.raises(SchedulerError, match="already registered"):
        s.add_service("A", 9)
    with pytest.raises(ValueError, match="priority"):
        s.add_service("Z", 10)
    with pytest.raises(SchedulerError):
        FikitConfig(gap_feedback_alpha=2.0)
