"""policy.routing: one instance-choice rule for both gateways."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gshare.policy.routing import Candidate, choose_instance

C = Candidate


@pytest.mark.parametrize(
    ("cands", "start", "wait_at_starting", "want"),
    [
        ([], 0, False, None),  # no instance: wait at the gateway
        ([C(3), C(1), C(2)], 0, False, 1),  # the shortest queue
        ([C(1), C(1), C(1)], 0, False, 0),  # ties: the first from start ...
        ([C(1), C(1), C(1)], 2, False, 2),  # ... a rotated start spreads them
        (
            [C(0, ready=False), C(5)],
            0,
            False,
            1,
        ),  # starting instances take nothing while one is ready
        ([C(8, cap=8), C(9, cap=8)], 0, False, None),  # every instance at its cap: wait
        ([C(8, cap=8), C(3, cap=4)], 0, False, 1),  # room under the cap
        ([C(2, ready=False), C(1, ready=False)], 0, False, None),  # runtime: wait at the gateway
        ([C(2, ready=False), C(1, ready=False)], 0, True, 1),  # sim: the least loaded starting one
        ([C(4, cap=4), C(0, ready=False)], 0, True, 1),  # no ready room: queue at a starting one
    ],
)
def test_choose_instance(cands, start, wait_at_starting, want) -> None:
    assert choose_instance(cands, start, wait_at_starting=wait_at_starting) == want


@given(
    st.lists(
        st.builds(
            Candidate, st.integers(0, 20), st.booleans(), st.one_of(st.none(), st.integers(1, 20))
        ),
        max_size=8,
    ),
    st.integers(0, 7),
)
def test_choice_is_ready_with_room_and_least_loaded(cands: list[Candidate], start: int) -> None:
    pick = choose_instance(cands, start)
    eligible = [c for c in cands if c.ready and (c.cap is None or c.outstanding < c.cap)]
    if not eligible:
        assert pick is None
        return
    assert pick is not None
    chosen = cands[pick]
    assert chosen.ready and (chosen.cap is None or chosen.outstanding < chosen.cap)
    assert chosen.outstanding == min(c.outstanding for c in eligible)
