"""``"mra-defrag"`` — ``"mra"`` plus gshare's cross-GPU defragmentation (not in FaST-GShare).

After a release, a sparse GPU (allocated area < ``sparse_pct``) whose instances all fit on the
other GPUs in use is emptied into them by MRA's best-area fit (all-or-nothing, at most one GPU
per release, only while GPUs used exceed the area bound by ``margin_pct``); the NOTE in
``DefragMaxRectsPlacer`` states the rule, its measurements are in ``docs/journal/placement.md``.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Iterable
from itertools import islice
from typing import ClassVar, Final

from gshare.policy.placement.base import Binding
from gshare.policy.placement.geometry import (
    AREA_KEY_DIGITS,
    AREA_KEY_TOL,
    Box,
    _area,
    _cut,
    _fits,
    _place_and_new_joint_rect,
)
from gshare.policy.placement.mra import (
    DEFAULT_REPACK_THRESHOLD,
    MaxRectsPlacer,
    _area_key,
    _AreaKey,
)
from gshare.resources import GEOM_EPS, GPU_HEIGHT, GPU_WIDTH

DEFAULT_DEFRAG_SPARSE_PCT: Final[float] = 50.0
"""A GPU whose allocated area is below this % of a GPU (5,000 of 10,000) is *sparse*: a candidate
for ``"mra-defrag"`` to drain. Chosen on ``packing-scale`` as the lowest value that keeps GPUs
used / area bound under 1.10 (``docs/journal/placement.md``)."""
DEFAULT_DEFRAG_MARGIN_PCT: Final[float] = 5.0
"""``"mra-defrag"`` drains only while GPUs used > area bound x (1 + this / 100): near the bound a
migration cannot buy a GPU back, so none is made."""


class DefragMaxRectsPlacer(MaxRectsPlacer):
    """``"mra-defrag"`` — ``"mra"`` plus cross-GPU defragmentation, gshare's extension (not in
    FaST-GShare; see the NOTE). Also built by ``make_placer("mra", ..., defrag=True)``.

    It places exactly like ``"mra"`` (same index, steps, ties and re-packs). After every release
    it may drain one sparse GPU: all its instances move to other GPUs in use and it empties.
    Every instance moved is reported by ``take_moves`` as a ``Move`` with ``is_cross_gpu``; the
    controller starts the replacement on ``Move.gpu`` and drains the old instance. ``defragment``
    applies the same rule on demand (a controller's quiet moment, e.g. after a scale-down).

    Parameters: those of ``MaxRectsPlacer``; ``sparse_pct`` (default
    ``DEFAULT_DEFRAG_SPARSE_PCT``) and ``margin_pct`` (default ``DEFAULT_DEFRAG_MARGIN_PCT``).
    Counters: ``drains`` (GPUs emptied by defragmentation), ``migrations`` (instances moved
    across GPUs), ``drain_attempts`` (drains planned, successful or not).
    """

    name: ClassVar[str] = "mra-defrag"

    def __init__(
        self,
        max_gpus: int,
        repack_threshold: int = DEFAULT_REPACK_THRESHOLD,
        merge_on_release: bool = True,
        sparse_pct: float = DEFAULT_DEFRAG_SPARSE_PCT,
        margin_pct: float = DEFAULT_DEFRAG_MARGIN_PCT,
    ) -> None:
        if not (math.isfinite(sparse_pct) and 0 <= sparse_pct <= 100):
            raise ValueError(f"sparse_pct must be in [0, 100] %, got {sparse_pct}")
        if not (math.isfinite(margin_pct) and margin_pct >= 0):
            raise ValueError(f"margin_pct must be >= 0 %, got {margin_pct}")
        super().__init__(
            max_gpus, repack_threshold=repack_threshold, merge_on_release=merge_on_release
        )
        self.sparse_pct: Final[float] = sparse_pct
        self.margin_pct: Final[float] = margin_pct
        self.drains = 0
        self.migrations = 0
        self.drain_attempts = 0
        self._load: list[float] = [0.0] * max_gpus
        """Allocated area of every GPU (0 when unused)."""
        self._by_load: list[tuple[float, int]] = []
        """Sorted (allocated area, gpu) of in-use GPUs: the least-loaded GPU is the first."""
        self._total_area = 0.0

    def area_bound(self) -> int:
        """⌈Σ allocated area / 10,000⌉: no placement of the live instances uses fewer GPUs."""
        if not self._used:
            return 0
        return max(1, math.ceil(self._total_area / (GPU_WIDTH * GPU_HEIGHT) - 1e-6))

    # NOTE — cross-GPU defragmentation: gshare's extension of MRA, NOT in FaST-GShare (whose
    # §3.4.2 restructures and re-packs inside one GPU only). Moving a stateless serverless
    # instance = starting a replacement on another GPU and draining the old one.
    # Rule, run after every release:
    #   1. only while gpus_used > area_bound x (1 + margin_pct / 100);
    #   2. candidates, in order: the GPU the release left, then the least-loaded GPU in use
    #      (sorted (allocated area, gpu) index); a candidate must be *sparse*, allocated area
    #      < sparse_pct % of a GPU;
    #   3. drain = re-place ALL the candidate's instances, largest area first, on the OTHER
    #      GPUs in use with MRA's own steps (line 1 global best-area fit, line 6 bottom-left
    #      with both splits, lines 9-25 intersection update), planned on copies of the
    #      receivers' free lists. All-or-nothing: if one instance fits nowhere, nothing moves
    #      and the next candidate is tried. On success the GPU is empty (back in the unused
    #      pool) and a receiver whose list grew past ``repack_threshold`` is re-packed as in
    #      "mra". At most ONE GPU is drained per release.
    # ``defragment`` applies steps 1-3 on demand to the least-loaded sparse GPUs.
    # Invariant: a drain never opens a GPU, so gpus_used drops by exactly one per drain, and a
    # failed drain changes nothing; placement itself is exactly MRA's.
    # Why this rule, per-seed results and rejected variants: docs/journal/placement.md.
    # drain failed at release time; ``packing-scale`` does not call it (release-time drains
    # act as soon as a GPU turns sparse, which is when a drain buys most GPU-time per move).

    def _release(self, instance_id: str) -> None:
        gpu = self._bindings[instance_id].gpu
        super()._release(instance_id)
        if not self._over_margin():
            return
        sparse = self._sparse_below()
        candidates = [gpu] if self._on_gpu[gpu] and self._load[gpu] < sparse else []
        if self._by_load and self._by_load[0][0] < sparse and self._by_load[0][1] != gpu:
            candidates.append(self._by_load[0][1])
        for g in candidates:
            if self._drain(g):
                return

    def defragment(self, max_drains: int = 1) -> int:
        """Drain up to ``max_drains`` sparse GPUs, least-loaded first, while GPUs used exceed
        the area bound by the margin; return how many were emptied (moves via ``take_moves``).

        Who calls it: a controller at a moment without arrivals (e.g. after a scale-down), in
        addition to the drains ``release`` makes. Every sparse GPU is tried at most once."""
        if max_drains < 0:
            raise ValueError(f"max_drains must be >= 0, got {max_drains}")
        sparse = self._sparse_below()
        drained = 0
        for load, g in list(self._by_load):  # a snapshot: drains make receivers fuller
            if drained >= max_drains or load >= sparse or not self._over_margin():
                break
            if self._on_gpu[g] and self._load[g] < sparse and self._drain(g):
                drained += 1
        return drained

    def _sparse_below(self) -> float:
        return self.sparse_pct / 100 * GPU_WIDTH * GPU_HEIGHT

    def _over_margin(self) -> bool:
        return self._used > self.area_bound() * (1 + self.margin_pct / 100) + GEOM_EPS

    def _drain(self, g: int) -> bool:
        """Plan every instance of ``g`` onto the other in-use GPUs (NOTE, step 3) and apply
        the plan only if all fit. True when ``g`` was emptied."""
        self.drain_attempts += 1
        planned = self._plan_elsewhere(self._on_gpu[g], g)
        if planned is None:
            return False  # all-or-nothing: nothing has changed
        self._apply_plan(*planned)
        self._emptied(g)
        self.drains += 1
        self._repack_receivers(planned[0])
        return True

    def _plan_elsewhere(
        self, instances: Iterable[str], g: int
    ) -> tuple[dict[int, list[Box]], list[tuple[str, int, Box]]] | None:
        """Plan ``instances`` (all on GPU ``g``), largest area first, onto the in-use GPUs
        other than ``g`` with MRA's steps (NOTE, step 3), on copies of the receivers' free
        lists; changes nothing. Returns (receiver -> its free list after the plan, [(instance,
        receiver, rectangle)]), or None when one instance fits nowhere."""
        size = self._size
        order = sorted(
            instances,
            key=lambda i: (-size[i][0] * size[i][1], -size[i][1], -size[i][0], i),
        )
        planned: dict[int, list[Box]] = {}  # receivers' free lists after the plan so far
        plan: list[tuple[str, int, Box]] = []
        idx = self._index
        for iid in order:
            w, h = size[iid]
            best: _AreaKey | None = None
            # the global index holds the receivers' free lists as they are now: skip g and the
            # receivers already planned on, whose updated lists are scanned below
            start = bisect_left(idx, (round(w * h, AREA_KEY_DIGITS) - AREA_KEY_TOL,))
            for key in islice(idx, start, None):
                _, gpu, y1, x1, x2, y2 = key
                if (
                    gpu != g
                    and gpu not in planned
                    and x2 - x1 >= w - GEOM_EPS
                    and y2 - y1 >= h - GEOM_EPS
                ):
                    best = key
                    break
            for gpu, free in planned.items():
                for r in free:
                    if _fits(r, w, h):
                        k = _area_key(gpu, r)
                        if best is None or k < best:
                            best = k
            if best is None:
                return None
            gpu = best[1]
            chosen: Box = (best[3], best[2], best[4], best[5])
            placed, joint = _place_and_new_joint_rect(chosen, w, h)
            free = planned.get(gpu, self._free[gpu])
            planned[gpu] = _cut((r for r in free if r != chosen), placed, joint)
            plan.append((iid, gpu, placed))
        return planned, plan

    def _apply_plan(self, planned: dict[int, list[Box]], plan: list[tuple[str, int, Box]]) -> None:
        """Apply a plan of ``_plan_elsewhere``: the receivers' new free lists and every move
        (reported by ``take_moves``, counted in ``migrations``). The caller then rebuilds the
        source GPU and calls ``_repack_receivers``."""
        for gpu, free in planned.items():
            self._set_free(gpu, free)
        for iid, gpu, placed in plan:
            self._move(iid, gpu, placed)
        self.migrations += len(plan)

    def _repack_receivers(self, planned: dict[int, list[Box]]) -> None:
        """Re-pack (as "mra" does) each receiver of a plan whose free list grew past
        ``repack_threshold``."""
        for gpu in sorted(planned):
            if len(self._free[gpu]) > self.repack_threshold:
                self._repack(gpu)

    # -- load bookkeeping: every change of an instance's GPU goes through these three ---------

    def _bind(self, instance_id: str, gpu: int, box: Box) -> Binding:
        b = super()._bind(instance_id, gpu, box)
        self._add_load(gpu, _area(box))
        return b

    def _unbind(self, instance_id: str) -> tuple[int, Box]:
        gpu, box = super()._unbind(instance_id)
        self._add_load(gpu, -_area(box))
        return gpu, box

    def _move(self, instance_id: str, gpu: int, box: Box, *, report: bool = True) -> None:
        old_gpu = self._bindings[instance_id].gpu
        super()._move(instance_id, gpu, box, report=report)
        if old_gpu != gpu:
            self._add_load(old_gpu, -_area(box))
            self._add_load(gpu, _area(box))

    def _add_load(self, gpu: int, delta: float) -> None:
        """Change a GPU's allocated area by ``delta``; keep ``_by_load`` and the total in step
        (call after the instance maps have changed). Loads are kept rounded to the index's
        digits, so a load is its own key."""
        by = self._by_load
        old = (self._load[gpu], gpu)
        i = bisect_left(by, old)
        if i < len(by) and by[i] == old:
            del by[i]
        if self._on_gpu[gpu]:
            load = round(self._load[gpu] + delta, AREA_KEY_DIGITS)
            self._load[gpu] = load
            insort(by, (load, gpu))
        else:
            self._load[gpu] = 0.0
        self._total_area = self._total_area + delta if self._used else 0.0
