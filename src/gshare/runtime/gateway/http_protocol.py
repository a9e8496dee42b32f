"""The gateway's HTTP/1.1 connections: uvicorn's httptools protocol with the read and write
deadlines and the connection caps it does not have.

Who uses it: ``server.run_server`` passes ``guarded_protocol(...)`` to ``uvicorn.Config(http=)``.

uvicorn closes a connection that stays idle ``timeout_keep_alive`` after a response, but
nothing else: a connection that never sends a request, a request whose headers or body stop
half-way (slowloris) and any number of connections stay open for ever (docs/DESIGN.md §12.2).
What holds here (docs/DESIGN.md §5):

* a new connection must start a request within ``idle_timeout_s`` (uvicorn's keep-alive
  timeout: the same bound as between two requests);
* once a request starts, its headers and its whole body must arrive within ``read_timeout_s``;
  past it the connection is closed (the handler waiting for the body sees a disconnect and
  nothing is queued);
* at most ``max_connections`` connections are open: one more is closed at once (before
  anything is read), and counted in ``gshare_connections_refused_total`` (a connection closed
  by a deadline: ``gshare_connections_read_timeouts_total``; ``metrics.Metrics``);
* at most ``max_connections_per_client`` of them come from one client address (default: a
  quarter of ``max_connections``), so one client cannot lock the others out: its next one is
  closed at once and counted in ``gshare_connections_refused_per_client_total``;
* a client that stops reading its responses cannot hold the gateway's memory: when a
  connection's write buffer stays over the transport's high-water mark (64 KiB) for
  ``write_timeout_s``, the connection is aborted and its buffered response dropped
  (``gshare_connections_write_timeouts_total``). A response is written whole before the
  gateway waits for the buffer to drain, so what one connection holds is bounded by one
  response (itself bounded by the batch and output sizes).

The deadline is a timer armed per request, not per read: a client that sends one byte a
second cannot keep it alive.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gshare.runtime.metrics import CONNECTION_COUNTERS as COUNTERS

DEFAULT_READ_TIMEOUT_S = 30.0
"""Longest a request's headers and body may take to arrive (``gshare serve --read-timeout-s``)."""
DEFAULT_MAX_CONNECTIONS = 4096
"""Most HTTP connections open at once (``gshare serve --max-connections``)."""
DEFAULT_WRITE_TIMEOUT_S = 30.0
"""Longest a connection's response may wait for its client to read (module doc)."""


def default_per_client(max_connections: int) -> int:
    """The per-client cap when none is given: a quarter of the global cap (at least 1)."""
    return max(1, max_connections // 4)


class GuardedHttpProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` with a read deadline and a connection cap (module doc); the
    limits are class attributes set by ``guarded_protocol``."""

    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_connections_per_client: int = default_per_client(DEFAULT_MAX_CONNECTIONS)
    per_client: dict[str, int] = {}
    """Open connections by client address (one dict per ``guarded_protocol`` class)."""
    _deadline: asyncio.TimerHandle | None = None
    _write_deadline: asyncio.TimerHandle | None = None
    _counted_as: str | None = None

    def connection_made(  # type: ignore[override]  # narrowed as uvicorn's own
        self, transport: asyncio.Transport
    ) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            COUNTERS.refused += 1
            self.connections.discard(self)
            transport.abort()
            return
        peer = self.client[0] if self.client else ""
        if self.per_client.get(peer, 0) >= self.max_connections_per_client:
            COUNTERS.refused_per_client += 1
            self.connections.discard(self)
            transport.abort()
            return
        self.per_client[peer] = self.per_client.get(peer, 0) + 1
        self._counted_as = peer
        self._arm(float(self.timeout_keep_alive))

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm(self.read_timeout_s)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._disarm_write()
        peer = self._counted_as
        if peer is not None:
            self._counted_as = None
            left = self.per_client.get(peer, 1) - 1
            if left > 0:
                self.per_client[peer] = left
            else:
                self.per_client.pop(peer, None)
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_deadline is None:
            self._write_deadline = self.loop.call_later(self.write_timeout_s, self._write_expired)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._disarm_write()

    def _disarm_write(self) -> None:
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None

    def _write_expired(self) -> None:
        self._write_deadline = None
        if not self.transport.is_closing() or self.transport.get_write_buffer_size():
            COUNTERS.write_timeouts += 1
            self.transport.abort()  # drops the buffered response: its memory is freed

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


def guarded_protocol(
    read_timeout_s: float,
    max_connections: int,
    *,
    max_connections_per_client: int | None = None,
    write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S,
) -> type[GuardedHttpProtocol]:
    """A protocol class with these limits (uvicorn instantiates it per connection); its own
    per-client table. ``max_connections_per_client`` None: ``default_per_client``."""
    per_client = (
        default_per_client(max_connections)
        if max_connections_per_client is None
        else max_connections_per_client
    )
    return type(
        "GuardedHttpProtocol",
        (GuardedHttpProtocol,),
        {
            "read_timeout_s": float(read_timeout_s),
            "write_timeout_s": float(write_timeout_s),
            "max_connections": int(max_connections),
            "max_connections_per_client": int(per_client),
            "per_client": {},
        },
    )
