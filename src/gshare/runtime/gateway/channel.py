"""The gateway's side of its instances: one accepted request until it is answered
(``Pending``) and the persistent connection to one instance (``InstanceChannel``, an asyncio
protocol over the instance's binary frames, ``instance.protocol``).

Who uses it: ``router.Gateway`` creates channels when the controller says an instance is ready,
sends ``Pending`` requests on them and gets every answer and every lost connection back
(``Gateway.on_response``, ``Gateway.on_channel_lost``), which decide what happens next.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gshare.runtime.gateway.errors import HttpError
from gshare.runtime.gateway.generation import parse_stats
from gshare.runtime.instance import protocol as P
from gshare.runtime.instance.lanes import ENC_IN_LANE, GatewayLanes, LaneError, send_with_fds

if TYPE_CHECKING:
    from gshare.runtime.metrics import Metrics

log = logging.getLogger("gshare.gateway")


# -- requests and instance connections ----------------------------------------------------------


@dataclass(eq=False)
class Pending:
    """One accepted request until it is answered."""

    function: str
    op: int
    enc: int
    payload: P.Payload
    arrived: float
    future: asyncio.Future[tuple[int, int, bytes, tuple[float, float, float, int]]]
    attempts: int = 0
    crashed_on: list[str] = field(default_factory=list)
    req_id: int = 0
    channel: InstanceChannel | None = None
    watcher: asyncio.Task[None] | None = None
    """Watches the client's connection once the request waits (``DISCONNECT_WATCH_S``)."""
    borrow: bool = False
    """Its caller takes an answer in a shared-memory lane as a view, not a copy, and calls
    ``release`` once it has used it (``OipService.call_borrowed``)."""
    borrowed: memoryview | None = None
    """A borrowed answer (its result's payload is then empty)."""
    release: Callable[[], None] | None = None
    """Set with a borrowed answer: gives its bytes back to the instance."""
    chunks: asyncio.Queue[tuple[bytes, int] | None] | None = None
    """A streamed request's (``OP_GENERATE``, ``gateway.streams``): its ``ST_CHUNK`` frames'
    payloads and ``batch`` fields in order, then None once its future is done (answered,
    failed or cancelled)."""


