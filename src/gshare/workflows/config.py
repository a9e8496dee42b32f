"""Function configurations ``(batch, vcpus, vgpus)``, the configuration grid and ESG's prices.

ESG (§3.2) gives each invocation of a serverless function a configuration of three
integers: the batch size (jobs processed by one task), the number of vCPUs and the number of
vGPUs (MIG slices; an A100 is cut into 7). Prices follow §4.1: $0.034 per vCPU-hour and $0.67
per vGPU-hour.

Cost model (per request). A task holds ``vcpus`` vCPUs and ``vgpus`` vGPUs for its execution
time ``exec_ms`` and serves ``batch`` requests, so

    cost_per_request_usd = (vcpus * 0.034 + vgpus * 0.67) [$/h] * exec_ms / 3_600_000 / batch

which is the "per-job resource cost" of the paths in ESG's Figure 3. Idle keep-alive time of a
warm container is not charged here (the simulator accounts for it if an experiment wants it).

This module is plain data: no I/O, importable from ``gshare.policy`` (``ConfigOption`` is the
input of the ESG search).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

VCPU_USD_PER_HOUR: Final[float] = 0.034
"""Price of one vCPU for one hour (ESG §4.1, after AWS EC2 / INFless)."""
VGPU_USD_PER_HOUR: Final[float] = 0.67
"""Price of one vGPU (1/7 of an A100) for one hour (ESG §4.1)."""
MS_PER_HOUR: Final[float] = 3_600_000.0

VGPUS_PER_GPU: Final[int] = 7
"""MIG slices of one A100 (ESG §3.2: "partitioned into the maximum number of MIG instances")."""
NODE_VCPUS: Final[int] = 16
"""vCPUs of one invoker node in ESG's evaluation cluster (§4)."""
NODE_VGPUS: Final[int] = 7
"""vGPUs of one invoker node (one A100 in 7 slices, §4)."""
CLUSTER_NODES: Final[int] = 16
"""Invoker nodes of ESG's evaluation cluster (§4)."""


class ConfigError(ValueError):
    """A configuration or grid with an out-of-range field; the message names the field."""


@dataclass(frozen=True, slots=True, order=True)
class FunctionConfig:
    """One configuration of one function invocation (a *task*).

    Invariants (checked): ``batch >= 1``, ``1 <= vcpus``, ``1 <= vgpus``. The node limits
    (16 vCPUs, 7 vGPUs) are limits of the grid and of the invokers, not of the type.
    """

    batch: int
    """Jobs (requests) processed together by one task."""
    vcpus: int
    """vCPUs held by the task while it runs."""
    vgpus: int
    """vGPUs (MIG slices) held by the task while it runs."""

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise ConfigError(f"batch must be >= 1, got {self.batch}")
        if self.vcpus < 1:
            raise ConfigError(f"vcpus must be >= 1, got {self.vcpus}")
        if self.vgpus < 1:
            raise ConfigError(f"vgpus must be >= 1, got {self.vgpus}")

    def __str__(self) -> str:
        return f"(b={self.batch}, cpu={self.vcpus}, gpu={self.vgpus})"

    @property
    def usd_per_hour(self) -> float:
        """Price of the resources the task holds, per hour."""
        return self.vcpus * VCPU_USD_PER_HOUR + self.vgpus * VGPU_USD_PER_HOUR


MIN_CONFIG: Final[FunctionConfig] = FunctionConfig(batch=1, vcpus=1, vgpus=1)
"""ESG's minimum configuration (Table 3's execution times are measured in it; the recheck list
falls back to it)."""


def cost_per_request_usd(config: FunctionConfig, exec_ms: float) -> float:
    """Cost of one request served by a task of ``config`` that runs ``exec_ms``.

    ``config.usd_per_hour * exec_ms / 3.6e6 / config.batch`` (see the module doc).
    """
    if exec_ms < 0:
        raise ConfigError(f"exec_ms must be >= 0, got {exec_ms}")
    return config.usd_per_hour * exec_ms / MS_PER_HOUR / config.batch


