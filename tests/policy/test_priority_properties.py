"""policy.priority.scheduler: properties of FIKIT under random event sequences (hypothesis).

A small driver plays a device that runs dispatched kernels first come first served (the
protocol's contract) and hosts that launch their tasks' kernels; hypothesis chooses which event
happens next and how much time passes. The properties are those of the module docstring:

* a launch of the highest registered class is dispatched in the call that reports it;
* a high-priority kernel waits on the device at most behind the fills already dispatched into
  its current gap (for its first kernel: behind at most the backlog horizon of a lower task plus
  one kernel);
* every fill is predicted to end within the predicted gap it fills (so the fills of a gap add
  up to at most its length when kernels take their SK);
* with one priority class every launch is dispatched in the call that reports it (FIFO sharing);
* every launch is dispatched exactly once and the scheduler never deadlocks: a drain always ends
  with every task ended and nothing queued.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from gshare.policy.priority import (
    Dispatch,
    DispatchReason,
    FikitConfig,
    FikitScheduler,
    KernelId,
    KernelProfile,
    KernelSpan,
)

HORIZON = 0.3


def kid(i: int) -> KernelId:
    return KernelId.gpu(f"k{i}", (1, 1, 1), (1, 1, 1))


@dataclass
class Task:
    tid: str
    service: str
    priority: int
    kernels: list[int]
    started: bool = False
    ended: bool = False
    next: int = 0
    waiting: bool = False
    inflight: int = 0
    last_end: float = 0.0
    launched_first: bool = False


@dataclass
class Driver:
    s: FikitScheduler
    tasks: list[Task]
    sk: dict[int, float]
    now: float = 0.0
    device: list[tuple[str, int, DispatchReason, float, int]] = field(default_factory=list)
    """In-flight kernels in dispatch order: (task, priority, reason, dispatched at, kernel)."""
    dispatched: int = 0
    launched: int = 0
    gap_end: float | None = None
    """Predicted end of the single top task's open gap (when there is one top task)."""
    one_class: bool = False
    order: list[str] = field(default_factory=list)
    """Tasks in dispatch order (one-class runs)."""

    @property
    def top_registered(self) -> int:
        return max(t.priority for t in self.tasks)

    def apply(self, ds: list[Dispatch]) -> None:
        by_id = {t.tid: t for t in self.tasks}
        for d in ds:
            t = by_id[d.task_id]
            assert t.waiting, f"{d} dispatched a launch that is not waiting"
            t.waiting = False
            t.inflight += 1
            self.dispatched += 1
            self.device.append((t.tid, t.priority, d.reason, self.now, int(d.kernel.name[1:])))
            self.order.append(t.tid)
            if d.reason is DispatchReason.GAP_FILL and self.gap_end is not None:
                # every fill is predicted to end within the predicted gap
                assert d.predicted_end_ms <= self.gap_end + 1e-9

    def begin(self, t: Task) -> None:
        t.started = True
        self.apply(self.s.begin_task(t.tid, t.service, self.now))

    def launch(self, t: Task) -> None:
        high = t.priority == self.top_registered
        ahead = list(self.device)
        t.waiting = True
        self.launched += 1
        kernel = kid(t.kernels[t.next])
        t.next += 1
        if high:
            self.gap_end = None  # the top task's gap ends with its launch
        ds = self.s.launch(t.tid, kernel, self.now)
        if self.one_class:
            # every launch is dispatched in the call that reports it, and nothing else is
            assert [(x.task_id, x.reason) for x in ds] == [(t.tid, DispatchReason.TOP_CLASS)]
        if high:
            assert any(d.task_id == t.tid for d in ds), "a high-priority launch was held"
            # what is ahead of its previous kernel on the FIFO device delays that one already;
            # what was dispatched after it must be fills of its current gap
            mine = [i for i, x in enumerate(ahead) if x[0] == t.tid]
            after = ahead[mine[-1] + 1 :] if mine else ahead
            lower = [x for x in after if x[1] < t.priority]
            if t.launched_first:
                for _, _, reason, at, _ in lower:
                    assert reason is DispatchReason.GAP_FILL and at >= t.last_end - 1e-12
            else:
                # its first kernel: behind at most the backlog horizon plus one kernel
                backlog = sum(self.sk[k] for (_, _, _, _, k) in lower)
                assert backlog <= HORIZON + max(self.sk.values()) + 1e-9
        t.launched_first = True
        self.apply(ds)

    def complete(self) -> None:
        tid = self.device.pop(0)[0]
        t = next(x for x in self.tasks if x.tid == tid)
        t.inflight -= 1
        t.last_end = self.now
        single_top = sum(1 for x in self.tasks if x.priority == self.top_registered) == 1
        opens_gap = (
            t.priority == self.top_registered and single_top and t.inflight == 0 and not t.waiting
        )
        if opens_gap:
            sg = self.s.sg_ms(t.service, kid(t.kernels[t.next - 1]))
            self.gap_end = None if sg is None else self.now + sg
        self.apply(self.s.complete(tid, self.now))

    def end(self, t: Task) -> None:
        t.ended = True
        if t.priority == self.top_registered:
            self.gap_end = None
        self.apply(self.s.end_task(t.tid, self.now))

    def step(self, action: int, pick: int) -> None:
        ts = self.tasks
        if action == 0:
            c = [t for t in ts if not t.started]
            if c:
                self.begin(c[pick % len(c)])
        elif action == 1:
            c = [t for t in ts if t.started and not t.ended and not t.waiting]
            c = [t for t in c if t.next < len(t.kernels)]
            if c:
                self.launch(c[pick % len(c)])
        elif action == 2:
            if self.device:
                self.complete()
        else:
            c = [t for t in ts if t.started and not t.ended and not t.waiting]
            c = [t for t in c if t.next == len(t.kernels) and t.inflight == 0]
            if c:
                self.end(c[pick % len(c)])

    def drain(self) -> None:
        for _ in range(10_000):
            self.now += 0.05
            if self.device:
                self.complete()
                continue
            c = [t for t in self.tasks if t.started and not t.ended and not t.waiting]
            la = [t for t in c if t.next < len(t.kernels)]
            if la:
                self.launch(la[0])
                continue
            en = [t for t in c if t.next == len(t.kernels) and t.inflight == 0]
            if en:
                self.end(en[0])
                continue
            ns = [t for t in self.tasks if not t.started]
            if ns:
                self.begin(ns[0])
                continue
            break
        assert all(t.ended for t in self.tasks), "deadlock: launches wait forever"
        assert self.s.snapshot().queued == 0 and self.dispatched == self.launched


