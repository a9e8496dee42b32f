"""Geometry of the placement plane: rectangles as boxes, and the free-rectangle maintenance of
Maximal Rectangles (FaST-GShare §3.4.2, Algorithm 2; after Jylänki 2010).

A GPU is a ``GPU_WIDTH`` x ``GPU_HEIGHT`` (100 x 100) square: x is time (% of every token
window), y is SMs (%). The placers work on ``Box`` tuples ``(x1, y1, x2, y2)`` (plain tuples
are ~10x cheaper than ``Rect``); the functions with a leading underscore are this package's
internal API on boxes, the others are their ``Rect``-typed public versions (for tests, plots
and other policies).

Tolerance: ``GEOM_EPS`` (``gshare.resources``), the one geometric tolerance shared with
``Rect``; coordinates are snapped to ``SNAP_DIGITS`` decimals to keep it valid.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from gshare.resources import GEOM_EPS, GPU_HEIGHT, GPU_WIDTH, Rect

SNAP_DIGITS: Final[int] = 9
"""Coordinates and sizes are rounded to this many decimals (finer than ``GEOM_EPS``)."""

Box = tuple[float, float, float, float]
"""Internal rectangle ``(x1, y1, x2, y2)``: plain tuples are ~10x cheaper than ``Rect``."""
FULL_BOX: Final[Box] = (0.0, 0.0, GPU_WIDTH, GPU_HEIGHT)
"""A whole GPU as one box."""
AREA_KEY_DIGITS: Final[int] = 6
"""Areas in the placers' sorted indexes are rounded to this many decimals ..."""
AREA_KEY_TOL: Final[float] = 10.0**-AREA_KEY_DIGITS
"""... and an index scan for area ``a`` starts at ``round(a, AREA_KEY_DIGITS) - AREA_KEY_TOL``."""


def _snap(v: float) -> float:
    return round(v, SNAP_DIGITS)


# -- boxes (package-internal: the placers of this package call these) --------------------------


def _overlap(a: Box, b: Box) -> bool:
    """True when the interiors of ``a`` and ``b`` intersect (touching edges do not)."""
    return (
        a[0] < b[2] - GEOM_EPS
        and b[0] < a[2] - GEOM_EPS
        and a[1] < b[3] - GEOM_EPS
        and b[1] < a[3] - GEOM_EPS
    )


def _inside(inner: Box, outer: Box) -> bool:
    """True when ``inner`` lies in ``outer`` (edges may touch)."""
    return (
        inner[0] >= outer[0] - GEOM_EPS
        and inner[1] >= outer[1] - GEOM_EPS
        and inner[2] <= outer[2] + GEOM_EPS
        and inner[3] <= outer[3] + GEOM_EPS
    )


def _fits(r: Box, w: float, h: float) -> bool:
    return r[2] - r[0] >= w - GEOM_EPS and r[3] - r[1] >= h - GEOM_EPS


def _area(r: Box) -> float:
    return (r[2] - r[0]) * (r[3] - r[1])


def _bl_key(r: Box) -> tuple[float, float, float, float]:
    """Bottom-left order: lowest SM offset first, then earliest time offset."""
    return (r[1], r[0], r[3], r[2])


def _to_rect(r: Box) -> Rect:
    return Rect(r[0], r[1], _snap(r[2] - r[0]), _snap(r[3] - r[1]))


def _to_box(r: Rect) -> Box:
    return (_snap(r.x), _snap(r.y), _snap(r.x2), _snap(r.y2))


def _subdivide(r: Box, i: Box) -> list[Box]:
    """Algorithm 2's Subdivide: the (up to 4) maximal pieces of ``r`` outside ``i``.

    Each piece spans ``r`` fully in one dimension (left, right, bottom, top of ``i``); they
    overlap each other, and their union is ``r`` minus ``i``. The caller checks that ``r`` and
    ``i`` overlap.
    """
    x1, y1, x2, y2 = r
    out: list[Box] = []
    if i[0] > x1 + GEOM_EPS:
        out.append((x1, y1, i[0], y2))  # left of i
    if i[2] < x2 - GEOM_EPS:
        out.append((i[2], y1, x2, y2))  # right of i
    if i[1] > y1 + GEOM_EPS:
        out.append((x1, y1, x2, i[1]))  # below i
    if i[3] < y2 - GEOM_EPS:
        out.append((x1, i[3], x2, y2))  # above i
    return out


def _cut(free: Iterable[Box], placed: Box, extra: Sequence[Box] = ()) -> list[Box]:
    """Algorithm 2, lines 9-25: intersection update of every free rectangle with ``placed``
    (Subdivide), then removal of rectangles contained in others; ``extra`` are pieces already
    split off (PlaceAndNewJointRect's R', R''). Returns the list in bottom-left order.

    Only new pieces can be redundant: untouched rectangles were mutually non-contained before
    (the invariant every mutation keeps), and a piece lies inside the rectangle it came from,
    so an untouched rectangle inside a piece would have been inside that rectangle.
    """
    kept: list[Box] = []
    pieces: list[Box] = list(extra)
    for r in free:
        if _overlap(r, placed):
            pieces.extend(_subdivide(r, placed))
        else:
            kept.append(r)
    out = kept
    for i, p in enumerate(pieces):
        if any(_inside(p, k) for k in kept):
            continue
        redundant = False
        for j, q in enumerate(pieces):
            # drop p inside a different piece; of two equal pieces keep the first
            if j != i and _inside(p, q) and (j < i or not _inside(q, p)):
                redundant = True
                break
        if not redundant:
            out.append(p)
    out.sort(key=_bl_key)
    return out


