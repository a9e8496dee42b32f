"""Time tokens over a Unix domain socket: the live runtime's FaST Backend (FaST-GShare §3.3.2).

Who uses what (docs/DESIGN.md §5):

* the **node agent** owns one ``TokenServer`` per device. It registers every instance it starts
  (``add_client`` with the instance's ``ClientSpec``) *before* the instance connects, and
  removes it (``remove_client``) when the instance is gone. The server runs its own thread; it
  drives the pure ``gshare.policy.tokens.TokenScheduler`` with the wall clock and is the only
  place that touches the scheduler (all calls go through one lock, so ``add_client``,
  ``remove_client``, ``snapshot`` and ``token_records`` are safe from any thread).
* every **instance process** owns one ``TokenClient`` (one connection per instance). Its
  frontend calls ``acquire()`` before each burst (one batch on the device), runs the burst, and
  calls ``release(busy_ms)`` after it, or uses ``with client.burst(): ...``. Before each kernel
  it may ask ``should_yield(next_kernel_ms)`` and give the token back early (Gemini
  revocation, ``release(..., completed=False)``) rather than overrun it. A frontend with work
  queued back to back reuses its token instead (Gemini: a token is a time slice):
  ``start_burst()`` runs the next burst on the held token while its rest fits the predicted
  burst (the EWMA of its own bursts; with ``split_bursts=True``, for a frontend that checks
  ``should_yield`` before every kernel: while any time is left on it), else releases it and
  acquires another; ``end_burst()``
  keeps the token; ``idle()`` releases it, charged with the busy time of all its bursts, when
  the queue is empty. The round trip (100-300 us where waking a sleeping thread is slow) is then
  paid once per token, not once per burst.

What must hold:

* every decision is the scheduler's: the server only turns socket events into ``request`` /
  ``release`` calls, calls ``tick`` at ``next_wakeup_ms()`` while a client waits, and delivers
  the returned grants; the SM adapter, quotas and limits are therefore exactly the policy's;
* a grant goes only to the connection that asked for it; a grant that nobody can receive (its
  client disconnected while waiting, or has no request outstanding) is given back at once
  (``release(busy_ms=0, completed=False)``), so it never blocks the device;
* a connection that drops while holding a token releases it, charged with the wall time since
  the grant (``completed=False``); the client stays registered (the agent removes clients) and
  may reconnect under the same id;
* a malformed frame closes that connection only (logged); an event the scheduler rejects
  (unknown client, acquire while holding, release without a token, bad ``busy_ms``) gets an
  error reply and the connection stays open; nothing a client sends stops the server.

Wire protocol (version 1). Every message is a 16-byte little-endian frame, optionally
followed by ``length`` bytes of UTF-8 text::

    offset  size  field
    0       u8    op
    1       u8    flags
    2       u16   length  (bytes of text after the frame; 0 except HELLO and ERROR)
    4       u32   seq     (the client's sequence number of the message, echoed in replies)
    8       f64   value   (milliseconds)

    client -> server
      0x01 HELLO    flags = protocol version, length = len(client_id) in 1..255, text = client_id
      0x02 ACQUIRE  seq = n                       -> GRANT(seq = n) when the token is dispatched
      0x03 RELEASE  seq = n, value = busy_ms, flags bit 0 = completed     (no reply on success)
    server -> client
      0x81 WELCOME  value = window_ms             (reply to HELLO)
      0x82 GRANT    seq = the ACQUIRE's seq, value = token length ms, flags bit 0 = elastic
      0xEE ERROR    flags = error code, seq = the offending message's seq, text = message

Error codes: 1 unknown client, 2 connection not identified (no HELLO yet), 3 bad state
(ACQUIRE while waiting or holding, RELEASE without a token, second HELLO, client id already
connected), 4 bad value (``busy_ms`` negative or not finite). A RELEASE has no reply, so one
request + release costs one round trip; an ERROR for a RELEASE reaches the client with its
next ``acquire`` and is logged there (the server's state is authoritative). Anything else -- an
unknown op, a non-zero length on ACQUIRE/RELEASE, a bad version, an id that is not UTF-8 --
is malformed and closes the connection.

Limits: the server never takes a token back (a device burst cannot be pre-empted; an overrun
is charged as debt by the policy), so an instance that hangs while holding one blocks its SM
band until its connection drops -- the agent's liveness check must kill such an instance. A
RELEASE is asynchronous: ``snapshot`` may show the token held until the server has read it.

Latency: the client uses a blocking socket and reuses its frame buffers; the server is one
selector loop. The server thread needs the GIL to answer, so keep CPU-bound Python threads out
of the process that hosts it (or lower ``sys.setswitchinterval``): a busy thread can delay a
grant by the switch interval (5 ms by default).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import select
import selectors
import socket
import stat
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from gshare.policy.tokens import (
    LIVE_TOKEN_CONFIG,
    ClientSpec,
    ClientView,
    Grant,
    TokenConfig,
    TokenError,
    TokenScheduler,
    predict_burst_ms,
    reuse_token,
    should_yield,
)

__all__ = [
    "LIVE_TOKEN_CONFIG",
    "PROTOCOL_VERSION",
    "TokenClient",
    "TokenRecord",
    "TokenRuntimeError",
    "TokenServer",
    "UnknownClientError",
]

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
_FRAME = struct.Struct("<BBHId")  # op, flags, length, seq, value_ms: 16 bytes
FRAME_SIZE = _FRAME.size

OP_HELLO = 0x01
OP_ACQUIRE = 0x02
OP_RELEASE = 0x03
OP_WELCOME = 0x81
OP_GRANT = 0x82
OP_ERROR = 0xEE

ERR_UNKNOWN_CLIENT = 1
ERR_NOT_IDENTIFIED = 2
ERR_BAD_STATE = 3
ERR_BAD_VALUE = 4

MAX_ID_BYTES = 255
MAX_ERROR_BYTES = 1024
_SEQ_MASK = 0xFFFFFFFF
_SELECT_FD_LIMIT = 1024  # FD_SETSIZE: select(2) takes no descriptor at or above it


class TokenRuntimeError(RuntimeError):
    """The token server refused a message (``code`` is the wire error code), or the client was
    used out of order (``code`` 0)."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


