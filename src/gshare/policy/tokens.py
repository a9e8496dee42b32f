"""Multi-token spatio-temporal scheduler of one GPU (FaST-GShare §3.3.2 with Gemini's refinements).

Who calls it: one ``TokenScheduler`` per device. The simulator's GPU model (``sim.gpu``) drives it
in virtual time; the live runtime's node agent drives it with the wall clock behind a Unix
socket. Both call exactly these methods, always passing the current time:

* ``request(client, now_ms)`` — an instance wants to run a burst (one batch);
* ``release(client, busy_ms, now_ms, completed=...)`` — it stopped, having used ``busy_ms``;
* ``tick(now_ms)`` — the mechanism's timer fired at ``next_wakeup_ms()`` (a window boundary);
* ``add_client`` / ``remove_client`` — instance lifecycle.

Each returns the list of ``Grant``s to deliver now. The scheduler keeps its state in plain data
(``ClientState`` records) that ``snapshot()`` exposes; it never reads a clock and does no I/O.

What must hold (tested by properties in ``tests/policy/test_tokens.py``):

* the SM % of clients holding a token never exceeds ``sm_global_limit_pct`` (the SM adapter);
* a client holding a token is never granted a second one;
* a client's usage charged to a window never exceeds ``quota_limit * window_ms`` unless it ran
  past its token (an overrun, possible only on hardware that cannot preempt a burst); an overrun
  past the limit is carried into the next window as debt, so over any run the client's share
  stays within its limit plus at most one burst; with ``TokenConfig.limit_margin_ms`` = m > 0 the
  tokens of a client whose cap is below the window stop m short of that cap, so an overrun of
  up to m stays within the limit too;
* a waiting client whose guaranteed quota is not yet used in this window is served before any
  client asking for elastic time;
* no token takes time still owed in this window to an active client that cannot run beside it
  (guarantee reservation, ``TokenConfig.reserve_guarantees``), beyond the holder's own missing
  quota.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Final

# NOTE — the multi-token scheduler (FaST-GShare §3.3.2, Gemini token scheduler).
# Time is cut into windows of ``window_ms`` (FaST-GShare's backend: 40 ms). A client with quota
# request Qr and limit Ql is guaranteed Qr·W and may use up to Ql·W of every window. On every
# event the scheduler (1) *filters*: clients with no quota left (used >= Ql·W) wait for the next
# window; (2) *enqueues* the other waiting clients ordered by priority class (higher first), then
# missing quota Q_miss = Qr·W − used (larger first), then the longest waiting, then id; clients
# whose guarantee is met (Q_miss <= 0) may only take *elastic* idle time up to their limit, after
# every client still owed its guarantee; (3) *dispatches* tokens from the head of the queue while
# the SM adapter allows (running SM % + the head's <= SM_GLOBAL_LIMIT); like FaST-GShare it stops
# at the first head that does not fit (no back-filling by default).
# Gemini *dynamic quota*: a token lasts the client's predicted burst (EWMA of its completed
# bursts) × headroom, clipped to its remaining quota. Gemini *revocation*: the frontend gives the
# token back early when its rest cannot fit the next kernel (``should_yield``). A burst that runs
# past its token is charged in full; usage beyond the limit is debt repaid in the next window.
#
# NOTE — guarantee reservation (gshare's, not in the papers; ``reserve_guarantees``). Rule: no
# token takes time still *owed* in this window to another client that conflicts with the holder
# (their SM shares sum over the global limit) and is active (waiting, holding a token, having
# used time in this window, or having asked or released within the last window). A client may
# always take its own missing quota, and beyond it only the window's slack:
#     length <= max(Q_miss(c), window_end - now - sum over conflicting active d of Q_owed(d)),
# Q_owed(d) = d's missing quota (at most what it can still be given) minus what its running
# token covers in this window. Invariant: a saturating client keeps its guarantee even though it
# is never waiting at the instant it releases; idle clients reserve nothing. Conflicts are
# judged pairwise (exact for two clients per SM band). Why and measurements:
# docs/journal/tokens.md.
#
# NOTE — fair elastic time (gshare's; FaST-GShare §3.3.2 lets a pod use idle time up to its
# limit but does not say how idle time is split). Rule: with reservations on, a token takes its
# own missing quota and at most 1/n of the window's elastic time (what is left of the window
# after every conflicting active client's guarantee), n = the client and the conflicting active
# clients that could still take elastic time. Invariant: saturating clients with equal
# requests and limits get equal shares of a window (an uncontended token no longer hands one of
# them the whole slack); a client alone keeps the whole slack. Measured on an H200 and the stub:
# docs/journal/tokens.md.
#
# NOTE — uncontended tokens (``idle_token_ms``, opt-in, the live runtime's; Gemini: a token is a
# time slice). Rule: when no other client waits at dispatch, a token is at least
# ``idle_token_ms`` long, clipped like any token (remaining quota, ``max_token_ms``,
# reservations), so a client reusing its token (``reuse_token``) pays the protocol once per
# slice. Invariant: a client arriving meanwhile waits at most the token's rest. The simulator
# keeps 0 (off). Measurements: docs/journal/tokens.md.
#
# NOTE — limit margin (``limit_margin_ms`` = m, opt-in, the live runtime's). Rule: a client
# whose per-window cap is below the window (limit < 1, or its request without elasticity) gets
# tokens only up to ``cap - m``; the rest of the cap (m < ``min_token_ms``) is never handed out.
# Invariant: an overrun of up to m keeps the window within the limit (FaST-GShare: a client never
# gets more than Ql of a window); a client with cap = window keeps its full quota; the guarantee
# reservation counts only what a client can still be given. Why m is small:
# docs/journal/tokens.md.


DEFAULT_BURST_EWMA_ALPHA: Final[float] = 0.3
"""Weight of the newest completed burst in a burst-length EWMA (``predict_burst_ms``): the
scheduler's default and the runtime token client's."""


class TokenError(ValueError):
    """A bad client specification or an event for an unknown client; the message names it."""


@dataclass(frozen=True, slots=True)
class TokenConfig:
    """Parameters of one GPU's token scheduler."""

    window_ms: float = 40.0
    """Length of a scheduling window (FaST-GShare's backend: 40 ms)."""
    sm_global_limit_pct: float = 100.0
    """SM adapter: the SM % of running clients never exceeds this."""
    min_token_ms: float = 0.5
    """Shortest token granted; a client with less quota left than this waits for the next window."""
    max_token_ms: float = 40.0
    """Longest token granted (bounds how long one client can hold SMs without re-asking)."""
    default_burst_ms: float = 10.0
    """Predicted burst length before a client has any history."""
    burst_ewma_alpha: float = DEFAULT_BURST_EWMA_ALPHA
    """Weight of the newest completed burst in the burst-length EWMA (Gemini dynamic quota)."""
    token_headroom: float = 1.25
    """Token length = predicted burst x headroom (then clipped), so a typical burst fits."""
    dynamic_quota: bool = True
    """Gemini dynamic quota; when False every token is the client's whole remaining quota."""
    elastic: bool = True
    """Allow clients to use idle time beyond their request, up to their limit."""
    backfill: bool = False
    """Skip a head client whose SMs do not fit and try the next ones (FaST-GShare: no)."""
    reserve_guarantees: bool = True
    """No token eats into guaranteed time still owed, in this window, to a client that cannot
    run beside it (see the NOTE on reservations). False restores plain dispatch by missing
    quota, where back-to-back bursts can lose their guarantee to a neighbour's long token."""
    idle_token_ms: float = 0.0
    """Uncontended tokens (opt-in; 0 = off, the simulator's default). When > 0 and no other
    client is waiting at dispatch, a token is at least ``idle_token_ms`` long instead of the
    predicted burst x headroom, still clipped to the client's remaining quota in the window,
    ``max_token_ms`` and the guarantee reservation: a client that reuses its token for
    back-to-back bursts (Gemini: a token is a time slice) then pays the protocol once per
    slice. See the NOTE on uncontended tokens."""
    limit_margin_ms: float = 0.0
    """Limit margin (opt-in; 0 = off, the simulator's default). A client whose per-window cap
    (limit x window, or request x window without elasticity) is below the window gets no token
    past ``cap - limit_margin_ms``, so an overrun of up to this long keeps its window within the
    limit; it costs such a client that much of its cap. Must be below ``min_token_ms``. See the
    NOTE on the limit margin."""
    reserve_for_lower_priority: bool = True
    """Guarantee reservation also for clients of lower priority (the default). False under
    FIKIT's class plan (``policy.priority.classes``: a quota is guaranteed against clients of
    the same and lower classes only): a client's token is never shortened for the guarantee of
    a client of lower priority, which gets no token while a higher class is active anyway."""

    def __post_init__(self) -> None:
        if self.window_ms <= 0:
            raise TokenError(f"window_ms must be > 0, got {self.window_ms}")
        if not (0 < self.sm_global_limit_pct <= 100):
            raise TokenError(
                f"sm_global_limit_pct must be in (0, 100], got {self.sm_global_limit_pct}"
            )
        if not (0 < self.min_token_ms <= self.max_token_ms):
            raise TokenError(
                "need 0 < min_token_ms <= max_token_ms, got "
                f"{self.min_token_ms}, {self.max_token_ms}"
            )
        if not (0 < self.burst_ewma_alpha <= 1):
            raise TokenError(f"burst_ewma_alpha must be in (0, 1], got {self.burst_ewma_alpha}")
        if self.token_headroom < 1:
            raise TokenError(f"token_headroom must be >= 1, got {self.token_headroom}")
        if not (self.idle_token_ms >= 0):
            raise TokenError(f"idle_token_ms must be >= 0, got {self.idle_token_ms}")
        if not (0 <= self.limit_margin_ms < self.min_token_ms):
            raise TokenError(
                f"need 0 <= limit_margin_ms < min_token_ms, got {self.limit_margin_ms}, "
                f"{self.min_token_ms}"
            )


