"""How a device combines FIKIT priorities with the token scheduler (``policy.tokens``).

Who calls it: a device's token server (the live node agent's, later the simulator's) on every
event that changes which clients are active — a token request, a release, a task's begin or end
— with the priority and activity of each client of the device. It returns a ``ClassPlan``: which
clients the ``TokenScheduler`` may serve now, which only run as FIKIT gap fills, and which token
holders must give their token back at their next preemption point.

NOTE — tokens × priorities (gshare's decision; FIKIT §3.1 (3): FIKIT "cannot be used together
with other schemes adopting time-division multiplexing", Gemini's among them). Both cannot own
the device's time, so they split it by level: FIKIT orders the *classes* (priorities), tokens
share the device *within* a class. The top class is the highest priority of the active clients;
its clients are served by the token scheduler exactly as today (request/limit quotas, windows,
elastic idle time, the SM adapter); clients of every lower class get no token while a client of
a higher class is active: they run only kernel by kernel, as FIKIT fills of the top class's idle
gaps (``policy.priority.scheduler``). A lower-class client holding a token when a higher class
becomes active must yield it at its next preemption point (task switching). Consequence, by
design: a quota request is guaranteed against clients of the same and lower classes only — a
best-effort function's guarantee never delays a latency-critical one (that delay is the priority
inversion FIKIT removes). With one class the plan is "everyone may ask" and the device behaves
exactly as the token scheduler alone. Why this split and the alternatives rejected:
docs/journal/priority.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gshare.policy.priority.queues import check_priority


@dataclass(frozen=True, slots=True)
class ClientClass:
    """What the plan needs to know of one client of the device."""

    client_id: str
    priority: int
    """The function spec's priority, 0-9 (higher first)."""
    active: bool
    """It has work now: a token request outstanding, a token held, or a task running."""
    holds_token: bool = False


@dataclass(frozen=True, slots=True)
class ClassPlan:
    """Who may use the device's time tokens now."""

    top_priority: int | None
    """Highest priority among the active clients (None: nobody is active)."""
    token_clients: frozenset[str]
    """Clients the token scheduler may serve: the top class (and any higher, idle one, whose
    next request makes it the top class)."""
    fill_clients: frozenset[str]
    """Clients below the top class: no token; they run only as FIKIT gap fills."""
    revoke: frozenset[str]
    """Token holders below the top class: give the token back at the next preemption point."""

    def may_request_token(self, client_id: str) -> bool:
        """Forward this client's token request to the token scheduler now?"""
        return client_id in self.token_clients


# NOTE — class plan (see the module NOTE): top = max priority of the active clients; token
# clients = priority >= top; fill clients = the rest; revoke = fill clients holding a token.
# Invariant: no client below the top class is a token client, and every token holder below it is
# revoked; with no active client every client may ask.
def plan_classes(clients: Iterable[ClientClass]) -> ClassPlan:
    """The plan of one device for the given clients (see the module docstring)."""
    cs = list(clients)
    for c in cs:
        check_priority(c.priority)
    top = max((c.priority for c in cs if c.active or c.holds_token), default=None)
    if top is None:
        return ClassPlan(None, frozenset(c.client_id for c in cs), frozenset(), frozenset())
    token = frozenset(c.client_id for c in cs if c.priority >= top)
    fill = frozenset(c.client_id for c in cs if c.priority < top)
    revoke = frozenset(c.client_id for c in cs if c.priority < top and c.holds_token)
    return ClassPlan(top, token, fill, revoke)
