"""Workflow data: specs (DAGs of function stages with an SLO), ESG's function and application
catalogue, configurations and prices, and the performance model. Data only — the decisions
are in ``gshare.policy.workflow``.

The names below are loaded lazily (PEP 562): ``gshare.policy`` imports
``gshare.workflows.config``, and importing this package must not drag in pydantic (whose
models import ``socket`` and ``threading``) or networkx.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gshare.workflows.catalogue import (
        APPLICATION_CHAINS,
        SLO_FACTORS,
        application,
        applications,
        min_config_latency_ms,
    )
    from gshare.workflows.config import (
        MIN_CONFIG,
        ConfigGrid,
        ConfigOption,
        FunctionConfig,
        cost_per_request_usd,
    )
    from gshare.workflows.functions import FUNCTIONS, FunctionInfo
    from gshare.workflows.perf import GpuScaling, PerfModel, PerfParams
    from gshare.workflows.spec import (
        StageSpec,
        WorkflowSpec,
        WorkflowSpecError,
        load_workflow,
        parse_workflow,
    )

_WHERE = {
    "APPLICATION_CHAINS": "catalogue",
    "FUNCTIONS": "functions",
    "SLO_FACTORS": "catalogue",
    "FunctionInfo": "functions",
    "application": "catalogue",
    "applications": "catalogue",
    "min_config_latency_ms": "catalogue",
    "MIN_CONFIG": "config",
    "ConfigGrid": "config",
    "ConfigOption": "config",
    "FunctionConfig": "config",
    "cost_per_request_usd": "config",
    "GpuScaling": "perf",
    "PerfModel": "perf",
    "PerfParams": "perf",
    "StageSpec": "spec",
    "WorkflowSpec": "spec",
    "WorkflowSpecError": "spec",
    "load_workflow": "spec",
    "parse_workflow": "spec",
}

__all__ = [
    "APPLICATION_CHAINS",
    "FUNCTIONS",
    "MIN_CONFIG",
    "SLO_FACTORS",
    "ConfigGrid",
    "ConfigOption",
    "FunctionConfig",
    "FunctionInfo",
    "GpuScaling",
    "PerfModel",
    "PerfParams",
    "StageSpec",
    "WorkflowSpec",
    "WorkflowSpecError",
    "application",
    "applications",
    "cost_per_request_usd",
    "load_workflow",
    "min_config_latency_ms",
    "parse_workflow",
]


def __getattr__(name: str) -> Any:
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module 'gshare.workflows' has no attribute {name!r}")
    return getattr(importlib.import_module(f"gshare.workflows.{mod}"), name)
