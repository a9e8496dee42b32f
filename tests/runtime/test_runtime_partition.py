"""Spatial partition: sm_pct → cores (arithmetic in comments), affinity applied in a real child
process, MPS environment and detection, memory measurement."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import psutil
import pytest
import torch

from gshare.runtime.node.partition import (
    MPS_ENV,
    MpsUnavailableWarning,
    apply_cuda_partition,
    cores_for,
    cpu_cores_for,
    cuda_env,
    mps_available,
    pss_mb,
    rss_mb,
    set_cuda_memory_fraction,
    start_mps_daemon,
)


@pytest.mark.parametrize(
    ("sm_pct", "total", "cores"),
    [
        (100, 2, 2),  # 1.0 × 2 = 2
        (75, 2, 2),  # 0.75 × 2 = 1.5 → halves round up → 2
        (74, 2, 1),  # 1.48 → 1
        (50, 2, 1),  # 1.0 → 1
        (25, 2, 1),  # 0.5 → 1 (half up)
        (10, 2, 1),  # 0.2 → 0 → at least one core
        (0.1, 64, 1),  # 0.064 → 0 → at least one core
        (30, 8, 2),  # 2.4 → 2
        (33, 8, 3),  # 2.64 → 3
        (12.5, 8, 1),  # 1.0 → 1
        (100, 1, 1),
    ],
)
def test_cores_for(sm_pct: float, total: int, cores: int) -> None:
    assert cores_for(sm_pct, total) == cores


@pytest.mark.parametrize("bad", [0, -5, 100.5, float("nan"), float("inf")])
def test_bad_sm_pct(bad: float) -> None:
    with pytest.raises(ValueError, match=r"sm_pct: must be a number in \(0, 100\]"):
        cores_for(bad, 4)
    with pytest.raises(ValueError, match="sm_pct"):
        cuda_env(bad)


def test_core_choice_follows_the_sm_offset() -> None:
    cpus = [0, 1, 2, 3, 4, 5, 6, 7]
    assert cpu_cores_for(25, available=cpus) == [0, 1]  # 2 cores from the bottom band
    assert cpu_cores_for(25, available=cpus, sm_offset_pct=50) == [4, 5]  # 50 % → core 4
    assert cpu_cores_for(25, available=cpus, sm_offset_pct=90) == [6, 7]  # clipped to the top
    assert cpu_cores_for(50, 4, available=cpus) == [0, 1]  # partition of the first 4 only
    assert cpu_cores_for(100, available=[3, 1]) == [1, 3]
    assert cpu_cores_for(50, available=[0, 1], sm_offset_pct=50) == [1]  # 2 cores: the 2nd
    with pytest.raises(ValueError, match="sm_offset_pct"):
        cpu_cores_for(50, available=cpus, sm_offset_pct=120)


def test_affinity_and_threads_applied_in_a_child_process() -> None:
    # One child applies several partitions in turn (affinity may widen again within the
    # parent's mask) and reports what the OS and torch then say.
    code = textwrap.dedent("""
        import json, os, torch
        from gshare.runtime.node.partition import apply_cpu_partition
        allowed = sorted(os.sched_getaffinity(0))
        out = []
        for pct, off in [(100, 0), (50, 0), (50, 50), (1, 0)]:
            os.sched_setaffinity(0, allowed)
            cores = apply_cpu_partition(pct, sm_offset_pct=off)
            out.append({"pct": pct, "off": off, "cores": cores,
                        "affinity": sorted(os.sched_getaffinity(0)),
                        "threads": torch.get_num_threads(),
                        "omp": os.environ["OMP_NUM_THREADS"]})
        print(json.dumps({"allowed": allowed, "runs": out}))
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    allowed = report["allowed"]
    n = len(allowed)
    for run in report["runs"]:
        expect = cpu_cores_for(run["pct"], available=allowed, sm_offset_pct=run["off"])
        assert run["cores"] == run["affinity"] == expect
        assert run["threads"] == len(expect) == int(run["omp"]) >= 1
    assert report["runs"][0]["affinity"] == allowed  # 100 %: every core
    assert len(report["runs"][3]["affinity"]) == 1  # 1 %: still one core
    if n >= 2:  # 50 % of the cores, the two halves disjoint
        low, high = report["runs"][1]["affinity"], report["runs"][2]["affinity"]
        assert len(low) == len(high) == cores_for(50, n) and not set(low) & set(high)
    assert sorted(os.sched_getaffinity(0)) == allowed  # the parent is untouched


def test_cuda_env_formats_the_mps_percentage() -> None:
    assert cuda_env(25) == {MPS_ENV: "25"}
    assert cuda_env(100.0) == {MPS_ENV: "100"}
    assert cuda_env(33.3333) == {MPS_ENV: "33.33"}
    assert cuda_env(12.5, pipe_dir="/run/mps") == {
        MPS_ENV: "12.5",
        "CUDA_MPS_PIPE_DIRECTORY": "/run/mps",
    }


def test_apply_cuda_partition_sets_the_environment_before_cuda_exists() -> None:
    code = textwrap.dedent("""
        import os
        from gshare.runtime.node.partition import apply_cuda_partition
        apply_cuda_partition(40)
        print(os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"])
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "40"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_apply_cuda_partition_refuses_after_the_context_exists() -> None:
    torch.zeros(1, device="cuda")
    with pytest.raises(RuntimeError, match="before the CUDA context exists"):
        apply_cuda_partition(40)
    assert set_cuda_memory_fraction(0.5) is True


def test_mps_detection_is_a_bool() -> None:
    assert isinstance(mps_available(), bool)


@pytest.mark.skipif(
    shutil.which("nvidia-cuda-mps-control") is not None, reason="MPS is installed here"
)
def test_start_mps_daemon_warns_clearly_without_mps() -> None:
    with pytest.warns(MpsUnavailableWarning, match="sm_pct is not enforced on the GPU"):
        assert start_mps_daemon() is False


def test_memory_fraction() -> None:
    for bad in (0, 1.5, -0.1):
        with pytest.raises(ValueError, match=r"fraction: must be a number in \(0, 1\]"):
            set_cuda_memory_fraction(bad)
    if not torch.cuda.is_available():
        assert set_cuda_memory_fraction(0.5) is False


def test_rss_and_pss_of_this_and_a_child_process() -> None:
    me = rss_mb()
    assert me > 10 and pss_mb() > 0
    assert rss_mb(os.getpid()) == pytest.approx(me, rel=0.5)
    # A child holding 64 MiB more than a bare interpreter shows it in its RSS.
    code = "import sys; b = bytearray(64 << 20); print('ready', flush=True); sys.stdin.read()"
    p = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        assert rss_mb(p.pid) >= 64
        assert pss_mb(p.pid) >= 60
    finally:
        p.communicate(timeout=30)
    with pytest.raises(psutil.NoSuchProcess):
        rss_mb(p.pid)
