"""How a node agent keeps its instances' processes (``node.agent``'s monitor): the record of
one managed instance, what the instance's files next to its socket say, and the restart rule.

Who uses it: ``NodeAgent`` keeps one ``Managed`` per instance and its monitor thread calls
``read_ready`` / ``exit_reason`` / ``read_memory_samples`` every ``MONITOR_PERIOD_S``
(``read_ready`` every ``STARTING_CHECK_S`` while an instance starts); when a process died it
asks ``restart_refused`` whether the instance is restarted in place or failed.
What must hold: an instance is restarted at most ``MAX_RESTARTS`` times per
``RESTART_WINDOW_S``, and a first start that fails is not retried (the controller backs the
function off instead).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import psutil

from gshare.runtime.instance.launch import InstanceInfo, InstanceLaunch
from gshare.runtime.instance.memory import read_samples
from gshare.runtime.messages import InstanceState

MONITOR_PERIOD_S = 0.2
"""How often the agent checks that its instances' processes are alive."""
STARTING_CHECK_S = 0.01
"""How often, while a forked instance starts, the agent looks for its ``.ready`` file (a stat:
an instance is ready ~60 ms after its fork, and ``MONITOR_PERIOD_S`` alone added up to 200 ms
to every cold start)."""
MAX_RESTARTS = 3
"""Restarts of one instance allowed within ``RESTART_WINDOW_S``; more mark it failed."""
RESTART_WINDOW_S = 60.0
START_TIMEOUT_S = 600.0
"""An instance not ready after this long is failed (a model load that hangs)."""
MEM_SAMPLES_KEPT = 256
"""Most recent per-batch memory measurements kept per instance for ``status``."""


@dataclass
class Managed:
    """One instance the agent keeps: its launch, process and state, restarts and memory."""

    launch: InstanceLaunch
    actor: Any = None
    """The instance's Ray actor (``launcher="ray"``), and the reference to its ``ready()``."""
    ready_ref: Any = None
    state: InstanceState = InstanceState.STARTING
    info: InstanceInfo = field(default_factory=InstanceInfo)
    error: str | None = None
    started_s: float = field(default_factory=time.monotonic)
    restarts: list[float] = field(default_factory=list)
    total_restarts: int = 0
    last_exit: str | None = None
    rss_mb: float = 0.0
    proc: psutil.Process | None = None
    pid: int | None = None
    """The instance's pid when forked from the template (``launcher="fork"``)."""
    mem_offset: int = 0
    """Bytes of ``<socket>.mem`` read so far."""
    mem_samples: deque[tuple[float, float]] = field(
        default_factory=lambda: deque(maxlen=MEM_SAMPLES_KEPT)
    )
    mem_total: int = 0


def read_ready(m: Managed) -> InstanceInfo | None:
    """What the instance wrote to ``<socket>.ready`` once it serves (None: not yet)."""
    try:
        return cast(InstanceInfo, json.loads(Path(m.launch.uds_path + ".ready").read_text()))
    except (OSError, ValueError):
        return None


def exit_status_text(code: int | None) -> str:
    """How a process ended, for an error message: ``" with code 1"``, ``" (signal 9)"``, or
    nothing when the code is unknown (``code``: ``os.waitstatus_to_exitcode``'s, negative for a
    signal)."""
    if code is None:
        return ""
    return f" (signal {-code})" if code < 0 else f" with code {code}"


def log_tail(path: Path | str, lines: int = 3, max_chars: int = 400) -> str:
    """The last ``lines`` non-blank lines of an instance's log, joined with " | " and cut to
    ``max_chars`` (its end kept), for an error message; "" when the file is missing or empty.
    Reads only the file's last 8 KiB."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 8192))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    kept = [ln.strip() for ln in text.splitlines() if ln.strip()][-lines:]
    out = " | ".join(kept)
    return out if len(out) <= max_chars else "..." + out[-(max_chars - 3) :]


def exit_reason(m: Managed, default: str) -> str:
    """Why the instance's process ended, as it left it in ``<socket>.exit`` (e.g. over its
    memory limit), else ``default``."""
    with contextlib.suppress(OSError):
        return Path(m.launch.uds_path + ".exit").read_text().strip() or default
    return default


def read_memory_samples(m: Managed) -> None:
    """Take the instance's new per-batch measurements (a restarted instance starts its file
    again: ``instance.memory.read_samples``)."""
    m.mem_offset, new = read_samples(m.launch.uds_path + ".mem", m.mem_offset)
    m.mem_samples.extend(new)
    m.mem_total += len(new)


def restart_refused(m: Managed, reason: str, now: float, *, start_failure: bool) -> str | None:
    """The instance's process died with ``reason`` at ``now`` (monotonic s): None when it is
    restarted in place (the restart is counted), else the error it fails with — a first start
    that failed, or ``MAX_RESTARTS`` restarts within ``RESTART_WINDOW_S`` already."""
    m.restarts = [t for t in m.restarts if now - t < RESTART_WINDOW_S]
    if start_failure and m.launch.incarnation == 0:
        return reason
    if len(m.restarts) >= MAX_RESTARTS:
        return f"{reason}; restarted {len(m.restarts)} times in {RESTART_WINDOW_S:.0f} s, giving up"
    m.restarts.append(now)
    m.total_restarts += 1
    return None


__all__ = [
    "MAX_RESTARTS",
    "MEM_SAMPLES_KEPT",
    "MONITOR_PERIOD_S",
    "RESTART_WINDOW_S",
    "START_TIMEOUT_S",
    "Managed",
    "exit_reason",
    "exit_status_text",
    "log_tail",
    "read_memory_samples",
    "read_ready",
    "restart_refused",
]
