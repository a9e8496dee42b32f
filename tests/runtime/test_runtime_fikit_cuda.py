"""FIKIT live on a CUDA device (``instance.fikit``: kernel spans from CUDA events, the gap after
an op predicted from its remaining device time).

Skipped without a CUDA device: no machine gshare is developed on has one, so this has never
run (README, Status). On a GPU it checks that the measurement phase records one span per leaf op
from CUDA events (device times, non-negative, in launch order) and ends after T runs, that a
held batch is not measured, and that the top class publishes a gap that starts after the op's
predicted device time.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_cuda_measurement_and_gap(short_tmp: Path) -> None:
    from gshare.policy.priority import FikitConfig, KernelId, KernelSpan, TaskPhase
    from gshare.policy.priority.profile import profile_from_runs
    from gshare.runtime.instance.fikit import FikitHost
    from gshare.runtime.tokens.board import MODE_FIKIT, S_STATE, BoardClient, BoardWriter

    w = BoardWriter(str(short_tmp / "c.board"), MODE_FIKIT)
    w.assign("g", 9)
    layer = torch.nn.Linear(64, 64).cuda()
    x = torch.zeros(8, 64, device="cuda")
    h = FikitHost(
        BoardClient(w.path, "g"), "g", device="cuda:0", config=FikitConfig(measure_runs=2)
    )
    h.worker_ident = threading.get_ident()
    try:
        for _ in range(2):
            h.begin_batch()
            for _ in range(3):
                h.before_op(layer, (x,))
                layer(x)
            h.end_batch(ok=True)
        assert h.phase is TaskPhase.SHARING
        s = h.profile.stats(KernelId.cpu("Linear", [[8, 64]]))
        assert s is not None and s.count == 6 and s.mean_ms >= 0 and s.gap_count == 4
        h.begin_batch()
        h.held(0.1)  # a held batch on CUDA is dropped from the measurement (device times)
        h.end_batch(ok=True)
        assert h.profile.runs == 2
        h.close()
        # a top-class instance with a 10-s gap after Linear publishes it after the op's SK
        op = KernelId.cpu("Linear", [[8, 64]])
        run = [KernelSpan(op, 0.0, 1.0), KernelSpan(op, 10_001.0, 10_002.0)]
        prof = profile_from_runs("g", [run]).to_records()
        h = FikitHost(
            BoardClient(w.path, "g"), "g", prof, device="cuda:0", config=FikitConfig(measure_runs=1)
        )
        h.worker_ident = threading.get_ident()
        h.begin_batch()
        h.before_op(layer, (x,))
        layer(x)
        assert h.board.get(S_STATE) > 0
        h.end_batch()
    finally:
        h.close()
        w.remove_file()
