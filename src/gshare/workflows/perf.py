"""Performance model of ESG's functions: execution time and cost of a ``(batch, vcpus, vgpus)``.

ESG's paper (001) reports only one number per function: the execution time in the minimum
configuration (Table 3: batch 1, 1 vCPU, 1 vGPU of an A100). Its emulator used measured
profiles of every configuration, which are not published. This module derives the missing
dimensions from data we have — the shipped V100 table (``ProfileTable.shipped_v100()``) — and
normalises them so that the minimum configuration reproduces Table 3 exactly.

NOTE (model; every constant below is a ``PerfParams`` field, so an experiment can change it)

    exec_ms(b, c, g) = cpu_ms(b, c) + gpu_ms(b, g)          (pre/post-processing, then the DNN)
    cpu_ms(b, c)     = T3 * (1 - f_gpu) * b * ((1 - p) + p / c)
    gpu_ms(b, g)     = T3 * f_gpu * R(b, g)

* ``T3`` — Table 3's time; ``f_gpu`` (default 0.5) — the share of it spent in the DNN on one
  vGPU. The paper does not split the time; 0.5 is an assumption. (The V100 table's absolute
  1/7-SM latency of the proxy models is 5-15 % of Table 3 for 224x224 inputs, but ESG's
  functions run at their own, larger resolutions, so the absolute value is not transferable;
  only the *shape* is taken from the table.)
* CPU part — Amdahl's law: a fraction ``p`` (default 0.9) of the per-request CPU work (image
  decode, resize, tensor conversion, post-processing) parallelises over the task's vCPUs, the
  rest is serial; the work grows linearly with the batch (every image is decoded).
* GPU part, ``R(1, 1) = 1`` — from the proxy model's V100 latencies ``T(sm_pct, batch)`` at
  quota 100 %:

  - ``GpuScaling.DATA_PARALLEL`` (default; ESG §3.2 task model: "if the function is given
    multiple vGPUs, it ... launch[es] multiple GPU kernels with each processing one portion of
    the batch on one vGPU"): every vGPU is a 1/7 slice and processes ``ceil(b / g)`` jobs, so
    ``R(b, g) = B(ceil(b / g))`` with the batch ratio ``B(n) = T(100/7, n) / T(100/7, 1)``.
    Consequence: extra vGPUs beyond the batch size do not help.
  - ``GpuScaling.SM_SHARE`` (a task with ``g`` vGPUs gets ``g/7`` of the SMs as one device):
    ``R(b, g) = T(100 g / 7, b) / T(100/7, 1)``.

  The V100 measurements are noisy and not always monotone, so ratios are made monotone where
  physics says they must be: ``B`` is the running maximum over batches (a bigger batch is never
  faster), capped at ``n`` (a batch is never slower than running its jobs one by one);
  SM_SHARE's ``R`` is ``min over g' <= g of max over b' <= b`` of the raw ratio (never slower
  with more slices, never faster with a bigger batch).

Resulting invariants (tested): ``exec_ms(MIN_CONFIG) == T3``; ``exec_ms`` is non-decreasing in
the batch and non-increasing in vCPUs and in vGPUs.

Proxy models (torchvision models of the shipped table; the shape of the GPU scaling is taken
from them):

==================  ===================  ==================  =======================================
function            paper model          proxy               why
==================  ===================  ==================  =======================================
super_resolution    SRGAN                resnet18            small residual CNN (16 res-blocks)
deblur              DeblurGAN            resnet34            ResNet-style generator, deeper than SR
segmentation        deeplabv3_resnet50   wide_resnet50_2     ResNet-50 body with heavier layers, as
                                                             DeepLabV3's dilated ResNet-50
classification      ResNet50             resnet50            the same model
background_removal  U2Net (44 M params)  resnet101 (44.5 M)  deep CNN of the same parameter count
depth_recognition   MiDaS                resnext101_32x8d    MiDaS v2's encoder is ResNeXt-101 32x8d
==================  ===================  ==================  =======================================

Cost per request: ``gshare.workflows.config.cost_per_request_usd`` (price of the task's
resources for its execution time, divided by the batch).

Noise (§4: "the emulations add Gaussian noises to the performance"): ``sample_exec_ms`` draws
``mean * max(floor, 1 + sigma * N(0, 1))`` with ``sigma = noise_sigma_frac`` (default 0.05,
relative) from a caller-supplied ``numpy.random.Generator``; the floor (default 0.1) keeps
times positive. Policies never call it — they plan with the mean; the simulator draws.

Who calls it: the simulator (task durations), ``plan_remaining``'s callers (``options`` builds
ESG's ``ConfigLists``), the experiments. The model is immutable after construction; lookups
are pure and cached.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from types import MappingProxyType
from typing import Final, Protocol

import numpy as np

from gshare.profiles import ProfileTable
from gshare.workflows.config import (
    MS_PER_HOUR,
    VGPUS_PER_GPU,
    ConfigGrid,
    ConfigOption,
    FunctionConfig,
    cost_per_request_usd,
)
from gshare.workflows.functions import FUNCTIONS, FunctionInfo

PROXY_MODELS: Final = MappingProxyType(
    {
        "super_resolution": "resnet18",
        "deblur": "resnet34",
        "segmentation": "wide_resnet50_2",
        "classification": "resnet50",
        "background_removal": "resnet101",
        "depth_recognition": "resnext101_32x8d",
    }
)
"""Function -> torchvision model of the shipped V100 table whose scaling it borrows."""


class PerfError(LookupError):
    """An unknown function, a function without a proxy model, or a bad parameter."""


class GpuScaling(StrEnum):
    """How a task's vGPUs speed up its DNN part (see the module doc)."""

    DATA_PARALLEL = "data_parallel"
    SM_SHARE = "sm_share"


