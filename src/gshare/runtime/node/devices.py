"""The devices of a node and the memory their instances reserve limits from.

Who calls it: ``NodeAgent`` when it starts (``detect_devices``, ``device_memory_mb``).
"""

from __future__ import annotations

import os

import psutil

from gshare.runtime.native import instance_env
from gshare.runtime.node.partition import cores_for
from gshare.runtime.node.partition import cuda_env as mps_env

CPU_MEMORY_FRACTION = 0.9
"""Share of the node's RAM that CPU instances' memory limits may reserve by default."""


def detect_devices() -> list[str]:
    """``cuda:N`` for every GPU torch sees (only when the NVIDIA driver's device node exists:
    torch is not imported otherwise), else ``["cpu"]``."""
    if os.path.exists("/dev/nvidiactl"):
        try:
            import torch  # lazy: torch is heavy, and only a GPU node needs it (docstring)

            n = torch.cuda.device_count()
            if n > 0:
                return [f"cuda:{i}" for i in range(n)]
        except Exception:  # no usable CUDA: serve on CPU
            pass
    return ["cpu"]


def device_memory_mb(device: str, configured_mb: float | None) -> float:
    """The memory a device's instances reserve their limits from: the CUDA device's memory,
    or (CPU) ``configured_mb`` / ``CPU_MEMORY_FRACTION`` of the node's RAM."""
    if device.startswith("cuda"):
        import torch  # lazy: torch is heavy, and only a GPU node needs it

        return float(torch.cuda.get_device_properties(device).total_memory) / (1 << 20)
    if configured_mb:
        return float(configured_mb)
    return float(psutil.virtual_memory().total) / (1 << 20) * CPU_MEMORY_FRACTION


__all__ = ["CPU_MEMORY_FRACTION", "detect_devices", "device_memory_mb"]


def instance_device_env(
    device: str,
    sm_pct: float,
    cpu_count: int,
    *,
    mps: bool,
    epoch_s: float,
    cuda_env: dict[str, str] | None,
) -> dict[str, str]:
    """The environment an instance's process needs on ``device`` (the node agent adds it to the
    launch's): on CUDA the MPS thread percentage and the GPU frontend's deployment; on a CPU,
    thread pools sized to its cores and passive waits."""
    if device.startswith("cuda"):
        # the GPU frontend's deployment (LD_PRELOAD or the shim), also for a Ray actor
        return {**(mps_env(sm_pct) if mps else {}), **instance_env(epoch_s, cuda_env)}
    n = str(cores_for(sm_pct, cpu_count))
    # Threads of a process waiting for its token must not spin on the cores another instance's
    # token entitles it to (OpenMP workers spin ~200 ms after each parallel region by default):
    # passive waits, and pools sized to the partition from the first import of torch. Set at
    # process start, through the actor's runtime env.
    return {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0", "OMP_NUM_THREADS": n,
            "MKL_NUM_THREADS": n}  # fmt: skip
