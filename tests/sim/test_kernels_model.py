"""sim.kernels: calibration of the launch streams and the three modes of the kernel-level model.

Jitter is off (``NOJIT``) wherever an exact time is asserted; the arithmetic is in the comments.
"""

from __future__ import annotations

import numpy as np
import pytest

from gshare.policy.priority import FikitConfig
from gshare.profiles import ProfileTable
from gshare.sim.kernels.catalogue import (
    INFERENCE_PASSES,
    SHIPPED_PASSES,
    TRAINING_PASSES,
    CatalogueError,
    HostMode,
    PassKind,
    load_pass,
    op_weight,
    task_model,
)
from gshare.sim.kernels.scenario import (
    Arrivals,
    DeviceParams,
    Mode,
    Service,
    measure_profile,
    run_scenario,
)
from gshare.sim.kernels.stream import HookCosts, Jitter

NOJIT = Jitter(0.0, 0.0)
NOHOOK = HookCosts(0.0, 0.0, 0.0)


@pytest.mark.parametrize("name", SHIPPED_PASSES)
def test_shipped_passes_load(name: str) -> None:
    p = load_pass(name)
    assert len(p.kernels) > 100 and p.device_ms > 1.0
    assert all(k.duration_ms > 0 for k in p.kernels)
    assert p.kind is (PassKind.INFERENCE if name.endswith("_fwd") else PassKind.TRAINING)


def test_unknown_passes_are_errors() -> None:
    with pytest.raises(CatalogueError, match="unknown pass"):
        load_pass("resnet50_32_fb0")  # placeholder durations: not shipped


@pytest.mark.parametrize("name", INFERENCE_PASSES)
@pytest.mark.parametrize("mode", list(HostMode))
def test_a_pass_alone_takes_the_tables_full_quota_latency(name: str, mode: HostMode) -> None:
    m = task_model(name, host_mode=mode)
    table = ProfileTable.shipped_v100()
    model = {"resnet50": "resnet50", "resnet101": "resnet101", "mobilenetv2": "mobilenet_v2"}
    target = table.latency_ms(model[name.split("_")[0]], 100.0, 100.0, 4)
    assert m.target_ms == pytest.approx(target)
    assert m.solo_ms == pytest.approx(target, rel=1e-6)
    if mode is HostMode.SYNC:  # L = sum(host) + sum(kernels)
        assert sum(m.host_ms) == pytest.approx(target - m.device_ms)
    # ... and simulated on the device alone (no switch after the first, no jitter) as well
    r = run_scenario(
        [Service("A", m, 9, Arrivals.closed_loop(3))],
        Mode.SHARING,
        horizon_ms=1e9,
        device=DeviceParams(switch_ms=0.0),
        jitter=NOJIT,
    )
    assert [x.jct_ms for x in r.done("A")] == pytest.approx([target] * 3, rel=1e-6)


@pytest.mark.parametrize("name", TRAINING_PASSES)
def test_training_passes_are_device_bound(name: str) -> None:
    m = task_model(name)
    assert m.host_mode is HostMode.ASYNC and m.target_ms is None
    assert float(np.mean(m.host_ms)) == pytest.approx(0.02)
    # ASYNC: the host runs ahead, the pass takes little more than its kernels
    assert m.device_ms <= m.solo_ms <= 1.2 * m.device_ms


@pytest.mark.parametrize(
    ("name", "weight"),
    [("Conv", 3.0), ("volta_sgemm_128x32_tn", 3.0), ("BatchNorm", 2.0),
     ("void at::native::vectorized_elementwise_kernel", 1.0)],
)  # fmt: skip
def test_op_weights(name: str, weight: float) -> None:
    assert op_weight(name) == weight


def _two(hi: str = "resnet50_4_fwd", lo: str = "mobilenetv2_4_fwd") -> list[Service]:
    return [
        Service("A", task_model(hi), 9, Arrivals.burst(1)),
        Service("B", task_model(lo), 1, Arrivals.burst(1)),
    ]


def test_exclusive_mode_serialises_in_arrival_order() -> None:
    # A and B arrive at 0 (A first). B's host does its first segment meanwhile, but no kernel of
    # B runs before A's last one ended: A alone (L_A), B = L_A + L_B - B's first host segment.
    trace: list[tuple[str, float, float, float]] = []
    svc = _two()
    r = run_scenario(
        svc,
        Mode.EXCLUSIVE,
        horizon_ms=1e9,
        device=DeviceParams(switch_ms=0.0),
        jitter=NOJIT,
        trace=trace,
    )
    la, lb = svc[0].model.solo_ms, svc[1].model.solo_ms
    a_end = r.done("A")[0].end_ms
    assert a_end == pytest.approx(la)
    assert r.done("B")[0].end_ms == pytest.approx(la + lb - svc[1].model.host_ms[0])
    assert min(s for c, _, s, _ in trace if c == "B") >= a_end - 1e-9
    assert max(e for c, _, _, e in trace if c == "A") == pytest.approx(a_end)


