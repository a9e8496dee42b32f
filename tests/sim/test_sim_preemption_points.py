"""Four mechanisms of the live CPU instance in the simulator: a token's end noticed only at the
burst's next preemption point (``SimGpu.run_burst(point_work_ms=...)``, the instance's module
hook), the batching thread's wake-up at an idle instance (``InstanceConfig.wakeup_ms``), its
loop's gap between back-to-back batches, the token kept (``InstanceConfig.batch_gap_ms``,
``SimGpu.hold_token``), and the delay of an idle instance's token release
(``SimGpu.token_release_ms``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gshare.policy.tokens import LIVE_TOKEN_CONFIG, ClientSpec, TokenConfig
from gshare.profiles import ProfilePoint, ProfileTable
from gshare.resources import GpuShare
from gshare.sim.engine import EventLoop
from gshare.sim.gateway import Gateway
from gshare.sim.gpu import SimGpu
from gshare.sim.instance import InstanceConfig, SimInstance
from gshare.sim.request import SimRequest

CONFIG = TokenConfig(window_ms=40.0)


def _one_burst(
    work_ms: float, point_ms: float, quota: float = 0.25
) -> tuple[float, list[tuple[str, float, float]]]:
    """One client capped at ``quota`` of each window runs one burst; (its end, the tokens)."""
    loop = EventLoop()
    log: list[tuple[str, float, float]] = []
    gpu = SimGpu(loop, token_config=CONFIG, token_log=log)
    gpu.add_client(ClientSpec("a", 100.0, quota, quota))
    done: list[float] = []
    gpu.run_burst("a", work_ms, lambda: done.append(loop.now_ms), point_work_ms=point_ms)
    loop.run(until_ms=20 * CONFIG.window_ms)
    assert len(done) == 1
    return done[0], log


def test_a_token_ending_inside_a_call_is_given_back_when_the_call_returns() -> None:
    # cap 10 ms a window: cut anywhere, the first token ends at 10 ms; with a point every 3 ms
    # the call that started at 9 ms runs to 12 ms, and the window's cap is spent
    _, cont = _one_burst(16.0, 0.0)
    _, pts = _one_burst(16.0, 3.0)
    assert cont[0][2] - cont[0][1] == pytest.approx(10.0)
    assert pts[0][2] - pts[0][1] == pytest.approx(12.0)
    worked = 0.0
    for _, start, end in pts[:-1]:  # each token but the last is given back at a call's end
        worked += end - start
        assert worked / 3.0 == pytest.approx(round(worked / 3.0))
    assert worked + pts[-1][2] - pts[-1][1] == pytest.approx(16.0)


@settings(max_examples=30, deadline=None)
@given(
    work_ms=st.floats(1.0, 60.0),
    point_ms=st.sampled_from([0.5, 1.0, 2.0, 3.0]),
    quota=st.sampled_from([0.1, 0.25, 0.5]),
)
def test_a_burst_runs_past_its_token_by_less_than_one_call_and_all_of_its_work_is_done(
    work_ms: float, point_ms: float, quota: float
) -> None:
    end, log = _one_burst(work_ms, point_ms, quota)
    cap = quota * CONFIG.window_ms
    ran = 0.0
    for _, start, stop in log:
        assert stop - start < cap + point_ms + 1e-6
        ran += stop - start
    assert ran == pytest.approx(work_ms, abs=1e-6)  # alone at rate 1: used = worked
    assert end >= work_ms - 1e-9


def _hi_done_ms(point_ms: float) -> float:
    """When "hi" (priority 8) finishes a 1-ms burst asked for at 1 ms while "lo" (priority 1,
    cap 5 ms a window) runs 8 ms of work in calls of ``point_ms``."""
    loop = EventLoop()
    gpu = SimGpu(loop, token_config=CONFIG)
    gpu.add_client(ClientSpec("lo", 100.0, 0.125, 0.125, 1))
    gpu.add_client(ClientSpec("hi", 100.0, 0.5, 0.5, 8))
    gpu.run_burst("lo", 8.0, lambda: None, point_work_ms=point_ms)
    done: list[float] = []
    loop.at(1.0, lambda: gpu.run_burst("hi", 1.0, lambda: done.append(loop.now_ms)))
    loop.run(until_ms=200.0)
    return done[0]


def test_a_waiting_higher_class_gets_the_token_only_after_the_call_in_progress() -> None:
    # hi waits for lo's token: cut anywhere it is given back at 5 ms, at call ends at 6 ms
    # (the call from 4 to 6); hi's burst ends 1 ms later
    assert _hi_done_ms(0.0) == pytest.approx(6.0)
    assert _hi_done_ms(2.0) == pytest.approx(7.0)


def _release_run(release_ms: float, again_at_ms: float | None = None) -> tuple[float, float]:
    """ "a" (token reuse) runs a 2-ms burst at 0 (and another at ``again_at_ms``); "b" asks at
    1 ms. (when b's 1-ms burst ends, when a's last burst ends)."""
    loop = EventLoop()
    gpu = SimGpu(loop, token_config=CONFIG, token_reuse=True, token_release_ms=release_ms)
    gpu.add_client(ClientSpec("a", 100.0, 0.5, 0.5))
    gpu.add_client(ClientSpec("b", 100.0, 0.5, 0.5))
    ends: dict[str, float] = {}
    gpu.run_burst("a", 2.0, lambda: ends.__setitem__("a", loop.now_ms))
    loop.at(1.0, lambda: gpu.run_burst("b", 1.0, lambda: ends.__setitem__("b", loop.now_ms)))
    if again_at_ms is not None:
        loop.at(
            again_at_ms,
            lambda: gpu.run_burst("a", 2.0, lambda: ends.__setitem__("a", loop.now_ms)),
        )
    loop.run(until_ms=100.0)
    return ends["b"], ends["a"]


def test_an_idle_clients_token_is_released_late_and_a_waiting_one_gets_it_then() -> None:
    assert _release_run(0.0)[0] == pytest.approx(3.0)  # a releases at 2, b runs 2-3
    assert _release_run(0.7)[0] == pytest.approx(3.7)  # released at 2.7


def test_a_client_that_asks_again_first_has_its_release_processed_with_the_request() -> None:
    # a asks again at 2.2 (before its release at 2.7 is processed): released then, and b,
    # waiting since 1, gets the token first (b 2.2-3.2); b, idle after it, releases at 3.9
    # and a runs 3.9-5.9
    b_end, a_end = _release_run(0.7, again_at_ms=2.2)
    assert b_end == pytest.approx(3.2)
    assert a_end == pytest.approx(5.9)


def test_a_negative_release_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="token_release_ms"):
        SimGpu(EventLoop(), token_release_ms=-1.0)


# A model "m" of 10 ms a request (batch 2: 14 ms) at any share.
TABLE = ProfileTable(
    ProfilePoint("m", sm, 100.0, b, lat)
    for sm in (10.0, 100.0)
    for b, lat in ((1, 10.0), (2, 14.0))
)


def _instance(
    wakeup_ms: tuple[float, ...], max_batch: int = 1, gpu: SimGpu | None = None, **kw: Any
) -> tuple[EventLoop, Gateway]:
    loop = gpu.loop if gpu is not None else EventLoop()
    gw = Gateway(loop)
    gw.register("f")
    cfg = InstanceConfig("f", "m", GpuShare(100.0, 1.0, 1.0), max_batch, wakeup_ms=wakeup_ms, **kw)
    inst = SimInstance(
        loop, gpu or SimGpu(loop), "i0", cfg, TABLE, np.random.default_rng(0), gw.completed
    )
    gw.add_instance(inst)
    return loop, gw


def _at(loop: EventLoop, gw: Gateway, times: list[float]) -> list[SimRequest]:
    out: list[SimRequest] = []
    for t in times:
        loop.at(t, lambda: out.append(gw.submit("f")))
    return out


def test_a_request_at_an_idle_instance_waits_for_the_wake_up_and_one_queued_does_not() -> None:
    loop, gw = _instance((2.0,))
    # 0: idle, wakes 2 ms, runs 2-12; 5: queued behind it, starts at 12; 40: idle again
    reqs = _at(loop, gw, [0.0, 5.0, 40.0])
    loop.run()
    assert [r.start_ms for r in reqs] == pytest.approx([2.0, 12.0, 42.0])
    assert [r.finish_ms for r in reqs] == pytest.approx([12.0, 22.0, 52.0])


def test_requests_that_arrive_while_the_thread_wakes_up_are_batched_together() -> None:
    loop, gw = _instance((3.0,), max_batch=2)
    reqs = _at(loop, gw, [0.0, 1.0])
    loop.run()
    assert [r.start_ms for r in reqs] == pytest.approx([3.0, 3.0])
    assert [r.finish_ms for r in reqs] == pytest.approx([17.0, 17.0])


def test_without_wake_up_samples_a_request_starts_at_once() -> None:
    loop, gw = _instance(())
    reqs = _at(loop, gw, [0.0, 40.0])
    loop.run()
    assert [r.start_ms for r in reqs] == pytest.approx([0.0, 40.0])


def test_a_batch_ready_when_one_ends_starts_a_loop_gap_later_on_the_kept_token() -> None:
    gpu = SimGpu(EventLoop(), token_config=LIVE_TOKEN_CONFIG, token_reuse=True)
    loop, gw = _instance((), gpu=gpu, batch_gap_ms=(0.5,))
    # 0: idle, runs 0-10; 5: queued, starts 0.5 ms after 10 on the kept 40-ms token; 40: idle
    # again, at once (no gap: no batch ended just before it)
    reqs = _at(loop, gw, [0.0, 5.0, 40.0])
    loop.run()
    assert [r.start_ms for r in reqs] == pytest.approx([0.0, 10.5, 40.0])
    assert [r.finish_ms for r in reqs] == pytest.approx([10.0, 20.5, 50.0])
    assert [r.token_wait_ms for r in reqs] == pytest.approx([0.0, 0.0, 0.0])
    assert gpu.reused == 1


def _gap_run(quota_a: float, hold: bool) -> tuple[float, int]:
    """ "a" (tokens of its whole quota of 10-ms windows) runs a 2-ms burst at 0 and another 0.5
    ms after it ends, its token held over the gap when ``hold``; "b" asks at 1 ms for 1 ms.
    (b's end, a's bursts run on a kept token)."""
    loop = EventLoop()
    whole = TokenConfig(window_ms=10.0, dynamic_quota=False)
    gpu = SimGpu(loop, token_config=whole, token_reuse=True)
    gpu.add_client(ClientSpec("a", 100.0, quota_a, quota_a))
    gpu.add_client(ClientSpec("b", 100.0, 0.5, 0.5))
    ends: dict[str, float] = {}

    def first_done() -> None:
        if hold:
            assert gpu.hold_token("a")
        loop.after(0.5, lambda: gpu.run_burst("a", 2.0, lambda: None))

    gpu.run_burst("a", 2.0, first_done)
    loop.at(1.0, lambda: gpu.run_burst("b", 1.0, lambda: ends.__setitem__("b", loop.now_ms)))
    loop.run(until_ms=40.0)
    return ends["b"], gpu.reused


def test_a_token_held_over_the_loop_gap_keeps_the_device_for_the_next_burst() -> None:
    # held: a's 8-ms token runs its second burst 2.5-4.5, and b gets the device after it
    assert _gap_run(0.8, hold=True) == (pytest.approx(5.5), 1)
    # not held: released when the first burst ends, b runs 2-3 and a waits for it
    assert _gap_run(0.8, hold=False) == (pytest.approx(3.0), 0)


def test_the_held_tokens_clock_runs_over_the_gap() -> None:
    # a's 4.2-ms token has 1.7 ms left after the gap (2.2 without it), short of the 2-ms burst:
    # given back, and b, waiting since 1, runs first (2.5-3.5)
    assert _gap_run(0.42, hold=True) == (pytest.approx(3.5), 0)


def test_nothing_is_held_without_a_kept_token() -> None:
    loop = EventLoop()
    gpu = SimGpu(loop)  # no token reuse: released after every burst
    gpu.add_client(ClientSpec("a", 100.0, 0.5, 0.5))
    held: list[bool] = []
    gpu.run_burst("a", 2.0, lambda: held.append(gpu.hold_token("a")))
    loop.run(until_ms=10.0)
    assert held == [False]
