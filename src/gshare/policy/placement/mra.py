"""``"mra"`` — FaST-GShare's Maximal Rectangles Algorithm (§3.4.2, Algorithm 2).

Global best-area fit over every in-use GPU's free list, bottom-left placement keeping both
maximal splits, intersection update with Subdivide, removal of contained rectangles,
"keep-restructure" on release and a re-pack of a GPU whose free list grows past
``repack_threshold`` (the NOTE in ``MaxRectsPlacer``).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from itertools import islice
from typing import ClassVar, Final

from gshare.policy.placement.base import Binding, _MaxRectsPlacer
from gshare.policy.placement.geometry import (
    AREA_KEY_DIGITS,
    AREA_KEY_TOL,
    FULL_BOX,
    Box,
    _add_back,
    _area,
    _bl_key,
    _cut,
    _fits,
    _maximal_free,
    _place_and_new_joint_rect,
)
from gshare.resources import GEOM_EPS

DEFAULT_REPACK_THRESHOLD: Final[int] = 16
"""Default length of a GPU's free list above which ``"mra"`` re-packs that GPU. The paper gives
no number ("a certain threshold"); 16 fires only on a GPU whose free space has split unusually
(a re-pack moves instances: not to be done often). How it was chosen:
``docs/journal/placement.md``."""

_AreaKey = tuple[float, int, float, float, float, float]
"""Global index entry: (area, gpu, y1, x1, x2, y2) of one free rectangle of an in-use GPU."""


def _area_key(gpu: int, r: Box) -> _AreaKey:
    return (round(_area(r), AREA_KEY_DIGITS), gpu, r[1], r[0], r[2], r[3])


class MaxRectsPlacer(_MaxRectsPlacer):
    """``"mra"`` — FaST-GShare's Maximal Rectangles Algorithm (§3.4.2).

    Parameters: ``max_gpus``; ``repack_threshold`` (default ``DEFAULT_REPACK_THRESHOLD``), the
    free-list length above which a GPU is re-packed; ``merge_on_release`` (default True): join
    the released rectangle with its free neighbours (see the NOTE; False is the letter of the
    paper: add it back and drop contained rectangles only). ``repacks`` counts re-packs.
    """

    name: ClassVar[str] = "mra"

    def __init__(
        self,
        max_gpus: int,
        repack_threshold: int = DEFAULT_REPACK_THRESHOLD,
        merge_on_release: bool = True,
    ) -> None:
        if repack_threshold < 2:
            raise ValueError(f"repack_threshold must be >= 2, got {repack_threshold}")
        super().__init__(max_gpus)
        self.repack_threshold: Final[int] = repack_threshold
        self.merge_on_release: Final[bool] = merge_on_release
        self.repacks = 0
        """Re-packs so far (each re-initialises one GPU and re-places its instances)."""
        self._index: list[_AreaKey] = []
        """Sorted area keys of every free rectangle of every in-use GPU (unused GPUs are not
        indexed: their full rectangle only matters when nothing in use fits)."""

    # NOTE — Maximal Rectangles Algorithm (FaST-GShare §3.4.2, Algorithm 2; after Jylänki 2010).
    # Invariant: every GPU's free list covers exactly its free space; its rectangles may
    # overlap, none lies inside another, and they are kept in bottom-left order. In-use GPUs'
    # rectangles are in the global sorted index (area, gpu, y, x); unused GPUs (one full
    # rectangle each, which no in-use GPU has) are not.
    # Rule, to place F = (w, h):
    #   line 1   best matching: over the free lists of all in-use GPUs, the rectangle R_t^k
    #            that fits F with the least Area(R) - Area(F) ("secondCores" difference); ties
    #            go to the lower GPU index, then bottom-left. The lowest-index unused GPU is
    #            opened only when nothing in use fits ("a new GPU required", line 3).
    #   line 6   PlaceAndNewJointRect: F goes to R_t^k's bottom-left corner and BOTH maximal
    #            splits of the rest, R' (right, full height) and R'' (top, full width), are kept.
    #   l. 9-18  intersection update: every other free rectangle that F overlaps is replaced by
    #            its Subdivide pieces (left/right/below/above F, up to 4, each maximal).
    #   l. 19-25 rectangles contained in another are removed.
    # Release ("keep-restructure"): the freed rectangle rejoins the list as it was and free
    # rectangles inside it are removed; with ``merge_on_release`` (default; the paper's "smaller
    # resource rectangles inside larger rectangles are merged") it is also joined with each free
    # neighbour whose side spans its own, and so on for every joint. The last instance leaving
    # re-initialises the GPU. A list longer than ``repack_threshold`` re-initialises the GPU as
    # one W x H rectangle and re-places its instances with the same steps, largest area first
    # (changes reported as ``Move``).
    # Reading of the pseudo-code: line 1's constraint is taken as w_F <= w_R and h_F <= h_R (the
    # text: a rectangle that satisfies the pod), and lines 10-14 replace R by its pieces.
    # Why these readings, and measurements: docs/journal/placement.md.

    def _place(self, instance_id: str, w: float, h: float) -> Binding:
        found = self._best_area_fit(w, h)
        if found is None:
            gpu = self._open_gpu()
            if gpu is None:
                raise self._no_capacity(instance_id, w, h)
            chosen = FULL_BOX
        else:
            gpu, chosen = found
        free = self._free[gpu]
        placed, joint = _place_and_new_joint_rect(chosen, w, h)  # line 6
        rest = (r for r in free if r != chosen)  # line 7: (L_t - R_t^k) ∪ {R', R''}
        self._set_free(gpu, _cut(rest, placed, joint))  # lines 9-25
        binding = self._bind(instance_id, gpu, placed)
        if len(self._free[gpu]) > self.repack_threshold:
            self._repack(gpu, new_instance=instance_id)
            binding = self._bindings[instance_id]
        return binding

    def _release(self, instance_id: str) -> None:
        gpu, box = self._unbind(instance_id)
        if not self._on_gpu[gpu]:
            self._emptied(gpu)
            return
        self._set_free(gpu, _add_back(self._free[gpu], box, merge=self.merge_on_release))
        if len(self._free[gpu]) > self.repack_threshold:
            self._repack(gpu)

    def _best_area_fit(self, w: float, h: float) -> tuple[int, Box] | None:
        """Algorithm 2, line 1: argmin Area(R) - Area(F) over every in-use GPU's free list."""
        idx = self._index
        start = bisect_left(idx, (round(w * h, AREA_KEY_DIGITS) - AREA_KEY_TOL,))
        for _, gpu, y1, x1, x2, y2 in islice(idx, start, None):
            if x2 - x1 >= w - GEOM_EPS and y2 - y1 >= h - GEOM_EPS:
                return gpu, (x1, y1, x2, y2)
        return None

    def _repack(self, gpu: int, new_instance: str | None = None) -> None:
        """Re-initialise ``gpu`` as one full rectangle and re-place its instances, largest area
        first (ties: taller, wider, id), each by best-area fit and the same restructuring.
        Instances that change rectangle are reported as ``Move`` (not ``new_instance``, placed
        in this very call). Should the order not fit (possible: it is a heuristic), the GPU
        keeps its layout and its free list is rebuilt as the exact maximal rectangles."""
        self.repacks += 1
        on_gpu = self._on_gpu[gpu]
        order = sorted(
            on_gpu,
            key=lambda i: (
                -self._size[i][0] * self._size[i][1],
                -self._size[i][1],
                -self._size[i][0],
                i,
            ),
        )
        free: list[Box] = [FULL_BOX]
        layout: dict[str, Box] = {}
        for iid in order:
            w, h = self._size[iid]
            fitting = [r for r in free if _fits(r, w, h)]
            if not fitting:
                self._set_free(gpu, _maximal_free(on_gpu.values()))
                return
            chosen = min(fitting, key=lambda r: (round(_area(r), AREA_KEY_DIGITS), _bl_key(r)))
            placed, joint = _place_and_new_joint_rect(chosen, w, h)
            free = _cut((r for r in free if r != chosen), placed, joint)
            layout[iid] = placed
        self._set_free(gpu, free)
        for iid in order:
            self._move(iid, gpu, layout[iid], report=iid != new_instance)

    def _set_free(self, gpu: int, free: list[Box]) -> None:
        """Replace the free list and update the global index (in-use GPUs only)."""
        old = self._free[gpu]
        self._free[gpu] = free
        idx = self._index
        # indexed iff in use, i.e. iff its list is not the single full rectangle
        was_indexed = old != [FULL_BOX]
        now_indexed = free != [FULL_BOX]
        old_set = set(old) if was_indexed else set()
        new_set = set(free) if now_indexed else set()
        for r in old_set - new_set:
            k = _area_key(gpu, r)
            i = bisect_left(idx, k)
            if i < len(idx) and idx[i] == k:
                del idx[i]
        for r in new_set - old_set:
            insort(idx, _area_key(gpu, r))
