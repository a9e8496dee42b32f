"""The token server: one per device, in the node agent's process (``tokens.protocol`` has the
wire protocol, who calls what and what must hold)."""

from __future__ import annotations

import contextlib
import hmac
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gshare.policy.memory import DeviceMemory, MemoryGrant, MemoryRefusal, Reservation
from gshare.policy.priority import ClassPlan, ClientClass, plan_classes
from gshare.policy.tokens import (
    ClientSpec,
    ClientView,
    Grant,
    TokenConfig,
    TokenError,
    TokenScheduler,
)
from gshare.runtime.tokens.board import (
    MODE_FIKIT,
    MODE_TOKENS,
    BoardError,
    BoardWriter,
    SlotUsage,
)
from gshare.runtime.tokens.protocol import (
    ERR_BAD_CREDENTIALS,
    ERR_BAD_STATE,
    ERR_BAD_VALUE,
    ERR_NOT_IDENTIFIED,
    ERR_UNKNOWN_CLIENT,
    F64,
    FRAME,
    FRAME_SIZE,
    HELLO_MEMORY_CHANNEL,
    MAX_ERROR_BYTES,
    MAX_HELLO_BYTES,
    MEMORY_OVER_MAX,
    OP_ACQUIRE,
    OP_ERROR,
    OP_GRANT,
    OP_HELLO,
    OP_MEMORY,
    OP_MEMORY_REPLY,
    OP_RELEASE,
    OP_WELCOME,
    PROTOCOL_VERSION,
    SELECT_FD_LIMIT,
)

log = logging.getLogger(__name__)


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


