"""The devices of a node and the memory their instances reserve limits from.

Who calls it: ``NodeAgent`` when it starts (``detect_devices``, ``device_memory_mb``).
"""

from __future__ import annotations

import os

CPU_MEMORY_FRACTION = 0.9
"""Share of the node's RAM that CPU instances' memory limits may reserve by default."""


def detect_devices() -> list[str]:
    """``cuda:N`` for every GPU torch sees (only when the NVIDIA driver's device node exists:
    torch is not imported otherwise), else ``["cpu"]``."""
    if os.path.exists("/dev/nvidiactl"):
        try:
            import torch

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
        import torch

        return float(torch.cuda.get_device_properties(device).total_memory) / (1 << 20)
    if configured_mb:
        return float(configured_mb)
    import psutil

    return float(psutil.virtual_memory().total) / (1 << 20) * CPU_MEMORY_FRACTION


__all__ = ["CPU_MEMORY_FRACTION", "detect_devices", "device_memory_mb"]
