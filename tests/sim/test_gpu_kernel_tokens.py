"""``SimGpu(kernel_ms=...)``: a token used in whole kernels, as the live CUDA interposer uses it —
a kernel only if it ends ``launch_margin_ms`` before the token, the token given back when the
next one does not fit, a token too short for one held idle and charged nothing."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gshare.experiments.token_share import Saturating, window_usage
from gshare.policy.tokens import ClientSpec, TokenConfig
from gshare.sim.engine import EventLoop
from gshare.sim.gpu import SimGpu

CONFIG = TokenConfig(window_ms=40.0)


def _run(
    clients: dict[str, tuple[float, float]],
    kernel_ms: float,
    margin_ms: float,
    burst_ms: float = 8.0,
    windows: int = 20,
    wakeup_ms: float = 0.0,
) -> tuple[SimGpu, list[tuple[str, float, float]]]:
    loop = EventLoop()
    log: list[tuple[str, float, float]] = []
    gpu = SimGpu(
        loop,
        token_config=CONFIG,
        token_log=log,
        kernel_ms=kernel_ms,
        launch_margin_ms=margin_ms,
        token_wakeup_ms=wakeup_ms,
    )
    for cid, (req, lim) in clients.items():
        gpu.add_client(ClientSpec(cid, 100.0, req, lim))
        Saturating(gpu, cid, burst_ms).set_active(True)
    loop.run(until_ms=windows * CONFIG.window_ms)
    return gpu, log


def _charged(log: list[tuple[str, float, float]], client: str) -> float:
    return sum(b - a for c, a, b in log if c == client)


def test_a_capped_client_loses_the_tail_no_kernel_fits() -> None:
    # cap 10 ms a window; 1-ms kernels must end 0.25 ms before the token: 9 fit, the last
    # 1 ms of the cap cannot hold one (it is held idle, charged nothing)
    windows = 20
    _, log = _run({"a": (0.25, 0.25)}, kernel_ms=1.0, margin_ms=0.25, windows=windows)
    _, cont = _run({"a": (0.25, 0.25)}, kernel_ms=0.0, margin_ms=0.0, windows=windows)
    assert _charged(log, "a") == pytest.approx(9.0 * windows, abs=1.0)
    assert _charged(cont, "a") == pytest.approx(10.0 * windows, abs=1.0)


@settings(max_examples=25, deadline=None)
@given(
    kernel_ms=st.sampled_from([0.25, 0.5, 1.0, 2.0]),
    margin_ms=st.sampled_from([0.0, 0.1, 0.2]),
    wakeup_ms=st.sampled_from([0.0, 0.15, 0.3]),
    quotas=st.lists(st.sampled_from([0.2, 0.3, 0.5, 0.6]), min_size=1, max_size=3),
)
def test_every_token_is_charged_whole_kernels_and_no_window_over_its_limit(
    kernel_ms: float, margin_ms: float, wakeup_ms: float, quotas: list[float]
) -> None:
    # a hand-over's wake-up is idle device time: it is not charged, and the kernels after it
    # still end before the token does
    clients = {f"c{i}": (q / len(quotas), q) for i, q in enumerate(quotas)}
    gpu, log = _run(clients, kernel_ms, margin_ms, windows=8, wakeup_ms=wakeup_ms)
    assert log
    for _, start, end in log:
        kernels = (end - start) / kernel_ms
        assert math.isclose(kernels, round(kernels), abs_tol=1e-6)  # whole kernels (rate 1)
        assert end - start <= CONFIG.window_ms + 1e-9
    # no window is charged over a client's limit
    for cid, (_, limit) in clients.items():
        for used in window_usage(log, cid, 0.0, 8, CONFIG.window_ms):
            assert used <= limit * CONFIG.window_ms + kernel_ms + 1e-6
    assert gpu.stats().tokens >= len(log) - len(clients)


def test_kernel_mode_refuses_what_it_does_not_model() -> None:
    loop = EventLoop()
    with pytest.raises(ValueError, match="kernel_ms and launch_margin_ms must be >= 0"):
        SimGpu(loop, kernel_ms=-1.0)
    with pytest.raises(ValueError, match="without token_reuse"):
        SimGpu(loop, kernel_ms=0.5, token_reuse=True)
    with pytest.raises(ValueError, match="preemptible"):
        SimGpu(loop, kernel_ms=0.5, preemptible=False)
