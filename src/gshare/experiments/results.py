"""Experiment results: the ``results.json`` / CSV / PNG files and the printed table.

``results.json`` is ``{"experiment", "seed", "params", "rows": [...], "summary": {...},
"provenance": {...}}`` (docs/DESIGN.md §4; the front ends add ``provenance``). Rows are flat
dicts (one per measured configuration); the summary holds the figures an issue's "Done when"
names.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Mapping, Sequence
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
    provenance: dict[str, Any] | None = None
    """How the run came about (``provenance()``; the CLI sets it): not part of the result's
    figures, so two runs of one seed differ only here."""

    def to_json(self) -> dict[str, Any]:
        out = {
            "experiment": self.experiment,
            "seed": self.seed,
            "params": jsonable(self.params),
            "rows": jsonable(self.rows),
            "summary": jsonable(self.summary),
        }
        if self.provenance is not None:
            out["provenance"] = jsonable(self.provenance)
        return out


def provenance(*, quick: bool, overrides: Sequence[str], wall_s: float) -> dict[str, Any]:
    """What a reader needs to reproduce a result: the command's variant (``quick``, the
    ``--set`` overrides), gshare's version and git commit (when run from a checkout, with
    ``dirty`` when it has local changes), Python's and the main libraries' versions, the
    machine's CPU count and platform, when it ran (UTC) and how long it took."""
    import datetime
    import os
    import platform
    import subprocess
    from importlib import metadata

    from gshare import __version__

    def version(pkg: str) -> str | None:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    repo = Path(__file__).resolve().parents[3]
    commit: str | None = None
    dirty: bool | None = None
    if (repo / ".git").exists():
        try:
            git = ["git", "-C", str(repo)]
            commit = (
                subprocess.run(
                    [*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
                ).stdout.strip()
                or None
            )
            status = subprocess.run(
                [*git, "status", "--porcelain", "--untracked-files=no"],
                capture_output=True, text=True, timeout=5,
            ).stdout  # fmt: skip
            dirty = bool(status.strip()) if commit else None
        except (OSError, subprocess.SubprocessError):
            commit = None
    return {
        "quick": quick,
        "overrides": list(overrides),
        "gshare_version": __version__,
        "git_commit": commit,
        "git_dirty": dirty,
        "python": platform.python_version(),
        "libraries": {p: version(p) for p in ("numpy", "scipy", "simpy", "torch")},
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "finished_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "wall_s": round(wall_s, 3),
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


def aggregate_summaries(summaries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The summaries of one experiment over several seeds, leaf by leaf (``gshare experiment
    run --seeds``, ``gshare simulate --seeds``): a number present in every summary becomes
    ``{"mean", "std", "min", "max", "median", "p05", "p95", "values"}`` (std: the sample
    standard deviation, 0 for one seed; p05..p95: the 90 % interval over the seeds,
    ``experiments.fidelity.interval``; ``values`` in seed order); a mapping present in every
    summary is aggregated inside; any other leaf is kept when every seed agrees and listed per
    seed otherwise. Keys missing from some summaries are
    listed per seed (None where missing)."""
    import statistics

    from gshare.experiments.fidelity import interval

    def numeric(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)

    def agg(vals: list[Any]) -> Any:
        if all(isinstance(v, Mapping) for v in vals):
            keys = list(dict.fromkeys(k for v in vals for k in v))
            return {
                k: agg([v[k] for v in vals])
                if all(k in v for v in vals)
                else [v.get(k) for v in vals]
                for k in keys
            }
        if all(numeric(v) for v in vals):
            xs = [float(v) for v in vals]
            return {
                "mean": statistics.fmean(xs),
                "std": statistics.stdev(xs) if len(xs) > 1 else 0.0,
                "min": min(xs),
                "max": max(xs),
                **interval(xs),
                "values": xs,
            }
        return vals[0] if all(v == vals[0] for v in vals) else list(vals)

    if not summaries:
        raise ValueError("aggregate_summaries: no summaries")
    out = agg([dict(s) for s in summaries])
    assert isinstance(out, dict)
    return out


def write_result(result: ExperimentResult, out_dir: Path, folder_name: str | None = None) -> Path:
    """Write ``out_dir/NAME/results.json``, ``rows.csv`` and the PNG plots; return the folder
    (``folder_name`` in place of NAME: ``--seeds`` writes ``NAME/seed-K``)."""
    d = out_dir / (folder_name or result.experiment)
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
