"""``policy.autoscale.measured``: the busy-time estimate and the config built on it, shared by
the live gateway and controller and the simulator."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gshare.policy.autoscale.measured import (
    BUSY_EWMA_WEIGHT,
    config_from_busy,
    next_busy_ms_per_request,
)
from gshare.resources import GpuShare
from gshare.runtime.control.configs import config_at


def test_the_first_answer_sets_the_estimate_and_later_ones_move_it_by_the_weight() -> None:
    first = next_busy_ms_per_request(None, 8.0, 4)  # a batch of 4 busy 8 ms: 2 ms each
    assert first == 2.0
    after = next_busy_ms_per_request(first, 4.0, 1)
    assert after == pytest.approx(2.0 + BUSY_EWMA_WEIGHT * (4.0 - 2.0))


@given(
    previous=st.floats(0.0, 1e4),
    busy=st.floats(0.0, 1e4),
    size=st.integers(1, 64),
)
def test_the_estimate_stays_between_the_previous_one_and_the_new_answer(
    previous: float, busy: float, size: int
) -> None:
    new = busy / size
    got = next_busy_ms_per_request(previous, busy, size)
    assert min(previous, new) - 1e-9 <= got <= max(previous, new) + 1e-9


def test_an_empty_batch_or_a_negative_busy_time_is_refused_with_its_name() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        next_busy_ms_per_request(1.0, 1.0, 0)
    with pytest.raises(ValueError, match="batch_busy_ms"):
        next_busy_ms_per_request(1.0, -0.5, 1)


def test_the_config_serves_its_quota_over_the_busy_time_and_matches_the_live_one() -> None:
    cfg = config_from_busy(25.0, 10.0, 2, 0.5)  # quota 10 %: 100 ms of busy time a second
    assert cfg.throughput_rps == pytest.approx(200.0)
    assert cfg.latency_ms == pytest.approx(2 * 1000.0 / 200.0)
    live = config_at("f", GpuShare(25.0, 0.1, 0.1), 2, None, 0.5)
    assert live == cfg  # the live controller builds the same config
    # a zero busy time does not divide by zero
    assert config_from_busy(25.0, 10.0, 1, 0.0).throughput_rps > 0
