"""The workflow performance model: normalisation to Table 3, monotonicity, cost, noise."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gshare.profiles import ProfileTable
from gshare.workflows.catalogue import FUNCTIONS
from gshare.workflows.config import (
    MIN_CONFIG,
    ConfigError,
    ConfigGrid,
    FunctionConfig,
    cost_per_request_usd,
)
from gshare.workflows.perf import GpuScaling, PerfError, PerfModel, PerfParams, noisy

SLICE = 100 / 7


@pytest.fixture(scope="module")
def dp() -> PerfModel:
    return PerfModel.default()


@pytest.fixture(scope="module")
def sm() -> PerfModel:
    return PerfModel(params=PerfParams(gpu_scaling=GpuScaling.SM_SHARE))


@pytest.mark.parametrize("fn", list(FUNCTIONS))
@pytest.mark.parametrize("scaling", list(GpuScaling))
def test_min_config_reproduces_table3(fn: str, scaling: GpuScaling) -> None:
    m = PerfModel(params=PerfParams(gpu_scaling=scaling))
    assert m.exec_ms(fn, MIN_CONFIG) == pytest.approx(FUNCTIONS[fn].exec_ms_at_min, rel=1e-12)
    # default split: half CPU, half GPU (PerfParams.gpu_fraction = 0.5)
    assert m.cpu_ms(fn, MIN_CONFIG) == pytest.approx(FUNCTIONS[fn].exec_ms_at_min / 2)


@pytest.mark.parametrize("model_name", ["dp", "sm"])
def test_monotone_over_the_default_grid(model_name: str, request: pytest.FixtureRequest) -> None:
    m: PerfModel = request.getfixturevalue(model_name)
    grid = ConfigGrid()
    for fn in FUNCTIONS:
        t = {c: m.exec_ms(fn, c) for c in grid.configs()}
        for c, v in t.items():
            for nxt, expect in (
                (FunctionConfig(c.batch * 2, c.vcpus, c.vgpus), "up"),
                (FunctionConfig(c.batch, c.vcpus + 1, c.vgpus), "down"),
                (FunctionConfig(c.batch, c.vcpus, c.vgpus + 1), "down"),
            ):
                if nxt not in t:
                    continue
                if expect == "up":
                    assert t[nxt] >= v, (fn, c, nxt)
                else:
                    assert t[nxt] <= v, (fn, c, nxt)


def test_batch_ratio_comes_from_the_proxy_models_table_rows(dp: PerfModel) -> None:
    table = ProfileTable.shipped_v100()
    # classification -> resnet50; ratio of batch 8 to batch 1 at a 1/7 slice (SM 14.29 %)
    raw = table.latency_ms("resnet50", SLICE, 100, 8) / table.latency_ms("resnet50", SLICE, 100, 1)
    assert dp.proxy_of("classification") == "resnet50"
    assert dp.gpu_ratio("classification", 8, 1) == pytest.approx(raw)
    # GPU part = 147 ms * 0.5 * ratio
    assert dp.gpu_ms("classification", FunctionConfig(8, 1, 1)) == pytest.approx(73.5 * raw)


def test_data_parallel_vgpus_split_the_batch(dp: PerfModel) -> None:
    # 8 jobs on 4 slices: each slice runs ceil(8/4) = 2 jobs -> ratio B(2)
    assert dp.gpu_ratio("segmentation", 8, 4) == dp.gpu_ratio("segmentation", 2, 1)
    # 3 jobs on 2 slices: ceil(3/2) = 2 jobs per slice
    assert dp.gpu_ratio("segmentation", 3, 2) == dp.gpu_ratio("segmentation", 2, 1)
    # more slices than jobs do not help
    assert dp.gpu_ratio("segmentation", 2, 7) == dp.gpu_ratio("segmentation", 1, 1) == 1.0


def test_sm_share_uses_k_sevenths_of_the_sms(sm: PerfModel) -> None:
    table = ProfileTable.shipped_v100()
    base = table.latency_ms("wide_resnet50_2", SLICE, 100, 1)
    raw = [table.latency_ms("wide_resnet50_2", SLICE * k, 100, 8) / base for k in (1, 2, 3)]
    # monotone envelope: max over batches <= 8 at each k, then min over k' <= 3
    assert sm.gpu_ratio("segmentation", 8, 3) <= min(raw) + 1e-12
    assert sm.gpu_ratio("segmentation", 8, 3) < sm.gpu_ratio("segmentation", 8, 1)


def test_cpu_part_is_amdahl(dp: PerfModel) -> None:
    # deblur: CPU part at the minimum is 319 * 0.5 = 159.5 ms; with p = 0.9 and 4 vCPUs:
    # 159.5 * (0.1 + 0.9 / 4) = 159.5 * 0.325 = 51.8375 ms; batch 2 doubles it
    assert dp.cpu_ms("deblur", FunctionConfig(1, 4, 1)) == pytest.approx(51.8375)
    assert dp.cpu_ms("deblur", FunctionConfig(2, 4, 1)) == pytest.approx(103.675)


def test_cost_per_request() -> None:
    # (4 * 0.034 + 2 * 0.67) $/h = 1.476 $/h; 360 ms -> 1.476 * 360 / 3.6e6 = 1.476e-4 $ per
    # task; batch 4 -> 3.69e-5 $ per request
    assert cost_per_request_usd(FunctionConfig(4, 4, 2), 360.0) == pytest.approx(3.69e-5)


def test_model_cost_matches_formula(dp: PerfModel) -> None:
    c = FunctionConfig(2, 3, 1)
    t = dp.exec_ms("classification", c)
    assert dp.cost_usd("classification", c) == pytest.approx((3 * 0.034 + 0.67) * t / 3.6e6 / 2)


def test_options_sorted_by_time_and_grid_sizes(dp: PerfModel) -> None:
    assert len(ConfigGrid()) == 448 and len(ConfigGrid().configs()) == 448
    assert len(ConfigGrid.esg_256()) == 256
    opts = dp.options("deblur", ConfigGrid.esg_256())
    assert len(opts) == 256
    times = [o.time_ms for o in opts]
    assert times == sorted(times)
    assert dp.options("deblur", ConfigGrid.esg_256()) is opts  # cached


def test_noise_is_seeded_gaussian_and_floored(dp: PerfModel) -> None:
    c = FunctionConfig(1, 2, 1)
    mean = dp.exec_ms("classification", c)
    a = [dp.sample_exec_ms("classification", c, np.random.default_rng(7)) for _ in range(2)]
    assert a[0] == a[1]  # same seed, same draw
    rng = np.random.default_rng(1)
    draws = np.array([dp.sample_exec_ms("classification", c, rng, 0.1) for _ in range(4000)])
    # sample mean within 4 standard errors (0.1 * mean / sqrt(4000)); sample sd near 10 %
    assert abs(draws.mean() - mean) < 4 * 0.1 * mean / math.sqrt(4000)
    assert draws.std() == pytest.approx(0.1 * mean, rel=0.05)
    assert dp.sample_exec_ms("classification", c, rng, 0.0) == mean
    # a huge sigma never gives a time below the floor (10 % of the mean)
    assert min(noisy(100.0, rng, 5.0) for _ in range(200)) >= 10.0


def test_errors_name_the_problem(dp: PerfModel) -> None:
    with pytest.raises(PerfError, match="unknown function 'yolo'"):
        dp.exec_ms("yolo", MIN_CONFIG)
    with pytest.raises(PerfError, match="gpu_fraction must be in"):
        PerfParams(gpu_fraction=1.5)
    with pytest.raises(PerfError, match="no proxy model"):
        PerfModel(proxies={})
    with pytest.raises(ConfigError, match="vgpus must be >= 1"):
        FunctionConfig(1, 1, 0)
    with pytest.raises(ConfigError, match=r"vgpus values must be in 1..7"):
        ConfigGrid(vgpus=(1, 8))


def test_gpu_fraction_override(dp: PerfModel) -> None:
    m = PerfModel(gpu_fraction={"deblur": 0.2})
    assert m.gpu_ms("deblur", MIN_CONFIG) == pytest.approx(319 * 0.2)
    assert m.exec_ms("deblur", MIN_CONFIG) == pytest.approx(319)
    assert m.gpu_ms("classification", MIN_CONFIG) == dp.gpu_ms("classification", MIN_CONFIG)
