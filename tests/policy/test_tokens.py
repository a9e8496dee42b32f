"""policy.tokens: the multi-token scheduler (FaST-GShare §3.3.2, Gemini), table-driven + properties.

Every test drives the pure ``TokenScheduler`` directly, passing the time in; the arithmetic of
each expectation is in the comments. The window is 40 ms throughout (``TokenConfig`` default).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gshare.policy.tokens import (
    ClientSpec,
    Grant,
    TokenConfig,
    TokenError,
    TokenScheduler,
    should_yield,
)

W = 40.0
EPS = 1e-6


def sched(*specs: ClientSpec, **cfg: object) -> TokenScheduler:
    s = TokenScheduler(TokenConfig(**cfg))  # type: ignore[arg-type]
    for spec in specs:
        s.add_client(spec, 0.0)
    return s


def spec(
    cid: str, sm: float = 100.0, req: float = 0.5, lim: float | None = None, prio: int = 0
) -> ClientSpec:
    return ClientSpec(cid, sm, req, req if lim is None else lim, prio)


def only(grants: list[Grant]) -> Grant:
    assert len(grants) == 1, grants
    return grants[0]


# -- guarantee, filtering, window roll ---------------------------------------------------------


@pytest.mark.parametrize(
    ("req", "lim", "elastic", "per_window_ms"),
    [
        (0.25, 0.25, True, 10.0),  # 0.25 x 40 = 10 ms guaranteed and capped
        (0.10, 0.10, True, 4.0),  # 0.10 x 40 = 4 ms
        (0.25, 0.75, True, 30.0),  # elastic up to the limit: 0.75 x 40 = 30 ms
        (0.25, 0.75, False, 10.0),  # elasticity off: capped at the request, 10 ms
        (0.50, 0.90, False, 20.0),  # elasticity off: 0.5 x 40 = 20 ms whatever the limit
    ],
)
def test_a_lone_saturating_client_gets_its_cap_per_window(
    req: float, lim: float, elastic: bool, per_window_ms: float
) -> None:
    # One client asks again the instant each token ends; with dynamic quota off every token is
    # the whole remaining quota, so the first token is the per-window cap and the next request
    # in the same window is filtered (used >= cap) until the tick at the window end.
    s = sched(spec("a", 100, req, lim), dynamic_quota=False, elastic=elastic)
    g = only(s.request("a", 0.0))
    assert g.quota_ms == pytest.approx(per_window_ms)
    assert s.release("a", g.quota_ms, g.quota_ms) == []
    assert s.request("a", g.quota_ms) == []  # filtered: nothing left in this window
    assert s.snapshot()["a"].waiting
    assert s.next_wakeup_ms() == pytest.approx(W)
    g2 = only(s.tick(W))  # new window: used forgotten, the cap again
    assert (g2.start_ms, g2.quota_ms) == (pytest.approx(W), pytest.approx(per_window_ms))


def test_filtering_is_by_remaining_quota_not_by_request() -> None:
    # request 0.25 (10 ms), limit 0.5 (20 ms). After 10 ms the guarantee is met (Q_miss = 0) but
    # Q_remain = 20 - 10 = 10 ms: the client is not filtered, it gets an elastic token of 10 ms.
    # After 20 ms, Q_remain = 0: filtered until the next window.
    s = sched(spec("a", 100, 0.25, 0.5), dynamic_quota=False)
    g = only(s.request("a", 0.0))
    assert (g.quota_ms, g.elastic) == (pytest.approx(20.0), False)
    s.release("a", 10.0, 10.0)
    g = only(s.request("a", 10.0))
    assert (g.quota_ms, g.elastic) == (pytest.approx(10.0), True)
    s.release("a", 10.0, 20.0)
    assert s.request("a", 20.0) == []
    assert s.snapshot()["a"].used_ms == pytest.approx(20.0)


def test_a_token_spanning_the_window_end_is_charged_to_both_windows() -> None:
    # quota 0.5 (20 ms per window), tokens of at most 10 ms. 5 ms used in window 1, then a
    # token from 35 to 45. The tick at 40 charges the 40 - 35 = 5 ms run inside window 1 (used
    # 10) and forgets window 1; the release at 45 (busy 10) charges the other 5 ms to window 2.
    s = sched(spec("a", 100, 0.5), dynamic_quota=False, max_token_ms=10.0)
    only(s.request("a", 0.0))
    s.release("a", 5.0, 5.0)
    g = only(s.request("a", 35.0))
    assert g.quota_ms == pytest.approx(10.0)  # min(max_token 10, 20 - 5)
    s.tick(40.0)
    v = s.snapshot()["a"]
    assert (v.used_ms, v.total_used_ms) == (pytest.approx(0.0), pytest.approx(10.0))
    s.release("a", 10.0, 45.0)
    v = s.snapshot()["a"]
    assert (v.used_ms, v.total_used_ms) == (pytest.approx(5.0), pytest.approx(15.0))


def test_each_released_token_adds_its_wall_time_held_beside_the_busy_time_charged() -> None:
    # a token granted at 0 and released at 6 with 5 ms busy (1 ms idle: the hand-over), one
    # granted at 35 and released at 45 across the window end (busy 9, 1 ms idle)
    s = sched(spec("a", 100, 0.5), dynamic_quota=False, max_token_ms=10.0)
    only(s.request("a", 0.0))
    s.release("a", 5.0, 6.0)
    only(s.request("a", 35.0))
    s.tick(40.0)
    assert s.snapshot()["a"].tokens == 1  # still holding the second
    s.release("a", 9.0, 45.0)
    v = s.snapshot()["a"]
    assert (v.tokens, v.total_held_ms, v.total_used_ms) == (2, 16.0, pytest.approx(14.0))


# -- ready-queue order -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("clients", "order"),
    [
        # same class: larger missing quota first: 0.5 x 40 = 20 > 0.3 x 40 = 12 > 0.1 x 40 = 4
        ([("a", 0.1, 0), ("b", 0.5, 0), ("c", 0.3, 0)], ["b", "c", "a"]),
        # priority class first: b (class 5, miss 4) before a (class 0, miss 20)
        ([("a", 0.5, 0), ("b", 0.1, 5)], ["b", "a"]),
        # two classes, missing quota within each: 9 > 1 class first, then 16 before 8
        ([("a", 0.2, 1), ("b", 0.4, 1), ("c", 0.3, 9), ("d", 0.1, 9)], ["c", "d", "b", "a"]),
        # equal missing quota (12 = 12): the one waiting longest (asked first) goes first
        ([("z", 0.3, 0), ("y", 0.3, 0)], ["z", "y"]),
    ],
)
def test_ready_queue_is_priority_class_then_missing_quota(
    clients: list[tuple[str, float, int]], order: list[str]
) -> None:
    # A blocker holds the whole GPU (SM 100 %) while everybody asks; each release then hands the
    # token to the head of the ready queue. Requests are made in table order, 1 ms apart.
    s = sched(spec("blk", 100, 0.05), *[spec(c, 100, q, prio=p) for c, q, p in clients])
    only(s.request("blk", 0.0))
    for i, (c, _, _) in enumerate(clients):
        assert s.request(c, 0.1 + 0.001 * i) == []  # blocked by the SM adapter
    got: list[str] = []
    holder, t = "blk", 0.2
    for _ in clients:
        g = only(s.release(holder, 0.1, t))
        got.append(g.client_id)
        holder, t = g.client_id, t + 0.1
    assert got == order


def test_a_client_owed_its_guarantee_goes_before_elastic_time() -> None:
    # e has met its 10 ms request (0.25) and may take elastic time up to 0.75; g (0.5) is owed
    # 20 ms. Both wait while the blocker runs: the release hands the token to g, not to e, even
    # though e asked first.
    s = sched(spec("blk", 100, 0.05), spec("e", 100, 0.25, 0.75), spec("g", 100, 0.5))
    only(s.request("e", 0.0))
    s.release("e", 10.0, 10.0)  # guarantee met
    only(s.request("blk", 10.0))
    s.request("e", 10.5)
    s.request("g", 11.0)
    g = only(s.release("blk", 1.0, 11.0))
    assert (g.client_id, g.elastic) == ("g", False)


def test_elastic_time_goes_up_to_the_limit_when_neighbours_are_idle() -> None:
    # e: request 0.25 (10 ms), limit 0.75 (30 ms), tokens of at most 10 ms; its neighbour n
    # (SM 100 %) has never run. e gets one guaranteed 10-ms token, then two elastic ones, and
    # nothing more in window 1: 30 = 0.75 x 40.
    s = sched(
        spec("e", 100, 0.25, 0.75), spec("n", 100, 0.5), dynamic_quota=False, max_token_ms=10.0
    )
    t, got, flags = 0.0, 0.0, []
    while True:
        gs = s.request("e", t)
        if not gs:
            break
        g = only(gs)
        flags.append(g.elastic)
        t += g.quota_ms
        got += g.quota_ms
        s.release("e", g.quota_ms, t)
    assert got == pytest.approx(30.0)
    assert flags == [False, True, True]


def test_elastic_tokens_leave_the_time_owed_to_an_active_neighbour() -> None:
    # n (request 0.5 = 20 ms) ran 5 ms and stepped away; e (0.25, limit 1) has met its 10 ms.
    # At t = 15 the window has 25 ms left, n is still owed 15: e's elastic token is at most
    # 25 - 15 = 10 ms. A window later n has been idle for a whole window and reserves nothing.
    s = sched(spec("e", 100, 0.25, 1.0), spec("n", 100, 0.5), dynamic_quota=False)
    only(s.request("n", 0.0))
    s.release("n", 5.0, 5.0)
    only(s.request("e", 5.0))
    s.release("e", 10.0, 15.0)
    g = only(s.request("e", 15.0))
    assert (g.elastic, g.quota_ms) == (True, pytest.approx(10.0))
    s.release("e", 10.0, 25.0)
    s.tick(80.0)  # n last seen at 5: idle for more than a window
    g = only(s.request("e", 80.0))
    assert g.quota_ms == pytest.approx(40.0)  # the whole limit (max_token 40)


# -- SM adapter ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backfill", "granted"),
    [
        # a (60 %) runs; head b (60 %, miss 36) does not fit (60 + 60 = 120 > 100). FaST-GShare
        # stops at the first head that does not fit: c (40 %, miss 4) waits although 60 + 40 =
        # 100 would fit.
        (False, []),
        # with back-filling c is granted behind the blocked head.
        (True, ["c"]),
    ],
)
def test_sm_adapter_stops_at_the_first_head_unless_backfill(
    backfill: bool, granted: list[str]
) -> None:
    s = sched(spec("a", 60, 0.2), spec("b", 60, 0.9), spec("c", 40, 0.1), backfill=backfill)
    only(s.request("a", 0.0))
    s.request("b", 1.0)
    grants = s.request("c", 2.0)
    assert [g.client_id for g in grants] == granted
    assert s.running_sm_pct() <= 100.0
    assert s.running_sm_pct() == pytest.approx(60.0 + (40.0 if backfill else 0.0))


def test_disjoint_sm_bands_hold_tokens_at_the_same_time() -> None:
    # 30 + 30 + 40 = 100 %: three tokens at once; a fourth client (10 %) must wait.
    s = sched(spec("a", 30, 0.1), spec("b", 30, 0.5), spec("c", 40, 0.9), spec("d", 10, 0.1))
    for cid in "abc":
        only(s.request(cid, 0.0))
    assert s.running_sm_pct() == pytest.approx(100.0)
    assert s.request("d", 0.0) == []


# -- dynamic quota (Gemini) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bursts", "completed", "token_ms"),
    [
        ([], [], 12.5),  # no history: default burst 10 x headroom 1.25
        ([8.0], [True], 10.0),  # the first burst is the prediction: 8 x 1.25
        ([12.0, 8.0], [True, True], 13.5),  # EWMA 0.3 x 8 + 0.7 x 12 = 10.8 -> x 1.25 = 13.5
        ([6.0], [False], 20.0),  # a cut burst doubles: max(10, 6) x 2 = 20 -> 25, cap 20
    ],
)
def test_dynamic_quota_follows_the_burst_ewma(
    bursts: list[float], completed: list[bool], token_ms: float
) -> None:
    # quota 0.5 -> 20-ms cap per window; each burst runs in its own window and within its token
    # (12.5 then 15 for [12, 8]), so the cap is always 20 and the token is min(EWMA x 1.25, 20).
    s = sched(spec("a", 100, 0.5))
    t = 0.0
    for b, done in zip(bursts, completed, strict=True):
        g = only(s.request("a", t))
        assert b <= g.quota_ms
        s.release("a", b, t + b, completed=done)
        t += W
    assert only(s.request("a", t)).quota_ms == pytest.approx(token_ms)


@pytest.mark.parametrize(
    ("idle_token_ms", "req", "max_token_ms", "contended", "token_ms"),
    [
        (0.0, 0.5, 40.0, False, 12.5),  # off (the default): default burst 10 x headroom 1.25
        (30.0, 0.5, 40.0, False, 20.0),  # min(30, remaining quota 0.5 x 40 = 20, max 40) = 20
        (30.0, 1.0, 40.0, False, 30.0),  # min(30, remaining 1.0 x 40 = 40, max 40) = 30
        (60.0, 1.0, 40.0, False, 40.0),  # min(60, 40, max 40) = 40
        (60.0, 1.0, 25.0, False, 25.0),  # min(60, 40, max 25) = 25
        (30.0, 0.5, 40.0, True, 12.5),  # b waits too: contended, back to 10 x 1.25 = 12.5
        (0.0, 0.5, 40.0, True, 12.5),  # off and contended: 12.5
    ],
)
def test_uncontended_tokens_are_long_only_when_nobody_else_waits(
    idle_token_ms: float, req: float, max_token_ms: float, contended: bool, token_ms: float
) -> None:
    # h (100 % SMs, request 0.2 -> 8 ms) holds the device from 0 to 5 while a (and, when
    # contended, b) wait; a and b have 50 % SMs each, so they fit side by side and only h
    # conflicts with them. At 5 h releases having used 5 ms: it is still owed 0.2 x 40 - 5 =
    # 3 ms, so the reservation slack for a is 40 - 5 - 3 = 32 ms and its own missing quota is
    # req x 40; neither clips the figures above (max(req x 40, 32) >= 20 and >= 40).
    s = sched(
        spec("h", 100, 0.2),
        spec("a", 50, req),
        spec("b", 50, req),
        idle_token_ms=idle_token_ms,
        max_token_ms=max_token_ms,
    )
    only(s.request("h", 0.0))
    assert s.request("a", 1.0) == []
    if contended:
        assert s.request("b", 1.0) == []
    grants = {g.client_id: g for g in s.release("h", 5.0, 5.0)}
    assert set(grants) == ({"a", "b"} if contended else {"a"})
    assert grants["a"].quota_ms == pytest.approx(token_ms)


def test_dynamic_quota_off_gives_the_whole_remaining_quota() -> None:
    # 0.6 x 40 = 24 ms remaining; max_token 40 -> 24.
    s = sched(spec("a", 100, 0.6), dynamic_quota=False)
    assert only(s.request("a", 0.0)).quota_ms == pytest.approx(24.0)


def test_token_never_shorter_than_min_token_unless_quota_is() -> None:
    # A 0.1-ms predicted burst still gets min_token 0.5 ms.
    s = sched(spec("a", 100, 0.5))
    only(s.request("a", 0.0))
    s.release("a", 0.1, 0.1)
    assert only(s.request("a", 1.0)).quota_ms == pytest.approx(0.5)


# -- overruns and debt ---------------------------------------------------------------------------


def test_an_overrun_is_carried_as_debt_and_repaid() -> None:
    # limit 0.25 -> 10 ms per window. A burst that cannot be preempted runs 25 ms on a 10-ms
    # token: overrun 15, used 25. End of window 1: debt = 25 - 10 = 15 > 10 - 0.5, so window 2
    # gives nothing; end of window 2: debt 15 - 10 = 5, so window 3 has 10 - 5 = 5 ms left.
    # Over 3 windows the client used 25 + 5 = 30 = 3 x 10: the limit holds on average.
    s = sched(spec("a", 100, 0.25), dynamic_quota=False)
    g = only(s.request("a", 0.0))
    assert g.quota_ms == pytest.approx(10.0)
    s.release("a", 25.0, 25.0)
    v = s.snapshot()["a"]
    assert (v.used_ms, v.overrun_ms) == (pytest.approx(25.0), pytest.approx(15.0))
    assert s.request("a", 30.0) == []
    assert s.tick(40.0) == []  # window 2: still 15 - 10 = 5 ms of debt... filtered
    assert s.snapshot()["a"].used_ms == pytest.approx(15.0)
    g3 = only(s.tick(80.0))
    assert g3.quota_ms == pytest.approx(5.0)
    s.release("a", 5.0, 85.0)
    assert s.snapshot()["a"].total_used_ms == pytest.approx(30.0)


@pytest.mark.parametrize(
    ("req", "lim", "elastic", "token_ms"),
    [
        (0.10, 0.10, True, 3.9),  # cap 0.10 x 40 = 4 ms, below the window: 4 - 0.1 = 3.9
        (0.25, 0.75, True, 29.9),  # cap 0.75 x 40 = 30: 30 - 0.1
        (0.25, 1.00, False, 9.9),  # elasticity off: cap = request 0.25 x 40 = 10: 10 - 0.1
        (0.50, 1.00, True, 40.0),  # cap = the whole window: nothing to exceed, no margin
    ],
)
def test_limit_margin_keeps_tokens_short_of_a_cap_below_the_window(
    req: float, lim: float, elastic: bool, token_ms: float
) -> None:
    # NOTE on the limit margin: with dynamic quota off the first token is the whole cap, minus
    # the 0.1-ms margin when the cap is below the window. After it the client has only the
    # margin left, 0.1 < min_token 0.5: filtered until the next window, which starts over.
    s = sched(spec("a", 100, req, lim), dynamic_quota=False, elastic=elastic, limit_margin_ms=0.1)
    g = only(s.request("a", 0.0))
    assert g.quota_ms == pytest.approx(token_ms)
    s.release("a", g.quota_ms, g.quota_ms)
    if token_ms < W:
        assert s.request("a", g.quota_ms) == []  # only the margin is left
        assert only(s.tick(W)).quota_ms == pytest.approx(token_ms)


def test_limit_margin_absorbs_an_overrun_up_to_its_length() -> None:
    # limit 0.1 -> cap 4 ms, margin 0.1 -> token 3.9 ms. The burst overruns it by 0.08 ms
    # (descheduled mid-kernel): usage 3.98 <= 4, within the limit, so no debt reaches the next
    # window (3.98 - 4 < 0), whose token is 3.9 again. Without the margin the token is 4 ms and
    # the same overrun puts the window at 4.08 ms, over the limit, and 0.08 ms of debt is carried.
    s = sched(spec("a", 100, 0.1), dynamic_quota=False, limit_margin_ms=0.1)
    g = only(s.request("a", 0.0))
    s.release("a", g.quota_ms + 0.08, g.quota_ms + 0.08)
    assert s.snapshot()["a"].used_ms == pytest.approx(3.98)
    assert s.snapshot()["a"].used_ms <= 0.1 * W
    assert s.request("a", 5.0) == []
    assert only(s.tick(W)).quota_ms == pytest.approx(3.9)
    s0 = sched(spec("a", 100, 0.1), dynamic_quota=False)
    g0 = only(s0.request("a", 0.0))
    s0.release("a", g0.quota_ms + 0.08, g0.quota_ms + 0.08)
    assert s0.snapshot()["a"].used_ms == pytest.approx(4.08)
    assert s0.request("a", 5.0) == []
    assert only(s0.tick(W)).quota_ms == pytest.approx(4.0 - 0.08)


def test_limit_margin_reserves_only_what_a_neighbour_can_still_be_given() -> None:
    # b (request = limit 0.5: cap 20, minus the 0.1 margin = 19.9 it can be given) and a
    # (request 0.25, limit 1) share all SMs. b asks alone: an uncontended token of 40, clipped
    # to 19.9. a asks at 1 and waits. At 19.9 b releases having used 19.9: it has only the
    # margin left (filtered), so nothing is owed to it any more, and a (owed 10 itself) may take
    # the rest of the window, 40 - 19.9 = 20.1 ms. Counting b's unusable 0.1 ms as owed would
    # clip a to 40 - 19.9 - 0.1 = 20.0.
    s = sched(
        spec("a", 100, 0.25, 1.0), spec("b", 100, 0.5), idle_token_ms=40.0, limit_margin_ms=0.1
    )
    assert only(s.request("b", 0.0)).quota_ms == pytest.approx(19.9)
    assert s.request("a", 1.0) == []
    ga = only(s.release("b", 19.9, 19.9))
    assert ga.client_id == "a"
    assert ga.quota_ms == pytest.approx(40.0 - 19.9)


# -- guarantee reservation and fairness (the bugs fixed in this module) ------------------------


def _alternate(s: TokenScheduler, bursts: dict[str, float], until_ms: float) -> dict[str, float]:
    """Two saturating clients that release at burst end and ask again at once (0-ms gap)."""
    held: dict[str, Grant] = {}
    used = dict.fromkeys(bursts, 0.0)
    ev: list[tuple[float, int, str]] = []
    seq = 0

    def take(grants: list[Grant]) -> None:
        nonlocal seq
        for g in grants:
            held[g.client_id] = g
            seq += 1
            heapq.heappush(
                ev, (g.start_ms + min(g.quota_ms, bursts[g.client_id]), seq, g.client_id)
            )

    for cid in bursts:
        take(s.request(cid, 0.0))
    tick = s.next_wakeup_ms()
    while True:
        t_ev = ev[0][0] if ev else math.inf
        if min(t_ev, tick) >= until_ms:
            break
        if tick <= t_ev:
            take(s.tick(tick))
            tick = s.next_wakeup_ms()
            continue
        t, _, cid = heapq.heappop(ev)
        g = held.pop(cid)
        used[cid] += t - g.start_ms
        take(s.release(cid, t - g.start_ms, t))
        take(s.request(cid, t))
    return {c: 100.0 * u / until_ms for c, u in used.items()}


@pytest.mark.parametrize(("reserve", "t_share_min"), [(True, 89.0), (False, 0.0)])
def test_back_to_back_bursts_keep_their_guarantee_only_with_reservation(
    reserve: bool, t_share_min: float
) -> None:
    # T asks 90 % (36 ms per window) with 5-ms bursts; N asks 10 % but may use 100 % with 12-ms
    # bursts; both on all SMs. Without reservation the scheduler hands the GPU to N in the
    # instant between T's release and T's next request, and N's 15-ms token (12 x 1.25) runs
    # while T waits: they alternate 5 : 12 and T gets 5 / 17 = 29 %. With reservation N's
    # token never eats into T's owed time, and T gets its 90 %.
    s = sched(spec("T", 100, 0.9), spec("N", 100, 0.1, 1.0), reserve_guarantees=reserve)
    share = _alternate(s, {"T": 5.0, "N": 12.0}, 4000.0)
    if reserve:
        assert share["T"] >= t_share_min
        assert share["N"] == pytest.approx(100.0 - share["T"], abs=0.5)
    else:
        assert share["T"] == pytest.approx(100 * 5 / 17, abs=1.0)


def test_equal_missing_quota_is_served_longest_waiting_first() -> None:
    # Four clients with limit 1 on all SMs, 20-ms bursts: usage is forgotten at every window end
    # and all tie at 40 ms missing. By id alone p0 and p1 would take every window and p2, p3
    # never run; longest-waiting-first rotates them.
    s = sched(*[spec(f"p{i}", 100, 1.0) for i in range(4)])
    share = _alternate(s, {f"p{i}": 20.0 for i in range(4)}, 2000.0)
    assert min(share.values()) >= 20.0
    assert sum(share.values()) == pytest.approx(100.0, abs=1.5)


def test_a_far_away_clock_does_not_loop_over_every_window() -> None:
    # The runtime may pass a monotonic clock in ms (1e12 ms = 25 billion windows): the roll
    # jumps over windows in which nothing is charged.
    s = TokenScheduler(TokenConfig())
    s.add_client(spec("a", 100, 0.5), 1e12)
    assert s.window_start_ms <= 1e12 < s.window_start_ms + W
    g = only(s.request("a", 1e12 + 1.0))
    assert g.start_ms == pytest.approx(1e12 + 1.0)


# -- token revocation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("left", "next_kernel", "yield_"),
    [
        (5.0, 2.0, False),  # fits
        (2.0, 2.0, False),  # exactly fits
        (1.9, 2.0, True),  # would overrun by 0.1 ms: give the token back
        (0.0, 0.1, True),
        (0.0, 0.0, False),
    ],
)
def test_should_yield(left: float, next_kernel: float, yield_: bool) -> None:
    assert should_yield(left, next_kernel) is yield_


# -- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sm_pct": 0}, "sm_pct must be in"),
        ({"sm_pct": 101}, "sm_pct must be in"),
        ({"quota_request": 0.0}, "need 0 < quota_request <= quota_limit <= 1"),
        ({"quota_request": 0.6, "quota_limit": 0.5}, "need 0 < quota_request <= quota_limit <= 1"),
        ({"quota_limit": 1.5}, "need 0 < quota_request <= quota_limit <= 1"),
        ({"priority": 10}, "priority must be in 0..9"),
    ],
)
def test_bad_client_specs_name_the_field(kwargs: dict[str, float], match: str) -> None:
    base: dict[str, float] = {"sm_pct": 50, "quota_request": 0.5, "quota_limit": 0.5, "priority": 0}
    base.update(kwargs)
    with pytest.raises(TokenError, match=f"client x: {match}"):
        ClientSpec(
            "x", base["sm_pct"], base["quota_request"], base["quota_limit"], int(base["priority"])
        )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"window_ms": 0.0}, "window_ms must be > 0"),
        ({"sm_global_limit_pct": 0.0}, "sm_global_limit_pct"),
        ({"min_token_ms": 5.0, "max_token_ms": 1.0}, "min_token_ms <= max_token_ms"),
        ({"burst_ewma_alpha": 0.0}, "burst_ewma_alpha"),
        ({"token_headroom": 0.5}, "token_headroom must be >= 1"),
        ({"idle_token_ms": -1.0}, "idle_token_ms must be >= 0"),
        ({"limit_margin_ms": -0.1}, "0 <= limit_margin_ms < min_token_ms"),
        ({"limit_margin_ms": 0.5}, "0 <= limit_margin_ms < min_token_ms"),
    ],
)
def test_bad_configs_name_the_field(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(TokenError, match=match):
        TokenConfig(**kwargs)  # type: ignore[arg-type]


def test_event_errors_are_clear() -> None:
    s = sched(spec("a", 100, 0.5))
    with pytest.raises(TokenError, match="unknown client 'zz'"):
        s.request("zz", 0.0)
    with pytest.raises(TokenError, match="unknown client 'zz'"):
        s.release("zz", 1.0, 0.0)
    with pytest.raises(TokenError, match="unknown client 'zz'"):
        s.remove_client("zz", 0.0)
    with pytest.raises(TokenError, match="already registered"):
        s.add_client(spec("a"), 0.0)
    with pytest.raises(TokenError, match="released a token it does not hold"):
        s.release("a", 1.0, 0.0)
    only(s.request("a", 0.0))
    with pytest.raises(TokenError, match="asked for a token while holding one"):
        s.request("a", 1.0)
    with pytest.raises(TokenError, match="busy_ms must be >= 0"):
        s.release("a", -1.0, 1.0)
    small = TokenScheduler(TokenConfig(sm_global_limit_pct=50.0))
    with pytest.raises(TokenError, match="exceeds the SM global limit 50"):
        small.add_client(spec("b", 60), 0.0)


def test_request_while_waiting_is_idempotent_and_remove_frees_the_gpu() -> None:
    s = sched(spec("a", 100, 0.5), spec("b", 100, 0.5))
    only(s.request("a", 0.0))
    assert s.request("b", 1.0) == []
    assert s.request("b", 2.0) == []  # still one outstanding request
    g = only(s.remove_client("a", 3.0))  # a's token is returned: b runs at once
    assert (g.client_id, g.start_ms) == ("b", 3.0)
    assert set(s.snapshot()) == {"b"}


# -- properties ----------------------------------------------------------------------------------


@dataclass
class Harness:
    """A tiny mechanism: grants run from their start for ``frac x quota`` ms, then release.

    ``frac`` <= 1 models preemptible bursts (never past the token); > 1 an overrun.
    """

    s: TokenScheduler
    fracs: list[float]
    no_overrun: bool = False
    held: dict[str, Grant] = field(default_factory=dict)
    ev: list[tuple[float, int, str, float]] = field(default_factory=list)
    runs: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    max_overrun: dict[str, float] = field(default_factory=dict)
    seq: int = 0

    def check_and_take(self, grants: list[Grant]) -> None:
        cfg = self.s.config
        for g in grants:
            assert g.client_id not in self.held, f"{g.client_id} granted a second token"
            assert g.quota_ms >= min(cfg.min_token_ms, cfg.max_token_ms) - EPS
            self.held[g.client_id] = g
            frac = self.fracs[self.seq % len(self.fracs)]
            self.seq += 1
            busy = frac * g.quota_ms
            heapq.heappush(self.ev, (g.start_ms + busy, self.seq, g.client_id, busy))
            self.max_overrun[g.client_id] = max(
                self.max_overrun.get(g.client_id, 0.0), busy - g.quota_ms
            )
        if self.no_overrun:
            # what the scheduler has charged to the current window never passes the cap
            for c in self.s.clients.values():
                cap = (c.spec.quota_limit if cfg.elastic else c.spec.quota_request) * cfg.window_ms
                assert c.used_ms <= cap + EPS
        running = sum(self.s.clients[c].spec.sm_pct for c in self.held)
        assert running <= cfg.sm_global_limit_pct + EPS
        assert self.s.running_sm_pct() == pytest.approx(running)
        if any(g.elastic for g in grants):
            # Elastic time was handed out: no waiting client may still be owed its guarantee
            # with quota left (it would have come first).
            for v in self.s.snapshot().values():
                if not v.waiting:
                    continue
                cap = (v.quota_limit if cfg.elastic else v.quota_request) * cfg.window_ms
                miss = v.quota_request * cfg.window_ms - v.used_ms
                assert not (miss >= cfg.min_token_ms and cap - v.used_ms >= cfg.min_token_ms)

    def advance(self, until_ms: float) -> None:
        """Process releases and window ticks up to ``until_ms`` in time order."""
        while True:
            t_rel = self.ev[0][0] if self.ev else math.inf
            t_tick = self.s.next_wakeup_ms()
            t = min(t_rel, t_tick)
            if t > until_ms:
                return
            if t_tick <= t_rel:
                self.check_and_take(self.s.tick(t_tick))
            else:
                _, _, cid, busy = heapq.heappop(self.ev)
                g = self.held.pop(cid)
                self.runs.setdefault(cid, []).append((g.start_ms, g.start_ms + busy))
                self.check_and_take(self.s.release(cid, busy, t, completed=busy <= g.quota_ms))


client_st = st.tuples(
    st.sampled_from([10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 100.0]),  # sm_pct
    st.integers(1, 20),  # request in 5 % steps
    st.integers(0, 20),  # limit - request in 5 % steps (clipped at 100 %)
    st.integers(0, 2),  # priority
)
config_st = st.fixed_dictionaries(
    {
        "elastic": st.booleans(),
        "backfill": st.booleans(),
        "dynamic_quota": st.booleans(),
        "reserve_guarantees": st.booleans(),
    }
)


def _build(clients: list[tuple[float, int, int, int]], cfg: dict[str, bool]) -> TokenScheduler:
    s = TokenScheduler(TokenConfig(**cfg))
    for i, (sm, r, extra, prio) in enumerate(clients):
        req = r * 0.05
        s.add_client(ClientSpec(f"c{i}", sm, req, min(1.0, req + extra * 0.05), prio), 0.0)
    return s


def _window_usage(runs: list[tuple[float, float]], w: float) -> dict[int, float]:
    use: dict[int, float] = {}
    for a, b in runs:
        k = int(a // w)
        while k * w < b:
            lo, hi = k * w, (k + 1) * w
            use[k] = use.get(k, 0.0) + max(0.0, min(b, hi) - max(a, lo))
            k += 1
    return use


def _drive(s: TokenScheduler, h: Harness, reqs: list[tuple[float, int]], n_clients: int) -> float:
    """Play the random request stream (gap, client index) on ``s``; returns the last time."""
    t = 0.0
    for dt, i in reqs:
        t += dt
        h.advance(t)
        cid = f"c{i % n_clients}"
        if cid not in h.held:
            h.check_and_take(s.request(cid, t))
    return t


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    clients=st.lists(client_st, min_size=1, max_size=4),
    cfg=config_st,
    fracs=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=6),
    reqs=st.lists(st.tuples(st.floats(0.0, 25.0), st.integers(0, 3)), min_size=1, max_size=60),
)
def test_random_events_keep_sm_tokens_and_per_window_limits(
    clients: list[tuple[float, int, int, int]],
    cfg: dict[str, bool],
    fracs: list[float],
    reqs: list[tuple[float, int]],
) -> None:
    # Bursts never run past their tokens (frac <= 1): every window's usage of every client
    # stays within its cap (limit x W, or request x W without elasticity), the SM % of token
    # holders never exceeds 100, nobody holds two tokens, and the scheduler's accounting equals
    # the time the clients really ran.
    s = _build(clients, cfg)
    h = Harness(s, fracs, no_overrun=True)
    t = _drive(s, h, reqs, len(clients))
    h.advance(t + 10 * W)  # let every token end
    for cid, c in s.clients.items():
        cap = (c.spec.quota_limit if s.config.elastic else c.spec.quota_request) * W
        for k, u in _window_usage(h.runs.get(cid, []), W).items():
            assert u <= cap + EPS, f"{cid} used {u} ms in window {k}, cap {cap}"
        ran = sum(b - a for a, b in h.runs.get(cid, []))
        assert c.total_used_ms == pytest.approx(ran, abs=1e-6)
        assert c.overrun_ms == pytest.approx(0.0, abs=1e-9)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    clients=st.lists(client_st, min_size=1, max_size=4),
    cfg=config_st,
    fracs=st.lists(st.floats(0.0, 3.0), min_size=1, max_size=6),
    reqs=st.lists(st.tuples(st.floats(0.0, 25.0), st.integers(0, 3)), min_size=1, max_size=60),
)
def test_with_overruns_usage_stays_within_the_limit_plus_one_burst(
    clients: list[tuple[float, int, int, int]],
    cfg: dict[str, bool],
    fracs: list[float],
    reqs: list[tuple[float, int]],
) -> None:
    # Bursts may run up to 3x past their tokens (non-preemptible kernels). Debt carries the
    # excess into later windows, so over the n windows a client has lived in its cumulative
    # usage is at most cap x n plus its largest single overrun:
    #   total = sum over closed windows of min(used, cap) + used now <= cap x n_closed + used now,
    #   and used now <= cap + max overrun (a token is only granted while used < cap).
    s = _build(clients, cfg)
    h = Harness(s, fracs)
    t = _drive(s, h, reqs, len(clients))
    t_end = t + 10 * W
    h.advance(t_end)
    s.tick(t_end)
    for cid, c in s.clients.items():
        cap = (c.spec.quota_limit if s.config.elastic else c.spec.quota_request) * W
        n_windows = math.floor(t_end / W) + 1  # windows [0, W), ... touched up to t_end
        bound = cap * n_windows + h.max_overrun.get(cid, 0.0)
        assert c.total_used_ms <= bound + EPS
        # the same as a rate: limit x elapsed + one window + one burst
        assert c.total_used_ms <= c.spec.quota_limit * t_end + W + h.max_overrun.get(cid, 0.0) + EPS


@pytest.mark.parametrize(("limit", "expected_share"), [(1.0, 1.0), (0.5, 0.5)])
def test_overrun_is_charged_where_it_happened(limit: float, expected_share: float) -> None:
    # A lone client runs non-preemptible 300 ms bursts on 40 ms windows. Overruns are charged
    # to the windows they spanned: with limit 1 each window is charged 40 ms = its cap, so no
    # debt and no wait (share 1.0); with limit 0.5 each spanned window leaves 20 ms of debt,
    # 7.5 windows x 20 ms = 150 ms repaid at 20 ms a window = 300 ms of waiting: share ~0.5.
    s = TokenScheduler(TokenConfig(window_ms=40.0))
    s.add_client(ClientSpec("a", 100, limit, limit), 0.0)
    t = busy = 0.0
    for _ in range(20):
        grants = s.request("a", t)
        while not grants:
            t = s.next_wakeup_ms()
            grants = s.tick(t)
        t += 300.0
        busy += 300.0
        s.release("a", 300.0, t)
    assert busy / t == pytest.approx(expected_share, abs=0.03)
