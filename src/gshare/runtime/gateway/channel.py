"""The gateway's side of its instances: one accepted request until it is answered
(``Pending``) and the persistent connection to one instance (``InstanceChannel``, an asyncio
protocol over the instance's binary frames, ``instance.protocol``).

Who uses it: ``router.Gateway`` creates channels when the controller says an instance is ready,
sends ``Pending`` requests on them and gets every answer and every lost connection back
(``Gateway.on_response``, ``Gateway.on_channel_lost``), which decide what happens next.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Protocol

from gshare.runtime.instance import protocol as P

log = logging.getLogger("gshare.gateway")


# -- requests and instance connections ----------------------------------------------------------


@dataclass(eq=False)
class Pending:
    """One accepted request until it is answered."""

    function: str
    op: int
    enc: int
    payload: bytes
    arrived: float
    future: asyncio.Future[tuple[int, int, bytes, tuple[float, float, float, int]]]
    attempts: int = 0
    crashed_on: list[str] = field(default_factory=list)
    req_id: int = 0
    channel: InstanceChannel | None = None
    watcher: asyncio.Task[None] | None = None
    """Watches the client's connection once the request waits (``DISCONNECT_WATCH_S``)."""


class ChannelOwner(Protocol):
    """What a channel calls back (``router.Gateway``): request ids, the answers, the loss."""

    def next_id(self) -> int: ...

    def on_response(
        self,
        ch: InstanceChannel,
        p: Pending,
        status: int,
        enc: int,
        payload: bytes,
        m: tuple[float, float, float, int],
    ) -> None: ...

    def dispatch(self, function: str) -> None: ...

    def on_channel_lost(self, ch: InstanceChannel, lost: list[Pending]) -> None: ...


class InstanceChannel(asyncio.Protocol):
    """The gateway's persistent connection to one instance (incarnation)."""

    def __init__(self, gateway: ChannelOwner, function: str, instance_id: str, cap: int) -> None:
        self.gateway = gateway
        self.function = function
        self.instance_id = instance_id
        self.cap = cap
        self.inflight: dict[int, Pending] = {}
        self.transport: asyncio.Transport | None = None
        self.reader = P.FrameReader(P.RESP_FIXED)
        self.closed = False
        self.draining = False
        self.retired = False
        """Replaced by a new connection to the same instance id: closed once its in-flight
        requests are answered (``Gateway._retire_channel``)."""

    def close_if_retired_and_idle(self) -> None:
        """A retired connection closes once nothing is in flight on it."""
        if self.retired and not self.inflight and self.transport is not None:
            self.transport.close()

    @property
    def usable(self) -> bool:
        return not self.closed and not self.draining and self.transport is not None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport
        P.set_nodelay(transport)

    def send(self, p: Pending) -> None:
        assert self.transport is not None
        p.req_id = self.gateway.next_id()
        p.channel = self
        self.inflight[p.req_id] = p
        self.transport.write(P.encode_request(p.req_id, p.op, p.enc, p.payload))

    def send_many(self, ps: list[Pending]) -> None:
        """Send several requests in one write, so that the instance reads them together and
        runs them as one batch (the live workflow scheduler's tasks, ``gateway.stages``)."""
        assert self.transport is not None
        frames = []
        for p in ps:
            p.req_id = self.gateway.next_id()
            p.channel = self
            self.inflight[p.req_id] = p
            frames.append(P.encode_request(p.req_id, p.op, p.enc, p.payload))
        self.transport.write(b"".join(frames))

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.reader.feed(data)
        except P.ProtocolError as e:
            log.error("instance %s sent a bad frame (%s); closing", self.instance_id, e)
            if self.transport:
                self.transport.close()
            return
        for f in frames:
            req_id, status, enc, q_ms, tw_ms, ex_ms, batch = P.RESP_REST.unpack_from(f)
            p = self.inflight.pop(req_id, None)
            if p is None:
                continue  # answered already (timed out)
            p.channel = None
            self.gateway.on_response(
                self, p, status, enc, f[P.RESP_FIXED :], (q_ms, tw_ms, ex_ms, batch)
            )
        self.close_if_retired_and_idle()
        self.gateway.dispatch(self.function)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.transport = None
        lost = list(self.inflight.values())
        self.inflight.clear()
        self.gateway.on_channel_lost(self, lost)


__all__ = ["ChannelOwner", "InstanceChannel", "Pending"]
