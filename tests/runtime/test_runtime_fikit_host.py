"""runtime.instance.fikit: one instance's FIKIT mechanism on a real board, driven in-process
through its hooks (torch modules, the batching thread = the test's thread).

What is asserted: the measurement phase adds one run per batch and ends after T runs with the
ops' ids; a batch's held time is not measured as a gap; the top class publishes the predicted
gap after an op its profile says is followed by one, and its next op closes it; a lower class
holds its op while a higher class is active, and dispatches it as a fill only into an open gap
it fits (else it waits for the token, here a fake ``acquire``). Profiles are built from chosen
spans so that every prediction is known; no timing is asserted beyond "a gap of 10 s is still
open".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from gshare.policy.priority import FikitConfig, KernelId, KernelSpan, TaskPhase
from gshare.policy.priority.profile import profile_from_runs
from gshare.runtime.instance.fikit import FikitHost
from gshare.runtime.tokens.board import (
    MODE_FIKIT,
    S_FILLS,
    S_PREEMPTIONS,
    S_STATE,
    STATE_BUSY,
    STATE_IDLE,
    BoardClient,
    BoardWriter,
)

pytestmark = pytest.mark.serial  # measures shares or timings: `make test` runs it alone

X = torch.zeros(1, 4)
OP = KernelId.cpu("Linear", [[1, 4]])


@pytest.fixture
def board(short_tmp: Path) -> Iterator[BoardWriter]:
    w = BoardWriter(str(short_tmp / "t.board"), MODE_FIKIT)
    w.assign("hi", 9)
    w.assign("lo", 2)
    yield w
    w.remove_file()


def _host(w: BoardWriter, cid: str, profile: dict[str, object] | None = None) -> FikitHost:
    h = FikitHost(BoardClient(w.path, cid), cid, profile, config=FikitConfig(measure_runs=3))
    h.worker_ident = threading.get_ident()
    return h


def _run_batch(h: FikitHost, layer: torch.nn.Module, ops: int = 2) -> None:
    h.begin_batch()
    for _ in range(ops):
        h.before_op(layer, (X,))
        layer(X)
    h.end_batch(ok=True)


def _profile(sg_ms: float, sk_ms: float = 0.2) -> dict[str, object]:
    # one run of two ops: 0..sk, then sk + sg .. 2 sk + sg: SK = sk, SG = sg (only the first op
    # has a next one)
    run = [KernelSpan(OP, 0.0, sk_ms), KernelSpan(OP, sk_ms + sg_ms, 2 * sk_ms + sg_ms)]
    return profile_from_runs("f", [run] * 3).to_records()


def test_measurement_phase_then_sharing(board: BoardWriter) -> None:
    h = _host(board, "hi")
    layer = torch.nn.Linear(4, 4)
    try:
        assert h.phase is TaskPhase.MEASURING
        for i in range(3):
            _run_batch(h, layer)
            assert h.profile.runs == i + 1
        assert h.phase is TaskPhase.SHARING
        stats = h.profile.stats(OP)
        assert stats is not None and stats.count == 6 and stats.gap_count == 3
        u = board.usage_of("hi")
        assert u is not None and u.phase == "sharing" and u.runs == 3 and u.measure_s > 0
        assert h.report(with_profile=True)["profile"]["runs"] == 3
    finally:
        h.close()


def test_held_time_is_not_a_gap(board: BoardWriter) -> None:
    h = _host(board, "hi")
    layer = torch.nn.Linear(4, 4)
    try:
        h.begin_batch()
        h.before_op(layer, (X,))
        layer(X)
        time.sleep(0.5)  # the batch waited 0.5 s for a token between its two ops
        h.held(0.5)
        h.before_op(layer, (X,))
        layer(X)
        h.end_batch(ok=True)
        sg = h.profile.sg_ms(OP)
        assert sg is not None and sg < 400.0  # the 500 ms are out of the run's clock
    finally:
        h.close()


def test_top_class_publishes_and_closes_its_gap(board: BoardWriter) -> None:
    h = _host(board, "hi", _profile(sg_ms=10_000.0))
    layer = torch.nn.Linear(4, 4)
    q, base = h.board.q, h.board.base
    try:
        assert h.phase is TaskPhase.SHARING and h.publishing
        h.begin_batch()
        assert q[base + S_STATE] == STATE_BUSY
        h.before_op(layer, (X,))
        layer(X)  # the post-hook publishes: SG = 10 s after this op
        assert q[base + S_STATE] > 0
        h.before_op(layer, (X,))  # the next op ends the gap at once (runtime feedback)
        assert q[base + S_STATE] == STATE_BUSY
        h.end_batch()
        assert q[base + S_STATE] == STATE_IDLE
    finally:
        h.close()


def test_no_gap_below_the_minimum(board: BoardWriter) -> None:
    h = _host(board, "hi", _profile(sg_ms=0.05))  # SG 0.05 ms < 0.1 ms: never published
    try:
        assert h.phase is TaskPhase.SHARING and not h.publishing
    finally:
        h.close()


def test_lower_class_fills_an_open_gap_it_fits(board: BoardWriter) -> None:
    hi = _host(board, "hi", _profile(sg_ms=10_000.0))
    lo = _host(board, "lo", _profile(sg_ms=0.0, sk_ms=0.2))
    layer = torch.nn.Linear(4, 4)
    asked: list[str] = []
    try:
        board.set_top(9)  # the token server's plan: hi's class is active
        assert lo.must_yield() and not hi.must_yield()
        hi.begin_batch()
        hi.before_op(layer, (X,))
        layer(X)  # hi's gap of 10 s is open
        # lo's op (SK 0.2 ms + 0.05 overhead) fits: dispatched as a fill, no token asked
        assert lo.hold(layer, (X,), lambda: asked.append("lo")) is True
        assert asked == [] and lo.board.get(S_FILLS) == 1 and lo.board.get(S_PREEMPTIONS) == 1
        hi.before_op(layer, (X,))  # hi's next op: the gap is over
        hi.end_batch()  # hi's task ends: no top-class task can open a gap, lo waits for a token

        def acquire() -> None:
            asked.append("lo")
            board.set_top(2)

        assert lo.hold(layer, (X,), acquire) is False
        assert asked == ["lo"] and lo.board.get(S_FILLS) == 1
    finally:
        hi.close()
        lo.close()


def test_an_op_longer_than_every_gap_waits_for_the_token(board: BoardWriter) -> None:
    hi = _host(board, "hi", _profile(sg_ms=1.0))  # gaps of 1 ms
    lo = _host(board, "lo", _profile(sg_ms=0.0, sk_ms=5.0))  # ops of 5 ms never fit
    layer = torch.nn.Linear(4, 4)
    try:
        board.set_top(9)
        hi.begin_batch()
        hi.before_op(layer, (X,))
        layer(X)

        def acquire() -> None:
            board.set_top(2)

        assert lo.hold(layer, (X,), acquire) is False  # blocked on the token, no polling
        assert lo.board.get(S_FILLS) == 0
        hi.end_batch()
    finally:
        hi.close()
        lo.close()


def test_state_database_keeps_the_profile_per_code(tmp_path: Path) -> None:
    from gshare.runtime.control.state import StateStore, kernel_code_key

    st = StateStore.open(tmp_path / "state")
    try:
        spec = {"name": "f", "model": "resnet50", "device": "cpu", "batching": {"max_batch": 4}}
        key = kernel_code_key(spec)
        assert st.kernel_profile("f", key) is None
        prof = profile_from_runs("f", [[KernelSpan(OP, 0.0, 1.0)]] * 3).to_records()
        st.put_kernel_profile("f", key, prof, 3)
        assert st.kernel_profile("f", key) == prof
        # the batching changed: same ops, same profile; the model changed: measured again
        assert st.kernel_profile("f", kernel_code_key({**spec, "batching": {}})) == prof
        assert st.kernel_profile("f", kernel_code_key({**spec, "model": "mlp"})) is None
    finally:
        st.close()
