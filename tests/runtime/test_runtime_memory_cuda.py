"""Resource-centric sizing on a CUDA device (``instance.memory.CudaMemory``).

Skipped without a CUDA device: no machine gshare is developed on has one, so this has never
run (README, Status). On a GPU it checks that an allocation over ``init`` raises out of memory,
that ``grow_after_oom`` grows the allocator's fraction by steps so the same allocation then
succeeds, that the peak is recorded, and that ``max`` is enforced.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_cuda_limit_grows_by_steps_after_out_of_memory(tmp_path: Path) -> None:
    from gshare.policy.memory import MemoryPlan
    from gshare.runtime.instance.memory import SAMPLE, CudaMemory

    asked: list[tuple[float, int]] = []

    def ask(limit_mb: float, steps: int) -> tuple[bool, float, str]:
        asked.append((limit_mb, steps))
        return True, limit_mb, ""

    mem = CudaMemory("cuda:0", MemoryPlan(64, 64, 512), str(tmp_path / "m.mem"), ask=ask)
    mem.begin_batch()
    with pytest.raises(torch.cuda.OutOfMemoryError):
        torch.empty(200 << 20, dtype=torch.uint8, device="cuda:0")
    assert mem.grow_after_oom() is None and mem.limit_mb > 64 and asked
    while True:
        try:
            x = torch.empty(200 << 20, dtype=torch.uint8, device="cuda:0")
            break
        except torch.cuda.OutOfMemoryError:
            assert mem.grow_after_oom() is None
    mem.end_batch(0.01)
    peak, _ = SAMPLE.unpack((tmp_path / "m.mem").read_bytes()[: SAMPLE.size])
    assert peak >= 200
    del x
    mem.shrink()
    assert mem.limit_mb == 64
    with pytest.raises(torch.cuda.OutOfMemoryError):
        torch.empty(600 << 20, dtype=torch.uint8, device="cuda:0")
    reasons = [mem.grow_after_oom() for _ in range(10)]
    assert any(r is not None and "max" in r for r in reasons)
