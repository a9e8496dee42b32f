"""gshare's configuration space of a workflow stage: (batch, GPU share), for ESG and its baselines.

ESG (§3.2) searches configurations ``(batch, vCPUs, vGPUs)`` of a serverless
function: a task holds its vCPUs and MIG slices while it runs. gshare shares a device in space
(an SM partition, fixed for an instance's life: an MPS partition or a core set is set when the
process starts) and in time (a quota of every token window, which the token server may change
at any moment). The live configuration space of a function is therefore
``batch x time quota`` at the SM partition its instances run with, and one task holds its quota
of the device while it runs.

The ESG search (``gshare.policy.workflow``) works on any set of ``ConfigOption(config, time,
cost)`` whose configs name the resources an invoker must have free (``InvokerState.fits``); the
two resource fields of ``FunctionConfig`` are read as *host units* and *accelerator units*.
ESG's cluster: vCPUs and MIG slices (7 per GPU). gshare (this module): one host slot per task
(``vcpus = 1``; an invoker has as many slots as it has instances to run tasks) and the quota in
units of ``1 / QUOTA_UNITS`` of the device's window (``vgpus = quota_pct / 5``; an invoker, a
device, has ``QUOTA_UNITS``). ``share_config`` / ``quota_pct_of`` convert.

Cost: share area x time. A task at SM partition ``s`` and quota ``q`` holds ``s x q`` of a
device for its execution time; priced at ``usd_per_device_hour`` (default: ESG's price of a
whole A100, 7 x $0.67 / h, so that gshare's and ESG's costs are on one scale), per request::

    cost_usd = s/100 * q/100 * exec_ms / 3.6e6 * usd_per_device_hour / batch

Latency: the function's profile table — the live one ``gshare profile`` measured (model name =
function name) or the shipped V100 table (model = the spec's built-in model, when it is in it) —
at (SM %, quota %, batch), interpolated as ``ProfileTable`` documents.

Who calls it: the live workflow scheduler (``gshare.runtime.gateway.esg``) for the options of
its stages, the simulator (``gshare.sim.workflow``, ``SharePerf`` in place of ESG's
``PerfModel``) when it runs a gshare scenario, and ``bench/twin.py``. Plain data: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from gshare.profiles import ProfileError, ProfileTable
from gshare.workflows.config import (
    MS_PER_HOUR,
    VGPU_USD_PER_HOUR,
    VGPUS_PER_GPU,
    ConfigGrid,
    ConfigOption,
    FunctionConfig,
)
from gshare.workflows.functions import FunctionInfo
from gshare.workflows.perf import NoisyTimes, PerfError, PerfParams

QUOTA_UNITS: Final[int] = 20
"""Accelerator units of one device: its token window in steps of 5 %."""
QUOTA_STEP_PCT: Final[float] = 100.0 / QUOTA_UNITS
DEVICE_USD_PER_HOUR: Final[float] = VGPU_USD_PER_HOUR * VGPUS_PER_GPU
"""Price of a whole device for an hour (ESG's A100: 7 slices x $0.67)."""
DEFAULT_QUOTAS_PCT: Final[tuple[float, ...]] = (25.0, 50.0, 75.0, 100.0)
"""Quotas offered when a function names none (``gshare profile``'s default points and 75 %)."""
DEFAULT_BATCHES: Final[tuple[int, ...]] = (1, 2, 4, 8)
DEFAULT_COLD_START_MS: Final[float] = 400.0
"""A live instance's start (the fork launcher, ``bench/cold_start.py``), for the simulator."""


class ShareError(ValueError):
    """A share function or configuration out of range; the message names the field."""


def share_config(batch: int, quota_pct: float) -> FunctionConfig:
    """The ESG config of one gshare task: ``batch`` jobs at ``quota_pct`` % of the window
    (a multiple of 5, in (0, 100])."""
    units = quota_pct / QUOTA_STEP_PCT
    if not 1 <= round(units) <= QUOTA_UNITS or abs(units - round(units)) > 1e-9:
        raise ShareError(
            f"quota_pct must be a multiple of {QUOTA_STEP_PCT:g} in (0, 100], got {quota_pct}"
        )
    return FunctionConfig(batch=batch, vcpus=1, vgpus=round(units))


def quota_pct_of(config: FunctionConfig) -> float:
    """The time quota (%) of a config built by ``share_config``."""
    return config.vgpus * QUOTA_STEP_PCT


@dataclass(frozen=True, slots=True)
class ShareFunction:
    """One function of a gshare workflow, as the share model needs it.

    Invariants (checked): ``0 < sm_pct <= 100``; batches >= 1; quotas multiples of 5 in (0, 100];
    ``cold_start_ms >= 0``; ``input_mb >= 0``."""

    name: str
    profile_model: str
    """Its model's name in the profile table (the function's own name for a live profile)."""
    sm_pct: float
    """The SM partition its instances run with."""
    batches: tuple[int, ...] = DEFAULT_BATCHES
    quotas_pct: tuple[float, ...] = DEFAULT_QUOTAS_PCT
    cold_start_ms: float = DEFAULT_COLD_START_MS
    input_mb: float = 0.0
    """Size of one input, MB (the simulator's transfer time)."""

    def __post_init__(self) -> None:
        if not 0 < self.sm_pct <= 100:
            raise ShareError(f"{self.name}: sm_pct must be in (0, 100], got {self.sm_pct}")
        if not self.batches or min(self.batches) < 1:
            raise ShareError(f"{self.name}: batches must be >= 1, got {self.batches}")
        if not self.quotas_pct:
            raise ShareError(f"{self.name}: quotas_pct must not be empty")
        for q in self.quotas_pct:
            share_config(1, q)
        if self.cold_start_ms < 0 or self.input_mb < 0:
            raise ShareError(f"{self.name}: cold_start_ms and input_mb must be >= 0")

    def configs(self) -> tuple[FunctionConfig, ...]:
        return tuple(
            share_config(b, q)
            for b in sorted(set(self.batches))
            for q in sorted(set(self.quotas_pct))
        )


class SharePerf(NoisyTimes):
    """Mean time, cost and noisy samples of ``(function, share config)`` from a profile table.

    The same surface as ``gshare.workflows.perf.PerfModel`` where the workflow simulator and
    the schedulers read it (``functions``, ``params``, ``exec_ms``, ``cost_usd``, ``options``,
    ``sample_exec_ms`` from ``perf.NoisyTimes``), so either model drives them. ``options``
    ignores ESG's ``ConfigGrid``: the space is each function's ``ShareFunction.configs()``.
    """

    def __init__(
        self,
        functions: Sequence[ShareFunction],
        table: ProfileTable | Mapping[str, ProfileTable],
        *,
        usd_per_device_hour: float = DEVICE_USD_PER_HOUR,
        params: PerfParams | None = None,
        time_scale: Mapping[str, float] | None = None,
    ) -> None:
        self.params = params if params is not None else PerfParams()
        self.usd_per_device_hour = usd_per_device_hour
        self.shares = MappingProxyType({f.name: f for f in functions})
        self._tables = (
            dict(table) if isinstance(table, Mapping) else {f.name: table for f in functions}
        )
        self._scale = dict(time_scale or {})
        """Per function: measured ÷ profiled time (a calibration; 1 when absent)."""
        infos = {}
        for f in functions:
            t = self._tables.get(f.name)
            if t is None or not t.has_model(f.profile_model):
                raise PerfError(f"no profile of {f.name!r} (model {f.profile_model!r})")
            try:
                base = self._latency(f, 1, 100.0)
            except ProfileError as e:
                raise PerfError(f"{f.name}: {e}") from None
            infos[f.name] = FunctionInfo(f.name, f.profile_model, base, f.cold_start_ms, f.input_mb)
        self.functions: Mapping[str, FunctionInfo] = MappingProxyType(infos)
        self._options: dict[str, tuple[ConfigOption, ...]] = {}

    def _share(self, function: str) -> ShareFunction:
        try:
            return self.shares[function]
        except KeyError:
            raise PerfError(
                f"unknown function {function!r} (known: {', '.join(self.shares)})"
            ) from None

    def _latency(self, f: ShareFunction, batch: int, quota_pct: float) -> float:
        lat = self._tables[f.name].latency_ms(f.profile_model, f.sm_pct, quota_pct, batch)
        return lat * self._scale.get(f.name, 1.0)

    def exec_ms(self, function: str, config: FunctionConfig) -> float:
        """Mean time of one task (the whole batch), ms."""
        return self._latency(self._share(function), config.batch, quota_pct_of(config))

    def cost_usd(self, function: str, config: FunctionConfig) -> float:
        """Mean cost per request (module doc)."""
        return self.cost_of(function, config, self.exec_ms(function, config))

    def cost_of(self, function: str, config: FunctionConfig, exec_ms: float) -> float:
        """Cost per request of a task of ``config`` that ran ``exec_ms`` (module doc)."""
        f = self._share(function)
        area = f.sm_pct / 100.0 * quota_pct_of(config) / 100.0
        return area * exec_ms / MS_PER_HOUR * self.usd_per_device_hour / config.batch

    def task_cost_usd(self, function: str, config: FunctionConfig, billed_ms: float) -> float:
        """Cost of one whole task of ``config`` billed for ``billed_ms``: share area x time."""
        return self.cost_of(function, config, billed_ms) * config.batch

    def option(self, function: str, config: FunctionConfig) -> ConfigOption:
        return ConfigOption(config, self.exec_ms(function, config), self.cost_usd(function, config))

    def options(self, function: str, grid: ConfigGrid | None = None) -> tuple[ConfigOption, ...]:
        """Every configuration of the function with its time and cost, sorted by time (then
        cost, then config); ``grid`` is ignored (class doc)."""
        del grid
        hit = self._options.get(function)
        if hit is None:
            opts = [self.option(function, c) for c in self._share(function).configs()]
            opts.sort(key=lambda o: (o.time_ms, o.cost_usd, o.config))
            hit = self._options[function] = tuple(opts)
        return hit


def quotas_of(table: ProfileTable, model: str, batch: int = 1) -> tuple[float, ...]:
    """The measured quotas of ``model`` that are multiples of 5 % (the offered quotas of a
    profiled function)."""
    qs = [
        q
        for q in table.quotas(model, batch)
        if math.isclose(q / QUOTA_STEP_PCT, round(q / QUOTA_STEP_PCT))
    ]
    return tuple(sorted(set(qs))) or DEFAULT_QUOTAS_PCT
