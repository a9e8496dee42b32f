"""policy.batching: the batch-ready rule both frontends use, with an injected clock (ms)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gshare.policy.batching import BatchingError, keep_token_for_next_batch, next_batch


@pytest.mark.parametrize(
    ("queued", "oldest", "now", "max_batch", "max_wait", "take", "deadline"),
    [
        (0, None, 5.0, 4, 10.0, 0, None),  # empty queue: nothing, no deadline
        (1, 0.0, 5.0, 4, 10.0, 0, 10.0),  # 1 < 4 and waited 5 < 10: wait until 0 + 10
        (1, 0.0, 10.0, 4, 10.0, 1, 10.0),  # waited exactly max_wait: run the partial batch
        (4, 3.0, 3.0, 4, 10.0, 4, 13.0),  # full: run at once
        (9, 0.0, 1.0, 4, 10.0, 4, 10.0),  # more than a batch: take max_batch
        (3, 0.0, 0.0, 4, 0.0, 3, 0.0),  # max_wait 0: never wait
        (2, 0.0, 10.0 - 1e-12, 4, 10.0, 2, 10.0),  # float rounding below the deadline counts
    ],
)
def test_next_batch(queued, oldest, now, max_batch, max_wait, take, deadline) -> None:
    d = next_batch(queued, oldest, now, max_batch, max_wait)
    assert (d.take, d.deadline_ms) == (take, deadline)


def test_keep_token_only_when_the_next_batch_is_ready() -> None:
    assert keep_token_for_next_batch(4, 0.0, 1.0, 4, 10.0)  # full
    assert keep_token_for_next_batch(1, 0.0, 10.0, 4, 10.0)  # oldest waited max_wait
    assert not keep_token_for_next_batch(1, 0.0, 1.0, 4, 10.0)  # would wait: give it back
    assert not keep_token_for_next_batch(0, None, 1.0, 4, 10.0)  # idle


@given(
    queued=st.integers(1, 50),
    waited=st.floats(0, 100),
    max_batch=st.integers(1, 16),
    max_wait=st.floats(0, 50),
)
def test_batch_invariants(queued: int, waited: float, max_batch: int, max_wait: float) -> None:
    d = next_batch(queued, 0.0, waited, max_batch, max_wait)
    assert 0 <= d.take <= min(queued, max_batch)
    # a batch is taken exactly when it is full or the oldest request waited max_wait
    assert (d.take > 0) == (queued >= max_batch or waited >= max_wait - 1e-9)
    assert d.deadline_ms == pytest.approx(max_wait)


def test_bad_parameters() -> None:
    with pytest.raises(BatchingError, match="max_batch"):
        next_batch(1, 0.0, 0.0, 0, 1.0)
    with pytest.raises(BatchingError, match="max_wait_ms"):
        next_batch(1, 0.0, 0.0, 1, -1.0)
