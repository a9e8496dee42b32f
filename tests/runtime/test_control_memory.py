"""The controller's memory sizing state (``runtime.control.memory``), without Ray."""

from __future__ import annotations

from gshare.policy.memory import MemoryPlan
from gshare.runtime.control.memory import AUTO_STEP_MB, RESOLVE_AFTER, FunctionMemory
from gshare.runtime.messages import MemoryUsage
from gshare.spec import load_function_spec

SHARE = {"sm_pct": 50, "quota_request": 0.5}


def spec(mem: object) -> object:
    return load_function_spec({"name": "f", "model": "mlp", "resources": {**SHARE, "mem_mb": mem}})


def test_plans_of_each_spec_form() -> None:
    m = FunctionMemory()
    assert m.plan(spec(0)) == MemoryPlan()  # no limit
    assert m.plan(spec(512)) == MemoryPlan(512, 0, 512)  # fixed
    assert m.plan(spec({"init": 256, "step": 128, "max": 2048})) == MemoryPlan(256, 128, 2048)
    assert m.plan(spec("auto")) == MemoryPlan(0, AUTO_STEP_MB, 0)  # before any measurement


def test_observe_takes_each_sample_once_and_counts_deltas() -> None:
    m = FunctionMemory()
    u1 = MemoryUsage(100, grows=1, steps=2, refusals=0, samples_total=2, samples=((10, 1), (20, 1)))
    assert m.observe("i1", u1) == (1, 2, 0)
    assert list(m.history) == [(10, 1), (20, 1)]
    # the same report again adds nothing; a later one adds only its new samples
    assert m.observe("i1", u1) == (0, 0, 0)
    u2 = MemoryUsage(
        164, grows=2, steps=3, refusals=1, samples_total=3, samples=((10, 1), (20, 1), (30, 2))
    )
    assert m.observe("i1", u2) == (1, 1, 1)
    assert list(m.history) == [(10, 1), (20, 1), (30, 2)]
    # a restarted instance counts from 0 again: its samples are new
    u3 = MemoryUsage(100, samples_total=1, samples=((40, 1),))
    m.observe("i1", u3)
    assert list(m.history)[-1] == (40, 1)
    m.forget("i1")
    assert "i1" not in m.usage


def test_auto_is_resolved_after_enough_new_peaks_and_manual_never() -> None:
    auto, manual = spec("auto"), spec({"init": 256, "step": 128, "max": 2048})
    m = FunctionMemory()
    peaks = tuple((float(50 + 10 * i), 0.1) for i in range(RESOLVE_AFTER - 1))
    m.observe("i", MemoryUsage(64, samples_total=len(peaks), samples=peaks))
    assert m.resolve(auto) is None  # one peak short
    more = (*peaks, (200.0, 0.1))
    m.observe("i", MemoryUsage(64, samples_total=len(more), samples=more))
    plan = m.resolve(auto)
    assert plan is not None and m.plan(auto) == plan
    assert plan.step_mb >= 8 and 0 <= plan.init_mb <= 200  # never above the largest peak
    assert m.resolve(auto) is None  # nothing new
    assert m.resolve(manual) is None