@dataclass(frozen=True, slots=True)
class ClientSpec:
    """What the scheduler knows of one instance (its FaST-GShare backend table row)."""

    client_id: str
    sm_pct: float
    """Spatial share (MPS active thread %)."""
    quota_request: float
    """Guaranteed fraction of every window, in (0, 1]."""
    quota_limit: float
    """Maximum fraction of every window, in [quota_request, 1]."""
    priority: int = 0
    """Priority class 0-9; higher is served first within the same phase."""

    def __post_init__(self) -> None:
        if not (0 < self.sm_pct <= 100):
            raise TokenError(
                f"client {self.client_id}: sm_pct must be in (0, 100], got {self.sm_pct}"
            )
        if not (0 < self.quota_request <= self.quota_limit <= 1):
            raise TokenError(
                f"client {self.client_id}: need 0 < quota_request <= quota_limit <= 1, "
                f"got {self.quota_request}, {self.quota_limit}"
            )
        if not (0 <= self.priority <= 9):
            raise TokenError(
                f"client {self.client_id}: priority must be in 0..9, got {self.priority}"
            )


@dataclass(frozen=True, slots=True)
class Grant:
    """A token: ``client_id`` may run from ``start_ms`` for at most ``quota_ms``."""

    client_id: str
    start_ms: float
    quota_ms: float
    """Token length (ms of GPU time the client may use before it must release)."""
    elastic: bool
    """True when the token is idle time beyond the client's guaranteed request."""


