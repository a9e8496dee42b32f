"""The GPU kit's pure pieces: the switch-cost analysis, the result model, part selection and
the bundle's wheel list (no process, no GPU)."""

from __future__ import annotations

import math

import pytest

from gshare.gpukit import PARTS, select_parts
from gshare.gpukit.analysis import SpinTimeline, switch_cost
from gshare.gpukit.bundle import wanted
from gshare.gpukit.results import Figure, PartResult, judge, render_markdown, validate

MS = 1_000_000  # ns


def _alternating(n: int, slice_ms: int, switch_ns: int) -> dict[str, SpinTimeline]:
    """Two spinners time-sliced: A runs a slice, the device switches, B runs one, ..."""
    period = slice_ms * MS + switch_ns
    a_gaps, b_gaps = [], []
    for k in range(n):
        start = k * period
        run_end = start + slice_ms * MS
        if k % 2 == 0:  # A runs; B is interrupted from its last read to its next
            b_gaps.append((start - switch_ns if k else 0, run_end + switch_ns))
        else:
            a_gaps.append((start - switch_ns, run_end + switch_ns))
    end = n * period
    b_gaps[0] = (0, b_gaps[0][1])  # B's kernel starts while A runs: its first read after
    return {
        "a": SpinTimeline(0, end, tuple(a_gaps)),
        "b": SpinTimeline(slice_ms * MS + switch_ns, end, tuple(g for g in b_gaps[1:])),
    }


def test_switch_cost_recovers_the_hand_over_time() -> None:
    sc = switch_cost(_alternating(n=40, slice_ms=2, switch_ns=25_000))
    assert sc.switches >= 30
    assert sc.median_us == pytest.approx(25.0, abs=1e-6)
    assert sc.slice_median_ms == pytest.approx(2.0, abs=0.05)
    assert sc.overlap_ms == 0.0


def test_concurrent_spinners_are_overlap_not_switches() -> None:
    both = {"a": SpinTimeline(0, 100 * MS, ()), "b": SpinTimeline(5 * MS, 90 * MS, ())}
    sc = switch_cost(both)
    assert sc.switches == 0 and math.isnan(sc.median_us)
    assert sc.overlap_ms == pytest.approx(85.0)


def test_a_spin_timeline_parses_and_names_what_is_malformed() -> None:
    tl = SpinTimeline.parse("# header\n100 900 2\n200 300\n500 600\n")
    assert tl.running() == [(100, 200), (300, 500), (600, 900)]
    with pytest.raises(ValueError, match="says 3 interruptions, has 1"):
        SpinTimeline.parse("0 10 3\n1 2\n")
    with pytest.raises(ValueError, match="ends"):
        SpinTimeline.parse("10 5 0\n")
    with pytest.raises(ValueError, match="two processes"):
        switch_cost({"a": tl})


def test_a_part_fails_on_a_failed_target_and_is_skipped_without_a_gpu() -> None:
    ok = Figure("x", 1.0, "<= 2", True)
    bad = Figure("y", 3.0, "<= 2", False)
    assert judge([ok], True, "").status == "pass"
    assert judge([ok], False, "no GPU").status == "skipped"
    r = judge([ok, bad], False, "no GPU")
    assert r.status == "fail" and "y" in r.reason  # a broken stub check is not hidden


def test_validate_names_the_problem() -> None:
    part = PartResult("skipped", "no GPU", [Figure("x", None)]).to_json()
    doc = {"schema": 1, "gpu": "H100", "dry_run": False, "provenance": {}, "parts": {"a": part}}
    validate(doc)
    assert "| x | — |" in render_markdown(doc, {"a": "A"})
    with pytest.raises(ValueError, match="must say why"):
        validate({**doc, "parts": {"a": {**part, "reason": ""}}})
    with pytest.raises(ValueError, match="no 'gpu'"):
        validate({k: v for k, v in doc.items() if k != "gpu"})
    with pytest.raises(ValueError, match="status"):
        PartResult("maybe").to_json()


def test_parts_are_selected_by_letter_or_name_in_the_kits_order() -> None:
    assert [p.key for p in select_parts("memory,a")] == ["a", "d"]
    assert select_parts(None) == list(PARTS) == select_parts("all")
    with pytest.raises(ValueError, match="unknown part q"):
        select_parts("a,q")
    assert sum(p.budget_s for p in PARTS) <= 520  # the default deadline holds them all


def test_the_bundle_holds_what_the_target_lacks_and_never_ray_or_torch() -> None:
    dists = wanted()
    for name in (
        "pydantic",
        "pydantic-core",
        "fastapi",
        "starlette",
        "uvicorn",
        "orjson",
    ):
        assert name in dists, name
    for name in ("ray", "torch", "numpy", "transformers", "httpx", "typer", "rich", "pytest"):
        assert name not in dists, name


def test_trace_rows_give_each_kernel_its_duration_and_the_idle_gap_after_it() -> None:
    from gshare.gpukit.analysis import TRACE_COLUMNS, trace_rows

    spans = [(0.0, 100.0, "conv"), (150.0, 170.0, "relu"), (160.0, 400.0, "gemm")]
    rows = trace_rows("m", 4, spans)
    assert [list(r) for r in rows] == [list(TRACE_COLUMNS)] * 3
    assert [(r["Name"], r["Duration"], r["Gap"]) for r in rows] == [
        ("conv", 100, 50),
        ("relu", 20, 0),  # the next one started before it ended (overlap): no idle time
        ("gemm", 240, ""),  # nothing follows the last kernel
    ]