@dataclass(frozen=True, slots=True)
class ConfigOption:
    """A configuration with its predicted execution time and cost: one entry of ESG's
    ``ConfigLists[j]`` (Appendix B). Built by ``gshare.workflows.perf.PerfModel.options``
    (or by hand in tests); consumed by ``gshare.policy.workflow.astar``.

    Invariants (checked): ``time_ms >= 0``, ``cost_usd >= 0``.
    """

    config: FunctionConfig
    time_ms: float
    """Predicted execution time of one task (the whole batch), ms."""
    cost_usd: float
    """Predicted cost per request (see ``cost_per_request_usd``), USD."""

    def __post_init__(self) -> None:
        if not self.time_ms >= 0:
            raise ConfigError(f"time_ms must be >= 0, got {self.time_ms}")
        if not self.cost_usd >= 0:
            raise ConfigError(f"cost_usd must be >= 0, got {self.cost_usd}")


@dataclass(frozen=True, slots=True)
class ConfigGrid:
    """The configuration space of one function: the product ``batches x vcpus x vgpus``.

    Default (``ConfigGrid()``): batch in {1, 2, 4, 8} (the batches of the shipped profile table)
    x vcpus 1..16 (one node) x vgpus 1..7 (one A100) = 448 configurations.
    ``ConfigGrid.esg_256()`` is the 256-configuration space of ESG's overhead study (§5.3):
    batch {1, 2, 4, 8} x vcpus 1..16 x vgpus {1, 2, 4, 7}.

    Invariants (checked): every value >= 1, vcpus <= 16 and vgpus <= 7 (one node), no
    duplicates; the tuples are kept sorted.
    """

    batches: tuple[int, ...] = (1, 2, 4, 8)
    vcpus: tuple[int, ...] = tuple(range(1, NODE_VCPUS + 1))
    vgpus: tuple[int, ...] = tuple(range(1, NODE_VGPUS + 1))

    def __post_init__(self) -> None:
        for field, values, hi in (
            ("batches", self.batches, None),
            ("vcpus", self.vcpus, NODE_VCPUS),
            ("vgpus", self.vgpus, NODE_VGPUS),
        ):
            if not values:
                raise ConfigError(f"ConfigGrid.{field} must not be empty")
            if len(set(values)) != len(values):
                raise ConfigError(f"ConfigGrid.{field} has duplicates: {values}")
            bad = [v for v in values if v < 1 or (hi is not None and v > hi)]
            if bad:
                allowed = ">= 1" if hi is None else f"in 1..{hi}"
                raise ConfigError(f"ConfigGrid.{field} values must be {allowed}, got {bad}")
            object.__setattr__(self, field, tuple(sorted(values)))

    @classmethod
    def esg_256(cls) -> ConfigGrid:
        """256 configurations per function, for the overhead experiment (ESG §5.3)."""
        return cls(batches=(1, 2, 4, 8), vcpus=tuple(range(1, 17)), vgpus=(1, 2, 4, 7))

    def configs(self) -> tuple[FunctionConfig, ...]:
        """Every configuration, ordered by (batch, vcpus, vgpus)."""
        return tuple(
            FunctionConfig(b, c, g) for b in self.batches for c in self.vcpus for g in self.vgpus
        )

    def __len__(self) -> int:
        return len(self.batches) * len(self.vcpus) * len(self.vgpus)

    def __contains__(self, config: object) -> bool:
        return (
            isinstance(config, FunctionConfig)
            and config.batch in self.batches
            and config.vcpus in self.vcpus
            and config.vgpus in self.vgpus
        )


def minimum_config(
    options: Sequence[ConfigOption], default: FunctionConfig = MIN_CONFIG
) -> FunctionConfig:
    """A function's minimum configuration, the fallback of ESG and its baselines: ``default``
    when it is one of ``options`` (ESG's grids: ``(1, 1, 1)``), else the batch-1 option holding
    the least resources (a configuration space of another shape, such as gshare's quotas in
    ``gshare.workflows.shares``); ``default`` when there are no options."""
    configs = [o.config for o in options]
    if not configs or default in configs:
        return default
    ones = [c for c in configs if c.batch == 1] or configs
    return min(ones, key=lambda c: (c.vgpus, c.vcpus, c.batch))
