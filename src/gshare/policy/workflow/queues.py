"""Application-function-wise (AFW) job queues, examined round-robin (ESG §3.1, Figure 2).

ESG keeps one FIFO queue per (application, function): requests of the same function but of
different applications wait in different queues, so that each queue's jobs share an SLO and a
predecessor invoker (locality, §3.4). The controller examines the queues round-robin; when a
queue is ready, ESG_1Q configures a batch of its jobs and ESG_Dispatch places the task.

Who calls it: the controller of the simulator (and of the live runtime): ``push`` when a request
arrives (first stage) or a predecessor task completes, ``next_queue`` to pick the queue to
serve, ``take`` to remove the jobs of a dispatched batch. ``AfwQueues`` is immutable: every
operation returns a new value (the policy state is passed in and returned, docs/DESIGN.md §1).

What holds: each queue is FIFO; ``next_queue`` visits queues in registration order starting
after the one served last, so a ready queue is served within one pass over the queues
(no starvation); it returns ``None`` (and leaves the cursor) when no queue is ready.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True, order=True)
class AfwKey:
    """An AFW queue: one application's stage. ESG's applications use each function once, so a
    stage is the paper's (application, function) pair; keying by stage also covers a function
    used twice in one workflow."""

    application: str
    stage: str

    def __str__(self) -> str:
        return f"{self.application}/{self.stage}"


@dataclass(frozen=True, slots=True)
class AfwJob:
    """One job (a request at one stage) waiting in an AFW queue."""

    request_id: int
    arrival_ms: float
    """When the request arrived at the gateway (end-to-end latency starts here)."""
    enqueued_ms: float
    """When the job entered this queue (its inputs became ready)."""


ReadyFn = Callable[[AfwKey, tuple[AfwJob, ...]], bool]
"""Whether a non-empty queue may be served now (default: always)."""


@dataclass(frozen=True, slots=True)
class AfwQueues:
    """All AFW queues: ``order[i]`` holds the jobs ``jobs[i]`` (oldest first); ``cursor`` is the
    index the next round-robin scan starts at."""

    order: tuple[AfwKey, ...] = ()
    jobs: tuple[tuple[AfwJob, ...], ...] = ()
    cursor: int = 0

    def _index(self, key: AfwKey) -> int:
        try:
            return self.order.index(key)
        except ValueError:
            raise KeyError(f"no AFW queue {key}") from None

    def register(self, key: AfwKey) -> AfwQueues:
        """Add an empty queue at the end of the round-robin order (no-op if it exists)."""
        if key in self.order:
            return self
        return replace(self, order=(*self.order, key), jobs=(*self.jobs, ()))

    def push(self, key: AfwKey, job: AfwJob) -> AfwQueues:
        """Append ``job`` to ``key``'s queue (registering the queue if it is new)."""
        q = self.register(key)
        i = q._index(key)
        return replace(q, jobs=(*q.jobs[:i], (*q.jobs[i], job), *q.jobs[i + 1 :]))

    def take(self, key: AfwKey, n: int) -> tuple[tuple[AfwJob, ...], AfwQueues]:
        """Remove and return the ``n`` oldest jobs of ``key`` (fewer if the queue is shorter)."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        i = self._index(key)
        taken, rest = self.jobs[i][:n], self.jobs[i][n:]
        return taken, replace(self, jobs=(*self.jobs[:i], rest, *self.jobs[i + 1 :]))

    def jobs_of(self, key: AfwKey) -> tuple[AfwJob, ...]:
        return self.jobs[self._index(key)] if key in self.order else ()

    def length(self, key: AfwKey) -> int:
        return len(self.jobs_of(key))

    def total(self) -> int:
        return sum(len(j) for j in self.jobs)

    def oldest_wait_ms(self, key: AfwKey, now_ms: float) -> float:
        """Appendix B's ``w``: how long the oldest job of ``key`` has waited in the queue
        (0 for an empty queue)."""
        jobs = self.jobs_of(key)
        return max(0.0, now_ms - jobs[0].enqueued_ms) if jobs else 0.0


def next_queue(queues: AfwQueues, ready: ReadyFn | None = None) -> tuple[AfwKey | None, AfwQueues]:
    """The next queue to serve, round-robin: the first non-empty (and ``ready``) queue at or
    after ``queues.cursor``, wrapping around; the returned state's cursor points just past it.
    ``(None, queues)`` when no queue is ready."""
    n = len(queues.order)
    for step in range(n):
        i = (queues.cursor + step) % n
        jobs = queues.jobs[i]
        if jobs and (ready is None or ready(queues.order[i], jobs)):
            return queues.order[i], replace(queues, cursor=(i + 1) % n)
    return None, queues


def round_robin_pass(
    get_queues: Callable[[], AfwQueues],
    set_queues: Callable[[AfwQueues], None],
    blocked: Container[AfwKey],
    serve: Callable[[AfwKey], bool],
) -> bool:
    """One pass of ESG's controller round (§3.1, Figure 2): every non-empty queue not in
    ``blocked`` is served once, round-robin from the cursor (``next_queue``); True when a
    ``serve`` started a task. Who calls it: the rounds of both mechanisms — the workflow
    simulator and the live stage scheduler — which repeat passes while one made progress.
    ``serve`` may change the queues (it takes jobs): the state is read through ``get_queues``
    before every step and written back through ``set_queues``."""
    visited: set[AfwKey] = set()
    progress = False
    while True:
        key, q = next_queue(get_queues(), lambda k, _jobs: k not in visited and k not in blocked)
        set_queues(q)
        if key is None:
            return progress
        visited.add(key)
        progress |= serve(key)
