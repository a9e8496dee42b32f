"""Placement: which GPU and which free rectangle of it an instance gets (docs/DESIGN.md §3).

A GPU is a 100 x 100 square: x is time (% of every token window), y is SMs (%). An instance with
quota ``w`` % and SM share ``h`` % gets a ``w`` x ``h`` rectangle (``Rect``: x = time offset,
y = SM offset); the rectangles of one GPU never overlap, so together they are a feasible static
schedule (FaST-GShare §3.4.2, Fig. 6).

Who calls it: the controller of each world — the simulator (``sim``) and the live runtime
(``runtime``) — owns one ``Placer`` per cluster. It calls ``place`` for every instance the
autoscaler starts and ``release`` for every instance it stops, then ``take_moves`` and applies
any ``Move`` (an instance whose rectangle a re-pack changed: new MPS SM band / time offset; or,
with ``"mra-defrag"`` / ``"mra-room"``, an instance moved to another GPU: start a replacement
there, drain the old one).
The placer is the policy's explicit state: it holds the free-space bookkeeping and returns every
decision as typed data (``Binding``, ``Move``); it does no I/O and reads no clock.

Placers (registry ``PLACERS``, built by ``make_placer``):

* ``"mra"`` — FaST-GShare's Maximal Rectangles Algorithm (§3.4.2, Algorithm 2):
  global best-area fit over every GPU's free list, bottom-left placement keeping both maximal
  splits, intersection update with Subdivide, removal of contained rectangles,
  "keep-restructure" on release and a re-pack of a GPU whose free list grows past
  ``repack_threshold``;
* ``"mra-defrag"`` — ``"mra"`` plus gshare's cross-GPU defragmentation (not in the paper):
  after a release, a sparse GPU (allocated area < ``sparse_pct``) whose instances all fit on
  the other GPUs in use is emptied into them by MRA's best-area fit (all-or-nothing, at most
  one GPU per release, only while GPUs used exceed the area bound by ``margin_pct``);
* ``"mra-room"`` — ``"mra-defrag"`` plus making room at arrival (gshare's, not in the paper):
  when nothing in use fits, up to ``room_max_moves`` instances blocking a spot on a fairly
  empty GPU are moved to other GPUs instead of opening one; drains and these moves share one
  migration budget (``max_migrations_per_release`` x releases + ``migration_burst``);
* ``"first-fit"`` — the lowest-index GPU whose maximal-rectangles free list fits, bottom-left;
* ``"best-fit"`` — the GPU with the least free area after placement (that fits), bottom-left;
* ``"time-share"`` — KubeShare-style time sharing (Yeh et al., 2020, the paper's baseline):
  every instance takes 100 % of the SMs, GPUs are filled first-fit along the quota axis.

What holds after every call (tested by properties in ``tests/policy/test_placement.py``):

* the rectangles of one GPU never overlap and lie inside its 100 x 100 square;
* free rectangles lie inside the GPU, never intersect an allocated rectangle, and together
  cover all of its free space (no capacity is ever lost);
* ``gpus_used`` is the number of GPUs with at least one instance; releasing every instance
  leaves every GPU as one full free rectangle.

Units: widths and heights are percentages (``_pct``); an area is quota % x SM % (a full GPU is
10,000, FaST-GShare's "secondCores").

Modules: ``geometry`` (boxes, free-rectangle maintenance, the public rectangle functions),
``base`` (``Binding``, ``Move``, errors, the ``Placer`` base class), ``mra``, ``defrag``, ``room``,
``baselines`` (first fit, best fit, time sharing) and ``registry`` (``PLACERS``,
``make_placer``). Tuning notes and measurements: ``docs/journal/placement.md``.
"""

from __future__ import annotations

from gshare.policy.placement.base import (
    Binding,
    Move,
    NoCapacity,
    Placer,
    UnknownInstance,
    UnknownPlacer,
)
from gshare.policy.placement.baselines import BestFitPlacer, FirstFitPlacer, TimeSharePlacer
from gshare.policy.placement.defrag import (
    DEFAULT_DEFRAG_MARGIN_PCT,
    DEFAULT_DEFRAG_SPARSE_PCT,
    DefragMaxRectsPlacer,
)
from gshare.policy.placement.geometry import (
    maximal_free_rects,
    place_and_new_joint_rect,
    remove_contained,
    subdivide,
)
from gshare.policy.placement.mra import DEFAULT_REPACK_THRESHOLD, MaxRectsPlacer
from gshare.policy.placement.registry import PLACERS, make_placer
from gshare.policy.placement.room import (
    DEFAULT_MAX_MIGRATIONS_PER_RELEASE,
    DEFAULT_MIGRATION_BURST,
    DEFAULT_ROOM_MAX_MOVES,
    DEFAULT_ROOM_SPARSE_PCT,
    RoomDefragPlacer,
)

__all__ = [
    "DEFAULT_DEFRAG_MARGIN_PCT",
    "DEFAULT_DEFRAG_SPARSE_PCT",
    "DEFAULT_MAX_MIGRATIONS_PER_RELEASE",
    "DEFAULT_MIGRATION_BURST",
    "DEFAULT_REPACK_THRESHOLD",
    "DEFAULT_ROOM_MAX_MOVES",
    "DEFAULT_ROOM_SPARSE_PCT",
    "PLACERS",
    "BestFitPlacer",
    "Binding",
    "DefragMaxRectsPlacer",
    "FirstFitPlacer",
    "MaxRectsPlacer",
    "Move",
    "NoCapacity",
    "Placer",
    "RoomDefragPlacer",
    "TimeSharePlacer",
    "UnknownInstance",
    "UnknownPlacer",
    "make_placer",
    "maximal_free_rects",
    "place_and_new_joint_rect",
    "remove_contained",
    "subdivide",
]
