"""Spatial partition of an instance process, and its memory measurement (docs/DESIGN.md §2, §5).

An instance gets ``sm_pct`` of a device. Enforcement depends on the device:

* **CUDA — MPS** (FaST-GShare §3.3.1): the MPS client limit
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` is read by the CUDA driver when the process creates its
  CUDA context; it cannot be changed afterwards. So the agent puts ``cuda_env(sm_pct)`` in the
  environment the instance process is *started* with (or the instance calls
  ``apply_cuda_partition`` first thing, before anything touches CUDA). The limit only holds
  when an MPS control daemon runs (``start_mps_daemon``); without one the variable is ignored
  and instances share SMs by time slicing only — ``start_mps_daemon`` warns about that.
  Device memory is capped with ``set_cuda_memory_fraction`` (the PyTorch caching allocator's
  per-process limit; an allocation beyond it raises out-of-memory in that process only).
* **CPU analogue** (no GPU): the spatial share is a share of the cores — core affinity
  (``os.sched_setaffinity``) plus as many intra-op threads (``torch.set_num_threads``)::

      cores = max(1, min(total, floor(sm_pct / 100 * total + 0.5)))

  i.e. ``round(sm_pct/100 × cores)`` with halves rounded up, at least one core. On a 2-core
  machine: sm_pct < 75 → 1 core (never fewer than one), sm_pct ≥ 75 → 2 cores. The cores are
  taken from the cores this process may use, starting at the one that corresponds to the
  share's SM offset (``sm_offset_pct``: the y position of its placement rectangle), so shares
  placed on disjoint SM bands get disjoint cores where the machine has enough of them.

``rss_mb`` / ``pss_mb`` measure a process's memory (psutil): the instance watchdog compares
RSS with ``mem_mb``; PSS (proportional set size: shared pages divided among their mappers) is
what model sharing reduces (``bench/model_sharing.py``).

Who calls it: the node agent (``cuda_env``, ``start_mps_daemon``) and instance processes at
start (``apply_cpu_partition``, ``apply_cuda_partition``, ``set_cuda_memory_fraction``) and in
their watchdog (``rss_mb``).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import subprocess
import sys
import time
import warnings
from typing import Final

import psutil

__all__ = [
    "MPS_ENV",
    "MpsUnavailableWarning",
    "apply_cpu_partition",
    "apply_cuda_partition",
    "cores_for",
    "cpu_cores_for",
    "cuda_env",
    "mps_available",
    "mps_pipe_dir",
    "pss_mb",
    "rss_mb",
    "set_cuda_memory_fraction",
    "start_mps_daemon",
]

log = logging.getLogger(__name__)

MPS_ENV: Final[str] = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MPS_CONTROL: Final[str] = "nvidia-cuda-mps-control"
DEFAULT_MPS_PIPE_DIR: Final[str] = "/tmp/nvidia-mps"
_MB: Final[float] = 1024.0 * 1024.0


class MpsUnavailableWarning(RuntimeWarning):
    """MPS is not running and cannot be started: SM percentages are not enforced on the GPU."""


def _check_pct(sm_pct: float) -> float:
    if not (isinstance(sm_pct, int | float) and math.isfinite(sm_pct) and 0.0 < sm_pct <= 100.0):
        raise ValueError(f"sm_pct: must be a number in (0, 100], got {sm_pct!r}")
    return float(sm_pct)


# -- CPU ----------------------------------------------------------------------------------------


def cores_for(sm_pct: float, total_cores: int) -> int:
    """How many of ``total_cores`` cores an ``sm_pct`` share gets: ``round(sm_pct/100 ×
    total)``, halves up, clamped to [1, total]. E.g. 2 cores: 25 → 1 (0.5 rounds up), 50 → 1,
    74 → 1, 75 → 2 (1.5 rounds up), 100 → 2; 8 cores: 30 → 2 (2.4), 33 → 3 (2.64)."""
    _check_pct(sm_pct)
    if total_cores < 1:
        raise ValueError(f"total_cores: must be an integer >= 1, got {total_cores}")
    return max(1, min(total_cores, math.floor(sm_pct / 100.0 * total_cores + 0.5)))


def cpu_cores_for(
    sm_pct: float,
    total_cores: int | None = None,
    *,
    sm_offset_pct: float = 0.0,
    available: list[int] | None = None,
) -> list[int]:
    """The cores (CPU ids) an ``sm_pct`` share starting at ``sm_offset_pct`` gets, without
    applying anything. ``available`` defaults to this process's affinity; ``total_cores``
    (default: all available) bounds how many of them the partition divides."""
    cores = sorted(available if available is not None else os.sched_getaffinity(0))
    if not cores:
        raise ValueError("no CPU is available to this process")
    total = len(cores) if total_cores is None else max(1, min(total_cores, len(cores)))
    n = cores_for(sm_pct, total)
    if not (0.0 <= sm_offset_pct <= 100.0):
        raise ValueError(f"sm_offset_pct: must be in [0, 100], got {sm_offset_pct}")
    start = min(math.floor(sm_offset_pct / 100.0 * total + 1e-9), total - n)
    return cores[start : start + n]


def apply_cpu_partition(
    sm_pct: float,
    total_cores: int | None = None,
    *,
    sm_offset_pct: float = 0.0,
) -> list[int]:
    """Confine the calling process to its share of the cores: affinity to
    ``cpu_cores_for(...)`` and that many torch intra-op threads (and ``OMP_NUM_THREADS`` /
    ``MKL_NUM_THREADS`` for libraries initialised later). Call it in the instance process
    before the model runs. Returns the cores."""
    cores = cpu_cores_for(sm_pct, total_cores, sm_offset_pct=sm_offset_pct)
    os.sched_setaffinity(0, cores)
    n = str(len(cores))
    os.environ["OMP_NUM_THREADS"] = n
    os.environ["MKL_NUM_THREADS"] = n
    try:
        import torch  # lazy: torch is heavy; the agent imports this module without it
    except ImportError:  # pragma: no cover - torch is a runtime dependency
        return cores
    torch.set_num_threads(len(cores))
    return cores


# -- CUDA / MPS ---------------------------------------------------------------------------------


def _fmt_pct(pct: float) -> str:
    # MPS reads a percentage; write integers plainly ("25"), others with at most 2 decimals.
    r = round(pct, 2)
    return str(int(r)) if r == int(r) else f"{r:g}"


def cuda_env(sm_pct: float, *, pipe_dir: str | None = None) -> dict[str, str]:
    """Environment variables that give a process an ``sm_pct`` share under MPS: put them in
    the environment of the instance process when it is started — they act only if set before
    its CUDA context exists. ``pipe_dir``: the MPS pipe directory when not the default."""
    env = {MPS_ENV: _fmt_pct(_check_pct(sm_pct))}
    if pipe_dir is not None:
        env["CUDA_MPS_PIPE_DIRECTORY"] = pipe_dir
    return env


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:  # pragma: no cover - exotic builds
        return False


def apply_cuda_partition(sm_pct: float, *, pipe_dir: str | None = None) -> dict[str, str]:
    """Set ``cuda_env(sm_pct)`` in this process's environment. ``RuntimeError`` when this
    process already created its CUDA context (the limit would silently not apply)."""
    if _cuda_initialized():
        raise RuntimeError(
            f"{MPS_ENV} must be set before the CUDA context exists, but CUDA is already "
            "initialised in this process; start the instance with cuda_env() instead"
        )
    env = cuda_env(sm_pct, pipe_dir=pipe_dir)
    os.environ.update(env)
    return env


def mps_pipe_dir() -> str:
    """The MPS pipe directory clients and the daemon use (``$CUDA_MPS_PIPE_DIRECTORY`` or the
    default ``/tmp/nvidia-mps``)."""
    return os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_MPS_PIPE_DIR


def mps_available() -> bool:
    """True when an MPS control daemon is running for this machine: its control pipe exists
    in the pipe directory and a ``nvidia-cuda-mps-control`` process is alive."""
    control = os.path.join(mps_pipe_dir(), "control")
    if not os.path.exists(control):
        return False
    for p in psutil.process_iter(["name"]):
        try:
            if p.info["name"] == MPS_CONTROL:
                return True
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return False


def start_mps_daemon(timeout_s: float = 5.0) -> bool:
    """Ensure an MPS control daemon runs (``nvidia-cuda-mps-control -d``). True when one runs
    afterwards; False with an ``MpsUnavailableWarning`` (and a log warning) when the binary is
    absent or the daemon did not come up — SM percentages are then NOT enforced on the GPU."""
    if mps_available():
        return True
    binary = shutil.which(MPS_CONTROL)
    if binary is None:
        _warn_mps(f"{MPS_CONTROL} not found on PATH")
        return False
    os.makedirs(mps_pipe_dir(), exist_ok=True)
    try:
        res = subprocess.run([binary, "-d"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        _warn_mps(f"{MPS_CONTROL} -d failed: {e}")
        return False
    if res.returncode != 0:
        _warn_mps(f"{MPS_CONTROL} -d exited with {res.returncode}: {res.stderr.strip()[:200]}")
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if mps_available():
            return True
        time.sleep(0.05)
    _warn_mps(f"{MPS_CONTROL} -d started but no control pipe appeared in {mps_pipe_dir()}")
    return False


def _warn_mps(why: str) -> None:
    msg = (
        f"MPS is unavailable ({why}): sm_pct is not enforced on the GPU; instances share "
        "its SMs by time slicing (tokens) only"
    )
    log.warning(msg)
    warnings.warn(msg, MpsUnavailableWarning, stacklevel=3)


def set_cuda_memory_fraction(fraction: float, device: int | str | None = None) -> bool:
    """Cap this process's CUDA caching allocator at ``fraction`` of ``device``'s memory
    (``torch.cuda.set_per_process_memory_fraction``). False (nothing done) without CUDA."""
    if not (isinstance(fraction, int | float) and 0.0 < fraction <= 1.0):
        raise ValueError(f"fraction: must be a number in (0, 1], got {fraction!r}")
    import torch  # lazy: torch is heavy; the agent imports this module without it

    if not torch.cuda.is_available():
        return False
    torch.cuda.set_per_process_memory_fraction(float(fraction), device)
    return True


# -- memory measurement -------------------------------------------------------------------------


def rss_mb(pid: int | None = None) -> float:
    """Resident set size of process ``pid`` (default: this one), MiB. Shared pages (e.g.
    mapped model-store weights) count in full in every process — the watchdog's number."""
    return float(psutil.Process(pid).memory_info().rss) / _MB


def pss_mb(pid: int | None = None) -> float:
    """Proportional set size of ``pid``, MiB: each shared page counts 1/N in each of its N
    mappers, so PSS summed over processes is their real joint footprint (Linux only)."""
    return float(psutil.Process(pid).memory_full_info().pss) / _MB
