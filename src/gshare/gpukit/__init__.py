"""The GPU kit: one prepared command that runs gshare's whole GPU path on a real NVIDIA GPU.

GPU time comes in short windows, so the kit is built and proven on the CPU and meets the GPU
only as one unattended command (docs/gpu/README.md is the guide):

* ``make gpu-bundle`` (a machine with PyPI) downloads the Python 3.12 wheels that the target
  machine lacks into ``.gpu-bundle/`` (``gshare.gpukit.bundle``);
* ``make gpu-check`` (the GPU machine) installs them into a private folder over the machine's
  own PyTorch, builds ``native/`` and the probe with the machine's toolkit, then runs the
  parts below, each in its own process with its own time budget, under one deadline, and
  writes ``RESULTS.md``, ``results.json``, the failed parts' logs and the measured kernel
  table into ``--out`` (``gshare.gpukit.check``);
* ``--dry-run`` runs the same orchestration on the CPU against the stub driver of
  ``tests/native``: the driver-level checks run on the stub, what needs a GPU is skipped with
  the reason. ``make test`` runs it, so the kit cannot rot between GPU windows.

Who calls what: ``check`` (the orchestrator, standard library only, so it runs before the
bundle is installed) starts ``python -m gshare.gpukit.parts.<part>`` per part with a context
file (``parts.common.KitContext``); a part writes one ``PartResult`` JSON, which ``results``
turns into the two result files. The kit never changes the GPU's settings (clocks, power,
compute mode, MIG, persistence); it may start (and always stops) the MPS control daemon.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PartInfo:
    key: str
    """The letter ``--parts`` selects it by."""
    module: str
    """``gshare.gpukit.parts.<module>``."""
    title: str
    budget_s: float
    """Its share of the default 520-s deadline (a part gets less when less is left)."""


PARTS: tuple[PartInfo, ...] = (
    PartInfo("a", "interception", "Interception (both deployments)", 70.0),
    PartInfo("b", "overhead", "Overhead per launch and per inference", 80.0),
    PartInfo("c", "shares", "Time shares under the token server", 50.0),
    PartInfo("d", "memory", "Memory cap", 25.0),
    PartInfo("e", "fikit", "FIKIT data: kernels, gaps, switch cost, priorities", 105.0),
    PartInfo("f", "mps", "MPS partitions", 60.0),
    PartInfo("g", "live", "Live: gshare serve on CUDA", 90.0),
    PartInfo("h", "pytest_cuda", "pytest -m cuda", 30.0),
)
"""Every part, in the order the kit runs them."""


def select_parts(spec: str | None) -> list[PartInfo]:
    """The parts a ``--parts`` value names (letters or module names, comma-separated; empty or
    ``all``: every part), in the kit's order. Raises ``ValueError`` naming an unknown one."""
    if spec is None or spec.strip() in ("", "all"):
        return list(PARTS)
    wanted = {s.strip().lower() for s in spec.split(",") if s.strip()}
    known = {p.key for p in PARTS} | {p.module for p in PARTS}
    unknown = sorted(wanted - known)
    if unknown:
        names = ", ".join(f"{p.key} ({p.module})" for p in PARTS)
        raise ValueError(f"unknown part {', '.join(unknown)}: the parts are {names}")
    return [p for p in PARTS if p.key in wanted or p.module in wanted]


__all__ = ["PARTS", "PartInfo", "select_parts"]
