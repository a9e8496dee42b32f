"""Experiment results: the ``results.json`` / CSV / PNG files and the printed table.

``results.json`` is ``{"experiment", "seed", "params", "rows": [...], "summary": {...}}``
(docs/DESIGN.md §4). Rows are flat dicts (one per measured configuration); the summary holds the
figures an issue's "Done when" names.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PlotFn = Callable[["ExperimentResult", Path], Path]
"""Draws one PNG for a result into a directory and returns its path."""


@dataclass
class ExperimentResult:
    experiment: str
    seed: int
    params: dict[str, Any]
    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    plots: list[PlotFn] = field(default_factory=list)
    table_columns: Sequence[str] | None = None
    """Columns of ``rows`` to print (all when None)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "seed": self.seed,
            "params": jsonable(self.params),
            "rows": jsonable(self.rows),
            "summary": jsonable(self.summary),
        }


def jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    if isinstance(x, float):
        return None if math.isnan(x) or math.isinf(x) else round(x, 6)
    if hasattr(x, "item") and callable(x.item):  # numpy scalars
        return jsonable(x.item())
    return x


def write_result(result: ExperimentResult, out_dir: Path) -> Path:
    """Write ``out_dir/NAME/results.json``, ``rows.csv`` and the PNG plots; return the folder."""
    d = out_dir / result.experiment
    d.mkdir(parents=True, exist_ok=True)
    (d / "results.json").write_text(json.dumps(result.to_json(), indent=2) + "\n")
    if result.rows:
        cols: list[str] = []
        for r in result.rows:
            for k in r:
                if k not in cols:
                    cols.append(k)
        with open(d / "rows.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            for r in result.rows:
                w.writerow({k: jsonable(v) for k, v in r.items()})
    if result.plots:
        import matplotlib

        matplotlib.use("Agg")
        for plot in result.plots:
            plot(result, d)
    return d


def format_value(v: Any) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"
    if isinstance(v, dict):
        return ", ".join(f"{k}={format_value(x)}" for k, x in v.items())
    return str(v)


def flatten(d: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Nested dicts as ``[("a.b.c", value), ...]`` for printing one value per line."""
    out: list[tuple[str, Any]] = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.extend(flatten(v, key + "."))
        else:
            out.append((key, v))
    return out