def _peer_alive(sock: socket.socket) -> bool:
    """Whether the process at the other end of a Unix socket still runs (not a zombie)."""
    try:
        pid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError, struct.error):
        return False
    return state != b"Z"


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
        "memory_of",
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
        self.memory_of: str | None = None
        """The client whose memory channel this is (HELLO with ``HELLO_MEMORY_CHANNEL``)."""


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
        memory_mb: float | None = None,
        board: str | None = None,
        priority_classes: bool = False,
    ) -> None:
        if len(os.fsencode(socket_path)) > 107:
            raise ValueError(f"socket path too long for AF_UNIX (max 107 bytes): {socket_path}")
        self.socket_path = socket_path
        self.config = config
        self._clock = clock
        self.epoch_s = clock()
        """Clock reading that is time 0 of the scheduler (windows are aligned to it)."""
        self._sched = TokenScheduler(config)
        self.memory = DeviceMemory(memory_mb) if memory_mb else None
        """The device's memory ledger (None: memory is not accounted)."""
        self._lock = threading.Lock()
        self._by_client: dict[str, _Conn] = {}
        self._memory_conns: dict[str, _Conn] = {}
        self._secrets: dict[str, bytes] = {}
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
        self.priority_classes = priority_classes
        """FIKIT across priority classes (``policy.priority.plan_classes``): a client below the
        top active class gets no token (its ACQUIRE is held until its class may run), and the
        top class is published on the board. False: priorities only order the token queue."""
        self._board: BoardWriter | None = None
        if board is not None:
            self._board = BoardWriter(board, MODE_FIKIT if priority_classes else MODE_TOKENS)
        self._plan: ClassPlan | None = None
        self._held: dict[str, float] = {}
        """Clients whose ACQUIRE the class plan holds back, and since when (ms)."""
        self._resuming: dict[str, float] = {}
        """Clients that gave a token back with work left (``completed=False``) and will ask
        again at once, and when (ms): still active for the class plan, for one window."""

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

    def add_client(self, spec: ClientSpec, secret: str | None = None) -> None:
        """Register an instance before it connects; with ``secret`` its HELLOs must carry it
        (``protocol``: identity). Raises ``TokenError`` (duplicate id, SM share above the
        global limit)."""
        with self._lock:
            if secret:
                self._secrets[spec.client_id] = secret.encode("ascii")
            else:
                self._secrets.pop(spec.client_id, None)
            now_ms = self._now_ms()
            self._deliver(self._sched.add_client(spec, now_ms), now_ms)
            if self._board is not None:
                try:
                    self._board.assign(spec.client_id, spec.priority)
                except BoardError as e:  # the client shares by tokens alone
                    log.warning("token server: %s", e)
            self._replan(now_ms)
        self._wake()

    def set_quota(self, client_id: str, quota_request: float, quota_limit: float) -> None:
        """Change a registered instance's time quotas in place (``TokenScheduler.set_quota``):
        no reconnect, effective for its next token. Raises ``TokenError``."""
        with self._lock:
            now_ms = self._now_ms()
            self._deliver(
                self._sched.set_quota(client_id, quota_request, quota_limit, now_ms), now_ms
            )
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
            self._held.pop(client_id, None)
            self._resuming.pop(client_id, None)
            if self._board is not None:
                self._board.free(client_id)
            self._deliver(grants, now_ms)
            self._replan(now_ms)
        self._wake()

    def reserve_memory(self, client_id: str, limit_mb: float) -> MemoryGrant:
        """Reserve an instance's starting memory limit (the agent, before it starts)."""
        with self._lock:
            if self.memory is None:
                return MemoryGrant(limit_mb, math.inf)
            return self.memory.reserve(client_id, limit_mb)

    def release_memory(self, client_id: str) -> None:
        """Drop an instance's reservation (the agent, once it stopped)."""
        with self._lock:
            if self.memory is not None:
                self.memory.release(client_id)

    def memory_snapshot(self) -> tuple[float, dict[str, Reservation]]:
        """(capacity MiB, the reservations); (0, {}) without a ledger."""
        with self._lock:
            if self.memory is None:
                return 0.0, {}
            return self.memory.capacity_mb, self.memory.snapshot()

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
                    if self._resuming and (
                        min(self._resuming.values()) + self.config.window_ms < now_ms
                    ):
                        self._replan(now_ms)
        except Exception:  # pragma: no cover - a bug; keep the traceback visible
            log.exception("token server loop on %s died", self.socket_path)
            raise

    def _timeout_s(self) -> float | None:
        """Seconds until the next window boundary while a client waits, else block (or, with
        priority classes, until the oldest ``completed=False`` release stops counting as
        active)."""
        expiry_s: float | None = None
        if self._resuming:
            end_ms = min(self._resuming.values()) + self.config.window_ms
            expiry_s = max(0.0, (end_ms - self._now_ms()) / 1000.0) + 1e-4
        if not self._any_waiting():
            return expiry_s
        tick_s = max(0.0, (self._sched.next_wakeup_ms() - self._now_ms()) / 1000.0)
        return tick_s if expiry_s is None else min(tick_s, expiry_s)

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
            if max(fds) < SELECT_FD_LIMIT:
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
        unpack = FRAME.unpack_from
        while n - off >= FRAME_SIZE:
            op, flags, length, seq, value = unpack(data, off)
            if op == OP_ACQUIRE and length == 0:
                off += FRAME_SIZE
                self._on_acquire(conn, seq)
            elif op == OP_RELEASE and length == 0:
                off += FRAME_SIZE
                self._on_release(conn, seq, value, bool(flags & 1))
            elif op == OP_MEMORY and length == 0:
                off += FRAME_SIZE
                self._on_memory(conn, seq, value, flags)
            elif (
                op == OP_HELLO
                and flags & ~HELLO_MEMORY_CHANNEL == PROTOCOL_VERSION
                and 0 < length <= MAX_HELLO_BYTES
            ):
                if n - off < FRAME_SIZE + length:
                    break
                raw = data[off + FRAME_SIZE : off + FRAME_SIZE + length]
                off += FRAME_SIZE + length
                cid_raw, _, secret = bytes(raw).partition(b"\0")
                try:
                    client_id = cid_raw.decode("utf-8")
                except UnicodeDecodeError:
                    self._malformed(conn, "client id is not UTF-8")
                    return
                if not self._credentials_ok(client_id, secret):
                    self._send_error(
                        conn, ERR_BAD_CREDENTIALS, seq, f"bad credentials for {client_id!r}"
                    )
                    log.warning("token server: refused a HELLO as %r (bad credentials)", client_id)
                    continue
                self._on_hello(conn, seq, client_id, bool(flags & HELLO_MEMORY_CHANNEL))
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

    def _on_hello(self, conn: _Conn, seq: int, client_id: str, memory: bool = False) -> None:
        if conn.client_id is not None or conn.memory_of is not None:
            self._send_error(
                conn,
                ERR_BAD_STATE,
                seq,
                f"connection already identified as {conn.client_id or conn.memory_of!r}",
            )
        elif client_id not in self._sched.clients:
            self._send_error(conn, ERR_UNKNOWN_CLIENT, seq, f"unknown client {client_id!r}")
        elif memory:
            old = self._memory_conns.get(client_id)
            if old is not None and not old.dead:
                self._send_error(
                    conn, ERR_BAD_STATE, seq, f"client {client_id!r} has a memory channel"
                )
                return
            conn.memory_of = client_id
            conn.label = f"memory channel of {client_id!r}"
            self._memory_conns[client_id] = conn
            FRAME.pack_into(
                self._out, 0, OP_WELCOME, PROTOCOL_VERSION, 0, seq, self.config.window_ms
            )
            self._send(conn, self._out)
        elif client_id in self._by_client and not self._take_over(client_id):
            self._send_error(conn, ERR_BAD_STATE, seq, f"client {client_id!r} is already connected")
        else:
            conn.client_id = client_id
            conn.label = f"client {client_id!r}"
            self._by_client[client_id] = conn
            FRAME.pack_into(
                self._out, 0, OP_WELCOME, PROTOCOL_VERSION, 0, seq, self.config.window_ms
            )
            self._send(conn, self._out)

    def _on_memory(self, conn: _Conn, seq: int, limit_mb: float, flags: int) -> None:
        cid = conn.memory_of
        if cid is None:
            self._send_error(conn, ERR_NOT_IDENTIFIED, seq, "MEMORY needs a memory channel")
            return
        if self.memory is None:  # not accounted: every limit is granted
            grant = MemoryGrant(limit_mb, math.inf)
        elif flags & MEMORY_OVER_MAX:
            self.memory.refused(cid)
            held = self.memory.snapshot().get(cid)
            grant = MemoryGrant(held.limit_mb if held else 0.0, self.memory.free_mb)
        else:
            grant = self.memory.resize(cid, limit_mb, flags)
        code = 0 if grant.refusal is None else 1 + list(MemoryRefusal).index(grant.refusal)
        self._send(
            conn,
            FRAME.pack(OP_MEMORY_REPLY, code, F64.size, seq, grant.limit_mb)
            + F64.pack(grant.free_mb),
        )

    def _take_over(self, client_id: str) -> bool:
        """A HELLO as ``client_id`` while a connection holds that id: the newcomer replaces the
        old connection (which is closed, its token released as on a drop) when the id is
        registered with a secret — the newcomer proved it, so it is the instance's new
        incarnation and the old one is dead or dying, its close not read yet (the restart race
        of issue 15, item 13) — or when the old connection's process is gone. Otherwise the
        newcomer is refused (without a secret the id alone proves nothing)."""
        old = self._by_client[client_id]
        if client_id not in self._secrets and _peer_alive(old.sock):
            return False
        log.info("token server: a new connection of %r replaces its old one", client_id)
        old.dead = True
        self._reap(self._now_ms())
        return True

    def _credentials_ok(self, client_id: str, secret: bytes) -> bool:
        want = self._secrets.get(client_id)
        return want is None or hmac.compare_digest(want, secret)

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
        self._resuming.pop(cid, None)
        if self.priority_classes:
            self._held[cid] = now_ms  # the class plan decides whether it goes on (_replan)
            self._replan(now_ms)
            return
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
        if completed or not self.priority_classes:
            self._resuming.pop(cid, None)
        else:
            self._resuming[cid] = now_ms
        self._finish(cid, grant, busy_ms, now_ms, completed=completed, dropped=False)
        self._replan(now_ms)

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

    # -- FIKIT's class plan (under the lock) ---------------------------------------------------

    def _replan(self, now_ms: float) -> None:
        """After an event that may change who is active: ``policy.priority.plan_classes`` over
        the registered clients (active = asking, holding a token, or resuming after a
        ``completed=False`` release within a window); publish its top class on the board (the
        instances below it yield at their next preemption point) and pass the held ACQUIREs of
        the clients it lets ask to the token scheduler, oldest first. No-op without
        ``priority_classes``."""
        if not self.priority_classes:
            return
        window = self.config.window_ms
        for cid, t in list(self._resuming.items()):
            if now_ms - t > window:
                del self._resuming[cid]
        clients: list[ClientClass] = []
        for cid, st in self._sched.clients.items():
            conn = self._by_client.get(cid)
            holds = conn is not None and conn.grant is not None
            asking = conn is not None and conn.pending_seq is not None
            active = holds or asking or cid in self._resuming
            clients.append(ClientClass(cid, st.spec.priority, active, holds))
        plan = self._plan = plan_classes(clients)
        if self._board is not None:
            self._board.set_top(plan.top_priority)
        for cid in sorted(self._held, key=self._held.__getitem__):
            if not plan.may_request_token(cid):
                continue
            del self._held[cid]
            conn = self._by_client.get(cid)
            if conn is None or conn.dead or conn.pending_seq is None:
                continue
            try:
                grants = self._sched.request(cid, now_ms)
            except TokenError as e:
                seq, conn.pending_seq = conn.pending_seq, None
                self._send_error(conn, ERR_BAD_STATE, seq, str(e))
                continue
            self._deliver(grants, now_ms)

    def class_plan(self) -> ClassPlan | None:
        """The last class plan (None without ``priority_classes`` or before any event)."""
        with self._lock:
            return self._plan

    def held_requests(self) -> frozenset[str]:
        """Clients whose ACQUIRE the class plan holds back now."""
        with self._lock:
            return frozenset(self._held)

    def board_usage(self, client_id: str) -> SlotUsage | None:
        """A client's FIKIT counters from the board (None: no board or no slot)."""
        with self._lock:
            return self._board.usage_of(client_id) if self._board is not None else None

    # -- delivery and connection upkeep (under the lock) --------------------------------------

    def _deliver(self, grants: list[Grant], now_ms: float) -> None:
        """Send each grant to its client's connection; give back the ones nobody can take."""
        i = 0
        while i < len(grants):
            g = grants[i]
            i += 1
            conn = self._by_client.get(g.client_id)
            if (
                conn is not None
                and not conn.dead
                and conn.pending_seq is not None
                and self._plan is not None
                and not self._plan.may_request_token(g.client_id)
            ):  # a higher class became active since it asked: no token, hold its request again
                self._held[g.client_id] = now_ms
                grants.extend(self._sched.release(g.client_id, 0.0, now_ms, completed=False))
                continue
            if conn is not None and not conn.dead and conn.pending_seq is not None:
                FRAME.pack_into(
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
        self._send(conn, FRAME.pack(OP_ERROR, code, len(text), seq, 0.0) + text)

    def _reap(self, now_ms: float) -> None:
        """Close dead connections; a token they hold is released with the time it ran."""
        replan = False
        while True:
            dead = [c for c in self._by_fd.values() if c.dead]
            if not dead:
                if replan:
                    self._replan(now_ms)
                return
            for conn in dead:
                self._close(conn)
                if conn.memory_of is not None:
                    if self._memory_conns.get(conn.memory_of) is conn:
                        del self._memory_conns[conn.memory_of]
                    continue
                cid = conn.client_id
                if cid is None:
                    continue
                if self._by_client.get(cid) is conn:
                    del self._by_client[cid]
                grant = conn.grant
                conn.grant = None
                conn.pending_seq = None
                self._held.pop(cid, None)
                self._resuming.pop(cid, None)
                replan = True
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


__all__ = ["TokenRecord", "TokenServer"]
