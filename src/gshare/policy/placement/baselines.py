"""The baseline placers gshare compares MRA with.

* ``"first-fit"`` — the lowest-index GPU whose maximal-rectangles free list fits, bottom-left;
* ``"best-fit"`` — the GPU with the least free area after placement (that fits), bottom-left;
* ``"time-share"`` — KubeShare-style time sharing (Yeh et al., 2020; the baseline of FaST-GShare
  Fig. 11): every instance takes 100 % of the SMs, GPUs are filled first-fit along the quota
  axis.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from itertools import islice
from typing import ClassVar

from gshare.policy.placement.base import Binding, Placer, _MaxRectsPlacer
from gshare.policy.placement.geometry import (
    AREA_KEY_DIGITS,
    AREA_KEY_TOL,
    FULL_BOX,
    Box,
    _cut,
    _fits,
    _maximal_free,
    _place_and_new_joint_rect,
    _snap,
)
from gshare.resources import GEOM_EPS, GPU_HEIGHT, GPU_WIDTH, Rect

# -- baselines on maximal-rectangles free lists --------------------------------------------------


class _RebuildOnRelease(_MaxRectsPlacer):
    """First/best fit keep exact maximal free lists: a release rebuilds the GPU's list from its
    remaining instances (the best bookkeeping a baseline can have; they never move anything).
    Per-GPU max free width/height reject GPUs that cannot fit without scanning their list."""

    def __init__(self, max_gpus: int) -> None:
        super().__init__(max_gpus)
        self._max_w: list[float] = [GPU_WIDTH] * max_gpus
        self._max_h: list[float] = [GPU_HEIGHT] * max_gpus

    def _set_free(self, gpu: int, free: list[Box]) -> None:
        self._free[gpu] = free
        self._max_w[gpu] = max((r[2] - r[0] for r in free), default=0.0)
        self._max_h[gpu] = max((r[3] - r[1] for r in free), default=0.0)

    def _first_fitting(self, gpu: int, w: float, h: float) -> Box | None:
        """The bottom-left-most free rectangle of ``gpu`` that fits, if any."""
        if self._max_w[gpu] < w - GEOM_EPS or self._max_h[gpu] < h - GEOM_EPS:
            return None
        for r in self._free[gpu]:
            if _fits(r, w, h):
                return r
        return None

    def _put(self, instance_id: str, gpu: int, chosen: Box, w: float, h: float) -> Binding:
        placed, joint = _place_and_new_joint_rect(chosen, w, h)
        self._set_free(gpu, _cut((r for r in self._free[gpu] if r != chosen), placed, joint))
        return self._bind(instance_id, gpu, placed)

    def _release(self, instance_id: str) -> None:
        gpu, _ = self._unbind(instance_id)
        if not self._on_gpu[gpu]:
            self._emptied(gpu)
        else:
            self._set_free(gpu, _maximal_free(self._on_gpu[gpu].values()))


class FirstFitPlacer(_RebuildOnRelease):
    """``"first-fit"`` — the lowest-index GPU (in use or not) with a free rectangle that fits,
    placed at the bottom-left-most such rectangle. No global best-area search."""

    name: ClassVar[str] = "first-fit"

    def _place(self, instance_id: str, w: float, h: float) -> Binding:
        for gpu in range(self.max_gpus):
            if not self._on_gpu[gpu]:
                # scanning in index order, the first unused GPU met is the heap's minimum
                opened = self._open_gpu()
                assert opened == gpu, (opened, gpu)
                return self._put(instance_id, gpu, FULL_BOX, w, h)
            r = self._first_fitting(gpu, w, h)
            if r is not None:
                return self._put(instance_id, gpu, r, w, h)
        raise self._no_capacity(instance_id, w, h)


class BestFitPlacer(_RebuildOnRelease):
    """``"best-fit"`` — among in-use GPUs that fit, the one whose total free area after
    placement is smallest (ties: lower index), bottom-left within it; the lowest-index unused
    GPU when none fits. A sorted (free area, gpu) index avoids scanning every GPU."""

    name: ClassVar[str] = "best-fit"

    def __init__(self, max_gpus: int) -> None:
        super().__init__(max_gpus)
        self._free_area: list[float] = [GPU_WIDTH * GPU_HEIGHT] * max_gpus
        self._by_free: list[tuple[float, int]] = []
        """Sorted (free area, gpu) of in-use GPUs."""

    def _place(self, instance_id: str, w: float, h: float) -> Binding:
        need = w * h
        start = bisect_left(self._by_free, (round(need, AREA_KEY_DIGITS) - AREA_KEY_TOL,))
        for _, gpu in islice(self._by_free, start, None):
            r = self._first_fitting(gpu, w, h)
            if r is not None:
                self._reindex_area(gpu, -need)
                return self._put(instance_id, gpu, r, w, h)
        gpu_new = self._open_gpu()
        if gpu_new is None:
            raise self._no_capacity(instance_id, w, h)
        b = self._put(instance_id, gpu_new, FULL_BOX, w, h)
        self._reindex_area(gpu_new, -need)
        return b

    def _release(self, instance_id: str) -> None:
        w, h = self._size[instance_id]
        gpu = self._bindings[instance_id].gpu
        super()._release(instance_id)
        self._reindex_area(gpu, w * h)

    def _reindex_area(self, gpu: int, delta: float) -> None:
        """Change a GPU's free area by ``delta`` and keep ``_by_free`` in step (only GPUs with
        instances are listed; call after binding on a new GPU, before releasing from one)."""
        old = (round(self._free_area[gpu], AREA_KEY_DIGITS), gpu)
        i = bisect_left(self._by_free, old)
        if i < len(self._by_free) and self._by_free[i] == old:
            del self._by_free[i]
        if self._on_gpu[gpu]:
            self._free_area[gpu] = _snap(self._free_area[gpu] + delta)
            insort(self._by_free, (round(self._free_area[gpu], AREA_KEY_DIGITS), gpu))
        else:
            self._free_area[gpu] = GPU_WIDTH * GPU_HEIGHT


# -- "time-share": KubeShare-style time sharing --------------------------------------------------


class _LeftmostAtLeast:
    """A max segment tree over GPU indices: ``find(t)`` is the lowest index whose value is
    ``>= t`` in O(log n) — first fit without scanning every GPU."""

    def __init__(self, n: int, value: float) -> None:
        self._size = 1
        while self._size < n:
            self._size *= 2
        self._t = [-math.inf] * (2 * self._size)
        for i in range(n):
            self._t[self._size + i] = value
        for i in range(self._size - 1, 0, -1):
            self._t[i] = max(self._t[2 * i], self._t[2 * i + 1])

    def set(self, i: int, value: float) -> None:
        i += self._size
        self._t[i] = value
        i //= 2
        while i:
            self._t[i] = max(self._t[2 * i], self._t[2 * i + 1])
            i //= 2

    def find(self, t: float) -> int | None:
        if self._t[1] < t:
            return None
        i = 1
        while i < self._size:
            i = 2 * i if self._t[2 * i] >= t else 2 * i + 1
        return i - self._size


class TimeSharePlacer(Placer):
    """``"time-share"`` — KubeShare-style temporal sharing (Yeh et al., 2020; the baseline of
    FaST-GShare Fig. 11). Every instance gets 100 % of the SMs (its height is forced to 100);
    a GPU fits an instance when its remaining quota (100 - sum of quotas) does — KubeShare's
    feasibility test — and the lowest-index such GPU is chosen (first fit on the quota axis).
    The instance takes the leftmost free time interval that is long enough; if the free quota
    is split into shorter gaps, the GPU's intervals are compacted to the left first (reported
    as ``Move``; a pure time-sharing mechanism ignores time offsets anyway)."""

    name: ClassVar[str] = "time-share"

    def __init__(self, max_gpus: int) -> None:
        super().__init__(max_gpus)
        self._free_q: list[float] = [GPU_WIDTH] * max_gpus
        self._tree = _LeftmostAtLeast(max_gpus, GPU_WIDTH)

    def _place(self, instance_id: str, w: float, h: float) -> Binding:
        gpu = self._tree.find(w - GEOM_EPS)
        if gpu is None:
            raise self._no_capacity(instance_id, w, h)
        x = self._leftmost_gap(gpu, w)
        if x is None:
            self._compact(gpu)
            x = self._leftmost_gap(gpu, w)
            assert x is not None, "compacted GPU with enough free quota has a gap"
        self._free_q[gpu] = _snap(self._free_q[gpu] - w)
        self._tree.set(gpu, self._free_q[gpu])
        return self._bind(instance_id, gpu, (x, 0.0, _snap(x + w), GPU_HEIGHT))

    def _release(self, instance_id: str) -> None:
        w, _ = self._size[instance_id]
        gpu, _box = self._unbind(instance_id)
        self._free_q[gpu] = GPU_WIDTH if not self._on_gpu[gpu] else _snap(self._free_q[gpu] + w)
        self._tree.set(gpu, self._free_q[gpu])

    def _intervals(self, gpu: int) -> list[tuple[float, float]]:
        return sorted((b[0], b[2]) for b in self._on_gpu[gpu].values())

    def _gaps(self, gpu: int) -> list[tuple[float, float]]:
        gaps: list[tuple[float, float]] = []
        x = 0.0
        for x1, x2 in self._intervals(gpu):
            if x1 > x + GEOM_EPS:
                gaps.append((x, x1))
            x = max(x, x2)
        if x < GPU_WIDTH - GEOM_EPS:
            gaps.append((x, GPU_WIDTH))
        return gaps

    def _leftmost_gap(self, gpu: int, w: float) -> float | None:
        for x1, x2 in self._gaps(gpu):
            if x2 - x1 >= w - GEOM_EPS:
                return x1
        return None

    def _compact(self, gpu: int) -> None:
        x = 0.0
        for iid, _box in sorted(self._on_gpu[gpu].items(), key=lambda kv: (kv[1][0], kv[0])):
            w = self._size[iid][0]
            self._move(iid, gpu, (x, 0.0, _snap(x + w), GPU_HEIGHT))
            x = _snap(x + w)

    def free_rects(self, gpu: int) -> list[Rect]:
        self._check_gpu(gpu)
        return [Rect(x1, 0.0, _snap(x2 - x1), GPU_HEIGHT) for x1, x2 in self._gaps(gpu)]
