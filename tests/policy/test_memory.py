"""policy.memory: the device memory ledger and the grow/shrink rule of resource-centric sizing."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gshare.policy.memory import (
    DeviceMemory,
    MemoryPlan,
    MemoryRefusal,
    grow_limit,
    idle_limit,
)

# -- grow_limit: the smallest init + k*step covering the need, at most max ----------------------


@pytest.mark.parametrize(
    ("limit", "need", "init", "step", "max_mb", "want_limit", "want_steps"),
    [
        # need 300 over init 256: k = ceil((300-256)/128) = 1 -> 384, one step from 256
        (256, 300, 256, 128, 2048, 384, 1),
        # need 700: k = ceil(444/128) = 4 -> 256 + 512 = 768, four steps from 256
        (256, 700, 256, 128, 2048, 768, 4),
        # already at 384, need 400: k = ceil(144/128) = 2 -> 512, one step from 384
        (384, 400, 256, 128, 2048, 512, 1),
        # need exactly on a step boundary: 512 covers 512 (k = 2), two steps from 256
        (256, 512, 256, 128, 2048, 512, 2),
        # the next step (2048 + ...) passes max 2000, but max covers 1990: offer max
        (1920, 1990, 256, 128, 2000, 2000, 1),
        # init 0 (auto before any measurement), step 64: need 100 -> 128, two steps
        (0, 100, 0, 64, math.inf, 128, 2),
    ],
)
def test_grow_limit_table(
    limit: float,
    need: float,
    init: float,
    step: float,
    max_mb: float,
    want_limit: float,
    want_steps: int,
) -> None:
    g = grow_limit(limit, need, init, step, max_mb)
    assert g.limit_mb == want_limit and g.steps == want_steps


@pytest.mark.parametrize(
    ("limit", "need", "max_mb"),
    [
        (2048, 2100, 2048),  # over max: nothing covers it
        (256, 5000, 2048),
    ],
)
def test_grow_limit_refuses_over_max(limit: float, need: float, max_mb: float) -> None:
    assert grow_limit(limit, need, 256, 128, max_mb).limit_mb is None


def test_grow_limit_needs_a_step() -> None:
    with pytest.raises(ValueError, match="step_mb"):
        grow_limit(256, 300, 256, 0, 1000)


@given(
    init=st.integers(0, 2000),
    step=st.integers(1, 500),
    extra=st.integers(0, 5000),
    need_over=st.floats(0.001, 3000),
)
def test_grow_limit_properties(init: int, step: int, extra: int, need_over: float) -> None:
    max_mb = init + extra
    limit = init
    need = limit + need_over
    g = grow_limit(limit, need, init, step, max_mb)
    if need > max_mb:
        assert g.limit_mb is None
        return
    assert g.limit_mb is not None
    assert need <= g.limit_mb + 1e-6 <= max_mb + 1e-6  # covers, within max
    on_grid = abs((g.limit_mb - init) / step - round((g.limit_mb - init) / step)) < 1e-9
    assert on_grid or g.limit_mb == max_mb
    # smallest: one step less would not cover (or would not be above the current limit)
    if on_grid and g.limit_mb != max_mb:
        assert g.limit_mb - step < need or g.limit_mb - step <= limit
    assert g.steps >= 1


@pytest.mark.parametrize(
    ("used", "want"),
    [
        (10, 256),  # under init: back to init
        (256, 256),
        (300, 384),  # 256 + ceil(44/128) * 128
        (5000, 2048),  # never above max
    ],
)
def test_idle_limit_table(used: float, want: float) -> None:
    assert idle_limit(used, 256, 128, 2048) == want


def test_plan_properties() -> None:
    assert not MemoryPlan().governed
    fixed = MemoryPlan(512, 0, 512)
    assert fixed.governed and fixed.fixed and fixed.cap_mb == 512
    auto = MemoryPlan(0, 64, 0)
    assert auto.governed and not auto.fixed and auto.cap_mb == math.inf
    assert MemoryPlan(256, 128, 2048).cap_mb == 2048


# -- the ledger -----------------------------------------------------------------------------------


def test_ledger_grants_refuses_and_counts() -> None:
    d = DeviceMemory(1000)
    assert d.reserve("a", 100).granted and d.reserve("b", 800).granted
    assert d.free_mb == 100
    g = d.resize("a", 200, steps=1)  # +100 fits exactly
    assert g.granted and g.limit_mb == 200 and g.free_mb == 0
    g = d.resize("a", 300, steps=1)  # +100 does not fit
    assert not g.granted and g.refusal is MemoryRefusal.DEVICE_FULL and g.limit_mb == 200
    assert d.resize("a", 100).granted  # shrinking always fits
    assert d.reserve("c", 200).refusal is MemoryRefusal.DEVICE_FULL
    assert d.resize("zz", 1).refusal is MemoryRefusal.UNKNOWN_OWNER
    assert d.resize("a", math.nan).refusal is MemoryRefusal.BAD_VALUE
    d.refused("a")
    snap = d.snapshot()["a"]
    assert (snap.limit_mb, snap.grows, snap.steps, snap.refusals) == (100, 1, 1, 2)
    d.release("a")
    d.release("a")  # idempotent
    assert d.free_mb == 200 and not d.holds("a")


def test_ledger_rejects_a_bad_capacity() -> None:
    for bad in (0, -1, math.inf, math.nan):
        with pytest.raises(ValueError, match="capacity_mb"):
            DeviceMemory(bad)


_ops = st.lists(
    st.tuples(
        st.sampled_from(["reserve", "resize", "release"]),
        st.sampled_from(["a", "b", "c", "d"]),
        st.floats(0, 600),
    ),
    max_size=60,
)


@settings(max_examples=200)
@given(ops=_ops)
def test_ledger_never_overcommits(ops: list[tuple[str, str, float]]) -> None:
    d = DeviceMemory(1000)
    for op, owner, mb in ops:
        before = d.snapshot().get(owner)
        if op == "reserve":
            g = d.reserve(owner, mb)
        elif op == "resize":
            g = d.resize(owner, mb)
        else:
            d.release(owner)
            assert not d.holds(owner)
            continue
        held = d.snapshot().get(owner)
        if g.granted:
            assert held is not None and held.limit_mb == mb
        elif before is not None:  # a refusal leaves the reservation as it was
            assert held is not None and held.limit_mb == before.limit_mb
        if op == "resize" and before is not None and mb <= before.limit_mb:
            assert g.granted  # shrinking is always granted
        total = sum(r.limit_mb for r in d.snapshot().values())
        assert total <= d.capacity_mb + 1e-6
        assert abs(total - d.reserved_mb) < 1e-6
