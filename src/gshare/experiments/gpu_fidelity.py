"""The simulator against a real GPU: the GPU kit's share scenes, scored on what ``docs/gpu/``
recorded.

Who calls it: ``bench/fidelity.py`` (scenario ``gpu-shares``: no live run here, the live runs
are the kit's recorded ones) and ``tests/experiments/test_gpu_fidelity.py``. Reads the kit's
``results.json`` files; simulates; no network, no GPU.

What was measured (``gshare.gpukit.parts.shares``, part c): saturating probe processes —
``PROBE_KERNEL_US`` kernels in bursts of ``PROBE_BATCH`` — under one token server with the live
configuration (``LIVE_TOKEN_CONFIG``), through the CUDA interposer, in three scenes (``SCENES``:
a 0.3 / 0.6 pair, a lone 0.2-0.5 client, three 0.2-0.6 clients); a client's share is the device
time the server charged it over the wall time. The kit writes each share in its figure's note
(``q03 0.290 (expected 0.300), ...``), which ``load_share_runs`` reads back.

What is simulated: the same scenes on one ``SimGpu`` with the same token configuration, each
client a closed loop of bursts of ``PROBE_BATCH`` kernels, the token used in whole kernels as
the interposer uses it (``kernel_ms``; a kernel must end ``INTERPOSER_MARGIN_MS`` before the
token, the interposer's default ``GSHARE_MARGIN_US``), and a token handed to a client that
waited for it starting with the GPU's context switch (``token_wakeup_ms``: uncharged device
time, the kit's own ``context_switch_us_median`` from part e of the same GPU, or
``DEFAULT_CONTEXT_SWITCH_US`` where a run has none). None of these is fitted on the shares.

Scored per client (``share_pct:SCENE/CLIENT``) with ``experiments.fidelity.score``: the kit's
runs are the live runs. ``SUPERSEDED`` names the recorded scenes that ran an earlier token
policy than the simulator's, which are left out with their reason.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from gshare.experiments.fidelity import score
from gshare.experiments.token_share import Saturating, window_usage
from gshare.gpukit.parts.shares import PROBE_BATCH, PROBE_KERNEL_US, SCENES
from gshare.policy.tokens import LIVE_TOKEN_CONFIG, ClientSpec
from gshare.sim.engine import EventLoop
from gshare.sim.gpu import SimGpu
from gshare.sim.priorities import PRIO_PHASE

INTERPOSER_MARGIN_MS: Final = 0.2
"""The interposer's launch margin (``native/gshare_cuda.c``: ``GSHARE_MARGIN_US``, 200 us by
default): a kernel is launched only if it is predicted to end this long before the token."""

DEFAULT_CONTEXT_SWITCH_US: Final = 152.35
"""The H200's context switch (the kit's part e, 2026-11-27), for runs that did not measure it."""

SUPERSEDED: Final[Mapping[tuple[str, str], str]] = {
    ("2026-11-27-h200/1-all", "three"): (
        "ran before the token scheduler split elastic time among the clients that can take it "
        "(one client took the idle time: 0.17 / 0.56 / 0.20)"
    ),
}
"""(run, scene) -> why that recorded scene is not scored (module doc)."""

WINDOWS: Final = 250
SETTLE_WINDOWS: Final = 25
"""Simulated windows per scene, and the first ones left out (the kit leaves out its first
second too)."""

_SHARE = re.compile(r"\b([A-Za-z]\w*) (\d+(?:\.\d+)?) \(expected")


@dataclass(frozen=True)
class ShareRun:
    """One recorded kit run's share scenes: ``shares[scene][client]`` in % of the device."""

    run: str
    gpu: str
    shares: dict[str, dict[str, float]]
    context_switch_us: float | None
    skipped: dict[str, str] = field(default_factory=dict)
    """Scenes recorded but not scored (``SUPERSEDED``), with the reason."""


