"""What the token server's connections say: ``Sessions`` reads their frames and handles the
session itself — HELLO (credentials, the take-over of a restarted instance's id, the memory
channel), MEMORY, and the closing of dead connections. ACQUIRE and RELEASE go to
``dispatch.TokenDispatch``; the wire format and its rules are ``protocol``."""

from __future__ import annotations

import hmac
import logging
import math

from gshare.policy.memory import DeviceMemory, MemoryGrant, MemoryRefusal
from gshare.policy.tokens import TokenConfig
from gshare.runtime.tokens.connection import Conn, Wire, peer_alive
from gshare.runtime.tokens.dispatch import TokenDispatch
from gshare.runtime.tokens.protocol import (
    ERR_BAD_CREDENTIALS,
    ERR_BAD_STATE,
    ERR_NOT_IDENTIFIED,
    ERR_UNKNOWN_CLIENT,
    F64,
    FRAME,
    FRAME_SIZE,
    HELLO_MEMORY_CHANNEL,
    MAX_HELLO_BYTES,
    MEMORY_OVER_MAX,
    OP_ACQUIRE,
    OP_HELLO,
    OP_MEMORY,
    OP_MEMORY_REPLY,
    OP_RELEASE,
    OP_WELCOME,
    PROTOCOL_VERSION,
)

log = logging.getLogger("gshare.runtime.tokens.server")
"""The token server's logger (its parts log under the server's name)."""


