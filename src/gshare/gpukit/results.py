"""The kit's result model and its two files: ``results.json`` and ``RESULTS.md``.

A part (``gshare.gpukit.parts.*``) measures ``Figure`` s and writes one ``PartResult``; the
orchestrator (``gshare.gpukit.check``) reads them back, adds the provenance and writes::

    results.json  {"gpu": <device name>, "dry_run": bool, "provenance": {...},
                   "parts": {"<key>": {"title", "status", "reason", "seconds",
                                       "figures": [{name, measured, target, pass, unit, on,
                                                    note}, ...]}}}
    RESULTS.md    the provenance, then a table per part: figure, measured, target, pass/fail

A part's ``status`` is ``pass``, ``fail`` or ``skipped`` (with the reason): ``fail`` when any
figure with a target failed or the part itself broke; ``skipped`` when nothing it was asked to
measure could run (no GPU, no time left), even if it checked something on the stub on the
way; otherwise ``pass``. Standard library only: the orchestrator imports this before the
bundle is installed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATUSES = ("pass", "fail", "skipped")
SCHEMA_VERSION = 1


@dataclass
class Figure:
    name: str
    measured: float | int | str | bool | None
    """None: not measured (``note`` says why)."""
    target: str | None = None
    """The condition, as text (``<= 3``, ``== device kernels``); None: reported only."""
    passed: bool | None = None
    """Whether ``measured`` meets ``target`` (None: no target, or not measured)."""
    unit: str = ""
    on: str = "gpu"
    """Where it was measured: ``gpu``, ``stub`` (the stub driver of tests/native) or ``cpu``."""
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["pass"] = d.pop("passed")
        m = d["measured"]
        if isinstance(m, float) and not math.isfinite(m):
            d["measured"] = None
        return d


@dataclass
class PartResult:
    status: str
    reason: str = ""
    figures: list[Figure] = field(default_factory=list)

    def add(self, figure: Figure) -> Figure:
        self.figures.append(figure)
        return figure

    def to_json(self) -> dict[str, Any]:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")
        return {
            "status": self.status,
            "reason": self.reason,
            "figures": [f.to_json() for f in self.figures],
        }


def judge(figures: Sequence[Figure], gpu_ran: bool, skip_reason: str) -> PartResult:
    """A part's status from its figures: ``fail`` if any target failed, else ``skipped`` (with
    ``skip_reason``) when nothing ran on the GPU, else ``pass``."""
    failed = [f.name for f in figures if f.passed is False]
    if failed:
        return PartResult("fail", "failed: " + ", ".join(failed), list(figures))
    if not gpu_ran:
        return PartResult("skipped", skip_reason, list(figures))
    return PartResult("pass", "", list(figures))


def read_part(path: Path) -> dict[str, Any]:
    """A part's JSON as written by ``PartResult.to_json``; raises ``ValueError`` naming what is
    wrong with it."""
    try:
        d = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"unreadable part result {path.name}: {e}") from e
    if not isinstance(d, dict) or d.get("status") not in STATUSES:
        raise ValueError(f"part result {path.name} has no valid status")
    if not isinstance(d.get("figures"), list):
        raise ValueError(f"part result {path.name} has no figure list")
    return d


def validate(doc: Mapping[str, Any]) -> None:
    """Check ``results.json``'s schema; raises ``ValueError`` naming the first problem. The
    dry run's test and the orchestrator itself call it."""
    for key in ("gpu", "dry_run", "provenance", "parts", "schema"):
        if key not in doc:
            raise ValueError(f"results.json has no {key!r}")
    if not isinstance(doc["gpu"], str) or not doc["gpu"]:
        raise ValueError("results.json: 'gpu' must name the device (or say there is none)")
    parts = doc["parts"]
    if not isinstance(parts, dict) or not parts:
        raise ValueError("results.json: 'parts' must be a non-empty object")
    for key, part in parts.items():
        if part.get("status") not in STATUSES:
            raise ValueError(f"part {key}: status {part.get('status')!r} not in {STATUSES}")
        if part["status"] != "pass" and not part.get("reason"):
            raise ValueError(f"part {key}: a {part['status']} part must say why")
        for f in part.get("figures", []):
            for k in ("name", "measured", "target", "pass", "unit", "on"):
                if k not in f:
                    raise ValueError(f"part {key}: figure {f.get('name')!r} has no {k!r}")
            if f["on"] not in ("gpu", "stub", "cpu"):
                raise ValueError(f"part {key}: figure {f['name']!r}: 'on' is {f['on']!r}")


def _cell(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e6 else f"{v:.3e}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def render_markdown(doc: Mapping[str, Any], titles: Mapping[str, str]) -> str:
    """``RESULTS.md``: the provenance, a summary line per part, then a table per part."""
    prov = doc["provenance"]
    lines = [
        "# GPU kit results" + (" (dry run: stub driver, CPU torch)" if doc["dry_run"] else ""),
        "",
        f"GPU: **{doc['gpu']}**",
        "",
        "| provenance | |",
        "|---|---|",
    ]
    for k, v in prov.items():
        lines.append(f"| {k} | {_cell(v)} |")
    lines += ["", "| part | status | seconds | reason |", "|---|---|---|---|"]
    for key, part in doc["parts"].items():
        lines.append(
            f"| {key}. {titles.get(key, key)} | **{part['status']}** | "
            f"{_cell(part.get('seconds'))} | {_cell(part.get('reason') or '')} |"
        )
    for key, part in doc["parts"].items():
        lines += ["", f"## {key}. {titles.get(key, key)} — {part['status']}", ""]
        if part.get("reason"):
            lines += [part["reason"], ""]
        if not part.get("figures"):
            continue
        lines += ["| figure | measured | target | pass | on | note |", "|---|---|---|---|---|---|"]
        for f in part["figures"]:
            unit = f" {f['unit']}" if f.get("unit") and f["measured"] is not None else ""
            ok = {True: "pass", False: "**FAIL**", None: ""}[f["pass"]]
            lines.append(
                f"| {f['name']} | {_cell(f['measured'])}{unit} | {_cell(f['target'])} | {ok} "
                f"| {f['on']} | {_cell(f.get('note', ''))} |"
            )
    return "\n".join(lines) + "\n"


__all__ = [
    "SCHEMA_VERSION",
    "STATUSES",
    "Figure",
    "PartResult",
    "judge",
    "read_part",
    "render_markdown",
    "validate",
]
