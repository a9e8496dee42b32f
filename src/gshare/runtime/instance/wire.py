"""An instance's data path on the wire: the gateway connections and the IO thread that serves them.

Who calls it: ``instance.server.InstanceServer`` owns one ``DataPath`` (cold-start step 4). Its
IO thread runs an asyncio loop with a Unix-domain listener (and a TCP one when the gateway runs
on another node); each accepted connection is a ``Conn``, which parses ``instance.protocol``
request frames, answers ``OP_CONTROL`` / ``OP_CANCEL`` at once through its owner (``ConnOwner``)
and hands every request to it as an ``Item`` (``enqueue``). The batching thread writes the
responses back with ``DataPath.send`` (one loop wake-up per batch); ``json_default`` is how a
handler's output is JSON-encoded.

What must hold: a ``Conn``'s transport is touched only on the IO thread (other threads go through
``send`` or ``loop.call_soon_threadsafe``); a connection — Unix socket or TCP — carries nothing
until its first frame (``OP_AUTH``) proved the channel secret, when the instance has one;
``DataPath.start`` returns only once the listeners are bound (or raises why they are not).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gshare.runtime.instance import protocol as P
from gshare.runtime.instance.lanes import (
    ENC_IN_LANE,
    LANES_MSG,
    InstanceLanes,
    LaneError,
    close_fds,
    recv_with_fds,
)
from gshare.runtime.instance.launch import InstanceLaunch

if TYPE_CHECKING:
    from gshare.runtime.oip.payload import OipCall

log = logging.getLogger("gshare.runtime.instance.server")
"""The instance server's logger (its parts log under the server's name)."""


class ConnOwner(Protocol):
    """What a ``Conn`` calls on the IO thread (``InstanceServer``)."""

    draining: bool

    def control(self, req_id: int, payload: bytes) -> bytes: ...

    def cancel(self, conn: Conn, req_id: int) -> bool: ...

    def enqueue(self, items: list[Item]) -> None: ...


@dataclass
class Item:
    req_id: int
    op: int
    enc: int
    payload: bytes | memoryview
    """Inline: a view of the frame; through a lane: a view of the lane (``instance.lanes``),
    valid until the request is answered."""
    writer: Conn
    arrived: float
    ctx: OipCall | None = None
    """An OIP request's context (``oip.payload.OipCall``), from ``_decode`` to ``_encode``."""


