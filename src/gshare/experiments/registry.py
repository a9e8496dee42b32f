"""One registry of named experiments shared by the CLI, tests and benchmarks (docs/DESIGN.md §8.8).

An experiment is a function ``run(params, seed) -> ExperimentResult``. It declares its full and
``--quick`` parameters so that tests run the small version and users the large one.

Who calls it: ``gshare.cli`` (``experiment list|run``), ``make demo`` and the tests.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gshare.experiments.results import ExperimentResult

RunFn = Callable[[Mapping[str, Any], int], ExperimentResult]

# Modules that define experiments; imported on first use of the registry.
EXPERIMENT_MODULES = (
    "gshare.experiments.fast_spatial",
    "gshare.experiments.fast_packing",
    "gshare.experiments.fast_autoscale",
    "gshare.experiments.autoscale_traces",
    "gshare.experiments.token_share",
    "gshare.experiments.token_fidelity",
    "gshare.experiments.packing_scale",
    "gshare.experiments.esg_endtoend",
    "gshare.experiments.esg_overhead",
    "gshare.experiments.esg_ablation",
    "gshare.experiments.esg_trace",
    "gshare.experiments.fikit_pairs",
    "gshare.experiments.fikit_low",
    "gshare.experiments.fikit_overhead",
    "gshare.experiments.bulkx_sizing",
)


class UnknownExperiment(KeyError):
    """No experiment has that name; the message lists the known names."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Experiment:
    """A registered experiment."""

    name: str
    description: str
    """One line: what the experiment reproduces (paper and figure)."""
    run: RunFn
    full_params: Mapping[str, Any] = field(default_factory=dict)
    quick_params: Mapping[str, Any] = field(default_factory=dict)
    """Overrides of ``full_params`` for ``--quick`` (seconds, not minutes)."""

    def params(self, quick: bool) -> dict[str, Any]:
        p = dict(self.full_params)
        if quick:
            p.update(self.quick_params)
        return p


_REGISTRY: dict[str, Experiment] = {}
_loaded = False


def register(
    name: str,
    description: str,
    full_params: Mapping[str, Any] | None = None,
    quick_params: Mapping[str, Any] | None = None,
) -> Callable[[RunFn], RunFn]:
    """Decorator: register ``fn`` as experiment ``name``."""

    def deco(fn: RunFn) -> RunFn:
        if name in _REGISTRY and _REGISTRY[name].run is not fn:
            raise ValueError(f"experiment {name!r} registered twice")
        _REGISTRY[name] = Experiment(
            name, description, fn, dict(full_params or {}), dict(quick_params or {})
        )
        return fn

    return deco


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    for mod in EXPERIMENT_MODULES:
        importlib.import_module(mod)  # a missing module raises: every one is listed on purpose
    _loaded = True


def all_experiments() -> list[Experiment]:
    _load_all()
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def get(name: str) -> Experiment:
    _load_all()
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise UnknownExperiment(f"unknown experiment {name!r} (known: {known})") from None


def run_experiment(name: str, *, quick: bool = False, seed: int = 0) -> ExperimentResult:
    exp = get(name)
    return exp.run(exp.params(quick), seed)
