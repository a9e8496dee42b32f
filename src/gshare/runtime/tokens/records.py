"""What the token server keeps about its own work: ``TokenRecord`` (one token from grant to
release, ``TokenServer.token_records``) and the counters of ``TokenServer.stats``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """One token from grant to release, as the server saw it (``TokenServer.token_records``).

    Times are readings of the server's clock in seconds (``time.monotonic`` by default, the same
    clock in every process of the machine). The busy interval the scheduler charged is
    ``[start_s, start_s + busy_ms / 1000]``.
    """

    client_id: str
    start_s: float
    """When the token was granted."""
    end_s: float
    """When its release (or its connection's drop) was processed."""
    quota_ms: float
    """Token length granted."""
    busy_ms: float
    """Time the client reported (on a drop: the wall time since the grant)."""
    elastic: bool
    completed: bool
    dropped: bool
    """True when the connection dropped while holding the token."""


def new_stats() -> dict[str, int]:
    """The server's counters, all 0 (``TokenServer.stats`` documents them). One dict per
    server, shared by its parts (``connection.Wire``, ``dispatch.TokenDispatch``), which count
    under the server's lock."""
    return {
        "connections": 0,
        "closed": 0,
        "grants": 0,
        "released": 0,
        "dropped_tokens": 0,
        "undelivered_grants": 0,
        "errors": 0,
        "malformed": 0,
    }


__all__ = ["TokenRecord", "new_stats"]