SERVICES = st.lists(
    st.tuples(
        st.integers(0, 9),
        st.lists(st.integers(0, 5), min_size=1, max_size=6),
        st.integers(1, 2),
    ),
    min_size=1,
    max_size=4,
)
STATS = st.lists(st.tuples(st.floats(0.01, 1.0), st.floats(0.0, 2.0)), min_size=6, max_size=6)
STEPS = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 7), st.floats(0.0, 1.0)), max_size=120)


def build(
    services: list[tuple[int, list[int], int]],
    stats: list[tuple[float, float]],
    one_class: bool = False,
) -> Driver:
    s = FikitScheduler(FikitConfig(measure_runs=1, backlog_horizon_ms=HORIZON))
    sk = {i: d for i, (d, _) in enumerate(stats)}
    tasks = []
    for n, (prio, kernels, count) in enumerate(services):
        p = KernelProfile(f"s{n}")
        spans, t = [], 0.0
        for i, (d, g) in enumerate(stats):  # every kernel once, each followed by its gap
            spans.append(KernelSpan(kid(i), t, t + d))
            t += d + g
        spans.append(KernelSpan(kid(0), t, t + stats[0][0]))
        p.add_run(spans)
        prio = 5 if one_class else prio
        s.add_service(f"s{n}", prio, p)
        for c in range(count):
            tasks.append(Task(f"s{n}#{c}", f"s{n}", prio, list(kernels)))
    return Driver(s, tasks, sk, one_class=one_class)


@settings(max_examples=150, deadline=None)
@given(services=SERVICES, stats=STATS, steps=STEPS)
def test_fikit_invariants_under_random_events(
    services: list[tuple[int, list[int], int]],
    stats: list[tuple[float, float]],
    steps: list[tuple[int, int, float]],
) -> None:
    d = build(services, stats)
    for action, pick, dt in steps:
        d.now += dt
        d.step(action, pick)
    d.drain()


@settings(max_examples=100, deadline=None)
@given(services=SERVICES, stats=STATS, steps=STEPS)
def test_one_priority_class_is_fifo_sharing(
    services: list[tuple[int, list[int], int]],
    stats: list[tuple[float, float]],
    steps: list[tuple[int, int, float]],
) -> None:
    d = build(services, stats, one_class=True)
    launched: list[str] = []
    real_launch = d.launch

    def launch(t: Task) -> None:
        launched.append(t.tid)
        real_launch(t)

    d.launch = launch  # type: ignore[method-assign]
    for action, pick, dt in steps:
        d.now += dt
        d.step(action, pick)
    d.drain()
    assert d.order == launched  # dispatch order is launch order: FIFO sharing
