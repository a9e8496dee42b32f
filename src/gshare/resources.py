"""The resource model: a spatio-temporal GPU share and its placement rectangle.

FaST-GShare (§3.3-3.4) gives an instance a share of a GPU in two dimensions:

* spatial — ``sm_pct``, the percentage of the GPU's SMs it may use (MPS
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``);
* temporal — ``quota_request`` and ``quota_limit``, the fraction of every time window it is
  guaranteed and the fraction it may use at most (time tokens);

plus ``mem_mb`` of device memory. For placement the share is a rectangle of width
``quota_request * 100`` (time, in % of a window) and height ``sm_pct`` inside the GPU's
100 x 100 square; non-overlapping rectangles form a feasible static schedule: each instance
runs in its x-interval of every window on its y-band of SMs.

This module is data only: no I/O, importable from ``policy/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

GPU_WIDTH = 100.0
"""Width of a GPU in placement units: 100 % of each time window."""
GPU_HEIGHT = 100.0
"""Height of a GPU in placement units: 100 % of its SMs."""
V100_MEM_MB = 16_384
"""Device memory of the V100 the shipped profile table was measured on."""

GEOM_EPS: Final[float] = 1e-9
"""The one geometric tolerance of the placement plane (percentage points), used by ``Rect``
and by every placer (``gshare.policy.placement``): edges closer than this touch, and a size
this much larger than a rectangle still fits. Placers snap coordinates to 9 decimals
(``placement.geometry.SNAP_DIGITS``) so that rounding noise stays below it."""


class ShareError(ValueError):
    """A GPU share or rectangle with an out-of-range field; the message names the field."""


@dataclass(frozen=True, slots=True)
class GpuShare:
    """A spatio-temporal share of one GPU.

    Invariants (checked at construction): ``0 < sm_pct <= 100``,
    ``0 < quota_request <= quota_limit <= 1``, ``mem_mb >= 0``.
    """

    sm_pct: float
    """Spatial share: percentage of the GPU's SMs (MPS active thread percentage)."""
    quota_request: float
    """Guaranteed fraction of each time window (0, 1]."""
    quota_limit: float
    """Maximum fraction of each time window, >= quota_request, <= 1."""
    mem_mb: float = 0.0
    """Device memory reserved for the instance, in MiB."""

    def __post_init__(self) -> None:
        if not (0.0 < self.sm_pct <= 100.0):
            raise ShareError(f"sm_pct must be in (0, 100], got {self.sm_pct}")
        if not (0.0 < self.quota_request <= 1.0):
            raise ShareError(f"quota_request must be in (0, 1], got {self.quota_request}")
        if not (self.quota_request <= self.quota_limit <= 1.0):
            raise ShareError(
                f"quota_limit must be in [quota_request={self.quota_request}, 1], "
                f"got {self.quota_limit}"
            )
        if self.mem_mb < 0:
            raise ShareError(f"mem_mb must be >= 0, got {self.mem_mb}")

    @property
    def width(self) -> float:
        """Placement width: the guaranteed time quota in % of a window."""
        return self.quota_request * GPU_WIDTH

    @property
    def height(self) -> float:
        """Placement height: the SM percentage."""
        return self.sm_pct

    @property
    def area(self) -> float:
        """FaST-GShare's "secondCores": quota x SMs, in %·% units (a full GPU is 10,000)."""
        return self.width * self.height


@dataclass(frozen=True, slots=True)
class Rect:
    """An axis-aligned rectangle inside a GPU's 100 x 100 square.

    ``x`` is the start of the time interval (% of window), ``y`` the first SM band (%).
    Width and height are positive.
    """

    x: float
    y: float
    w: float
    h: float

    def __post_init__(self) -> None:
        if self.w <= 0 or self.h <= 0:
            raise ShareError(f"rectangle width and height must be > 0, got {self.w} x {self.h}")

    @property
    def x2(self) -> float:
        return self.x + self.w

    @property
    def y2(self) -> float:
        return self.y + self.h

    @property
    def area(self) -> float:
        return self.w * self.h

    def fits(self, w: float, h: float) -> bool:
        """True when a ``w`` x ``h`` rectangle fits inside this one."""
        return w <= self.w + GEOM_EPS and h <= self.h + GEOM_EPS

    def contains(self, other: Rect) -> bool:
        """True when ``other`` lies inside this rectangle (edges may touch)."""
        return (
            other.x >= self.x - GEOM_EPS
            and other.y >= self.y - GEOM_EPS
            and other.x2 <= self.x2 + GEOM_EPS
            and other.y2 <= self.y2 + GEOM_EPS
        )

    def intersects(self, other: Rect) -> bool:
        """True when the interiors overlap (touching edges do not count)."""
        return (
            self.x < other.x2 - GEOM_EPS
            and other.x < self.x2 - GEOM_EPS
            and self.y < other.y2 - GEOM_EPS
            and other.y < self.y2 - GEOM_EPS
        )

    def inside_gpu(self) -> bool:
        """True when the rectangle lies inside the GPU's 100 x 100 square."""
        return (
            self.x >= -GEOM_EPS
            and self.y >= -GEOM_EPS
            and self.x2 <= GPU_WIDTH + GEOM_EPS
            and self.y2 <= GPU_HEIGHT + GEOM_EPS
        )


FULL_GPU = Rect(0.0, 0.0, GPU_WIDTH, GPU_HEIGHT)
"""The whole GPU as one free rectangle."""