class ChannelOwner(Protocol):
    """What a channel calls back (``router.Gateway``): request ids, the answers, the loss;
    and where it counts its payload bytes."""

    metrics: Metrics

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
        pb = gateway.metrics.payload_bytes
        self._bytes_req_lane = pb.labels("request", "lane")
        self._bytes_req_socket = pb.labels("request", "socket")
        self._bytes_resp_lane = pb.labels("response", "lane")
        self._bytes_resp_socket = pb.labels("response", "socket")
        self.lanes: GatewayLanes | None = None
        """The connection's shared-memory lanes (``instance.lanes``; Unix sockets only), set
        by ``Gateway.instance_ready`` before the first request."""
        self.engine_stats: dict[str, float] = {}
        """A generative instance's last ``ST_STATS`` counters (``gateway.generation``)."""

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

    def _frame(self, p: Pending) -> bytes:
        """``p``'s request frame: its payload through the request lane when it is large and
        fits, else inline."""
        p.req_id = self.gateway.next_id()
        p.channel = self
        self.inflight[p.req_id] = p
        payload = p.payload
        if self.lanes is not None:
            parts = (payload,) if isinstance(payload, bytes) else payload
            ref = self.lanes.put_request(p.req_id, parts)
            if ref is not None:
                self._bytes_req_lane.inc(P.payload_size(payload))
                return P.encode_request(p.req_id, p.op, p.enc | ENC_IN_LANE, ref)
        data = P.payload_bytes(payload)
        self._bytes_req_socket.inc(len(data))
        return P.encode_request(p.req_id, p.op, p.enc, data)

    def send(self, p: Pending) -> None:
        assert self.transport is not None
        self.transport.write(self._frame(p))

    def send_many(self, ps: list[Pending]) -> None:
        """Send several requests in one write, so that the instance reads them together and
        runs them as one batch (the live workflow scheduler's tasks, ``gateway.stages``)."""
        assert self.transport is not None
        self.transport.write(b"".join([self._frame(p) for p in ps]))

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.reader.feed(data)
        except P.ProtocolError as e:
            log.error("instance %s sent a bad frame (%s); closing", self.instance_id, e)
            if self.transport:
                self.transport.close()
            return
        lanes = self.lanes
        for f in frames:
            req_id, status, enc, q_ms, tw_ms, ex_ms, batch = P.RESP_REST.unpack_from(f)
            payload = f[P.RESP_FIXED :]
            if status == P.ST_CHUNK or status == P.ST_STATS:
                self._stream_frame(req_id, status, payload, batch)
                continue
            p = self.inflight.pop(req_id, None)
            if lanes is not None:
                lanes.release_request(req_id)  # answered: the instance is done with its bytes
            if lanes is not None and enc & ENC_IN_LANE:
                try:
                    if p is not None and p.borrow and status == P.ST_OK and not p.future.done():
                        view, loan = lanes.borrow_response(payload)
                        p.borrowed, payload = view, b""
                        p.release = functools.partial(lanes.give_back, loan)
                        self._bytes_resp_lane.inc(len(view))
                    else:
                        payload = lanes.take_response(payload)
                        self._bytes_resp_lane.inc(len(payload))
                except LaneError as e:
                    log.error("instance %s: %s; closing", self.instance_id, e)
                    if self.transport:
                        self.transport.close()
                    return
                enc &= ~ENC_IN_LANE
            else:
                self._bytes_resp_socket.inc(len(payload))
            if p is None:
                continue  # answered already (timed out)
            if status == P.ST_CANCELLED and p.chunks is not None and not p.future.done():
                # a generation the instance stopped without being asked (it is stopping)
                msg = f"instance {self.instance_id} stopped while generating; try again"
                p.future.set_exception(HttpError(503, msg))
            p.channel = None
            self.gateway.on_response(self, p, status, enc, payload, (q_ms, tw_ms, ex_ms, batch))
        self.close_if_retired_and_idle()
        self.gateway.dispatch(self.function)

    def _stream_frame(self, req_id: int, status: int, payload: bytes, batch: int) -> None:
        """A chunk of a streamed answer to its consumer (the request stays in flight), or an
        instance's engine counters (always inline: ``instance.protocol``)."""
        if status == P.ST_STATS:
            self.engine_stats = parse_stats(payload)
            return
        self._bytes_resp_socket.inc(len(payload))
        p = self.inflight.get(req_id)
        if p is not None and p.chunks is not None and not p.future.done():
            # a stream that has begun is not re-sent elsewhere when this connection drops
            # (its client has part of the answer): the loss fails it (Gateway.on_channel_lost)
            p.attempts = max(p.attempts, 1)
            p.chunks.put_nowait((payload, batch))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.transport = None
        if self.lanes is not None:
            self.lanes.close()
        lost = list(self.inflight.values())
        self.inflight.clear()
        self.gateway.on_channel_lost(self, lost)


async def connect_unix(
    ch: InstanceChannel, uds_path: str, first: bytes, lane_mb: int
) -> tuple[socket.socket, str]:
    """A connected Unix socket to an instance (for ``ch``, ``Gateway.instance_ready``) that has
    been sent ``first`` (its ``OP_AUTH``) and, unless ``lane_mb`` is 0, the connection's
    shared-memory lanes: a ``lane_mb`` MiB request lane and a response lane half that size
    (``OP_LANES`` with their descriptors, ``instance.lanes``; set on ``ch.lanes``). Also why
    lanes could not be made (no ``memfd_create``, out of memory: the connection goes on
    without), else "". ``OSError`` when the instance cannot be reached."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    why = ""
    try:
        await loop.sock_connect(sock, uds_path)
        if lane_mb > 0:
            try:
                ch.lanes = GatewayLanes(lane_mb << 20, max(1, lane_mb // 2) << 20)
            except (OSError, LaneError) as e:
                why = str(e)
        if ch.lanes is not None:
            hello = P.encode_request(0, P.OP_LANES, P.ENC_RAW, ch.lanes.hello())
            send_with_fds(sock, first + hello, ch.lanes.fds())
            ch.lanes.close_fds()
        elif first:
            await loop.sock_sendall(sock, first)
    except BaseException:
        sock.close()
        if ch.lanes is not None:
            ch.lanes.close()
            ch.lanes = None
        raise
    return sock, why


__all__ = ["ChannelOwner", "InstanceChannel", "Pending", "connect_unix"]
