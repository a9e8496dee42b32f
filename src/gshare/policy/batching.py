"""When an instance runs its next batch, and whether it keeps its token for it.

Who calls it: the instance frontends of both worlds — the simulator's ``SimInstance`` (virtual
time) and the runtime's ``InstanceServer`` batching thread (``time.perf_counter``) — every
time their queue changes or a wait ends, with the queue's length, its oldest request's arrival
time and the clock in milliseconds.

The rule (Clipper/INFless-style adaptive batching, as FaST-GShare's and ESG's frontends batch):
a batch is *ready* when the queue holds ``max_batch`` requests or its oldest request has waited
``max_wait_ms``; then it takes ``min(max_batch, queued)`` requests. Otherwise the frontend
waits until ``deadline_ms`` (or until another request arrives).

Token reuse (Gemini: a token is a time slice): after a batch the frontend keeps its token only
when the next batch is ready at once; otherwise it gives the token back at once, so that a
token never idles on a device others wait for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

TIME_EPS_MS: Final[float] = 1e-9
"""Float tolerance on the wait comparison: a request that waited ``max_wait_ms`` minus rounding
has waited ``max_wait_ms``."""


class BatchingError(ValueError):
    """A bad batching parameter; the message names it."""


@dataclass(frozen=True, slots=True)
class BatchDecision:
    """What the frontend does now."""

    take: int
    """Requests to take from the head of the queue now (0: wait)."""
    deadline_ms: float | None
    """When the oldest request will have waited ``max_wait_ms`` (None when the queue is
    empty); the frontend wakes then if ``take`` is 0."""


def next_batch(
    queued: int, oldest_arrival_ms: float | None, now_ms: float, max_batch: int, max_wait_ms: float
) -> BatchDecision:
    """The batching decision for a queue of ``queued`` requests whose oldest arrived at
    ``oldest_arrival_ms`` (module doc)."""
    if max_batch < 1:
        raise BatchingError(f"max_batch must be >= 1, got {max_batch}")
    if not max_wait_ms >= 0:
        raise BatchingError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
    if queued <= 0 or oldest_arrival_ms is None:
        return BatchDecision(0, None)
    deadline = oldest_arrival_ms + max_wait_ms
    if queued >= max_batch or now_ms - oldest_arrival_ms >= max_wait_ms - TIME_EPS_MS:
        return BatchDecision(min(max_batch, queued), deadline)
    return BatchDecision(0, deadline)


def keep_token_for_next_batch(
    queued: int, oldest_arrival_ms: float | None, now_ms: float, max_batch: int, max_wait_ms: float
) -> bool:
    """After a batch: keep the held token only when the next batch is ready now."""
    return next_batch(queued, oldest_arrival_ms, now_ms, max_batch, max_wait_ms).take > 0


__all__ = [
    "TIME_EPS_MS",
    "BatchDecision",
    "BatchingError",
    "keep_token_for_next_batch",
    "next_batch",
]