def _place_and_new_joint_rect(r: Box, w: float, h: float) -> tuple[Box, list[Box]]:
    """Algorithm 2, line 6: put a ``w`` x ``h`` rectangle at the bottom-left corner of free
    rectangle ``r`` and return it with BOTH maximal splits of the rest of ``r`` (Fig. 6):
    R' to its right (full height of ``r``) and R'' above it (full width of ``r``). They
    overlap; keeping both instead of one guillotine cut is what makes the list "maximal"."""
    placed = (r[0], r[1], _snap(r[0] + w), _snap(r[1] + h))
    return placed, _subdivide(r, placed)


def _add_back(free: Sequence[Box], released: Box, merge: bool = True) -> list[Box]:
    """Keep-restructure (§3.4.2): the released rectangle rejoins the free list as it was, and
    free rectangles now contained in it are removed (they merge into it). With ``merge`` the
    new rectangle is also joined with its free neighbours (``_joints``), and so is every
    rectangle that creates, until nothing new appears; rectangles contained in a joint are
    removed. The list stays a cover of the free space with no rectangle inside another."""
    if any(_inside(released, r) for r in free):  # cannot happen for an allocated rectangle
        return list(free)
    out = [r for r in free if not _inside(r, released)]
    out.append(released)
    work = [released] if merge else []
    while work:
        a = work.pop()
        if a not in out:  # swallowed by a later joint
            continue
        for b in list(out):
            for u in _joints(a, b):
                if not any(_inside(u, r) for r in out):
                    out = [r for r in out if not _inside(r, u)]
                    out.append(u)
                    work.append(u)
    out.sort(key=_bl_key)
    return out


def _joints(a: Box, b: Box) -> list[Box]:
    """Free rectangles spanned by two free rectangles that touch or overlap: when one's span
    in y contains the other's, the band of the narrower one stretched over both x-ranges is
    free (every point lies in one of them); likewise with x and y swapped."""
    out: list[Box] = []
    if a[0] <= b[2] + GEOM_EPS and b[0] <= a[2] + GEOM_EPS:  # x-ranges touch or overlap
        lo, hi = min(a[0], b[0]), max(a[2], b[2])
        if b[1] <= a[1] + GEOM_EPS and a[3] <= b[3] + GEOM_EPS:
            out.append((lo, a[1], hi, a[3]))
        elif a[1] <= b[1] + GEOM_EPS and b[3] <= a[3] + GEOM_EPS:
            out.append((lo, b[1], hi, b[3]))
    if a[1] <= b[3] + GEOM_EPS and b[1] <= a[3] + GEOM_EPS:  # y-ranges touch or overlap
        lo, hi = min(a[1], b[1]), max(a[3], b[3])
        if b[0] <= a[0] + GEOM_EPS and a[2] <= b[2] + GEOM_EPS:
            out.append((a[0], lo, a[2], hi))
        elif a[0] <= b[0] + GEOM_EPS and b[2] <= a[2] + GEOM_EPS:
            out.append((b[0], lo, b[2], hi))
    return [u for u in out if u != a and u != b]


def _maximal_free(allocated: Iterable[Box]) -> list[Box]:
    """The maximal free rectangles of a GPU holding ``allocated``: start from the full GPU and
    cut every allocated rectangle out (each cut keeps the list exactly maximal)."""
    free: list[Box] = [FULL_BOX]
    for a in allocated:
        free = _cut(free, a)
    return free


def _remove_contained(rects: Sequence[Box]) -> list[Box]:
    out: list[Box] = []
    for i, p in enumerate(rects):
        if not any(
            j != i and _inside(p, q) and (j < i or not _inside(q, p)) for j, q in enumerate(rects)
        ):
            out.append(p)
    return out


# -- public, Rect-typed versions (for tests, plots and other policies) -------------------------


def subdivide(r: Rect, i: Rect) -> list[Rect]:
    """Subdivide ``r`` around ``i`` (Algorithm 2, line 13): the up-to-4 maximal pieces of ``r``
    outside ``i`` (left, right, below, above); ``[r]`` when they do not overlap."""
    rb, ib = _to_box(r), _to_box(i)
    if not _overlap(rb, ib):
        return [r]
    return [_to_rect(p) for p in _subdivide(rb, ib)]


def place_and_new_joint_rect(
    r: Rect, width_pct: float, height_pct: float
) -> tuple[Rect, list[Rect]]:
    """PlaceAndNewJointRect(r, F, "BottomLeft") (Algorithm 2, line 6): the placed rectangle and
    the maximal splits R' (right of it) and R'' (above it) that are not empty."""
    if not _fits(_to_box(r), width_pct, height_pct):
        raise ValueError(f"{width_pct:g} x {height_pct:g} does not fit in {r}")
    placed, splits = _place_and_new_joint_rect(_to_box(r), width_pct, height_pct)
    return _to_rect(placed), [_to_rect(s) for s in splits]


def remove_contained(rects: Sequence[Rect]) -> list[Rect]:
    """Algorithm 2, lines 19-25: drop every rectangle contained in another (one of equal
    rectangles survives); order is kept."""
    return [_to_rect(b) for b in _remove_contained([_to_box(r) for r in rects])]


def maximal_free_rects(allocated: Iterable[Rect]) -> list[Rect]:
    """All maximal free rectangles of a GPU whose allocated rectangles are ``allocated``."""
    return [_to_rect(b) for b in _maximal_free(_to_box(r) for r in allocated)]
