"""SimGpu: bursts under the token scheduler, interference, quota limits, metrics integrals."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gshare.policy.tokens import ClientSpec, TokenConfig
from gshare.sim.engine import EventLoop
from gshare.sim.gpu import DEFAULT_INTERFERENCE_BETA, InterferenceModel, SimGpu

W = 40.0  # TokenConfig().window_ms


class CheckedLoop(EventLoop):
    """An EventLoop that runs ``check()`` after every event."""

    def __init__(self) -> None:
        super().__init__()
        self.checks: list[Callable[[], None]] = []

    def at(self, time_ms: float, callback: Callable[[], Any], priority: int = 5) -> None:
        def wrapped() -> None:
            callback()
            for c in self.checks:
                c()

        super().at(time_ms, wrapped, priority)


class TracingGpu(SimGpu):
    """Records, per client and per token window, how long it ran (a burst held the GPU).

    ``SimGpu`` calls ``_settle_metrics`` just before every change of its running set, so the
    interval since the last call had a constant running set."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.ran: dict[tuple[str, int], float] = {}

    def _settle_metrics(self) -> None:
        t0, t1 = self._last_change, self.loop.now_ms
        if t1 > t0:
            for cid in self._running:
                t = t0
                while t < t1 - 1e-12:
                    k = int(t // W + 1e-9)
                    end = min(t1, (k + 1) * W)
                    self.ran[(cid, k)] = self.ran.get((cid, k), 0.0) + (end - t)
                    t = end
        super()._settle_metrics()


def _client(cid: str, sm: float, req: float = 1.0, lim: float = 1.0) -> ClientSpec:
    return ClientSpec(cid, sm, req, lim)


# -- timing of single and co-running bursts --------------------------------------------------


@pytest.mark.parametrize("work_ms", [5.0, 25.0, 100.0, 333.3])
def test_lone_burst_at_full_quota_takes_exactly_its_work(work_ms: float) -> None:
    # Alone, request = limit = 1: the burst may be cut into several tokens (first token 12.5 ms
    # = default 10 ms x headroom 1.25; window rolls every 40 ms) but each is re-granted at once,
    # so it ends exactly work_ms after it started.
    loop = EventLoop()
    gpu = SimGpu(loop)
    gpu.add_client(_client("a", 30.0))
    done: list[float] = []
    loop.at(3.0, lambda: gpu.run_burst("a", work_ms, lambda: done.append(loop.now_ms)))
    loop.run()
    assert done == [pytest.approx(3.0 + work_ms, abs=1e-9)]


def test_interference_slows_co_running_bursts_by_the_documented_factor() -> None:
    # a: 30 % SMs, 10 ms of work; b: 50 % SMs, 100 ms of work; both start at 0.
    # slowdown(a) = 1 + beta * 50/100 = 1 + 1.07 * 0.5 = 1.535 -> a ends at 10 * 1.535 = 15.35 ms
    # slowdown(b) = 1 + beta * 30/100 = 1 + 1.07 * 0.3 = 1.321 while a runs: by 15.35 ms b has done
    # 15.35 / 1.321 = 11.620 ms of work; the other 88.380 ms run alone -> b ends at 103.730 ms.
    beta = DEFAULT_INTERFERENCE_BETA
    s_a, s_b = 1 + beta * 0.5, 1 + beta * 0.3
    loop = EventLoop()
    gpu = SimGpu(loop)
    gpu.add_client(_client("a", 30.0))
    gpu.add_client(_client("b", 50.0))
    done: dict[str, float] = {}
    gpu.run_burst("a", 10.0, lambda: done.setdefault("a", loop.now_ms))
    gpu.run_burst("b", 100.0, lambda: done.setdefault("b", loop.now_ms))
    loop.run()
    end_a = 10.0 * s_a
    assert done["a"] == pytest.approx(end_a, abs=1e-9)
    assert done["b"] == pytest.approx(end_a + (100.0 - end_a / s_b), abs=1e-9)
    assert beta == pytest.approx(1.07)
    assert done["a"] == pytest.approx(15.35)
    assert done["b"] == pytest.approx(103.730, abs=1e-3)


def test_without_interference_co_running_bursts_take_their_work() -> None:
    loop = EventLoop()
    gpu = SimGpu(loop, interference=InterferenceModel(enabled=False))
    gpu.add_client(_client("a", 30.0))
    gpu.add_client(_client("b", 50.0))
    done: dict[str, float] = {}
    gpu.run_burst("a", 10.0, lambda: done.setdefault("a", loop.now_ms))
    gpu.run_burst("b", 100.0, lambda: done.setdefault("b", loop.now_ms))
    loop.run()
    assert done == {"a": pytest.approx(10.0), "b": pytest.approx(100.0)}


def test_over_subscribed_sms_serialise() -> None:
    # 60 % + 60 % > 100 %: the SM adapter runs one at a time; no interference (never together).
    loop = EventLoop()
    gpu = SimGpu(loop)
    gpu.add_client(_client("a", 60.0))
    gpu.add_client(_client("b", 60.0))
    done: dict[str, float] = {}
    gpu.run_burst("a", 10.0, lambda: done.setdefault("a", loop.now_ms))
    gpu.run_burst("b", 10.0, lambda: done.setdefault("b", loop.now_ms))
    loop.run()
    assert sorted(done.values()) == [pytest.approx(10.0), pytest.approx(20.0)]


# -- quota limit --------------------------------------------------------------------------------


def test_quota_limited_client_runs_limit_times_window_per_window() -> None:
    # request = limit = 0.25 of a 40 ms window: 10 ms per window. 1000 ms of work alone needs
    # 100 windows: it runs [0, 10) of windows 0..99 and ends at 99 * 40 + 10 = 3970 ms.
    loop = EventLoop()
    gpu = TracingGpu(loop)
    gpu.add_client(_client("a", 50.0, 0.25, 0.25))
    done: list[float] = []
    gpu.run_burst("a", 1000.0, lambda: done.append(loop.now_ms))
    loop.run()
    assert done == [pytest.approx(3970.0, abs=1e-6)]
    per_window = [gpu.ran.get(("a", k), 0.0) for k in range(100)]
    assert per_window == [pytest.approx(10.0, abs=1e-6)] * 100


# -- property: random mixes of clients ------------------------------------------------------------

_client_st = st.tuples(
    st.sampled_from([5.0, 12.0, 24.0, 30.0, 50.0, 60.0, 100.0]),  # sm_pct
    st.sampled_from([0.1, 0.25, 0.4, 0.5, 1.0]),  # quota_request
    st.sampled_from([0.0, 0.2, 0.5]),  # limit - request (clipped to 1)
    st.integers(0, 2),  # priority
    st.lists(st.floats(0.5, 60.0), min_size=1, max_size=6),  # burst works (ms)
    st.floats(0.0, 20.0),  # think time between bursts (ms)
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    clients=st.lists(_client_st, min_size=1, max_size=6),
    preemptible=st.booleans(),
    interference=st.booleans(),
    backfill=st.booleans(),
    token_reuse=st.booleans(),
)
def test_random_mix_keeps_sm_and_quota_invariants(
    clients: list[tuple[float, float, float, int, list[float], float]],
    preemptible: bool,
    interference: bool,
    backfill: bool,
    token_reuse: bool,
) -> None:
    loop = CheckedLoop()
    gpu = TracingGpu(
        loop,
        token_config=TokenConfig(backfill=backfill),
        interference=InterferenceModel(enabled=interference),
        preemptible=preemptible,
        token_reuse=token_reuse,
    )
    limits: dict[str, float] = {}
    finished: dict[str, int] = {}
    starters: dict[str, Callable[[], None]] = {}
    for i, (sm, req, extra, prio, works, think) in enumerate(clients):
        cid = f"c{i}"
        lim = min(1.0, req + extra)
        limits[cid] = lim
        gpu.add_client(ClientSpec(cid, sm, req, lim, prio))
        finished[cid] = 0

        def start(cid: str = cid, works: list[float] = works, think: float = think) -> None:
            k = finished[cid]
            if k < len(works):
                gpu.run_burst(cid, works[k], lambda: done(cid, think))

        def done(cid: str, think: float) -> None:
            finished[cid] += 1
            if think < 2.0:  # back to back: the next burst starts now (token reuse applies)
                starters[cid]()
            else:
                loop.after(think, starters[cid])

        starters[cid] = start
        loop.at(float(i), start)

    def check() -> None:
        running = gpu.running_clients
        sm = sum(gpu.scheduler.clients[c].spec.sm_pct for c in running)
        assert sm <= 100.0 + 1e-9, f"SM of running bursts {sm} > 100 at {loop.now_ms}"

    loop.checks.append(check)
    loop.run(until_ms=20_000.0)
    assert loop.events_processed > 0
    # When a token can stop a burst, nobody runs more than limit x window in any window.
    if preemptible:
        for (cid, k), ran in gpu.ran.items():
            assert ran <= limits[cid] * W + 1e-6, f"{cid} ran {ran} ms in window {k}"


# -- metrics integrals ------------------------------------------------------------------------


def test_utilisation_and_sm_occupancy_on_a_hand_built_case() -> None:
    # a (30 % SMs) runs [0, 10); b (50 % SMs) runs [5, 15) (interference off); stats at 20 ms.
    # busy: [0, 15) = 15 ms -> utilisation 15 / 20 = 0.75
    # SM integral: 30 * 10 + 50 * 10 = 800 %.ms -> occupancy 800 / 100 / 20 = 0.4
    loop = EventLoop()
    gpu = SimGpu(loop, interference=InterferenceModel(enabled=False))
    gpu.add_client(_client("a", 30.0))
    gpu.add_client(_client("b", 50.0))
    gpu.run_burst("a", 10.0, lambda: None)
    loop.at(5.0, lambda: gpu.run_burst("b", 10.0, lambda: None))
    loop.run(until_ms=20.0)
    s = gpu.stats()
    assert s.elapsed_ms == pytest.approx(20.0)
    assert s.busy_ms == pytest.approx(15.0)
    assert s.sm_pct_ms == pytest.approx(800.0)
    assert s.utilisation == pytest.approx(0.75)
    assert s.sm_occupancy == pytest.approx(0.4)
    assert s.bursts == 2


def test_reset_stats_starts_a_new_span() -> None:
    # a (40 %) runs [0, 30). Reset at 10, read at 50: busy [10, 30) = 20 ms of 40 -> 0.5;
    # SM integral 40 * 20 = 800 -> occupancy 800 / 100 / 40 = 0.2.
    loop = EventLoop()
    gpu = SimGpu(loop)
    gpu.add_client(_client("a", 40.0))
    gpu.run_burst("a", 30.0, lambda: None)
    loop.run(until_ms=10.0)
    gpu.reset_stats()
    loop.run(until_ms=50.0)
    s = gpu.stats()
    assert (s.elapsed_ms, s.busy_ms) == (pytest.approx(40.0), pytest.approx(20.0))
    assert s.utilisation == pytest.approx(0.5)
    assert s.sm_occupancy == pytest.approx(0.2)


def test_a_second_burst_in_flight_is_an_error() -> None:
    loop = EventLoop()
    gpu = SimGpu(loop)
    gpu.add_client(_client("a", 40.0))
    gpu.run_burst("a", 30.0, lambda: None)
    with pytest.raises(RuntimeError, match="already has a burst"):
        gpu.run_burst("a", 1.0, lambda: None)


def test_full_quota_clients_racing_for_all_sms_all_make_progress() -> None:
    # Four pods, 100 % SMs, request = limit = 1, back-to-back 20 ms bursts for 2 s: the GPU can
    # run 100 bursts; fair time sharing gives each ~25, and no pod should get none.
    loop = EventLoop()
    gpu = SimGpu(loop)
    count = {f"p{i}": 0 for i in range(4)}

    def again(cid: str) -> None:
        count[cid] += 1
        if loop.now_ms < 2000.0:
            gpu.run_burst(cid, 20.0, lambda: again(cid))

    for cid in count:
        gpu.add_client(_client(cid, 100.0))
        gpu.run_burst(cid, 20.0, lambda cid=cid: again(cid))
    loop.run(until_ms=2000.0)
    assert sum(count.values()) >= 95
    assert min(count.values()) >= 1


# -- token reuse (the live runtime's protocol) -------------------------------------------------


def _back_to_back(gpu: SimGpu, loop: EventLoop, cid: str, work_ms: float, n: int) -> list[float]:
    done: list[float] = []

    def start() -> None:
        if len(done) < n:
            gpu.run_burst(cid, work_ms, lambda: (done.append(loop.now_ms), start()))

    start()
    return done


@pytest.mark.parametrize("reuse", [False, True])
def test_token_reuse_pays_the_protocol_once_per_token(reuse: bool) -> None:
    # One client, 200 back-to-back bursts of 2 ms. Without reuse every burst asks for a token;
    # with reuse and the live runtime's 40-ms uncontended tokens a token serves 20 bursts.
    from gshare.policy.tokens import LIVE_TOKEN_CONFIG

    loop = EventLoop()
    gpu = SimGpu(loop, token_config=LIVE_TOKEN_CONFIG, token_reuse=reuse)
    gpu.add_client(_client("a", 50.0))
    done = _back_to_back(gpu, loop, "a", 2.0, 200)
    loop.run()
    assert len(done) == 200 and done[-1] == pytest.approx(400.0)
    st_ = gpu.stats()
    assert st_.bursts == 200
    if reuse:
        assert st_.tokens == 10 and gpu.reused == 190
    else:
        assert st_.tokens == 200 and gpu.reused == 0


def test_token_reuse_keeps_shares() -> None:
    # Two saturating clients on all SMs with requests 0.7 / 0.3 (no elasticity): with reuse
    # each still runs its request x window in every window.
    loop = EventLoop()
    gpu = TracingGpu(
        loop,
        token_config=TokenConfig(elastic=False),
        token_reuse=True,
        interference=InterferenceModel(enabled=False),
    )
    gpu.add_client(_client("a", 100.0, 0.7, 0.7))
    gpu.add_client(_client("b", 100.0, 0.3, 0.3))
    _back_to_back(gpu, loop, "a", 3.0, 10_000)
    _back_to_back(gpu, loop, "b", 3.0, 10_000)
    loop.run(until_ms=100 * W)
    assert gpu.reused > 0
    for k in range(5, 95):
        assert gpu.ran.get(("a", k), 0.0) == pytest.approx(0.7 * W, abs=3.0)
        assert gpu.ran.get(("b", k), 0.0) == pytest.approx(0.3 * W, abs=3.0)
        assert gpu.ran.get(("a", k), 0.0) <= 0.7 * W + 1e-6
        assert gpu.ran.get(("b", k), 0.0) <= 0.3 * W + 1e-6