class UnknownClientError(TokenRuntimeError):
    """The server has no client of that id (never added by the agent, or removed since)."""


def _error(code: int, message: str) -> TokenRuntimeError:
    if code == ERR_UNKNOWN_CLIENT:
        return UnknownClientError(message, code)
    return TokenRuntimeError(message, code)


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


class _Conn:
    """Server side of one instance connection (touched only under the server lock)."""

    __slots__ = (
        "sock",
        "fd",
        "buf",
        "client_id",
        "removed_id",
        "label",
        "pending_seq",
        "grant",
        "dead",
    )

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.buf = b""
        self.client_id: str | None = None
        """Bound client id after a successful HELLO; None before it and after removal."""
        self.removed_id: str | None = None
        """The id it was bound to when the agent removed that client."""
        self.label = f"fd {self.fd}"
        self.pending_seq: int | None = None
        """Seq of the outstanding ACQUIRE, if any."""
        self.grant: Grant | None = None
        """The token this connection holds."""
        self.dead = False
        """Set when the connection must be closed (the loop thread closes it)."""


class TokenServer:
    """The per-device token server: one ``TokenScheduler`` behind a Unix domain socket.

    Owned by the node agent (one per device). ``start()`` binds ``socket_path`` and runs the
    loop in a daemon thread; ``stop()`` closes everything and removes the socket file. The
    scheduler's time is ``(clock() - epoch_s) * 1000`` ms, so its windows are
    ``[epoch_s + k * window_ms / 1000, ...)`` on the clock. ``record_tokens`` > 0 keeps that many
    most recent ``TokenRecord``s (for tests, benches and metrics; off by default).
    """

    def __init__(
        self,
        socket_path: str,
        config: TokenConfig = TokenConfig(),
        clock: Callable[[], float] = time.monotonic,
        *,
        record_tokens: int = 0,
    ) -> None:
        if len(os.fsencode(socket_path)) > 107:
            raise ValueError(f"socket path too long for AF_UNIX (max 107 bytes): {socket_path}")
        self.socket_path = socket_path
        self.config = config
        self._clock = clock
        self.epoch_s = clock()
        """Clock reading that is time 0 of the scheduler (windows are aligned to it)."""
        self._sched = TokenScheduler(config)
        self._lock = threading.Lock()
        self._by_client: dict[str, _Conn] = {}
        self._by_fd: dict[int, _Conn] = {}
        self._records: deque[TokenRecord] | None = (
            deque(maxlen=record_tokens) if record_tokens > 0 else None
        )
        self._stats = {
            "connections": 0,
            "closed": 0,
            "grants": 0,
            "released": 0,
            "dropped_tokens": 0,
            "undelivered_grants": 0,
            "errors": 0,
            "malformed": 0,
        }
        self._out = bytearray(FRAME_SIZE)
        self._listener: socket.socket | None = None
        self._sel: selectors.BaseSelector | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False

    # -- lifecycle (node agent) ---------------------------------------------------------------

    def start(self) -> None:
        """Bind and listen on ``socket_path``, then serve in a background thread.

        Returns once the socket accepts connections. A stale socket file (nobody listening) is
        replaced; a live one raises ``RuntimeError``.
        """
        if self._thread is not None:
            raise RuntimeError("TokenServer already started")
        self._clear_stale_socket()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.socket_path)
            os.chmod(self.socket_path, 0o600)
            listener.listen(128)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(listener, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._stopping = False
        self._thread = threading.Thread(
            target=self._run, name=f"gshare-tokens:{self.socket_path}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving: close every connection and the socket, remove the socket file.

        Idempotent. Clients blocked in ``acquire`` get a ``ConnectionError``; tokens held are
        released as on a drop; registered clients stay registered (``start`` may be called
        again).
        """
        if self._thread is None:
            return
        with self._lock:
            self._stopping = True
        self._wake()
        self._thread.join(timeout=5.0)
        self._thread = None
        with self._lock:
            for conn in self._by_fd.values():
                conn.dead = True
            self._reap(self._now_ms())  # held tokens go back to the scheduler, as on a drop
            for s in (self._listener, self._wake_r, self._wake_w):
                if s is not None:
                    s.close()
            if self._sel is not None:
                self._sel.close()
            self._listener = self._wake_r = self._wake_w = None
            self._sel = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    def __enter__(self) -> TokenServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- clients (node agent, any thread) -----------------------------------------------------

    def add_client(self, spec: ClientSpec) -> None:
        """Register an instance before it connects. Raises ``TokenError`` (duplicate id, SM
        share above the global limit)."""
        with self._lock:
            now_ms = self._now_ms()
            self._deliver(self._sched.add_client(spec, now_ms), now_ms)
        self._wake()

    def remove_client(self, client_id: str) -> None:
        """Forget an instance. Its token (if any) goes back to the scheduler and others may be
        granted at once; its connection stays open but is no longer identified, and an
        outstanding ``acquire`` on it fails with ``UnknownClientError``. Raises ``TokenError``
        for an unknown id."""
        with self._lock:
            now_ms = self._now_ms()
            conn = self._by_client.pop(client_id, None)
            grants = self._sched.remove_client(client_id, now_ms)
            if conn is not None:
                if conn.pending_seq is not None:
                    self._send_error(
                        conn,
                        ERR_UNKNOWN_CLIENT,
                        conn.pending_seq,
                        f"client {client_id!r} was removed",
                    )
                conn.pending_seq = None
                conn.grant = None
                conn.client_id = None
                conn.removed_id = client_id
            self._deliver(grants, now_ms)
        self._wake()

    def snapshot(self) -> Mapping[str, ClientView]:
        """The scheduler's table (immutable copies), as of the last event. Thread-safe."""
        with self._lock:
            return self._sched.snapshot()

    def token_records(self) -> list[TokenRecord]:
        """The kept ``TokenRecord``s, oldest first (empty unless ``record_tokens`` > 0)."""
        with self._lock:
            return list(self._records) if self._records is not None else []

    def stats(self) -> dict[str, int]:
        """Counters since construction: connections (accepted), closed (connections closed,
        by either side), grants, released, dropped_tokens, undelivered_grants, errors (error
        replies), malformed (connections closed for a malformed message)."""
        with self._lock:
            return dict(self._stats)

    # -- the loop (server thread) -------------------------------------------------------------

    def _run(self) -> None:
        assert self._sel is not None
        try:
            while True:
                with self._lock:
                    if self._stopping:
                        return
                    timeout_s = self._timeout_s()
                ready = self._wait(timeout_s)
                with self._lock:
                    if self._stopping:
                        return
                    for fd in ready:
                        self._on_ready(fd)
                    now_ms = self._now_ms()
                    if now_ms >= self._sched.next_wakeup_ms() and self._any_waiting():
                        self._deliver(self._sched.tick(now_ms), now_ms)
                    self._reap(now_ms)
        except Exception:  # pragma: no cover - a bug; keep the traceback visible
            log.exception("token server loop on %s died", self.socket_path)
            raise

    def _timeout_s(self) -> float | None:
        """Seconds until the next window boundary while a client waits, else block."""
        if not self._any_waiting():
            return None
        return max(0.0, (self._sched.next_wakeup_ms() - self._now_ms()) / 1000.0)

    def _any_waiting(self) -> bool:
        return any(c.waiting for c in self._sched.clients.values())

    def _wait(self, timeout_s: float | None) -> list[int]:
        """Ready descriptors, or none once ``timeout_s`` has passed (None: no timeout).

        epoll's timeout is whole milliseconds rounded up (up to 1 ms late, i.e. 2.5 % of a
        40 ms window lost at every tick); so wait whole milliseconds rounded *down* with the
        selector and the sub-millisecond rest with select(2), whose timeout has microsecond
        resolution (what is left is the OS's wake-up latency).
        """
        sel = self._sel
        assert sel is not None
        if timeout_s is not None and 0 < timeout_s < 0.001:
            fds = [k.fd for k in sel.get_map().values()]
            if max(fds) < _SELECT_FD_LIMIT:
                ready, _, _ = select.select(fds, [], [], timeout_s)
                return ready
        if timeout_s is not None and timeout_s >= 0.001:
            whole_ms = math.floor(timeout_s * 1000.0)
            timeout_s = (whole_ms - 0.5) / 1000.0  # EpollSelector rounds this up to whole_ms
        return [key.fd for key, _ in sel.select(timeout_s)]

    def _on_ready(self, fd: int) -> None:
        if self._listener is not None and fd == self._listener.fileno():
            self._accept()
        elif self._wake_r is not None and fd == self._wake_r.fileno():
            with contextlib.suppress(BlockingIOError):
                while self._wake_r.recv(4096):
                    pass
        else:
            conn = self._by_fd.get(fd)
            if conn is not None and not conn.dead:
                try:
                    self._read(conn)
                except Exception:
                    log.exception("token server: error serving %s; closing it", conn.label)
                    conn.dead = True

    def _accept(self) -> None:
        assert self._listener is not None and self._sel is not None
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            sock.setblocking(False)
            conn = _Conn(sock)
            self._by_fd[conn.fd] = conn
            self._sel.register(sock, selectors.EVENT_READ, None)
            self._stats["connections"] += 1

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            conn.dead = True
            return
        if conn.buf:
            data = conn.buf + data
            conn.buf = b""
        n = len(data)
        off = 0
        unpack = _FRAME.unpack_from
        while n - off >= FRAME_SIZE:
            op, flags, length, seq, value = unpack(data, off)
            if op == OP_ACQUIRE and length == 0:
                off += FRAME_SIZE
                self._on_acquire(conn, seq)
            elif op == OP_RELEASE and length == 0:
                off += FRAME_SIZE
                self._on_release(conn, seq, value, bool(flags & 1))
            elif op == OP_HELLO and flags == PROTOCOL_VERSION and 0 < length <= MAX_ID_BYTES:
                if n - off < FRAME_SIZE + length:
                    break
                raw = data[off + FRAME_SIZE : off + FRAME_SIZE + length]
                off += FRAME_SIZE + length
                try:
                    client_id = raw.decode("utf-8")
                except UnicodeDecodeError:
                    self._malformed(conn, "client id is not UTF-8")
                    return
                self._on_hello(conn, seq, client_id)
            else:
                self._malformed(conn, f"bad frame op=0x{op:02x} flags={flags} length={length}")
                return
            if conn.dead:
                return
        if off < n:
            conn.buf = data[off:]

    def _malformed(self, conn: _Conn, why: str) -> None:
        log.warning("token server: malformed message from %s (%s); closing it", conn.label, why)
        self._stats["malformed"] += 1
        conn.dead = True

    # -- message handlers (server thread, under the lock) -------------------------------------

    def _on_hello(self, conn: _Conn, seq: int, client_id: str) -> None:
        if conn.client_id is not None:
            self._send_error(
                conn, ERR_BAD_STATE, seq, f"connection already identified as {conn.client_id!r}"
            )
        elif client_id not in self._sched.clients:
            self._send_error(conn, ERR_UNKNOWN_CLIENT, seq, f"unknown client {client_id!r}")
        elif client_id in self._by_client:
            self._send_error(conn, ERR_BAD_STATE, seq, f"client {client_id!r} is already connected")
        else:
            conn.client_id = client_id
            conn.label = f"client {client_id!r}"
            self._by_client[client_id] = conn
            _FRAME.pack_into(
                self._out, 0, OP_WELCOME, PROTOCOL_VERSION, 0, seq, self.config.window_ms
            )
            self._send(conn, self._out)

    def _bound(self, conn: _Conn, seq: int) -> str | None:
        cid = conn.client_id
        if cid is None:
            if conn.removed_id is not None:
                self._send_error(
                    conn, ERR_UNKNOWN_CLIENT, seq, f"client {conn.removed_id!r} was removed"
                )
            else:
                self._send_error(conn, ERR_NOT_IDENTIFIED, seq, "send HELLO first")
        return cid

    def _on_acquire(self, conn: _Conn, seq: int) -> None:
        cid = self._bound(conn, seq)
        if cid is None:
            return
        if conn.pending_seq is not None or conn.grant is not None:
            what = "waiting for" if conn.grant is None else "holding"
            self._send_error(conn, ERR_BAD_STATE, seq, f"client {cid!r} asked while {what} a token")
            return
        now_ms = self._now_ms()
        conn.pending_seq = seq
        try:
            grants = self._sched.request(cid, now_ms)
        except TokenError as e:
            conn.pending_seq = None
            self._send_error(conn, ERR_BAD_STATE, seq, str(e))
            return
        self._deliver(grants, now_ms)

    def _on_release(self, conn: _Conn, seq: int, busy_ms: float, completed: bool) -> None:
        cid = self._bound(conn, seq)
        if cid is None:
            return
        grant = conn.grant
        if grant is None:
            self._send_error(conn, ERR_BAD_STATE, seq, f"client {cid!r} released no token")
            return
        if not (math.isfinite(busy_ms) and busy_ms >= 0):
            self._send_error(
                conn, ERR_BAD_VALUE, seq, f"busy_ms must be finite and >= 0, got {busy_ms}"
            )
            return
        now_ms = self._now_ms()
        conn.grant = None
        self._finish(cid, grant, busy_ms, now_ms, completed=completed, dropped=False)

    def _finish(
        self,
        cid: str,
        grant: Grant,
        busy_ms: float,
        now_ms: float,
        *,
        completed: bool,
        dropped: bool,
    ) -> None:
        """Release ``grant`` in the scheduler, record it, deliver what it unblocks."""
        try:
            grants = self._sched.release(cid, busy_ms, now_ms, completed=completed)
        except TokenError as e:  # the scheduler no longer holds that token (cannot happen)
            log.error("token server: release of %r refused: %s", cid, e)
            return
        self._stats["dropped_tokens" if dropped else "released"] += 1
        if self._records is not None:
            self._records.append(
                TokenRecord(
                    client_id=cid,
                    start_s=self.epoch_s + grant.start_ms / 1000.0,
                    end_s=self.epoch_s + now_ms / 1000.0,
                    quota_ms=grant.quota_ms,
                    busy_ms=busy_ms,
                    elastic=grant.elastic,
                    completed=completed,
                    dropped=dropped,
                )
            )
        self._deliver(grants, now_ms)

    # -- delivery and connection upkeep (under the lock) --------------------------------------

    def _deliver(self, grants: list[Grant], now_ms: float) -> None:
        """Send each grant to its client's connection; give back the ones nobody can take."""
        i = 0
        while i < len(grants):
            g = grants[i]
            i += 1
            conn = self._by_client.get(g.client_id)
            if conn is not None and not conn.dead and conn.pending_seq is not None:
                _FRAME.pack_into(
                    self._out, 0, OP_GRANT, 1 if g.elastic else 0, 0, conn.pending_seq, g.quota_ms
                )
                if self._send(conn, self._out):
                    conn.pending_seq = None
                    conn.grant = g
                    self._stats["grants"] += 1
                    continue
                conn.pending_seq = None
            # Nobody will run this token: return it now so that it never blocks the device.
            self._stats["undelivered_grants"] += 1
            grants.extend(self._sched.release(g.client_id, 0.0, now_ms, completed=False))

    def _send(self, conn: _Conn, frame: bytes | bytearray) -> bool:
        """Non-blocking send of one whole message; a connection that cannot take it is dead.

        A well-behaved client has at most one reply outstanding, so a full socket buffer means a
        client that does not read.
        """
        try:
            sent = conn.sock.send(frame)
        except OSError:
            sent = -1
        if sent != len(frame):
            if not conn.dead:
                log.warning("token server: cannot write to %s; closing it", conn.label)
            conn.dead = True
            return False
        return True

    def _send_error(self, conn: _Conn, code: int, seq: int, message: str) -> None:
        text = message.encode("utf-8")[:MAX_ERROR_BYTES]
        self._stats["errors"] += 1
        log.debug("token server: error %d to %s: %s", code, conn.label, message)
        self._send(conn, _FRAME.pack(OP_ERROR, code, len(text), seq, 0.0) + text)

    def _reap(self, now_ms: float) -> None:
        """Close dead connections; a token they hold is released with the time it ran."""
        while True:
            dead = [c for c in self._by_fd.values() if c.dead]
            if not dead:
                return
            for conn in dead:
                self._close(conn)
                cid = conn.client_id
                if cid is None:
                    continue
                if self._by_client.get(cid) is conn:
                    del self._by_client[cid]
                grant = conn.grant
                conn.grant = None
                conn.pending_seq = None
                state = self._sched.clients.get(cid)
                if grant is not None and state is not None and state.token is grant:
                    elapsed_ms = max(0.0, now_ms - grant.start_ms)
                    log.info(
                        "token server: %s dropped holding a token; released after %.3f ms",
                        conn.label,
                        elapsed_ms,
                    )
                    self._finish(cid, grant, elapsed_ms, now_ms, completed=False, dropped=True)

    def _close(self, conn: _Conn) -> None:
        if self._by_fd.pop(conn.fd, None) is not None:
            self._stats["closed"] += 1
        conn.dead = True
        if self._sel is not None:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._sel.unregister(conn.sock)
        conn.sock.close()

    def _wake(self) -> None:
        w = self._wake_w
        if w is not None:
            with contextlib.suppress(OSError):
                w.send(b"\0")

    def _now_ms(self) -> float:
        return (self._clock() - self.epoch_s) * 1000.0

    def _clear_stale_socket(self) -> None:
        try:
            mode = os.stat(self.socket_path).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(mode):
            raise RuntimeError(f"{self.socket_path} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(self.socket_path)
        except OSError:
            os.unlink(self.socket_path)  # stale: nobody listens
        else:
            raise RuntimeError(f"a server already listens on {self.socket_path}")
        finally:
            probe.close()


class TokenClient:
    """An instance's connection to its device's token server (blocking, one per instance).

    Called by the instance frontend from one thread: ``acquire()`` before a burst, ``release()``
    after it, never two ``acquire`` in a row. The constructor connects and identifies itself
    (HELLO): it raises ``UnknownClientError`` if the agent has not registered ``client_id``,
    ``ConnectionError`` if nobody serves ``socket_path``.

    ``timeout_s`` bounds every blocking call (``None``: wait for ever). When it expires the
    connection is closed (the server then forgets the request, or releases a token granted
    meanwhile) and ``TimeoutError`` is raised; the client cannot be used afterwards.
    """

    def __init__(
        self,
        socket_path: str,
        client_id: str,
        timeout_s: float | None = None,
        *,
        split_bursts: bool = False,
        busy_clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        raw = client_id.encode("utf-8")
        if not 0 < len(raw) <= MAX_ID_BYTES:
            raise ValueError(
                f"client_id must be 1..{MAX_ID_BYTES} bytes of UTF-8, got {client_id!r}"
            )
        self.socket_path = socket_path
        self.client_id = client_id
        self.window_ms = 0.0
        """The server's window length (from WELCOME)."""
        self.token_ms: float | None = None
        """Length of the token held, or None."""
        self.elastic = False
        """Whether the token held is elastic (idle time beyond the guarantee)."""
        self._t_grant = 0.0
        self._busy_at_grant = 0.0
        """``busy_clock`` when the held token was granted."""
        self._used_ms = 0.0
        """Busy time of the bursts ended on the held token (reuse protocol)."""
        self._in_burst = False
        self._seg_t0 = 0.0
        """Start of the open burst segment (``busy_clock``), valid while ``_in_burst``."""
        self._burst_done_ms = 0.0
        """Busy time of the open burst on earlier tokens (a burst renewed mid-way)."""
        self.predicted_burst_ms = 0.0
        """EWMA of this client's completed bursts (0 = no history): the reuse test."""
        self.burst_ewma_alpha = 0.3
        self.reused = 0
        """Bursts that ran on a token already held (no round trip to the server)."""
        self.split_bursts = split_bursts
        self.busy_clock = busy_clock
        """The clock (seconds) that measures the busy time reported on a token; the token's
        own length is always wall time (``perf_counter``). Default ``perf_counter``: the
        device time a GPU burst holds, as the host sees it. A single-threaded CPU frontend may
        pass ``time.thread_time``: the CPU time it got, which leaves out the time its core was
        taken from it (another task, or the VM stopping the vCPU) while it held the token."""
        """Reuse a held token while any time is left on it, not only while its rest fits the
        predicted burst (``reusable``). For frontends that call ``should_yield`` before every
        kernel, so that a burst cut where the token ends never runs past it."""
        self._seq = 0
        self._out = bytearray(FRAME_SIZE)
        self._in = bytearray(FRAME_SIZE)
        self._in_view = memoryview(self._in)
        self._sock: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        try:
            try:
                self._sock.connect(socket_path)
            except (FileNotFoundError, ConnectionRefusedError) as e:
                raise ConnectionError(f"no token server on {socket_path}: {e}") from None
            self._io(
                self._sock.sendall, _FRAME.pack(OP_HELLO, PROTOCOL_VERSION, len(raw), 0, 0.0) + raw
            )
            op, flags, length, _seq, value = self._read_frame()
            if op == OP_ERROR:
                raise _error(flags, self._read_text(length))
            if op != OP_WELCOME:
                raise TokenRuntimeError(f"token server answered HELLO with op 0x{op:02x}")
            self.window_ms = value
        except BaseException:
            self.close()
            raise

    # -- the burst protocol (instance frontend) -----------------------------------------------

    def acquire(self) -> float:
        """Block until the server grants a token; return its length in ms.

        Raises ``UnknownClientError`` if the client was removed, ``TokenRuntimeError`` if a
        token is already held, ``ConnectionError`` if the server went away, ``TimeoutError``.
        """
        sock = self._sock
        if sock is None:
            raise TokenRuntimeError(f"token client {self.client_id!r} is closed")
        if self.token_ms is not None:
            raise TokenRuntimeError(f"client {self.client_id!r} already holds a token")
        seq = self._seq = (self._seq + 1) & _SEQ_MASK
        _FRAME.pack_into(self._out, 0, OP_ACQUIRE, 0, 0, seq, 0.0)
        self._io(sock.sendall, self._out)
        while True:
            op, flags, length, rseq, value = self._read_frame()
            if op == OP_GRANT and rseq == seq:
                self._t_grant = time.perf_counter()
                self._busy_at_grant = (
                    self._t_grant if self.busy_clock is time.perf_counter else self.busy_clock()
                )
                self.token_ms = value
                self.elastic = bool(flags & 1)
                self._used_ms = 0.0
                if self._in_burst:
                    self._seg_t0 = self._busy_at_grant
                return value
            if op == OP_ERROR:
                text = self._read_text(length)
                if rseq == seq:
                    raise _error(flags, text)
                log.warning(
                    "token server rejected an earlier release of %r: %s", self.client_id, text
                )
                continue
            self.close()
            raise TokenRuntimeError(
                f"unexpected reply op=0x{op:02x} seq={rseq} (waiting for {seq})"
            )

    def release(self, busy_ms: float, completed: bool = True) -> None:
        """Give the token back, having used ``busy_ms`` of device time on it.

        ``completed`` is False when the burst is not finished (the token ran out or was
        revoked by ``should_yield``). Does not wait for the server (no reply on success).
        """
        sock = self._sock
        if sock is None:
            raise TokenRuntimeError(f"token client {self.client_id!r} is closed")
        if self.token_ms is None:
            raise TokenRuntimeError(f"client {self.client_id!r} holds no token")
        if not (math.isfinite(busy_ms) and busy_ms >= 0):
            raise ValueError(f"busy_ms must be finite and >= 0, got {busy_ms}")
        self._seq = (self._seq + 1) & _SEQ_MASK
        _FRAME.pack_into(self._out, 0, OP_RELEASE, 1 if completed else 0, 0, self._seq, busy_ms)
        self.token_ms = None
        self._used_ms = 0.0
        self._io(sock.sendall, self._out)

    @contextlib.contextmanager
    def burst(self, reuse: bool = False) -> Iterator[float]:
        """``with client.burst() as token_ms: run()`` -- acquire, run, release the time measured
        with ``busy_clock`` (also when the body raises).

        ``reuse=True``: ``start_burst`` / ``end_burst`` instead -- the token is kept after the
        body for the next burst (yields the time left on it); call ``idle()`` when done."""
        if reuse:
            left = self.start_burst()
            try:
                yield left
            finally:
                self.end_burst()
            return
        token_ms = self.acquire()
        t0 = self._busy_at_grant
        try:
            yield token_ms
        finally:
            self.release((self.busy_clock() - t0) * 1000.0)

    # -- token reuse (Gemini: a token is a time slice) -----------------------------------------

    def reusable(self) -> bool:
        """True when a token is held and its rest fits the predicted next burst (the EWMA of
        this client's bursts; any rest > 0 before the first burst ends), or, with
        ``split_bursts``, when any time is left on it.

        NOTE — split bursts. Giving back a rest that cannot fit the next burst and asking again
        costs one round trip, as does cutting the burst where the token ends (revocation) and
        asking again for its remainder; but a rest given back is not charged, so the scheduler
        hands it out again later in the window, and while a neighbour time-shares the device
        that is one more hand-over (two wake-ups, device idle) per token: two clients with
        quota-sized tokens then swap four times per window instead of twice. A frontend that
        checks ``should_yield`` before every kernel can cut a burst anywhere without running
        past its token, so it keeps the rest (``split_bursts=True``). A frontend whose only
        preemption points are coarse (the instance's per-module hook, which yields once the
        token is spent) would instead overrun the token at every cut, so it keeps the default.
        """
        if self.token_ms is None:
            return False
        return reuse_token(
            self.token_left_ms(), self.predicted_burst_ms, split_bursts=self.split_bursts
        )

    def start_burst(self) -> float:
        """Begin a burst on the held token if its rest fits the predicted burst (``reusable``),
        else give it back (``completed=False``: work is still queued) and ``acquire`` a new
        one. Returns the time left on the token. End the burst with ``end_burst``; call
        ``release_if_held`` when the caller goes idle (no more work queued), so the protocol is
        paid once per token, not once per burst."""
        if self._in_burst:
            raise TokenRuntimeError(f"client {self.client_id!r} is already in a burst")
        if self.reusable():
            self.reused += 1
        else:
            self.release_if_held(completed=False)
            self.acquire()
        self.begin_burst()
        return self.token_left_ms()

    @property
    def in_burst(self) -> bool:
        """Between ``start_burst``/``begin_burst`` and ``end_burst``."""
        return self._in_burst

    def begin_burst(self) -> None:
        """Mark the start of a burst on the token held now (``start_burst`` without the
        acquire, for callers that acquire through their own reconnect logic)."""
        if self.token_ms is None:
            raise TokenRuntimeError(f"client {self.client_id!r} holds no token")
        self._in_burst = True
        self._seg_t0 = self.busy_clock()
        self._burst_done_ms = 0.0

    def end_burst(self) -> float:
        """End the burst: its busy time (measured since ``start_burst``, across renewed
        tokens) feeds the burst EWMA and is added to the time used on the held token, which is
        kept for the next burst. Returns the burst's busy ms."""
        if not self._in_burst:
            raise TokenRuntimeError(f"client {self.client_id!r} is not in a burst")
        self._in_burst = False
        seg_ms = (self.busy_clock() - self._seg_t0) * 1000.0 if self.token_ms is not None else 0.0
        self._used_ms += seg_ms
        burst_ms = self._burst_done_ms + seg_ms
        self._burst_done_ms = 0.0
        self.predicted_burst_ms = predict_burst_ms(
            self.predicted_burst_ms, burst_ms, self.burst_ewma_alpha
        )
        return burst_ms

    def release_if_held(self, completed: bool = True) -> bool:
        """Give back the held token, if any, charged with the busy time used on it (bursts
        ended on it plus the open burst's segment). Inside a burst (the token ran out mid-way,
        ``completed=False``) the burst stays open and continues on the next ``acquire``.
        Returns whether a token was released."""
        if self.token_ms is None:
            return False
        busy_ms = self._used_ms
        if self._in_burst:
            seg_ms = (self.busy_clock() - self._seg_t0) * 1000.0
            self._burst_done_ms += seg_ms
            busy_ms += seg_ms
        self.release(busy_ms, completed=completed)
        return True

    def idle(self) -> bool:
        """The caller has no more work queued: ``release_if_held(completed=True)``."""
        return self.release_if_held(completed=True)

    def token_left_ms(self) -> float:
        """Time left on the held token (0 when none is held)."""
        if self.token_ms is None:
            return 0.0
        return self.token_ms - (time.perf_counter() - self._t_grant) * 1000.0

    def should_yield(self, next_kernel_ms: float) -> bool:
        """Gemini revocation: True when the next kernel does not fit in the token's rest."""
        return should_yield(self.token_left_ms(), next_kernel_ms)

    def close(self) -> None:
        """Close the connection (a held token is released by the server). Idempotent."""
        sock, self._sock = self._sock, None
        self.token_ms = None
        self._in_burst = False
        self._used_ms = 0.0
        if sock is not None:
            sock.close()

    def __enter__(self) -> TokenClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------------

    def _io(self, fn: Callable[[bytes | bytearray], object], data: bytes | bytearray) -> None:
        try:
            fn(data)
        except TimeoutError:
            self.close()
            raise TimeoutError(
                f"token server on {self.socket_path} did not answer in time"
            ) from None
        except OSError as e:
            self.close()
            raise ConnectionError(f"token server on {self.socket_path} went away: {e}") from None

    def _recv_exact(self, view: memoryview) -> None:
        sock = self._sock
        if sock is None:
            raise TokenRuntimeError(f"token client {self.client_id!r} is closed")
        got = 0
        want = len(view)
        try:
            while got < want:
                k = sock.recv_into(view[got:], want - got) if got else sock.recv_into(view, want)
                if k == 0:
                    raise ConnectionError("closed by the server")
                got += k
        except TimeoutError:
            self.close()
            raise TimeoutError(
                f"token server on {self.socket_path} did not answer in time"
            ) from None
        except OSError as e:
            self.close()
            raise ConnectionError(f"token server on {self.socket_path} went away: {e}") from None

    def _read_frame(self) -> tuple[int, int, int, int, float]:
        self._recv_exact(self._in_view)
        op, flags, length, seq, value = _FRAME.unpack_from(self._in)
        return op, flags, length, seq, value

    def _read_text(self, length: int) -> str:
        if length == 0:
            return ""
        buf = bytearray(length)
        self._recv_exact(memoryview(buf))
        return buf.decode("utf-8", errors="replace")
