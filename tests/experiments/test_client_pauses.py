"""The load generator's collector pauses: recorded, frozen heap, cleaned up on any exit."""

from __future__ import annotations

import gc

import pytest

from gshare.experiments.client_pauses import quiet_collector


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_a_full_collection_inside_the_block_is_recorded_with_its_generation() -> None:
    with quiet_collector(freeze=False, min_ms=0.0) as p:
        gc.collect()
    assert any(g == 2 for _, g, _ in p.pauses)
    assert all(ms >= 0.0 for _, _, ms in p.pauses)
    s = p.summary()
    assert s["pauses"] == len(p.pauses) and s["max_ms"] >= 0.0 and s["frozen_objects"] == 0


def test_pauses_below_the_threshold_are_left_out() -> None:
    with quiet_collector(freeze=False, min_ms=1e9) as p:
        gc.collect()
    assert p.pauses == [] and p.summary()["max_ms"] == 0.0


def test_the_heap_built_before_the_run_is_frozen_during_it_and_released_after() -> None:
    before = gc.get_freeze_count()
    keep = [_Cycle() for _ in range(1000)]
    with quiet_collector() as p:
        assert gc.get_freeze_count() >= before + len(keep)
        assert p.frozen_objects >= before + len(keep)  # what the summary reports
    assert gc.get_freeze_count() == before
    del keep


def test_cycles_made_during_the_run_are_still_reclaimed() -> None:
    with quiet_collector():
        for _ in range(100):
            _Cycle()
        gc.collect()
        assert not any(isinstance(o, _Cycle) for o in gc.get_objects())


def test_the_callback_is_removed_and_the_heap_unfrozen_when_the_block_raises() -> None:
    n_callbacks = len(gc.callbacks)
    before = gc.get_freeze_count()
    with pytest.raises(RuntimeError), quiet_collector():
        raise RuntimeError("boom")
    assert len(gc.callbacks) == n_callbacks
    assert gc.get_freeze_count() == before


def test_since_gives_ms_after_the_runs_start() -> None:
    with quiet_collector(freeze=False, min_ms=0.0) as p:
        gc.collect()
    t0 = p.pauses[0][0] - 0.010
    at_ms, _, _ = p.since(t0)[0]
    assert at_ms == pytest.approx(10.0, abs=0.01)
