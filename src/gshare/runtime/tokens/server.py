"""The token server: one per device, in the node agent's process (``tokens.protocol`` has the
wire protocol, who calls what and what must hold).

``TokenServer`` owns the socket, the lock and the loop thread, and its parts, which run under
that lock: ``connection.Wire`` (the connections, the epoll set, sending), ``sessions.Sessions``
(reading frames, HELLO, MEMORY, closing dead connections) and ``dispatch.TokenDispatch`` (the
token scheduler, FIKIT's class plan, delivering grants); ``records`` has ``TokenRecord``."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Mapping

from gshare.policy.memory import DeviceMemory, MemoryGrant, Reservation
from gshare.policy.priority import ClassPlan
from gshare.policy.tokens import ClientSpec, ClientView, TokenConfig
from gshare.runtime.tokens.board import MODE_FIKIT, MODE_TOKENS, BoardWriter, SlotUsage
from gshare.runtime.tokens.connection import Conn, Wire
from gshare.runtime.tokens.dispatch import TokenDispatch
from gshare.runtime.tokens.records import TokenRecord, new_stats
from gshare.runtime.tokens.sessions import Sessions

log = logging.getLogger(__name__)


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
        self._clock = clock
        self._memory = DeviceMemory(memory_mb) if memory_mb else None
        self._lock = threading.Lock()
        self._stats = new_stats()
        self._listener: socket.socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        board_writer: BoardWriter | None = None
        if board is not None:
            board_writer = BoardWriter(board, MODE_FIKIT if priority_classes else MODE_TOKENS)
        by_client: dict[str, Conn] = {}
        self._wire = Wire(self._stats)
        self._dispatch = TokenDispatch(
            config,
            clock,
            clock(),
            wire=self._wire,
            by_client=by_client,
            board=board_writer,
            priority_classes=priority_classes,
            record_tokens=record_tokens,
        )
        self._sessions = Sessions(
            config,
            wire=self._wire,
            dispatch=self._dispatch,
            by_client=by_client,
            memory=self._memory,
        )

    # -- settings (read-only: the parts that use them hold them) ------------------------------

    @property
    def config(self) -> TokenConfig:
        return self._dispatch.config

    @property
    def epoch_s(self) -> float:
        """Clock reading that is time 0 of the scheduler (windows are aligned to it)."""
        return self._dispatch.epoch_s

    @property
    def memory(self) -> DeviceMemory | None:
        """The device's memory ledger (None: memory is not accounted)."""
        return self._memory

    @property
    def priority_classes(self) -> bool:
        """FIKIT across priority classes (``policy.priority.plan_classes``): a client below the
        top active class gets no token (its ACQUIRE is held until its class may run), and the
        top class is published on the board. False: priorities only order the token queue."""
        return self._dispatch.priority_classes

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
            # Tenants' instances (their own uids: instance.walls) connect; each client proves
            # its secret in its HELLO, and the socket's directory is the run directory (0700).
            os.chmod(self.socket_path, 0o666)
            listener.listen(128)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._wire.open(listener, self._wake_r)
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
            for conn in self._wire.by_fd.values():
                conn.dead = True
            # held tokens go back to the scheduler, as on a drop
            self._sessions.reap(self._dispatch.now_ms())
            for s in (self._listener, self._wake_r, self._wake_w):
                if s is not None:
                    s.close()
            self._wire.shut()
            self._listener = self._wake_r = self._wake_w = None
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
            self._sessions.set_secret(spec.client_id, secret)
            self._dispatch.add_client(spec)
        self._wake()

    def set_quota(self, client_id: str, quota_request: float, quota_limit: float) -> None:
        """Change a registered instance's time quotas in place (``TokenScheduler.set_quota``):
        no reconnect, effective for its next token. Raises ``TokenError``."""
        with self._lock:
            self._dispatch.set_quota(client_id, quota_request, quota_limit)
        self._wake()

    def remove_client(self, client_id: str) -> None:
        """Forget an instance. Its token (if any) goes back to the scheduler and others may be
        granted at once; its connection stays open but is no longer identified, and an
        outstanding ``acquire`` on it fails with ``UnknownClientError``. Raises ``TokenError``
        for an unknown id."""
        with self._lock:
            self._dispatch.remove_client(client_id)
        self._wake()

    def reserve_memory(self, client_id: str, limit_mb: float) -> MemoryGrant:
        """Reserve an instance's starting memory limit (the agent, before it starts)."""
        with self._lock:
            if self._memory is None:
                return MemoryGrant(limit_mb, math.inf)
            return self._memory.reserve(client_id, limit_mb)

    def release_memory(self, client_id: str) -> None:
        """Drop an instance's reservation (the agent, once it stopped)."""
        with self._lock:
            if self._memory is not None:
                self._memory.release(client_id)

    def memory_snapshot(self) -> tuple[float, dict[str, Reservation]]:
        """(capacity MiB, the reservations); (0, {}) without a ledger."""
        with self._lock:
            if self._memory is None:
                return 0.0, {}
            return self._memory.capacity_mb, self._memory.snapshot()

    def snapshot(self) -> Mapping[str, ClientView]:
        """The scheduler's table (immutable copies), as of the last event. Thread-safe."""
        with self._lock:
            return self._dispatch.sched.snapshot()

    def token_records(self) -> list[TokenRecord]:
        """The kept ``TokenRecord``s, oldest first (empty unless ``record_tokens`` > 0)."""
        with self._lock:
            records = self._dispatch.records
            return list(records) if records is not None else []

    def stats(self) -> dict[str, int]:
        """Counters since construction: connections (accepted), closed (connections closed,
        by either side), grants, released, dropped_tokens, undelivered_grants, errors (error
        replies), malformed (connections closed for a malformed message)."""
        with self._lock:
            return dict(self._stats)

    # -- FIKIT's class plan (any thread) ------------------------------------------------------

    def class_plan(self) -> ClassPlan | None:
        """The last class plan (None without ``priority_classes`` or before any event)."""
        with self._lock:
            return self._dispatch.plan

    def held_requests(self) -> frozenset[str]:
        """Clients whose ACQUIRE the class plan holds back now."""
        with self._lock:
            return frozenset(self._dispatch.held)

    def board_usage(self, client_id: str) -> SlotUsage | None:
        """A client's FIKIT counters from the board (None: no board or no slot)."""
        with self._lock:
            board = self._dispatch.board
            return board.usage_of(client_id) if board is not None else None

    # -- the loop (server thread) -------------------------------------------------------------

    def _run(self) -> None:
        assert self._wire.started
        dispatch, sessions, wire = self._dispatch, self._sessions, self._wire
        try:
            while True:
                with self._lock:
                    if self._stopping:
                        return
                    timeout_s = dispatch.timeout_s()
                ready = wire.wait(timeout_s)
                with self._lock:
                    if self._stopping:
                        return
                    for fd in ready:
                        self._on_ready(fd)
                    now_ms = dispatch.now_ms()
                    dispatch.tick(now_ms)
                    sessions.reap(now_ms)
                    dispatch.expire_resuming(now_ms)
        except Exception:  # pragma: no cover - a bug; keep the traceback visible
            log.exception("token server loop on %s died", self.socket_path)
            raise

    def _on_ready(self, fd: int) -> None:
        if self._listener is not None and fd == self._listener.fileno():
            self._wire.accept(self._listener)
        elif self._wake_r is not None and fd == self._wake_r.fileno():
            with contextlib.suppress(BlockingIOError):
                while self._wake_r.recv(4096):
                    pass
        else:
            conn = self._wire.by_fd.get(fd)
            if conn is not None and not conn.dead:
                try:
                    self._sessions.read(conn)
                except Exception:
                    log.exception("token server: error serving %s; closing it", conn.label)
                    conn.dead = True

    def _wake(self) -> None:
        w = self._wake_w
        if w is not None:
            with contextlib.suppress(OSError):
                w.send(b"\0")

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
