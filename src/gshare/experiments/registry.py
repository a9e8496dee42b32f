"""One registry of named experiments shared by the CLI, tests and benchmarks (docs/DESIGN.md §8.8).

An experiment is a function ``run(params, seed) -> ExperimentResult``. It declares its full and
``--quick`` parameters so that tests run the small version and users the large one.

Who calls it: ``gshare.cli`` (``experiment list|run``), ``make demo`` and the tests.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
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


class ParamError(ValueError):
    """A ``--set`` override that does not fit the experiment's parameters (one line)."""


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


def override(params: Mapping[str, Any], assignments: Sequence[str]) -> dict[str, Any]:
    """``params`` with each ``KEY=VALUE`` of ``assignments`` applied (``gshare experiment run
    --set``). ``VALUE`` is read as YAML (``5000``, ``[0.025, 0.05]``, ``{a: 1}``, ``true``, a
    bare string); a dotted ``KEY`` reaches into a mapping (``pair_sets.services=[[a, b]]``).
    The key must exist, the value must have its kind (number, bool, string, list, mapping)
    and a number whose default is >= 0 must stay >= 0: ``ParamError`` names the problem (and
    the known keys) otherwise. ``params`` is not
    changed."""
    import copy

    import yaml

    out = copy.deepcopy(dict(params))
    for a in assignments:
        key, sep, raw = a.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ParamError(f"--set {a!r}: expected KEY=VALUE")
        try:
            value: Any = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as e:
            first = str(e).splitlines()[0]
            raise ParamError(f"--set {key}: the value is not valid YAML ({first})") from None
        *path, last = key.split(".")
        where: Any = out
        for i, part in enumerate(path):
            where = where.get(part) if isinstance(where, dict) else None
            if not isinstance(where, dict):
                raise ParamError(f"--set {key}: {'.'.join(path[: i + 1])} is not a mapping")
        if last not in where:
            known = ", ".join(sorted(where)) or "none"
            raise ParamError(f"--set {key}: no such parameter (known: {known})")
        old = where[last]
        if not _same_kind(old, value):
            raise ParamError(
                f"--set {key}: expected {_kind(old)} like {old!r}, got {_kind(value)} {value!r}"
            )
        if _is_number(old) and _is_number(value) and old >= 0 > value:  # durations, counts, rates
            raise ParamError(f"--set {key}: must be >= 0 (default {old!r}), got {value!r}")
        where[last] = float(value) if isinstance(old, float) and _is_number(value) else value
    return out


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a bool"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, (list, tuple)):
        return "a list"
    if isinstance(v, dict):
        return "a mapping"
    return type(v).__name__


def _same_kind(old: Any, new: Any) -> bool:
    """A default of None takes anything; a float default takes an integer too."""
    if old is None:
        return True
    if isinstance(old, float):
        return _is_number(new)
    return _kind(old) == _kind(new)


def run_experiment(
    name: str, *, quick: bool = False, seed: int = 0, overrides: Sequence[str] = ()
) -> ExperimentResult:
    exp = get(name)
    return exp.run(override(exp.params(quick), overrides), seed)
