"""Priority queues of intercepted kernel launches, in gshare's priority order.

Who calls it: ``policy.priority.scheduler`` (it pushes every launch it holds, and
``policy.priority.fikit`` dequeues the ones chosen to fill a gap).

NOTE — priority order (FIKIT §3.2, Fig. 7: ten queues Q0..Q9, Q0 the highest, scanned from
Q0 to Q9; within a queue launches keep their arrival order). gshare's function spec has
``priority`` 0..9 with 9 the highest (the token scheduler serves higher first, too), so level p
is the paper's queue Q(9 - p): ``paper_queue(9) == 0``. Levels are scanned from 9 down to 0 and
each level is FIFO (launch order; ``PendingLaunch.seq`` is the tie-break everywhere).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from gshare.policy.priority.kernel_id import KernelId

MIN_PRIORITY: Final[int] = 0
MAX_PRIORITY: Final[int] = 9
PRIORITY_LEVELS: Final[int] = MAX_PRIORITY - MIN_PRIORITY + 1


class PriorityError(ValueError):
    """A priority outside 0..9."""


def check_priority(priority: int) -> int:
    if not (MIN_PRIORITY <= priority <= MAX_PRIORITY):
        raise PriorityError(f"priority must be in {MIN_PRIORITY}..{MAX_PRIORITY}, got {priority}")
    return priority


def paper_queue(priority: int) -> int:
    """The paper's queue index Qi of gshare priority ``priority`` (9 -> Q0, 0 -> Q9)."""
    return MAX_PRIORITY - check_priority(priority)


@dataclass(frozen=True, slots=True)
class PendingLaunch:
    """A launch the scheduler holds: the task's host thread waits until it is dispatched."""

    task_id: str
    kernel: KernelId
    priority: int
    seq: int
    """Arrival order over all launches of one scheduler (FIFO tie-break)."""
    at_ms: float
    """When the launch was intercepted."""


@dataclass(slots=True)
class PriorityQueues:
    """One FIFO per priority level; iteration goes from the highest level to the lowest."""

    _levels: list[list[PendingLaunch]] = field(
        default_factory=lambda: [[] for _ in range(PRIORITY_LEVELS)]
    )
    _size: int = 0

    def push(self, launch: PendingLaunch) -> None:
        self._levels[check_priority(launch.priority)].append(launch)
        self._size += 1

    def remove(self, launch: PendingLaunch) -> None:
        """Dequeue ``launch`` (it must be queued)."""
        self._levels[launch.priority].remove(launch)
        self._size -= 1

    def levels(self) -> Iterator[tuple[int, list[PendingLaunch]]]:
        """Non-empty levels as ``(priority, launches in FIFO order)``, highest priority first.
        The lists are the queue's own: do not mutate them while iterating."""
        for p in range(MAX_PRIORITY, MIN_PRIORITY - 1, -1):
            if self._levels[p]:
                yield p, self._levels[p]

    def of_task(self, task_id: str) -> list[PendingLaunch]:
        return [x for lvl in self._levels for x in lvl if x.task_id == task_id]

    def at_level(self, priority: int) -> list[PendingLaunch]:
        return list(self._levels[check_priority(priority)])

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[PendingLaunch]:
        for _, lvl in self.levels():
            yield from lvl
