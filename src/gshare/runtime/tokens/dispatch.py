"""The token side of the token server: ``TokenDispatch`` drives the device's
``policy.tokens.TokenScheduler`` and FIKIT's class plan (``policy.priority.plan_classes``) and
delivers their grants to the connections that asked (``protocol``: what must hold)."""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable

from gshare.policy.priority import ClassPlan, ClientClass, plan_classes
from gshare.policy.tokens import ClientSpec, Grant, TokenConfig, TokenError, TokenScheduler
from gshare.runtime.tokens.board import BoardError, BoardWriter
from gshare.runtime.tokens.connection import Conn, Wire
from gshare.runtime.tokens.protocol import (
    ERR_BAD_STATE,
    ERR_BAD_VALUE,
    ERR_UNKNOWN_CLIENT,
    FRAME,
    FRAME_SIZE,
    OP_GRANT,
)
from gshare.runtime.tokens.records import TokenRecord

log = logging.getLogger("gshare.runtime.tokens.server")
"""The token server's logger (its parts log under the server's name)."""


class TokenDispatch:
    """The scheduler, FIKIT's class plan and the delivery of grants, for one ``TokenServer``.

    Owned by the server, which calls it for the agent's client changes and at the loop's ticks;
    ``sessions.Sessions`` calls it for ACQUIRE and RELEASE frames and for dropped connections.
    Every method runs under the server's lock. What must hold: this is the only caller of the
    scheduler; ``by_client`` is the sessions' table of identified connections (the same dict;
    read here, and only ``remove_client`` unbinds one); a grant goes to the connection of its
    client with an ACQUIRE outstanding, or back to the scheduler at once (``_deliver``). Times
    are ``now_ms()``: ``(clock() - epoch_s) * 1000``.
    """

    def __init__(
        self,
        config: TokenConfig,
        clock: Callable[[], float],
        epoch_s: float,
        *,
        wire: Wire,
        by_client: dict[str, Conn],
        board: BoardWriter | None,
        priority_classes: bool,
        record_tokens: int,
    ) -> None:
        self.config = config
        self._clock = clock
        self.epoch_s = epoch_s
        self.sched = TokenScheduler(config)
        self._wire = wire
        self._stats = wire.stats
        self._by_client = by_client
        self.priority_classes = priority_classes
        """FIKIT across priority classes (``TokenServer.priority_classes``)."""
        self.board = board
        self.records: deque[TokenRecord] | None = (
            deque(maxlen=record_tokens) if record_tokens > 0 else None
        )
        self.plan: ClassPlan | None = None
        self.held: dict[str, float] = {}
        """Clients whose ACQUIRE the class plan holds back, and since when (ms)."""
        self.resuming: dict[str, float] = {}
        """Clients that gave a token back with work left (``completed=False``) and will ask
        again at once, and when (ms): still active for the class plan, for one window."""
        self._out = bytearray(FRAME_SIZE)

    def now_ms(self) -> float:
        return (self._clock() - self.epoch_s) * 1000.0

    # -- clients (the agent's calls on the server) --------------------------------------------

    def add_client(self, spec: ClientSpec) -> None:
        now_ms = self.now_ms()
        self._deliver(self.sched.add_client(spec, now_ms), now_ms)
        if self.board is not None:
            try:
                self.board.assign(spec.client_id, spec.priority)
            except BoardError as e:  # the client shares by tokens alone
                log.warning("token server: %s", e)
        self.replan(now_ms)

    def set_quota(self, client_id: str, quota_request: float, quota_limit: float) -> None:
        now_ms = self.now_ms()
        self._deliver(self.sched.set_quota(client_id, quota_request, quota_limit, now_ms), now_ms)

    def remove_client(self, client_id: str) -> None:
        now_ms = self.now_ms()
        conn = self._by_client.pop(client_id, None)
        grants = self.sched.remove_client(client_id, now_ms)
        if conn is not None:
            if conn.pending_seq is not None:
                self._wire.send_error(
                    conn,
                    ERR_UNKNOWN_CLIENT,
                    conn.pending_seq,
                    f"client {client_id!r} was removed",
                )
            conn.pending_seq = None
            conn.grant = None
            conn.client_id = None
            conn.removed_id = client_id
        self.held.pop(client_id, None)
        self.resuming.pop(client_id, None)
        if self.board is not None:
            self.board.free(client_id)
        self._deliver(grants, now_ms)
        self.replan(now_ms)

    # -- messages and drops (``Sessions``) -----------------------------------------------------

    def acquire(self, conn: Conn, seq: int) -> None:
        cid = self._wire.bound(conn, seq)
        if cid is None:
            return
        if conn.pending_seq is not None or conn.grant is not None:
            what = "waiting for" if conn.grant is None else "holding"
            self._wire.send_error(
                conn, ERR_BAD_STATE, seq, f"client {cid!r} asked while {what} a token"
            )
            return
        now_ms = self.now_ms()
        conn.pending_seq = seq
        self.resuming.pop(cid, None)
        if self.priority_classes:
            self.held[cid] = now_ms  # the class plan decides whether it goes on (replan)
            self.replan(now_ms)
            return
        try:
            grants = self.sched.request(cid, now_ms)
        except TokenError as e:
            conn.pending_seq = None
            self._wire.send_error(conn, ERR_BAD_STATE, seq, str(e))
            return
        self._deliver(grants, now_ms)

    def release(self, conn: Conn, seq: int, busy_ms: float, completed: bool) -> None:
        cid = self._wire.bound(conn, seq)
        if cid is None:
            return
        grant = conn.grant
        if grant is None:
            self._wire.send_error(conn, ERR_BAD_STATE, seq, f"client {cid!r} released no token")
            return
        if not (math.isfinite(busy_ms) and busy_ms >= 0):
            self._wire.send_error(
                conn, ERR_BAD_VALUE, seq, f"busy_ms must be finite and >= 0, got {busy_ms}"
            )
            return
        now_ms = self.now_ms()
        conn.grant = None
        if completed or not self.priority_classes:
            self.resuming.pop(cid, None)
        else:
            self.resuming[cid] = now_ms
        self._finish(cid, grant, busy_ms, now_ms, completed=completed, dropped=False)
        self.replan(now_ms)

    def drop(self, conn: Conn, cid: str, now_ms: float) -> None:
        """``conn``, bound to ``cid``, is closed: forget its request; a token it holds is
        released with the time it ran. The caller (``Sessions.reap``) replans afterwards."""
        grant = conn.grant
        conn.grant = None
        conn.pending_seq = None
        self.held.pop(cid, None)
        self.resuming.pop(cid, None)
        state = self.sched.clients.get(cid)
        if grant is not None and state is not None and state.token is grant:
            elapsed_ms = max(0.0, now_ms - grant.start_ms)
            log.info(
                "token server: %s dropped holding a token; released after %.3f ms",
                conn.label,
                elapsed_ms,
            )
            self._finish(cid, grant, elapsed_ms, now_ms, completed=False, dropped=True)

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
            grants = self.sched.release(cid, busy_ms, now_ms, completed=completed)
        except TokenError as e:  # the scheduler no longer holds that token (cannot happen)
            log.error("token server: release of %r refused: %s", cid, e)
            return
        self._stats["dropped_tokens" if dropped else "released"] += 1
        if self.records is not None:
            self.records.append(
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

    # -- the loop's clock (server thread) ------------------------------------------------------

    def timeout_s(self) -> float | None:
        """Seconds until the next window boundary while a client waits, else block (or, with
        priority classes, until the oldest ``completed=False`` release stops counting as
        active)."""
        expiry_s: float | None = None
        if self.resuming:
            end_ms = min(self.resuming.values()) + self.config.window_ms
            expiry_s = max(0.0, (end_ms - self.now_ms()) / 1000.0) + 1e-4
        if not self._any_waiting():
            return expiry_s
        tick_s = max(0.0, (self.sched.next_wakeup_ms() - self.now_ms()) / 1000.0)
        return tick_s if expiry_s is None else min(tick_s, expiry_s)

    def _any_waiting(self) -> bool:
        return any(c.waiting for c in self.sched.clients.values())

    def tick(self, now_ms: float) -> None:
        """The scheduler's tick once its wake-up time has come while a client waits."""
        if now_ms >= self.sched.next_wakeup_ms() and self._any_waiting():
            self._deliver(self.sched.tick(now_ms), now_ms)

    def expire_resuming(self, now_ms: float) -> None:
        """Replan once the oldest ``completed=False`` release stopped counting as active."""
        if self.resuming and (min(self.resuming.values()) + self.config.window_ms < now_ms):
            self.replan(now_ms)

    # -- FIKIT's class plan (under the lock) ---------------------------------------------------

    def replan(self, now_ms: float) -> None:
        """After an event that may change who is active: ``policy.priority.plan_classes`` over
        the registered clients (active = asking, holding a token, or resuming after a
        ``completed=False`` release within a window); publish its top class on the board (the
        instances below it yield at their next preemption point) and pass the held ACQUIREs of
        the clients it lets ask to the token scheduler, oldest first. No-op without
        ``priority_classes``."""
        if not self.priority_classes:
            return
        window = self.config.window_ms
        for cid, t in list(self.resuming.items()):
            if now_ms - t > window:
                del self.resuming[cid]
        clients: list[ClientClass] = []
        for cid, st in self.sched.clients.items():
            conn = self._by_client.get(cid)
            holds = conn is not None and conn.grant is not None
            asking = conn is not None and conn.pending_seq is not None
            active = holds or asking or cid in self.resuming
            clients.append(ClientClass(cid, st.spec.priority, active, holds))
        plan = self.plan = plan_classes(clients)
        if self.board is not None:
            self.board.set_top(plan.top_priority)
        for cid in sorted(self.held, key=self.held.__getitem__):
            if not plan.may_request_token(cid):
                continue
            del self.held[cid]
            conn = self._by_client.get(cid)
            if conn is None or conn.dead or conn.pending_seq is None:
                continue
            try:
                grants = self.sched.request(cid, now_ms)
            except TokenError as e:
                seq, conn.pending_seq = conn.pending_seq, None
                self._wire.send_error(conn, ERR_BAD_STATE, seq, str(e))
                continue
            self._deliver(grants, now_ms)

    # -- delivery (under the lock) -------------------------------------------------------------

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
                and self.plan is not None
                and not self.plan.may_request_token(g.client_id)
            ):  # a higher class became active since it asked: no token, hold its request again
                self.held[g.client_id] = now_ms
                grants.extend(self.sched.release(g.client_id, 0.0, now_ms, completed=False))
                continue
            if conn is not None and not conn.dead and conn.pending_seq is not None:
                FRAME.pack_into(
                    self._out, 0, OP_GRANT, 1 if g.elastic else 0, 0, conn.pending_seq, g.quota_ms
                )
                if self._wire.send(conn, self._out):
                    conn.pending_seq = None
                    conn.grant = g
                    self._stats["grants"] += 1
                    continue
                conn.pending_seq = None
            # Nobody will run this token: return it now so that it never blocks the device.
            self._stats["undelivered_grants"] += 1
            grants.extend(self.sched.release(g.client_id, 0.0, now_ms, completed=False))


__all__ = ["TokenDispatch"]