@dataclass(slots=True)
class ClientState:
    """The scheduler's row for one client (exposed read-only through ``snapshot``)."""

    spec: ClientSpec
    used_ms: float = 0.0
    """Usage charged to the current window (starts at the carried debt)."""
    waiting: bool = False
    """A request is outstanding and no token has been granted for it yet."""
    token: Grant | None = None
    """The token currently held, if any."""
    charged_in_token_ms: float = 0.0
    """Part of the current token's run already charged to earlier windows (at window ticks)."""
    predicted_burst_ms: float = 0.0
    """EWMA of completed burst lengths (0 = no history yet)."""
    total_used_ms: float = 0.0
    """Usage since the client was added (for achieved-share metrics)."""
    overrun_ms: float = 0.0
    """Total time run past granted tokens."""
    total_held_ms: float = 0.0
    """Time from each released token's grant to its release, summed: with ``total_used_ms``
    and ``tokens`` the device time tokens held idle (the protocol's hand-overs)."""
    tokens: int = 0
    """Tokens released since the client was added."""
    added_ms: float = 0.0
    last_seen_ms: float = float("-inf")
    """Time of the client's last request or release (guarantee reservation: recently active)."""
    waiting_since_ms: float = 0.0
    """When the outstanding request was made (ties of missing quota: longest waiting first)."""