@pytest.fixture(scope="module")
def profiles() -> dict[str, object]:
    return {
        n: measure_profile(n, task_model(n), 3, jitter=NOJIT)[0]
        for n in ("resnet50_4_fwd", "mobilenetv2_4_fwd", "mobilenetv2_32_fb1")
    }


def test_measurement_phase_reads_the_model_back(profiles: dict[str, object]) -> None:
    # Without jitter every launch of a kernel ID lasts its Nsight duration, so SK is the mean
    # of that ID's durations; SG is the mean host segment after it plus the 2-us interception
    # (the measuring mechanism removes its own 40 us per kernel from the gaps it records).
    m = task_model("resnet50_4_fwd")
    prof = profiles["resnet50_4_fwd"]
    by_id: dict[object, list[float]] = {}
    gaps: dict[object, list[float]] = {}
    for i, k in enumerate(m.kernels):
        by_id.setdefault(k.kernel, []).append(k.duration_ms)
        if i + 1 < len(m.kernels):
            gaps.setdefault(k.kernel, []).append(m.host_ms[i + 1] + HookCosts().intercept_ms)
    assert prof.runs == 3  # type: ignore[attr-defined]
    for kid, ds in by_id.items():
        assert prof.sk_ms(kid) == pytest.approx(np.mean(ds))  # type: ignore[attr-defined]
        if kid in gaps:
            assert prof.sg_ms(kid) == pytest.approx(np.mean(gaps[kid]))  # type: ignore[attr-defined]


def test_one_priority_class_fikit_is_default_sharing(profiles: dict[str, object]) -> None:
    # Equal priorities: FIKIT dispatches every launch at once, FIFO. Without interception costs
    # the run is the sharing run, kernel for kernel (same seeds, same device).
    names = ("resnet50_4_fwd", "mobilenetv2_4_fwd")
    svc = [Service(n, task_model(n), 5, Arrivals.closed_loop()) for n in names]
    kw = {"horizon_ms": 400.0, "hooks": NOHOOK, "seed": 3}
    share = run_scenario(svc, Mode.SHARING, **kw)  # type: ignore[arg-type]
    fikit = run_scenario(
        svc,
        Mode.FIKIT,
        profiles=profiles,  # type: ignore[arg-type]
        fikit=FikitConfig(measure_runs=3),
        **kw,  # type: ignore[arg-type]
    )
    for n in names:
        a = [t for x in share.done(n) for t in (x.begin_ms, x.end_ms)]
        b = [t for x in fikit.done(n) for t in (x.begin_ms, x.end_ms)]
        assert len(a) > 10 and a == pytest.approx(b)
    assert fikit.reasons and set(fikit.reasons) == {next(iter(fikit.reasons))}  # TOP_CLASS only


def test_fikit_high_kernels_wait_only_behind_fills_of_their_gap(
    profiles: dict[str, object],
) -> None:
    # A high-priority kernel can only be delayed by low-priority kernels that were on the device
    # (submitted) before it: nothing of B submitted after an A kernel runs before it. And A
    # stays close to running alone (fills are chosen to fit its gaps).
    trace: list[tuple[str, float, float, float]] = []
    svc = [
        Service("A", task_model("resnet50_4_fwd"), 9, Arrivals.closed_loop()),
        Service("B", task_model("mobilenetv2_32_fb1"), 1, Arrivals.closed_loop()),
    ]
    r = run_scenario(
        svc,
        Mode.FIKIT,
        horizon_ms=300.0,
        profiles={"A": profiles["resnet50_4_fwd"], "B": profiles["mobilenetv2_32_fb1"]},  # type: ignore[dict-item]
        fikit=FikitConfig(measure_runs=3),
        trace=trace,
    )
    assert r.reasons  # some fills happened
    b_runs = [(sub, st) for c, sub, st, _ in trace if c == "B"]
    for c, sub, st, _ in trace:
        if c != "A":
            continue
        # every B kernel that started while this A kernel waited was submitted before it
        assert all(bsub <= sub + 1e-9 for bsub, bst in b_runs if sub < bst < st)
    alone = svc[0].model.solo_ms
    assert r.mean_jct_ms("A") <= 1.15 * alone


def test_default_sharing_slows_the_high_task_behind_a_training_step() -> None:
    # B's training step keeps the device busy: under time-slicing every A kernel waits for B's
    # slice; FIKIT serves A first.
    svc = [
        Service("A", task_model("mobilenetv2_4_fwd"), 9, Arrivals.closed_loop()),
        Service("B", task_model("mobilenetv2_32_fb1"), 1, Arrivals.closed_loop()),
    ]
    share = run_scenario(svc, Mode.SHARING, horizon_ms=300.0)
    assert share.mean_jct_ms("A") > 3 * svc[0].model.solo_ms
