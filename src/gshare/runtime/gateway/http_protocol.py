"""The gateway's HTTP/1.1 connections: uvicorn's httptools protocol with the read deadlines
and the connection cap it does not have.

Who uses it: ``server.run_server`` passes ``guarded_protocol(...)`` to ``uvicorn.Config(http=)``.

uvicorn closes a connection that stays idle ``timeout_keep_alive`` after a response, but
nothing else: a connection that never sends a request, a request whose headers or body stop
half-way (slowloris) and any number of connections stay open for ever (issue 15, item 11).
What holds here (docs/DESIGN.md §5):

* a new connection must start a request within ``idle_timeout_s`` (uvicorn's keep-alive
  timeout: the same bound as between two requests);
* once a request starts, its headers and its whole body must arrive within ``read_timeout_s``;
  past it the connection is closed (the handler waiting for the body sees a disconnect and
  nothing is queued);
* at most ``max_connections`` connections are open: one more is closed at once (before
  anything is read), and counted in ``gshare_connections_refused_total`` (a connection closed
  by a deadline: ``gshare_connections_read_timeouts_total``; ``metrics.Metrics``).

The deadline is a timer armed per request, not per read: a client that sends one byte a
second cannot keep it alive.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

DEFAULT_READ_TIMEOUT_S = 30.0
"""Longest a request's headers and body may take to arrive (``gshare serve --read-timeout-s``)."""
DEFAULT_MAX_CONNECTIONS = 4096
"""Most HTTP connections open at once (``gshare serve --max-connections``)."""


class _Counters:
    refused = 0
    read_timeouts = 0


COUNTERS = _Counters()
"""Connections refused over the cap and closed by the read deadline (``/metrics``)."""


class GuardedHttpProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` with a read deadline and a connection cap (module doc); the
    limits are class attributes set by ``guarded_protocol``."""

    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            COUNTERS.refused += 1
            self.connections.discard(self)
            transport.abort()
            return
        self._arm(float(self.timeout_keep_alive))

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm(self.read_timeout_s)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, delay_s: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(delay_s, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            COUNTERS.read_timeouts += 1
            self.transport.close()


def guarded_protocol(read_timeout_s: float, max_connections: int) -> type[GuardedHttpProtocol]:
    """A protocol class with these limits (uvicorn instantiates it per connection)."""
    return type(
        "GuardedHttpProtocol",
        (GuardedHttpProtocol,),
        {"read_timeout_s": float(read_timeout_s), "max_connections": int(max_connections)},
    )