@dataclass(frozen=True, slots=True)
class PerfParams:
    """The assumptions of the model (module doc). Invariants (checked): ``0 <= gpu_fraction <=
    1``, ``0 <= cpu_parallel_fraction <= 1``, ``noise_sigma_frac >= 0``,
    ``0 < noise_floor_frac <= 1``."""

    gpu_fraction: float = 0.5
    """Share of Table 3's time spent in the DNN (GPU) in the minimum configuration."""
    cpu_parallel_fraction: float = 0.9
    """Amdahl's parallel fraction of the CPU part."""
    gpu_scaling: GpuScaling = GpuScaling.DATA_PARALLEL
    noise_sigma_frac: float = 0.05
    """Default relative standard deviation of ``sample_exec_ms``."""
    noise_floor_frac: float = 0.1
    """Sampled times are at least this fraction of the mean."""

    def __post_init__(self) -> None:
        for name in ("gpu_fraction", "cpu_parallel_fraction"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise PerfError(f"{name} must be in [0, 1], got {v}")
        if self.noise_sigma_frac < 0:
            raise PerfError(f"noise_sigma_frac must be >= 0, got {self.noise_sigma_frac}")
        if not 0.0 < self.noise_floor_frac <= 1.0:
            raise PerfError(f"noise_floor_frac must be in (0, 1], got {self.noise_floor_frac}")


_SLICE_SM_PCT: Final[float] = 100.0 / VGPUS_PER_GPU


class WorkflowPerf(Protocol):
    """What the workflow simulator and the schedulers read of a performance model: ESG's
    ``PerfModel`` (vCPUs x MIG slices) or gshare's ``shares.SharePerf`` (quota x SM partition)."""

    @property
    def params(self) -> PerfParams: ...

    @property
    def functions(self) -> Mapping[str, FunctionInfo]: ...

    def exec_ms(self, function: str, config: FunctionConfig) -> float: ...

    def options(
        self, function: str, grid: ConfigGrid | None = None
    ) -> tuple[ConfigOption, ...]: ...

    def task_cost_usd(self, function: str, config: FunctionConfig, billed_ms: float) -> float: ...

    def sample_exec_ms(
        self,
        function: str,
        config: FunctionConfig,
        rng: np.random.Generator,
        sigma_frac: float | None = None,
    ) -> float: ...


class NoisyTimes:
    """``sample_exec_ms`` for a model with ``exec_ms`` and ``params`` (``PerfModel``,
    ``shares.SharePerf``): ESG §4's Gaussian noise around the mean time."""

    params: PerfParams

    def exec_ms(self, function: str, config: FunctionConfig) -> float:
        raise NotImplementedError

    def sample_exec_ms(
        self,
        function: str,
        config: FunctionConfig,
        rng: np.random.Generator,
        sigma_frac: float | None = None,
    ) -> float:
        """One noisy execution time: ``mean * max(floor, 1 + sigma * N(0, 1))``. Draws exactly
        one standard normal from ``rng`` (so a seeded run is reproducible)."""
        return noisy(
            self.exec_ms(function, config),
            rng,
            self.params.noise_sigma_frac if sigma_frac is None else sigma_frac,
            self.params.noise_floor_frac,
        )


class PerfModel(NoisyTimes):
    """Mean execution time, cost and noisy samples of ``(function, FunctionConfig)``.

    ``functions`` default to ESG's catalogue, ``table`` to the shipped V100 table, ``proxies``
    to ``PROXY_MODELS``; ``gpu_fraction`` may override ``params.gpu_fraction`` per function.
    """

    def __init__(
        self,
        functions: Mapping[str, FunctionInfo] = FUNCTIONS,
        *,
        table: ProfileTable | None = None,
        proxies: Mapping[str, str] = PROXY_MODELS,
        params: PerfParams | None = None,
        gpu_fraction: Mapping[str, float] | None = None,
    ) -> None:
        self.params = params if params is not None else PerfParams()
        self.functions = MappingProxyType(dict(functions))
        self._table = table if table is not None else ProfileTable.shipped_v100()
        self._proxies = dict(proxies)
        for f in self.functions:
            if f not in self._proxies:
                raise PerfError(f"function {f!r} has no proxy model (proxies: {sorted(proxies)})")
            if not self._table.has_model(self._proxies[f]):
                raise PerfError(
                    f"proxy model {self._proxies[f]!r} of {f!r} is not in the profile table"
                )
        self._gpu_fraction = {f: self.params.gpu_fraction for f in self.functions}
        for f, v in (gpu_fraction or {}).items():
            self._info(f)
            if not 0.0 <= v <= 1.0:
                raise PerfError(f"gpu_fraction[{f!r}] must be in [0, 1], got {v}")
            self._gpu_fraction[f] = v
        self._raw_cache: dict[tuple[str, int, int], float] = {}
        self._batch_cache: dict[tuple[str, int], float] = {}
        self._ratio_cache: dict[tuple[str, int, int], float] = {}
        self._options_cache: dict[tuple[str, ConfigGrid], tuple[ConfigOption, ...]] = {}

    @classmethod
    def default(cls) -> PerfModel:
        """The model with default parameters over the shipped table (built once per process)."""
        return _default_model()

    # -- mean time and cost -------------------------------------------------------------------

    def proxy_of(self, function: str) -> str:
        self._info(function)
        return self._proxies[function]

    def cpu_ms(self, function: str, config: FunctionConfig) -> float:
        """CPU part of one task (Amdahl over the task's vCPUs, linear in the batch)."""
        info = self._info(function)
        p = self.params.cpu_parallel_fraction
        base = info.exec_ms_at_min * (1.0 - self._gpu_fraction[function])
        return base * config.batch * ((1.0 - p) + p / config.vcpus)

    def gpu_ms(self, function: str, config: FunctionConfig) -> float:
        """DNN part of one task: ``T3 * f_gpu * R(batch, vgpus)``."""
        info = self._info(function)
        return (
            info.exec_ms_at_min
            * self._gpu_fraction[function]
            * self.gpu_ratio(function, config.batch, config.vgpus)
        )

    def exec_ms(self, function: str, config: FunctionConfig) -> float:
        """Mean execution time of one task (the whole batch), ms."""
        return self.cpu_ms(function, config) + self.gpu_ms(function, config)

    def cost_usd(self, function: str, config: FunctionConfig) -> float:
        """Mean cost per request of one task, USD (``cost_per_request_usd``)."""
        return cost_per_request_usd(config, self.exec_ms(function, config))

    def task_cost_usd(self, function: str, config: FunctionConfig, billed_ms: float) -> float:
        """Cost of one whole task of ``config`` billed for ``billed_ms`` (the simulator splits
        it over the task's jobs): ``config.usd_per_hour * billed_ms / 3.6e6``."""
        del function
        return config.usd_per_hour * billed_ms / MS_PER_HOUR

    def option(self, function: str, config: FunctionConfig) -> ConfigOption:
        return ConfigOption(config, self.exec_ms(function, config), self.cost_usd(function, config))

    def options(self, function: str, grid: ConfigGrid | None = None) -> tuple[ConfigOption, ...]:
        """ESG's ``ConfigLists[function]``: every configuration of ``grid`` (default
        ``ConfigGrid()``) with its time and cost, sorted by increasing time (then cost, then
        config). Cached per (function, grid)."""
        grid = grid if grid is not None else ConfigGrid()
        key = (function, grid)
        hit = self._options_cache.get(key)
        if hit is None:
            opts = [self.option(function, c) for c in grid.configs()]
            opts.sort(key=lambda o: (o.time_ms, o.cost_usd, o.config))
            hit = self._options_cache[key] = tuple(opts)
        return hit

    # -- GPU ratio ----------------------------------------------------------------------------

    def gpu_ratio(self, function: str, batch: int, vgpus: int) -> float:
        """``R(batch, vgpus)``: DNN time relative to batch 1 on one vGPU (module doc)."""
        if batch < 1 or vgpus < 1:
            raise PerfError(f"batch and vgpus must be >= 1, got {batch}, {vgpus}")
        if self.params.gpu_scaling is GpuScaling.DATA_PARALLEL:
            return self._batch_ratio(function, math.ceil(batch / vgpus))
        key = (function, batch, vgpus)
        hit = self._ratio_cache.get(key)
        if hit is None:
            hit = min(
                max(self._raw(function, b, g) for b in range(1, batch + 1))
                for g in range(1, min(vgpus, VGPUS_PER_GPU) + 1)
            )
            self._ratio_cache[key] = hit
        return hit

    def _batch_ratio(self, function: str, n: int) -> float:
        key = (function, n)
        hit = self._batch_cache.get(key)
        if hit is None:
            running_max = max(self._raw(function, b, 1) for b in range(1, n + 1))
            hit = self._batch_cache[key] = min(float(n), running_max)
        return hit

    def _raw(self, function: str, batch: int, vgpus: int) -> float:
        """Table latency at (sm = 100 g / 7, batch) over the latency at (100/7, 1)."""
        key = (function, batch, vgpus)
        hit = self._raw_cache.get(key)
        if hit is None:
            model = self.proxy_of(function)
            base = self._table.latency_ms(model, _SLICE_SM_PCT, 100.0, 1)
            sm = _SLICE_SM_PCT * min(vgpus, VGPUS_PER_GPU)
            hit = self._raw_cache[key] = self._table.latency_ms(model, sm, 100.0, batch) / base
        return hit

    # -- internals ----------------------------------------------------------------------------

    def _info(self, function: str) -> FunctionInfo:
        try:
            return self.functions[function]
        except KeyError:
            raise PerfError(
                f"unknown function {function!r} (known: {', '.join(self.functions)})"
            ) from None


def noisy(
    mean_ms: float, rng: np.random.Generator, sigma_frac: float, floor_frac: float = 0.1
) -> float:
    """``mean_ms * max(floor_frac, 1 + sigma_frac * N(0, 1))``; one draw from ``rng``."""
    if sigma_frac < 0:
        raise PerfError(f"sigma_frac must be >= 0, got {sigma_frac}")
    z = float(rng.standard_normal())
    return mean_ms * max(floor_frac, 1.0 + sigma_frac * z)


@lru_cache(maxsize=1)
def _default_model() -> PerfModel:
    return PerfModel()