class Sessions:
    """The connections' sessions for one ``TokenServer``: which connection speaks for which
    client (``by_client``, the memory channels, the agent's secrets), reading and dispatching
    their frames, closing the dead ones.

    Owned by the server: its loop thread calls ``read`` for a readable connection and ``reap``
    after each round; the agent's calls reach ``set_secret`` (``add_client``) and ``reap``
    (``stop``). Every method runs under the server's lock. What must hold: ``by_client`` is the
    same dict as ``TokenDispatch``'s and maps an id to its one identified connection; a
    connection marked ``dead`` is closed, and its token released, by the next ``reap``.
    """

    def __init__(
        self,
        config: TokenConfig,
        *,
        wire: Wire,
        dispatch: TokenDispatch,
        by_client: dict[str, Conn],
        memory: DeviceMemory | None,
    ) -> None:
        self.config = config
        self._wire = wire
        self._dispatch = dispatch
        self.by_client = by_client
        self._memory_conns: dict[str, Conn] = {}
        self._secrets: dict[str, bytes] = {}
        self._memory = memory
        self._out = bytearray(FRAME_SIZE)

    def set_secret(self, client_id: str, secret: str | None) -> None:
        """The secret ``client_id``'s HELLOs must carry from now on (None: none)."""
        if secret:
            self._secrets[client_id] = secret.encode("ascii")
        else:
            self._secrets.pop(client_id, None)

    # -- reading (server thread, under the lock) ----------------------------------------------

    def read(self, conn: Conn) -> None:
        """Read what ``conn`` sent and handle each whole message; keep a partial one."""
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
        dispatch = self._dispatch
        while n - off >= FRAME_SIZE:
            op, flags, length, seq, value = unpack(data, off)
            if op == OP_ACQUIRE and length == 0:
                off += FRAME_SIZE
                dispatch.acquire(conn, seq)
            elif op == OP_RELEASE and length == 0:
                off += FRAME_SIZE
                dispatch.release(conn, seq, value, bool(flags & 1))
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
                    self._wire.malformed(conn, "client id is not UTF-8")
                    return
                if not self._credentials_ok(client_id, secret):
                    self._wire.send_error(
                        conn, ERR_BAD_CREDENTIALS, seq, f"bad credentials for {client_id!r}"
                    )
                    log.warning("token server: refused a HELLO as %r (bad credentials)", client_id)
                    continue
                self._on_hello(conn, seq, client_id, bool(flags & HELLO_MEMORY_CHANNEL))
            else:
                self._wire.malformed(conn, f"bad frame op=0x{op:02x} flags={flags} length={length}")
                return
            if conn.dead:
                return
        if off < n:
            conn.buf = data[off:]

    # -- message handlers (server thread, under the lock) -------------------------------------

    def _on_hello(self, conn: Conn, seq: int, client_id: str, memory: bool = False) -> None:
        if conn.client_id is not None or conn.memory_of is not None:
            self._wire.send_error(
                conn,
                ERR_BAD_STATE,
                seq,
                f"connection already identified as {conn.client_id or conn.memory_of!r}",
            )
        elif client_id not in self._dispatch.sched.clients:
            self._wire.send_error(conn, ERR_UNKNOWN_CLIENT, seq, f"unknown client {client_id!r}")
        elif memory:
            old = self._memory_conns.get(client_id)
            if old is not None and not old.dead:
                self._wire.send_error(
                    conn, ERR_BAD_STATE, seq, f"client {client_id!r} has a memory channel"
                )
                return
            conn.memory_of = client_id
            conn.label = f"memory channel of {client_id!r}"
            self._memory_conns[client_id] = conn
            self._welcome(conn, seq)
        elif client_id in self.by_client and not self._take_over(client_id):
            self._wire.send_error(
                conn, ERR_BAD_STATE, seq, f"client {client_id!r} is already connected"
            )
        else:
            conn.client_id = client_id
            conn.label = f"client {client_id!r}"
            self.by_client[client_id] = conn
            self._welcome(conn, seq)

    def _welcome(self, conn: Conn, seq: int) -> None:
        FRAME.pack_into(self._out, 0, OP_WELCOME, PROTOCOL_VERSION, 0, seq, self.config.window_ms)
        self._wire.send(conn, self._out)

    def _on_memory(self, conn: Conn, seq: int, limit_mb: float, flags: int) -> None:
        cid = conn.memory_of
        if cid is None:
            self._wire.send_error(conn, ERR_NOT_IDENTIFIED, seq, "MEMORY needs a memory channel")
            return
        if self._memory is None:  # not accounted: every limit is granted
            grant = MemoryGrant(limit_mb, math.inf)
        elif flags & MEMORY_OVER_MAX:
            self._memory.refused(cid)
            held = self._memory.snapshot().get(cid)
            grant = MemoryGrant(held.limit_mb if held else 0.0, self._memory.free_mb)
        else:
            grant = self._memory.resize(cid, limit_mb, flags)
        code = 0 if grant.refusal is None else 1 + list(MemoryRefusal).index(grant.refusal)
        self._wire.send(
            conn,
            FRAME.pack(OP_MEMORY_REPLY, code, F64.size, seq, grant.limit_mb)
            + F64.pack(grant.free_mb),
        )

    def _take_over(self, client_id: str) -> bool:
        """A HELLO as ``client_id`` while a connection holds that id: the newcomer replaces the
        old connection (which is closed, its token released as on a drop) when the id is
        registered with a secret — the newcomer proved it, so it is the instance's new
        incarnation and the old one is dead or dying, its close not read yet (the restart race
        of docs/DESIGN.md §12.4) — or when the old connection's process is gone. Otherwise the
        newcomer is refused (without a secret the id alone proves nothing)."""
        old = self.by_client[client_id]
        if client_id not in self._secrets and peer_alive(old.sock):
            return False
        log.info("token server: a new connection of %r replaces its old one", client_id)
        old.dead = True
        self.reap(self._dispatch.now_ms())
        return True

    def _credentials_ok(self, client_id: str, secret: bytes) -> bool:
        want = self._secrets.get(client_id)
        return want is None or hmac.compare_digest(want, secret)

    # -- connection upkeep (under the lock) ---------------------------------------------------

    def reap(self, now_ms: float) -> None:
        """Close dead connections; a token they hold is released with the time it ran."""
        replan = False
        by_fd = self._wire.by_fd
        while True:
            dead = [c for c in by_fd.values() if c.dead]
            if not dead:
                if replan:
                    self._dispatch.replan(now_ms)
                return
            for conn in dead:
                self._wire.close(conn)
                if conn.memory_of is not None:
                    if self._memory_conns.get(conn.memory_of) is conn:
                        del self._memory_conns[conn.memory_of]
                    continue
                cid = conn.client_id
                if cid is None:
                    continue
                if self.by_client.get(cid) is conn:
                    del self.by_client[cid]
                replan = True
                self._dispatch.drop(conn, cid, now_ms)


__all__ = ["Sessions"]
