"""Which instance of a function takes the next request.

Who calls it: the gateways of both worlds for every request they dispatch — the simulator's
``sim.gateway.Gateway`` and the runtime's ``runtime.gateway.router.Gateway`` — with one
``Candidate`` per instance of the function that is not draining.

The rule (join the shortest queue, as FaST-GShare's gateway balances its pods): among the
*ready* candidates with room (``outstanding < cap``), the one with the fewest outstanding
requests; ties go to the first such candidate at or after ``start`` in the given order
(cyclically), so a caller that sorts by instance id and passes ``start=0`` breaks ties by id,
and one that rotates ``start`` spreads them round-robin. When no ready candidate has room:
with ``wait_at_starting`` the least loaded *starting* candidate takes the request (it queues
there until its cold start ends — the simulator's instances have their own queues); otherwise
``None`` (the request waits at the gateway — the runtime has no channel to a starting
instance).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Candidate:
    """An instance as the router sees it."""

    outstanding: int
    """Requests sent to it and not answered (queued at it or running)."""
    ready: bool = True
    """Cold start finished (and, live, its connection is up)."""
    cap: int | None = None
    """Most outstanding requests it may hold (None: no cap)."""


def choose_instance(
    candidates: Sequence[Candidate], start: int = 0, *, wait_at_starting: bool = False
) -> int | None:
    """Index into ``candidates`` of the instance that takes the request, or None (module doc)."""
    n = len(candidates)
    best: int | None = None
    best_load = 0
    for k in range(n):
        i = (start + k) % n
        c = candidates[i]
        has_room = c.cap is None or c.outstanding < c.cap
        if c.ready and has_room and (best is None or c.outstanding < best_load):
            best, best_load = i, c.outstanding
    if best is not None or not wait_at_starting:
        return best
    for k in range(n):
        i = (start + k) % n
        c = candidates[i]
        if not c.ready and (best is None or c.outstanding < best_load):
            best, best_load = i, c.outstanding
    return best


__all__ = ["Candidate", "choose_instance"]