def load_share_runs(root: Path) -> list[ShareRun]:
    """Every kit run under ``root`` (``docs/gpu/``: ``*/results.json`` and ``*/*/results.json``)
    that ran part c on a GPU, in path order. A figure whose note holds no share is skipped."""
    out: list[ShareRun] = []
    for path in sorted([*root.glob("*/results.json"), *root.glob("*/*/results.json")]):
        doc = json.loads(path.read_text())
        if doc.get("dry_run") or not doc.get("gpu"):
            continue
        run = str(path.parent.relative_to(root))
        parts = doc.get("parts") or {}
        shares: dict[str, dict[str, float]] = {}
        skipped: dict[str, str] = {}
        for f in (parts.get("c") or {}).get("figures") or []:
            name = str(f.get("name", ""))
            prefix = "max_abs_share_error_pp_probe_"
            if not name.startswith(prefix) or f.get("on") != "gpu":
                continue
            scene = name[len(prefix) :]
            got = {c: 100.0 * float(v) for c, v in _SHARE.findall(str(f.get("note", "")))}
            if scene not in SCENES or not got:
                continue
            if (run, scene) in SUPERSEDED:
                skipped[scene] = SUPERSEDED[(run, scene)]
                continue
            shares[scene] = got
        switch = None
        for f in (parts.get("e") or {}).get("figures") or []:
            if f.get("name") == "context_switch_us_median" and f.get("measured") is not None:
                switch = float(f["measured"])
        if shares or skipped:
            out.append(ShareRun(run, str(doc["gpu"]), shares, switch, skipped))
    return out


def simulate_scene(
    scene: str,
    context_switch_us: float,
    *,
    kernels: bool = True,
    windows: int = WINDOWS,
    settle: int = SETTLE_WINDOWS,
) -> dict[str, float]:
    """Each client's simulated share (%, charged time over wall time, after ``settle``
    windows) in one of the kit's ``SCENES`` (module doc). ``kernels=False``: the simulator's
    default GPU model instead — continuous work revoked at the token's end, an instant
    hand-over (``sim_before``)."""
    clients = SCENES[scene][0]
    loop = EventLoop()
    log: list[tuple[str, float, float]] = []
    kernel_ms = PROBE_KERNEL_US / 1000.0
    gpu = SimGpu(
        loop,
        token_config=LIVE_TOKEN_CONFIG,
        token_log=log,
        kernel_ms=kernel_ms if kernels else 0.0,
        launch_margin_ms=INTERPOSER_MARGIN_MS if kernels else 0.0,
        token_wakeup_ms=context_switch_us / 1000.0 if kernels else 0.0,
    )
    for cid, (request, limit) in clients.items():
        gpu.add_client(ClientSpec(cid, 100.0, request, limit))
        driver = Saturating(gpu, cid, PROBE_BATCH * kernel_ms)
        loop.at(0.0, functools.partial(driver.set_active, True), PRIO_PHASE)
    w = LIVE_TOKEN_CONFIG.window_ms
    loop.run(until_ms=windows * w)
    out = {}
    for cid in clients:
        use = window_usage(log, cid, 0.0, windows, w)[settle:]
        out[cid] = 100.0 * sum(use) / (len(use) * w)
    return out


def score_gpu_shares(runs: Sequence[ShareRun]) -> list[dict[str, Any]]:
    """One score per (scene, client) recorded in any of ``runs``: the simulated share against
    the runs' (each run a live run), at the context switch the runs measured (their mean)."""
    switches = [r.context_switch_us for r in runs if r.context_switch_us is not None]
    switch_us = sum(switches) / len(switches) if switches else DEFAULT_CONTEXT_SWITCH_US
    out: list[dict[str, Any]] = []
    for scene in SCENES:
        recorded = [r for r in runs if scene in r.shares]
        if not recorded:
            continue
        sim = simulate_scene(scene, switch_us)
        before = simulate_scene(scene, switch_us, kernels=False)
        for cid in SCENES[scene][0]:
            lives = [r.shares[scene][cid] for r in recorded if cid in r.shares[scene]]
            if not lives:
                continue
            row = {"scenario": "gpu-shares", **score(f"share_pct:{scene}/{cid}", [sim[cid]], lives)}
            row.update(
                sim_before=before[cid],
                live_from=[r.run for r in recorded if cid in r.shares[scene]],
                gpu=sorted({r.gpu for r in recorded}),
                context_switch_us=switch_us,
            )
            out.append(row)
    return out


__all__ = [
    "DEFAULT_CONTEXT_SWITCH_US",
    "INTERPOSER_MARGIN_MS",
    "SUPERSEDED",
    "ShareRun",
    "load_share_runs",
    "score_gpu_shares",
    "simulate_scene",
]