@dataclass(frozen=True, slots=True)
class ClientView:
    """Immutable copy of a client's row, returned by ``snapshot``."""

    client_id: str
    sm_pct: float
    quota_request: float
    quota_limit: float
    priority: int
    used_ms: float
    waiting: bool
    running: bool
    predicted_burst_ms: float
    total_used_ms: float
    overrun_ms: float
    total_held_ms: float = 0.0
    tokens: int = 0


@dataclass(slots=True)
class TokenScheduler:
    """The multi-token scheduler of one GPU. See the module docstring for the protocol."""

    config: TokenConfig = field(default_factory=TokenConfig)
    window_start_ms: float = 0.0
    clients: dict[str, ClientState] = field(default_factory=dict)

    # -- lifecycle ----------------------------------------------------------------------------

    def add_client(self, spec: ClientSpec, now_ms: float) -> list[Grant]:
        """Register an instance. Its SM share must fit under the global limit on its own."""
        if spec.client_id in self.clients:
            raise TokenError(f"client {spec.client_id} is already registered")
        if spec.sm_pct > self.config.sm_global_limit_pct + 1e-9:
            raise TokenError(
                f"client {spec.client_id}: sm_pct {spec.sm_pct} exceeds the SM global limit "
                f"{self.config.sm_global_limit_pct}"
            )
        self._roll(now_ms)
        self.clients[spec.client_id] = ClientState(spec=spec, added_ms=now_ms)
        return []

    def remove_client(self, client_id: str, now_ms: float) -> list[Grant]:
        """Forget an instance (a held token is returned); others may be granted at once."""
        self._get(client_id)
        self._roll(now_ms)
        del self.clients[client_id]
        return self._dispatch(now_ms)

    def set_quota(
        self, client_id: str, quota_request: float, quota_limit: float, now_ms: float
    ) -> list[Grant]:
        """Change a client's time quotas in place (its usage in the current window stays
        charged; a held token keeps its length). Who calls it: the token server, for the
        profiler's quota sweep and the live workflow scheduler (a task's quota, ESG on gshare's
        shares). ``TokenError`` for an unknown client or quotas ``ClientSpec`` refuses."""
        c = self._get(client_id)
        spec = replace(c.spec, quota_request=quota_request, quota_limit=quota_limit)
        self._roll(now_ms)
        c.spec = spec
        return self._dispatch(now_ms)

    # -- events -------------------------------------------------------------------------------

    def request(self, client_id: str, now_ms: float) -> list[Grant]:
        """The client wants to run a burst. Idempotent while it waits; an error while it runs."""
        c = self._get(client_id)
        if c.token is not None:
            raise TokenError(f"client {client_id} asked for a token while holding one")
        self._roll(now_ms)
        if not c.waiting:
            c.waiting_since_ms = now_ms
        c.waiting = True
        c.last_seen_ms = now_ms
        return self._dispatch(now_ms)

    def release(
        self, client_id: str, busy_ms: float, now_ms: float, *, completed: bool = True
    ) -> list[Grant]:
        """The client stopped after using ``busy_ms`` of GPU time on its token.

        ``completed`` is False when the burst is not finished (the token ran out or was
        revoked); the burst-length prediction then grows instead of averaging a cut burst.
        """
        c = self._get(client_id)
        if c.token is None:
            raise TokenError(f"client {client_id} released a token it does not hold")
        if busy_ms < 0:
            raise TokenError(f"client {client_id}: busy_ms must be >= 0, got {busy_ms}")
        self._roll(now_ms)
        token = c.token
        c.last_seen_ms = now_ms
        charge = max(0.0, busy_ms - c.charged_in_token_ms)
        c.used_ms += charge
        c.total_used_ms += charge
        c.overrun_ms += max(0.0, busy_ms - token.quota_ms)
        c.total_held_ms += max(0.0, now_ms - token.start_ms)
        c.tokens += 1
        c.token = None
        c.charged_in_token_ms = 0.0
        cfg = self.config
        if completed:
            c.predicted_burst_ms = predict_burst_ms(
                c.predicted_burst_ms, busy_ms, cfg.burst_ewma_alpha
            )
        else:
            base = c.predicted_burst_ms if c.predicted_burst_ms > 0 else cfg.default_burst_ms
            c.predicted_burst_ms = min(cfg.max_token_ms, max(base, busy_ms) * 2.0)
        return self._dispatch(now_ms)

    def tick(self, now_ms: float) -> list[Grant]:
        """Timer event: roll the window if it ended, then dispatch."""
        self._roll(now_ms)
        return self._dispatch(now_ms)

    def next_wakeup_ms(self) -> float:
        """When the mechanism must call ``tick`` next: the end of the current window."""
        return self.window_start_ms + self.config.window_ms

    # -- queries ------------------------------------------------------------------------------

    def running_sm_pct(self) -> float:
        return sum(c.spec.sm_pct for c in self.clients.values() if c.token is not None)

    def snapshot(self) -> Mapping[str, ClientView]:
        return {
            cid: ClientView(
                client_id=cid,
                sm_pct=c.spec.sm_pct,
                quota_request=c.spec.quota_request,
                quota_limit=c.spec.quota_limit,
                priority=c.spec.priority,
                used_ms=c.used_ms,
                waiting=c.waiting,
                running=c.token is not None,
                predicted_burst_ms=c.predicted_burst_ms,
                total_used_ms=c.total_used_ms,
                overrun_ms=c.overrun_ms,
                total_held_ms=c.total_held_ms,
                tokens=c.tokens,
            )
            for cid, c in self.clients.items()
        }

    # -- internals ----------------------------------------------------------------------------

    def _get(self, client_id: str) -> ClientState:
        try:
            return self.clients[client_id]
        except KeyError:
            raise TokenError(f"unknown client {client_id!r}") from None

    def _roll(self, now_ms: float) -> None:
        """Close every window that ended at or before ``now_ms``.

        Running tokens are charged for the wall time they were held inside the closing window;
        usage above the limit is carried into the next window as debt.
        """
        w = self.config.window_ms
        while now_ms >= self.window_start_ms + w - 1e-9:
            n = int((now_ms - self.window_start_ms + 1e-9) // w)
            if n > 1 and all(c.token is None for c in self.clients.values()):
                # Nothing left to charge: close the n windows at once (each only repays debt),
                # so a long idle gap (or a wall clock far from window_start_ms) costs O(clients).
                for c in self.clients.values():
                    c.used_ms = max(0.0, c.used_ms - n * self._cap_ms(c))
                self.window_start_ms += n * w
                continue
            end = self.window_start_ms + w
            for c in self.clients.values():
                if c.token is not None:
                    # A token holder occupies the device: charge the wall time it held the
                    # token inside the closing window, even past the token's length (an
                    # overrun is charged where it happened, so a burst longer than a window
                    # never owes more than its limit allows per window — a client alone with
                    # limit 1 owes nothing).
                    ran = max(0.0, end - max(c.token.start_ms, self.window_start_ms))
                    c.used_ms += ran
                    c.total_used_ms += ran
                    c.charged_in_token_ms += ran
                c.used_ms = max(0.0, c.used_ms - self._cap_ms(c))
            self.window_start_ms = end

    def _cap_ms(self, c: ClientState) -> float:
        """Most a client may use per window: its limit, or its request without elasticity."""
        q = c.spec.quota_limit if self.config.elastic else c.spec.quota_request
        return q * self.config.window_ms

    def _remaining_ms(self, c: ClientState) -> float:
        """What may still be given to ``c`` in this window: its cap minus its usage, and minus
        ``limit_margin_ms`` when the cap is below the window (NOTE on the limit margin)."""
        cap = self._cap_ms(c)
        if cap < self.config.window_ms - 1e-9:
            cap -= self.config.limit_margin_ms
        return cap - c.used_ms

    def _token_length(self, c: ClientState, remaining_ms: float, contended: bool = True) -> float:
        cfg = self.config
        if not cfg.dynamic_quota:
            return min(remaining_ms, cfg.max_token_ms)
        predicted = c.predicted_burst_ms if c.predicted_burst_ms > 0 else cfg.default_burst_ms
        want = max(cfg.min_token_ms, predicted * cfg.token_headroom)
        if not contended and cfg.idle_token_ms > 0:
            want = max(want, cfg.idle_token_ms)  # NOTE on uncontended tokens
        return min(want, remaining_ms, cfg.max_token_ms)

    def _owed_to_others_ms(self, c: ClientState, now_ms: float) -> float:
        """Guaranteed time still owed in this window to active clients that conflict with ``c``.

        See the NOTE on guarantee reservation. Called by ``_dispatch`` only.
        """
        cfg = self.config
        w_start = self.window_start_ms
        w_end = w_start + cfg.window_ms
        owed = 0.0
        for d in self.clients.values():
            if d is c or c.spec.sm_pct + d.spec.sm_pct <= cfg.sm_global_limit_pct + 1e-9:
                continue  # itself, or it can run side by side with c
            if not cfg.reserve_for_lower_priority and d.spec.priority < c.spec.priority:
                continue  # FIKIT's class plan: lower classes are owed nothing by higher ones
            recently = now_ms - d.last_seen_ms < cfg.window_ms
            if not (d.waiting or d.token is not None or d.used_ms > 0 or recently):
                continue  # idle for a window: nothing reserved
            # Owed: its missing quota, but no more than it can still be given (limit margin).
            miss = min(d.spec.quota_request * cfg.window_ms - d.used_ms, self._remaining_ms(d))
            if d.token is not None:
                t_end = d.token.start_ms + d.token.quota_ms
                miss -= max(0.0, min(t_end, w_end) - max(d.token.start_ms, w_start))
            owed += max(0.0, miss)
        return owed

    def _elastic_sharers(self, c: ClientState, now_ms: float) -> int:
        """``c`` and the active clients that conflict with it and could still take elastic
        time in this window (their cap not reached). See the NOTE on fair elastic time.
        Called by ``_dispatch`` only."""
        cfg = self.config
        if not cfg.elastic:
            return 1
        n = 1
        for d in self.clients.values():
            if d is c or c.spec.sm_pct + d.spec.sm_pct <= cfg.sm_global_limit_pct + 1e-9:
                continue
            if d.spec.quota_limit <= d.spec.quota_request + 1e-12:
                continue  # no elasticity: it never takes time beyond its guarantee
            if not cfg.reserve_for_lower_priority and d.spec.priority < c.spec.priority:
                continue  # FIKIT's class plan: a lower class gets nothing while c's is active
            recently = now_ms - d.last_seen_ms < cfg.window_ms
            if not (d.waiting or d.token is not None or d.used_ms > 0 or recently):
                continue  # idle for a window: it takes no elastic time
            if self._remaining_ms(d) >= cfg.min_token_ms:
                n += 1
        return n

    def _dispatch(self, now_ms: float) -> list[Grant]:
        cfg = self.config
        w = cfg.window_ms
        guaranteed: list[tuple[int, float, float, str, ClientState]] = []
        elastic: list[tuple[int, float, float, str, ClientState]] = []
        for cid, c in self.clients.items():
            if not c.waiting or c.token is not None:
                continue
            if self._remaining_ms(c) < cfg.min_token_ms:  # filtering: next window
                continue
            miss = c.spec.quota_request * w - c.used_ms
            # Ties of missing quota: the client waiting longest, then id, so clients that always
            # tie take turns (why: docs/journal/tokens.md).
            key = (-c.spec.priority, -miss, c.waiting_since_ms, cid, c)
            if miss >= cfg.min_token_ms:
                guaranteed.append(key)
            elif cfg.elastic:
                elastic.append(key)
        if not guaranteed and not elastic:
            return []
        guaranteed.sort(key=lambda k: k[:4])
        elastic.sort(key=lambda k: k[:4])
        running_sm = self.running_sm_pct()
        # Uncontended: a single client waits (NOTE on uncontended tokens).
        contended = len(guaranteed) + len(elastic) > 1 or any(
            c.waiting and c.token is None
            for c in self.clients.values()
            if self._remaining_ms(c) < cfg.min_token_ms
        )
        grants: list[Grant] = []
        blocked = False
        for phase_elastic, queue in ((False, guaranteed), (True, elastic)):
            if blocked:
                break
            if phase_elastic and guaranteed and any(k[4].token is None for k in guaranteed):
                # A client still owed its guarantee is waiting for SMs: no elastic time now.
                break
            for _, _, _, cid, c in queue:
                if running_sm + c.spec.sm_pct > cfg.sm_global_limit_pct + 1e-9:
                    if cfg.backfill:
                        continue
                    blocked = True
                    break
                # A token never lets the client pass its cap (limit, or request without
                # elasticity); its length is the predicted burst (dynamic quota) within that,
                # and never eats into time owed to conflicting clients (reservation NOTE).
                length = self._token_length(c, self._remaining_ms(c), contended)
                if cfg.reserve_guarantees:
                    own_miss = c.spec.quota_request * w - c.used_ms
                    slack = self.window_start_ms + w - now_ms - self._owed_to_others_ms(c, now_ms)
                    # Elastic time is split among the clients that can use it (NOTE on fair
                    # elastic time): beyond its own missing quota a token takes at most an
                    # equal part of what is left of the window after every guarantee.
                    elastic_part = (slack - max(0.0, own_miss)) / self._elastic_sharers(c, now_ms)
                    slack = max(0.0, own_miss) + max(0.0, elastic_part)
                    length = min(length, max(own_miss, slack))
                    if length < cfg.min_token_ms - 1e-9:
                        continue  # only elastic clients get here: no slack left this window
                g = Grant(cid, now_ms, length, phase_elastic)
                c.token = g
                c.waiting = False
                c.charged_in_token_ms = 0.0
                running_sm += c.spec.sm_pct
                grants.append(g)
        return grants


LIVE_TOKEN_CONFIG = TokenConfig(idle_token_ms=40.0, limit_margin_ms=0.1)
"""The token configuration of the live runtime's node agent and of the benches that measure it
(``bench/share_accuracy.py``, ``bench/token_overhead.py``); the simulator keeps
``TokenConfig()`` unless an experiment asks for this one.

* ``idle_token_ms=40`` -- a token handed out while nobody else waits lasts up to the window
  (clipped to the client's quota and the guarantee reservation), so a client that reuses its
  token (``reuse_token``) pays the protocol about once per window instead of once per burst;
* ``limit_margin_ms=0.1`` -- a limited client's tokens stop 0.1 ms short of its per-window
  limit, so a burst descheduled or woken late for up to that long stays within the limit; it
  costs a client with request = limit 0.1 ms of its 40-ms window (0.25 pp). Measurements behind
  both values: ``docs/journal/tokens.md``.
"""


def predict_burst_ms(predicted_ms: float, burst_ms: float, alpha: float) -> float:
    """Gemini's burst-length prediction: the EWMA of a client's completed bursts.

    Called by the scheduler when a client releases a completed burst and by the runtime's
    token client after each burst it ran on a reused token. ``predicted_ms`` <= 0 means no
    history: the first burst is taken as is.
    """
    if predicted_ms <= 0.0:
        return burst_ms
    return alpha * burst_ms + (1.0 - alpha) * predicted_ms


def reuse_token(token_left_ms: float, predicted_burst_ms: float, *, split_bursts: bool) -> bool:
    """Token reuse (Gemini: a token is a time slice), decided by an instance frontend before a
    burst while it holds a token: run the burst on it when its rest fits the predicted burst
    (``should_yield`` would not cut it), or, for a frontend that checks ``should_yield`` before
    every kernel (``split_bursts``), while any time is left on it. Otherwise give the token
    back and ask for a new one. Whether to keep the token at all after a burst is
    ``policy.batching.keep_token_for_next_batch``."""
    if token_left_ms <= 0.0:
        return False
    return split_bursts or not should_yield(token_left_ms, predicted_burst_ms)


def should_yield(token_left_ms: float, next_kernel_ms: float) -> bool:
    """Gemini token revocation, decided by the instance's frontend before each kernel.

    Called by the simulator's instance model and the runtime's token client: give the token
    back (release with ``completed=False``) when the time left on it cannot fit the next
    kernel's predicted duration, rather than overrun it.
    """
    return next_kernel_ms > token_left_ms + 1e-9
