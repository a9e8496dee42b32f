"""``bench/generate.py --quick``: the in-process comparison of batching modes, the priority
streams and the live twin (a real ``gshare serve``, the LLM trace segment loaded and simulated)
run end to end and report every summary key. The figures are not asserted (a quick run on a
shared machine is noise); their meaning is the bench's."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
KEYS = (
    "tokens_per_s_ratio_continuous_vs_request",
    "hi_tpot_p99_ratio_vs_alone",
    "hi_tpot_p99_ratio_equal_over_fikit",
    "ttft_p50_ratio_sim_over_live",
    "tpot_p50_ratio_sim_over_live",
)


@pytest.mark.slow
def test_bench_generate_quick_reports_every_summary_key() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import generate
    finally:
        sys.path.remove(str(BENCH))
    s = generate.main(["--quick"])
    for k in KEYS:
        assert k in s, k
    for k in KEYS[1:]:
        assert s[k] is not None and math.isfinite(s[k]) and s[k] > 0, (k, s[k])
    assert s["twin_live_tpot_ms_p50"] > 0 and s["twin_sim_tpot_ms_p50"] > 0
    assert s["twin_frontend_ms"] >= 0 and s["twin_step_overhead_ms"] >= 0
    assert "loadavg_1m" in s