class Conn(asyncio.Protocol):
    """One gateway connection on the instance's IO loop."""

    def __init__(
        self,
        server: ConnOwner,
        secret: str = "",
        first: bytes = b"",
        fds: list[int] | None = None,
    ) -> None:
        self.server = server
        self.reader = P.FrameReader(P.REQ_FIXED)
        self.transport: asyncio.Transport | None = None
        self.secret = secret.encode()
        """Non-empty until the connection's ``OP_AUTH`` frame proved it (every connection of
        an instance launched with a channel secret)."""
        self.lanes: InstanceLanes | None = None
        """The connection's shared-memory lanes, once its ``OP_LANES`` frame mapped them."""
        self._first = first
        """What the accept already read (``DataPath._first_read``), fed at ``connection_made``."""
        self._fds = fds or []
        """Descriptors passed with that first read, for ``OP_LANES`` (closed once used)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport
        P.set_nodelay(transport)
        first, self._first = self._first, b""
        if first:
            self.data_received(first)
        self._close_fds()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._close_fds()

    def _close_fds(self) -> None:
        close_fds(self._fds)
        self._fds = []

    def _bad(self, why: str) -> None:
        log.warning("instance: %s; the connection is closed", why)
        if self.transport:
            self.transport.close()

    def _map_lanes(self, payload: bytes | memoryview) -> None:
        try:
            if len(payload) != LANES_MSG.size:
                raise LaneError(f"OP_LANES carries {LANES_MSG.size} bytes, not {len(payload)}")
            req_bytes, resp_bytes = LANES_MSG.unpack_from(payload)
            self.lanes = InstanceLanes(self._fds, req_bytes, resp_bytes)
        except (LaneError, OSError, ValueError) as e:
            log.warning("instance: no shared-memory lanes on this connection (%s)", e)
        self._close_fds()

    def response_frame(
        self,
        req_id: int,
        status: int,
        enc: int,
        data: bytes | Sequence[bytes | memoryview],
        queue_ms: float = 0.0,
        token_wait_ms: float = 0.0,
        exec_ms: float = 0.0,
        batch: int = 0,
    ) -> bytes:
        """A response frame for this connection (``data``: the payload, or its parts in
        order): the payload through the response lane when it is large and fits (batching
        thread only: the lane is allocated in frame order), else inline."""
        parts = (data,) if isinstance(data, bytes) else data
        lanes = self.lanes
        if lanes is not None:
            ref = lanes.put_response(parts)
            if ref is not None:
                return P.encode_response(
                    req_id, status, enc | ENC_IN_LANE, ref, queue_ms, token_wait_ms, exec_ms, batch
                )
        payload = data if isinstance(data, bytes) else b"".join(data)
        return P.encode_response(
            req_id, status, enc, payload, queue_ms, token_wait_ms, exec_ms, batch
        )

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.reader.feed(data)
        except P.ProtocolError:
            if self.transport:
                self.transport.close()
            return
        now = time.perf_counter()
        srv = self.server
        items: list[Item] = []
        for f in frames:
            req_id, op, enc = P.REQ_REST.unpack_from(f)
            payload: bytes | memoryview = memoryview(f)[P.REQ_FIXED :]
            if self.secret:  # the first frame must prove the secret
                if op != P.OP_AUTH or not hmac.compare_digest(bytes(payload), self.secret):
                    self._bad("a connection did not authenticate")
                    return
                self.secret = b""
                continue
            if op == P.OP_AUTH:
                continue
            if op == P.OP_LANES:
                self._map_lanes(payload)
                continue
            if enc & ENC_IN_LANE:
                if self.lanes is None:
                    self._bad("a frame refers to a lane the connection does not have")
                    return
                try:
                    payload = self.lanes.request_view(payload)
                except LaneError as e:
                    self._bad(str(e))
                    return
                enc &= ~ENC_IN_LANE
            if op == P.OP_CONTROL:
                self.write(srv.control(req_id, bytes(payload)))
            elif op == P.OP_CANCEL:
                if srv.cancel(self, req_id):
                    self.write(P.encode_response(req_id, P.ST_CANCELLED, P.ENC_RAW, b"cancelled"))
            elif srv.draining:
                self.write(P.encode_response(req_id, P.ST_DRAINING, P.ENC_RAW, b"draining"))
            else:
                items.append(Item(req_id, op, enc, payload, self, now))
        if items:
            srv.enqueue(items)

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)


def json_default(o: object) -> object:
    """``json.dumps``' ``default`` for a handler's output (arrays, bytes, sets, tuples)."""
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, bytes | bytearray):
        return o.decode("utf-8", errors="replace")
    if isinstance(o, set | tuple):
        return list(o)
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


class DataPath:
    """The instance's IO thread: an asyncio loop serving one ``Conn`` per connection for
    ``owner`` on the launch's Unix socket (and a TCP port when ``listen_tcp``)."""

    def __init__(self, owner: ConnOwner, launch: InstanceLaunch) -> None:
        self.owner = owner
        self.launch = launch
        self.loop = asyncio.new_event_loop()
        self.servers: list[asyncio.AbstractServer] = []
        self._listener: socket.socket | None = None
        """The Unix-socket listener (accepted by hand: ``_accept``)."""
        self._adopting: set[asyncio.Task[None]] = set()
        self.tcp_port: int | None = None

    def start(self) -> None:
        """Start the IO thread and wait (at most 30 s) for its listeners."""
        ready = threading.Event()
        errors: list[BaseException] = []
        self.thread = threading.Thread(
            target=self._main, args=(ready, errors), name="gshare-io", daemon=True
        )
        self.thread.start()
        ready.wait(30)
        if errors:
            raise RuntimeError(f"instance {self.launch.instance_id}: cannot listen: {errors[0]}")

    def _main(self, ready: threading.Event, errors: list[BaseException]) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            path = self.launch.uds_path
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            # every connection, Unix socket or TCP, proves the channel secret first: the run
            # directory's 0700 keeps other users out, not another instance of this user
            # accepted by hand: a connection's first read may carry the lanes' descriptors
            # (``SCM_RIGHTS``), which a transport's plain reads would drop
            lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            lsock.bind(path)
            lsock.listen(256)
            lsock.setblocking(False)
            self._listener = lsock
            self.loop.add_reader(lsock.fileno(), self._accept)
            if self.launch.listen_tcp:
                if not self.launch.channel_secret:
                    raise RuntimeError("a TCP listener needs a channel secret")
                secret = self.launch.channel_secret
                tcp = self.loop.run_until_complete(
                    self.loop.create_server(
                        lambda: Conn(self.owner, secret), host=self.launch.tcp_host, port=0
                    )
                )
                self.servers.append(tcp)
                self.tcp_port = tcp.sockets[0].getsockname()[1]
        except BaseException as e:  # reported to start
            errors.append(e)
            ready.set()
            return
        ready.set()
        self.loop.run_forever()

    def _accept(self) -> None:
        """The Unix listener is readable: accept what is waiting; each new connection's first
        read is ``_first_read``'s (IO thread)."""
        lsock = self._listener
        assert lsock is not None
        for _ in range(64):
            try:
                conn, _addr = lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of descriptors, ...: try again on the next wake-up
                log.warning("instance: cannot accept a connection: %s", e)
                return
            conn.setblocking(False)
            self.loop.add_reader(conn.fileno(), self._first_read, conn)

    def _first_read(self, conn: socket.socket) -> None:
        """A new connection's first bytes, with any descriptors passed along, then a ``Conn``
        for the rest (IO thread)."""
        try:
            data, fds = recv_with_fds(conn)
        except (BlockingIOError, InterruptedError):
            return
        except (OSError, LaneError) as e:
            self.loop.remove_reader(conn.fileno())
            log.warning("instance: a new connection failed its first read: %s", e)
            conn.close()
            return
        self.loop.remove_reader(conn.fileno())
        if not data:
            close_fds(fds)
            conn.close()
            return
        proto = Conn(self.owner, self.launch.channel_secret, first=data, fds=fds)

        async def adopt() -> None:
            try:
                await self.loop.connect_accepted_socket(lambda: proto, conn)
            except OSError as e:
                log.warning("instance: cannot serve a new connection: %s", e)
                proto.connection_lost(e)
                conn.close()

        task = self.loop.create_task(adopt())
        self._adopting.add(task)
        task.add_done_callback(self._adopting.discard)

    def send(self, out: list[tuple[Conn, bytes]]) -> None:
        """Write responses from the batching thread (one loop wake-up per batch)."""
        if not out or self.loop.is_closed():
            return

        def write_all() -> None:
            for conn, data in out:
                conn.write(data)

        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(write_all)

    def call_soon(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the IO thread (``RuntimeError`` when the loop is closed)."""
        self.loop.call_soon_threadsafe(fn)

    def close(self) -> None:
        """Close the listeners and stop the loop (from any thread; a no-op once closed)."""

        def close() -> None:
            for s in self.servers:
                s.close()
            if self._listener is not None:
                self.loop.remove_reader(self._listener.fileno())
                self._listener.close()
                self._listener = None
            self.loop.stop()

        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(close)


__all__ = ["Conn", "ConnOwner", "DataPath", "Item", "json_default"]
