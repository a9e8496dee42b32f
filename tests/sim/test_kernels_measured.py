"""Measured passes: the kernel-level simulator on a launch-order trace from a real GPU (the GPU
kit's kernel-trace.csv) instead of the calibrated V100 profiles."""

from __future__ import annotations

from pathlib import Path

import pytest


def _trace(rows: list[tuple[str, int, str, int, str]]) -> str:
    head = "model,batch,Name,Profile,Memory_footprint,SM_usage,Duration,Gap\n"
    return head + "".join(f"{m},{b},{n},,,,{d},{g}\n" for m, b, n, d, g in rows)


def test_a_measured_pass_is_the_trace_itself_with_gaps_as_host_time() -> None:
    from gshare.sim.kernels.catalogue import CatalogueError, HostMode, measured_task_model

    text = _trace([
        ("resnet50", 1, "conv", 50_000, "1000"),  # batch 1: not this pass
        ("resnet50", 4, "conv", 200_000, "300000"),
        ("mobilenet_v2", 4, "dw", 10_000, "0"),
        ("resnet50", 4, "relu", 20_000, "0"),
        ("resnet50", 4, "gemm", 100_000, ""),
    ])  # fmt: skip
    m = measured_task_model(text, "resnet50_4_fwd")
    assert [k.kernel.name for k in m.kernels] == ["conv", "relu", "gemm"]
    assert [k.duration_ms for k in m.kernels] == [0.2, 0.02, 0.1]
    # the gap after kernel i is the host segment before kernel i + 1 (FIKIT's SYNC model)
    assert m.host_ms == (0.0, 0.3, 0.0)
    assert m.host_mode is HostMode.SYNC
    assert m.solo_ms == pytest.approx(0.62) == pytest.approx(m.target_ms)
    assert measured_task_model(text, "mobilenetv2_4_fwd").device_ms == pytest.approx(0.01)
    with pytest.raises(CatalogueError, match="no resnet101 at batch 4"):
        measured_task_model(text, "resnet101_4_fwd")
    with pytest.raises(CatalogueError, match="only inference"):
        measured_task_model(text, "bert_8_fb1")
    with pytest.raises(CatalogueError, match="trace line 2"):
        measured_task_model(_trace([("resnet50", 4, "conv", 0, "x")]), "resnet50_4_fwd")


def test_the_fikit_experiments_run_their_services_on_a_measured_trace(tmp_path: Path) -> None:
    from gshare.experiments.fikit_common import COMMON_PARAMS, Bench

    path = tmp_path / "kernel-trace.csv"
    path.write_text(_trace([("resnet101", 4, "conv", 500_000, "200000"),
                            ("resnet101", 4, "relu", 30_000, "")]))  # fmt: skip
    bench = Bench({**COMMON_PARAMS, "kernel_trace": str(path)}, seed=0)
    assert bench.model("resnet101_4_fwd").solo_ms == pytest.approx(0.73)
    assert bench.model("bert_8_fb1").kernels  # training passes stay the shipped V100 ones
    with pytest.raises(ValueError, match="kernel_trace: cannot read"):
        Bench({**COMMON_PARAMS, "kernel_trace": str(tmp_path / "no.csv")}, 0).model(
            "resnet50_4_fwd"
        )
