"""policy.priority.kernel_id and .profile: kernel identity and FIKIT's SK / SG statistics.

The statistics are checked against the paper's formulas (FIKIT §3.2) computed directly, and
the worked example of the paper (a kernel ID j at positions 1 and 5 of two runs) by hand.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gshare.policy.priority import (
    DeviceKind,
    KernelId,
    KernelIdError,
    KernelProfile,
    KernelSpan,
    ProfileError,
)

J = KernelId.gpu("conv", (98, 1, 1), (256, 1, 1))
K = KernelId.gpu("relu", (392, 1, 1), (128, 1, 1))


def test_gpu_and_cpu_identities() -> None:
    g = KernelId.gpu("sgemm", [4, 2, 1], (128, 1, 1))
    assert g.device is DeviceKind.GPU and g.grid == (4, 2, 1) and g.input_shapes is None
    c = KernelId.cpu("Conv2d", [[1, 3, 224, 224]])
    assert c.device is DeviceKind.CPU and c.input_shapes == ((1, 3, 224, 224),)
    # the launch configuration is part of the identity; so are the shapes on CPU
    assert g != KernelId.gpu("sgemm", (4, 2, 1), (64, 1, 1))
    assert c != KernelId.cpu("Conv2d", [[2, 3, 224, 224]])
    assert len({g, KernelId.gpu("sgemm", (4, 2, 1), (128, 1, 1))}) == 1  # hashable, by value
    for k in (g, c):
        assert KernelId.from_record(json.loads(json.dumps(k.to_record()))) == k


@pytest.mark.parametrize(
    "build",
    [
        lambda: KernelId.gpu("", (1, 1, 1), (1, 1, 1)),
        lambda: KernelId.gpu("k", (0, 1, 1), (1, 1, 1)),
        lambda: KernelId.gpu("k", (1, 1), (1, 1, 1)),
        lambda: KernelId(DeviceKind.GPU, "k", grid=(1, 1, 1)),
        lambda: KernelId(DeviceKind.CPU, "op", grid=(1, 1, 1), input_shapes=()),
        lambda: KernelId.cpu("op", [[-1]]),
        lambda: KernelId.from_record({"device": "tpu", "name": "x"}),
    ],
)
def test_malformed_identities_are_rejected(build) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(KernelIdError):
        build()


def test_the_papers_worked_example() -> None:
    # Run 1: j at positions 1 and 5 (0-based 0 and 4); run 2: j at 0-based 1 and 4.
    # SK_j = (K11 + K15 + K22 + K25) / 4 and SG_j = (G11 + G15 + G22 + G25) / 4.
    def run(js: set[int], ks: list[float], gs: list[float]) -> list[KernelSpan]:
        spans, t = [], 0.0
        for i, d in enumerate(ks):
            spans.append(KernelSpan(J if i in js else K, t, t + d))
            t += d + (gs[i] if i < len(gs) else 0.0)
        return spans

    p = KernelProfile("svc")
    p.add_run(run({0, 4}, [2, 1, 1, 1, 3, 1], [10, 1, 1, 1, 5]))
    p.add_run(run({1, 4}, [1, 4, 1, 1, 6, 1], [1, 8, 1, 1, 7]))
    # SK_j = (2 + 3 + 4 + 6) / 4 = 3.75; SG_j = (10 + 5 + 8 + 7) / 4 = 7.5
    assert p.sk_ms(J) == pytest.approx(3.75)
    assert p.sg_ms(J) == pytest.approx(7.5)
    s = p.stats(J)
    assert s is not None and (s.count, s.gap_count) == (4, 4)
    # K: 8 launches, durations 1 each: SK 1; its gaps: run 1 after positions 1,2,3 (1,1,1) and
    # none after the last; run 2 after 0,2,3 (1,1,1): 6 gaps of 1 -> SG 1
    assert p.sk_ms(K) == pytest.approx(1.0)
    assert p.sg_ms(K) == pytest.approx(1.0)
    assert p.runs == 2 and len(p) == 2


def test_last_kernel_has_no_gap_and_unknowns_are_none() -> None:
    p = KernelProfile("svc")
    p.add_run([KernelSpan(J, 0.0, 1.0)])
    assert p.sk_ms(J) == 1.0 and p.sg_ms(J) is None  # N kernels, N - 1 gaps
    assert p.sk_ms(K) is None and p.stats(K) is None
    # overlapping kernels (another stream) count as a zero gap, never a negative one
    p.add_run([KernelSpan(K, 0.0, 2.0), KernelSpan(J, 1.0, 3.0)])
    assert p.sg_ms(K) == 0.0


def test_bad_spans_are_rejected() -> None:
    with pytest.raises(ProfileError):
        KernelProfile("s").add_run([KernelSpan(J, 2.0, 1.0)])


SPANS = st.lists(
    st.lists(
        st.tuples(st.sampled_from([J, K]), st.floats(0.001, 2.0), st.floats(0.0, 3.0)),
        min_size=1,
        max_size=15,
    ),
    min_size=1,
    max_size=6,
)


@given(runs=SPANS)
def test_incremental_statistics_equal_the_formulas(
    runs: list[list[tuple[KernelId, float, float]]],
) -> None:
    p = KernelProfile("svc")
    for run in runs:
        spans, t = [], 0.0
        for k, d, g in run:
            spans.append(KernelSpan(k, t, t + d))
            t += d + g
        p.add_run(spans)
    # the paper's formulas: SK_j = sum K delta / sum delta over all positions; SG_j the same
    # over positions 1..N_t - 1
    for j in (J, K):
        ks = [d for run in runs for (k, d, _) in run if k == j]
        gs = [g for run in runs for (k, _, g) in run[:-1] if k == j]
        assert p.sk_ms(j) == (pytest.approx(sum(ks) / len(ks)) if ks else None)
        assert p.sg_ms(j) == (pytest.approx(sum(gs) / len(gs)) if gs else None)
    restored = KernelProfile.from_records(json.loads(json.dumps(p.to_records())))
    assert restored.runs == p.runs
    for j in (J, K):
        assert restored.sk_ms(j) == p.sk_ms(j) and restored.sg_ms(j) == p.sg_ms(j)


def test_bad_records_are_rejected() -> None:
    with pytest.raises(ProfileError):
        KernelProfile.from_records({"task_key": "s", "runs": 1})
    with pytest.raises(ProfileError):
        KernelProfile.from_records(
            {
                "task_key": "s",
                "runs": 1,
                "kernels": [
                    {
                        "kernel": J.to_record(),
                        "count": 1,
                        "total_ms": 1.0,
                        "gap_count": 2,
                        "gap_total_ms": 1.0,
                    }
                ],
            }
        )
