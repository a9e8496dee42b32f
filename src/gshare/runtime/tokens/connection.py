"""The token server's connections and sockets: ``Conn`` (the server side of one instance
connection), ``peer_alive`` and ``Wire`` (the connections by descriptor, the epoll set, sending
replies, accepting, closing). What a connection says is ``sessions``; what its tokens do is
``dispatch``; the wire format is ``protocol``."""

from __future__ import annotations

import contextlib
import logging
import math
import select
import socket
import struct

from gshare.policy.tokens import Grant
from gshare.runtime.tokens.protocol import (
    ERR_NOT_IDENTIFIED,
    ERR_UNKNOWN_CLIENT,
    FRAME,
    MAX_ERROR_BYTES,
    OP_ERROR,
    SELECT_FD_LIMIT,
)

log = logging.getLogger("gshare.runtime.tokens.server")
"""The token server's logger (its parts log under the server's name)."""


def peer_alive(sock: socket.socket) -> bool:
    """Whether the process at the other end of a Unix socket still runs (not a zombie)."""
    try:
        pid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError, struct.error):
        return False
    return state != b"Z"


class Conn:
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


class Wire:
    """The token server's open connections and its epoll set, and the sending of replies.

    Owned by ``TokenServer`` (one per server); ``sessions.Sessions`` and
    ``dispatch.TokenDispatch`` send through it. Every method runs under the server's lock (in
    the loop thread, or in an agent call such as ``remove_client``). ``open`` (the server's
    ``start``) creates the epoll set with the listener and the wake-up socket, ``shut`` (its
    ``stop``) closes it. ``by_fd`` holds every accepted connection until ``close`` (only
    ``Sessions.reap`` closes one: a connection that must go is marked ``dead`` and closed by the
    next reap). ``stats`` is the server's
    counter dict (``records.new_stats``).

    It uses ``select.epoll`` directly, not ``selectors``: the loop wakes once per message, and
    the selector's key objects cost about 1 us of Python per wake-up (docs/journal/tokens.md,
    the token path).
    """

    __slots__ = ("by_fd", "ep", "fds", "stats")

    def __init__(self, stats: dict[str, int]) -> None:
        self.by_fd: dict[int, Conn] = {}
        self.ep: select.epoll | None = None
        self.fds: set[int] = set()
        """Every descriptor in the epoll set (the sub-millisecond ``select`` waits on them)."""
        self.stats = stats

    @property
    def started(self) -> bool:
        return self.ep is not None

    def open(self, *socks: socket.socket) -> None:
        """Create the epoll set watching ``socks`` (the listener, the wake-up socket)."""
        self.ep = select.epoll()
        for sock in socks:
            self._watch(sock.fileno())

    def shut(self) -> None:
        """Close the epoll set (the connections are closed by ``Sessions.reap``)."""
        if self.ep is not None:
            self.ep.close()
        self.ep = None
        self.fds.clear()

    def _watch(self, fd: int) -> None:
        assert self.ep is not None
        self.ep.register(fd, select.EPOLLIN)
        self.fds.add(fd)

    def send(self, conn: Conn, frame: bytes | bytearray) -> bool:
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

    def send_error(self, conn: Conn, code: int, seq: int, message: str) -> None:
        text = message.encode("utf-8")[:MAX_ERROR_BYTES]
        self.stats["errors"] += 1
        log.debug("token server: error %d to %s: %s", code, conn.label, message)
        self.send(conn, FRAME.pack(OP_ERROR, code, len(text), seq, 0.0) + text)

    def malformed(self, conn: Conn, why: str) -> None:
        log.warning("token server: malformed message from %s (%s); closing it", conn.label, why)
        self.stats["malformed"] += 1
        conn.dead = True

    def bound(self, conn: Conn, seq: int) -> str | None:
        """The client id ``conn`` speaks for; None (and an error reply to ``seq``) when it has
        none: no HELLO yet, or the agent removed its client."""
        cid = conn.client_id
        if cid is None:
            if conn.removed_id is not None:
                self.send_error(
                    conn, ERR_UNKNOWN_CLIENT, seq, f"client {conn.removed_id!r} was removed"
                )
            else:
                self.send_error(conn, ERR_NOT_IDENTIFIED, seq, "send HELLO first")
        return cid

    def accept(self, listener: socket.socket) -> None:
        """Accept every pending connection on ``listener`` (non-blocking, while started)."""
        assert self.ep is not None
        while True:
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            sock.setblocking(False)
            conn = Conn(sock)
            self.by_fd[conn.fd] = conn
            self._watch(conn.fd)
            self.stats["connections"] += 1

    def close(self, conn: Conn) -> None:
        if self.by_fd.pop(conn.fd, None) is not None:
            self.stats["closed"] += 1
        conn.dead = True
        if self.ep is not None and conn.fd in self.fds:
            self.fds.discard(conn.fd)
            with contextlib.suppress(KeyError, ValueError, OSError):
                self.ep.unregister(conn.fd)
        conn.sock.close()

    def wait(self, timeout_s: float | None) -> list[int]:
        """Ready descriptors, or none once ``timeout_s`` has passed (None: no timeout). The loop
        thread calls it outside the server's lock.

        epoll's timeout is whole milliseconds rounded up (up to 1 ms late, i.e. 2.5 % of a
        40 ms window lost at every tick); so wait whole milliseconds rounded *down* with epoll
        and the sub-millisecond rest with select(2), whose timeout has microsecond resolution
        (what is left is the OS's wake-up latency).
        """
        ep = self.ep
        assert ep is not None
        if timeout_s is None:
            return [fd for fd, _ in ep.poll(-1)]
        if timeout_s >= 0.001:
            whole_ms = math.floor(timeout_s * 1000.0)
            return [fd for fd, _ in ep.poll((whole_ms - 0.5) / 1000.0)]  # rounded up: whole_ms
        if timeout_s <= 0:
            return [fd for fd, _ in ep.poll(0)]
        if max(self.fds) < SELECT_FD_LIMIT:
            ready, _, _ = select.select(list(self.fds), [], [], timeout_s)
            return ready
        return [fd for fd, _ in ep.poll(timeout_s)]  # rounded up to 1 ms


__all__ = ["Conn", "Wire", "peer_alive"]
