"""policy.placement: FaST-GShare's Maximal Rectangles Algorithm (§3.4.2) and the
baseline placers. Table-driven cases carry their arithmetic in comments; hypothesis properties
check the geometric invariants of every placer under random place/release sequences.

Notation in comments: a rectangle is (x, y)-(x2, y2), x = time %, y = SM %; a request is
"w x h" = quota % x SM %.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gshare.policy.placement import (
    DEFAULT_DEFRAG_MARGIN_PCT,
    DEFAULT_DEFRAG_SPARSE_PCT,
    DEFAULT_REPACK_THRESHOLD,
    PLACERS,
    Binding,
    DefragMaxRectsPlacer,
    MaxRectsPlacer,
    Move,
    NoCapacity,
    Placer,
    RoomDefragPlacer,
    UnknownInstance,
    UnknownPlacer,
    make_placer,
    maximal_free_rects,
    place_and_new_joint_rect,
    remove_contained,
    subdivide,
)
from gshare.resources import FULL_GPU, GpuShare, Rect

ALL = sorted(PLACERS)
SPATIAL = ["best-fit", "first-fit", "mra", "mra-defrag"]  # "mra-room" may move to avoid opening


def R(x1: float, y1: float, x2: float, y2: float) -> Rect:
    """A Rect from corners, to keep the tables readable."""
    return Rect(x1, y1, x2 - x1, y2 - y1)


# -- geometry -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("r", "i", "pieces"),
    [
        # i strictly inside r: all four maximal pieces, each spanning r in one dimension
        (
            R(0, 0, 100, 100),
            R(20, 30, 60, 50),
            [R(0, 0, 20, 100), R(60, 0, 100, 100), R(0, 0, 100, 30), R(0, 50, 100, 100)],
        ),
        # i over r's top-right corner: only the left and the bottom piece remain
        (R(0, 0, 50, 50), R(40, 40, 60, 60), [R(0, 0, 40, 50), R(0, 0, 50, 40)]),
        # i cuts a band through r: the pieces below and above
        (R(10, 10, 30, 90), R(0, 40, 100, 60), [R(10, 10, 30, 40), R(10, 60, 30, 90)]),
        # i covers r: nothing is left
        (R(10, 10, 20, 20), R(0, 0, 50, 50), []),
        # i only touches r's edge: no overlap, r stays whole
        (R(0, 0, 50, 50), R(50, 0, 100, 50), [R(0, 0, 50, 50)]),
    ],
)
def test_subdivide(r: Rect, i: Rect, pieces: list[Rect]) -> None:
    assert subdivide(r, i) == pieces


def test_place_and_new_joint_rect_keeps_both_maximal_splits() -> None:
    # free (10,20)-(60,80); F = 20 x 30 at its bottom-left corner -> (10,20)-(30,50)
    # R' = right of F, full height: (30,20)-(60,80); R'' = above F, full width: (10,50)-(60,80)
    # (they overlap in (30,50)-(60,80): both are kept, not one guillotine cut)
    placed, splits = place_and_new_joint_rect(R(10, 20, 60, 80), 20, 30)
    assert placed == R(10, 20, 30, 50)
    assert splits == [R(30, 20, 60, 80), R(10, 50, 60, 80)]
    # an exact fit leaves no split; a full-width one only the top one
    assert place_and_new_joint_rect(R(0, 0, 40, 40), 40, 40)[1] == []
    assert place_and_new_joint_rect(R(0, 0, 40, 40), 40, 10)[1] == [R(0, 10, 40, 40)]
    with pytest.raises(ValueError, match="does not fit"):
        place_and_new_joint_rect(R(0, 0, 40, 40), 50, 10)


def test_remove_contained() -> None:
    # (10,10)-(20,20) lies in (0,0)-(50,50); of two equal rectangles one survives
    rects = [R(0, 0, 50, 50), R(10, 10, 20, 20), R(0, 0, 50, 50), R(40, 0, 100, 100)]
    assert remove_contained(rects) == [R(0, 0, 50, 50), R(40, 0, 100, 100)]


@pytest.mark.parametrize(
    ("allocated", "free"),
    [
        ([], [FULL_GPU]),
        # 60 x 50 at the origin: right of it (60,0)-(100,100), above it (0,50)-(100,100)
        ([R(0, 0, 60, 50)], [R(60, 0, 100, 100), R(0, 50, 100, 100)]),
        # a centred 20 x 20 block leaves four overlapping maximal rectangles
        (
            [R(40, 40, 60, 60)],
            [R(0, 0, 40, 100), R(60, 0, 100, 100), R(0, 0, 100, 40), R(0, 60, 100, 100)],
        ),
        ([FULL_GPU], []),
    ],
)
def test_maximal_free_rects(allocated: list[Rect], free: list[Rect]) -> None:
    assert sorted(maximal_free_rects(allocated), key=lambda r: (r.y, r.x, r.w)) == sorted(
        free, key=lambda r: (r.y, r.x, r.w)
    )


# -- Algorithm 2 step by step -------------------------------------------------------------------


def test_mra_intersection_update_and_redundant_removal() -> None:
    p = make_placer("mra", max_gpus=1)
    # a = 60 x 50 -> (0,0)-(60,50); free R' = (60,0)-(100,100), R'' = (0,50)-(100,100)
    p.place("a", 60, 50)
    assert p.free_rects(0) == [R(60, 0, 100, 100), R(0, 50, 100, 100)]
    # b = 30 x 70 fits R' only (R'' is 50 high): area 4,000 - 2,100 -> (60,0)-(90,70)
    assert p.place("b", 30, 70).rect == R(60, 0, 90, 70)
    # split of R': right (90,0)-(100,100), top (60,70)-(100,100)
    # intersection update of R'' with b: left (0,50)-(60,100), right (90,50)-(100,100),
    #   above (0,70)-(100,100) (b starts below R'', so no piece below)
    # removal: (90,50)-(100,100) in (90,0)-(100,100); (60,70)-(100,100) in (0,70)-(100,100)
    assert p.free_rects(0) == [R(90, 0, 100, 100), R(0, 50, 60, 100), R(0, 70, 100, 100)]


def test_fast_fig11_case() -> None:
    # FaST Fig. 11: 4 ResNet (sm 12 %, quota 40 %), 2 RNNT (24 %, 40 %), 2 BERT (50 %, 60 %).
    # Areas 4 x 480 + 2 x 960 + 2 x 3,000 = 9,840 <= 10,000: in decreasing-area order MRA packs
    # all on one GPU: BERTs stacked at (0,0),(0,50) 60 wide; the 40 % column right of them
    # holds RNNTs at y 0, 24 and ResNets at y 48, 60, 72, 84 (up to 96); 40 x 4 stays free.
    # Time sharing takes 100 % SMs each: quotas 2 x 60 + 6 x 40 = 360 % -> >= 4 GPUs, and
    # first fit gives 60+40, 60+40, 40+40, 40+40 = exactly 4.
    pods = [("bert", 60, 50)] * 2 + [("rnnt", 40, 24)] * 2 + [("resnet", 40, 12)] * 4
    expected_gpus = {n: 1 for n in ALL} | {"time-share": 4}
    for name in ALL:
        p = make_placer(name, max_gpus=4)
        for k, (fn, w, h) in enumerate(pods):
            p.place(f"{fn}{k}", w, h)
        assert p.gpus_used() == expected_gpus[name], name
    p = make_placer("mra", max_gpus=4)
    rects = [p.place(f"{fn}{k}", w, h).rect for k, (fn, w, h) in enumerate(pods)]
    assert [(r.x, r.y) for r in rects] == [
        (0, 0),
        (0, 50),
        (60, 0),
        (60, 24),
        (60, 48),
        (60, 60),
        (60, 72),
        (60, 84),
    ]
    assert p.free_rects(0) == [R(60, 96, 100, 100)]
    assert sum(r.area for r in rects) == 9_840


def _two_gpu_state(name: str) -> Placer:
    # a = 50 x 100 and f = 50 x 100 fill GPU 0; b = 40 x 60 opens GPU 1 at (0,0); f leaves.
    # GPU 0 free: (50,0)-(100,100), area 5,000, total free 5,000.
    # GPU 1 free: (40,0)-(100,100) area 6,000 and (0,60)-(100,100) area 4,000; total 7,600.
    p = make_placer(name, max_gpus=2)
    p.place("a", 50, 100)
    p.place("f", 50, 100)
    assert p.place("b", 40, 60).gpu == 1
    p.release("f")
    return p


@pytest.mark.parametrize(
    ("name", "gpu", "corner"),
    [
        # c = 40 x 40 (area 1,600). MRA, global best area: GPU 1's (0,60)-(100,100) leaves
        # 4,000 - 1,600 = 2,400 < GPU 0's 5,000 - 1,600 = 3,400 -> GPU 1 at (0,60)
        ("mra", 1, (0, 60)),
        # first fit: GPU 0 is the first that fits -> (50,0)
        ("first-fit", 0, (50, 0)),
        # best fit by GPU free area after placement: GPU 0 5,000 - 1,600 = 3,400 <
        #   GPU 1 7,600 - 1,600 = 6,000 -> GPU 0, bottom-left (50,0)
        ("best-fit", 0, (50, 0)),
        # time sharing: GPU 0 has 50 % quota free -> its gap at x = 50
        ("time-share", 0, (50, 0)),
    ],
)
def test_gpu_choice_by_placer(name: str, gpu: int, corner: tuple[float, float]) -> None:
    c = _two_gpu_state(name).place("c", 40, 40)
    assert (c.gpu, (c.rect.x, c.rect.y)) == (gpu, corner)


def test_mra_ties_go_to_the_lower_gpu_then_bottom_left() -> None:
    # a, f = 50 x 100 fill GPU 0; b = 50 x 100 opens GPU 1; f leaves. Both GPUs now have one
    # free (50,0)-(100,100), area 5,000: for d = 30 x 30 both leave 5,000 - 900 = 4,100
    # -> tie -> GPU 0, at (50,0)
    p = make_placer("mra", max_gpus=2)
    p.place("a", 50, 100)
    p.place("f", 50, 100)
    assert p.place("b", 50, 100).gpu == 1
    p.release("f")
    assert p.place("d", 30, 30) == Binding("d", 0, R(50, 0, 80, 30))
    # one GPU with 20 x 20 at the origin has (20,0)-(100,100) and (0,20)-(100,100), both
    # 8,000: bottom-left picks y = 0 -> (20,0)
    q = make_placer("mra", max_gpus=1)
    q.place("a", 20, 20)
    assert q.place("b", 20, 20).rect == R(20, 0, 40, 20)


def test_mra_opens_the_lowest_unused_gpu_only_when_nothing_fits() -> None:
    p = make_placer("mra", max_gpus=3)
    p.place("a", 50, 100)  # GPU 0
    p.place("b", 60, 100)  # 60 > 50 free on GPU 0 -> GPU 1
    p.place("c", 60, 100)  # fits neither -> GPU 2
    p.release("b")  # GPU 1 empty again
    # an exact fit for 50 x 100 on GPU 0 (difference 0) beats opening GPU 1
    assert p.place("e", 50, 100).gpu == 0
    # 45 x 100 fits GPU 2's (60,0)-(100,100)? 40 < 45 no; nothing in use fits -> GPU 1
    assert p.place("g", 45, 100).gpu == 1
    assert p.gpus_used() == 3


# -- release: keep-restructure, merging, re-pack ---------------------------------------------------


def test_keep_restructure_returns_the_released_rectangle_for_exact_reuse() -> None:
    p = make_placer("mra", max_gpus=2)
    p.place("a", 50, 100)
    p.place("b", 50, 100)
    assert p.free_rects(0) == []
    p.release("a")
    # the freed (0,0)-(50,100) is back in the list as it was
    assert p.free_rects(0) == [R(0, 0, 50, 100)]
    # the next instance of the same shape finds it (area difference 0) instead of a new GPU
    assert p.place("a2", 50, 100) == Binding("a2", 0, R(0, 0, 50, 100))
    assert p.gpus_used() == 1


@pytest.mark.parametrize(
    ("merge", "free_after", "wide_gpu"),
    [
        # a = 50 x 100 at (0,0), b = 50 x 50 at (50,0), c = 50 x 50 at (50,50); b, then a leave.
        # Letter of the paper: the freed rectangles are only added back:
        #   (0,0)-(50,100) and (50,0)-(100,50); no rectangle holds 100 x 50 -> a new GPU
        (False, [R(0, 0, 50, 100), R(50, 0, 100, 50)], 1),
        # merging: (50,0)-(100,50) spans y 0..50 within a's 0..100 and touches it at x = 50
        #   -> joint (0,0)-(100,50); (50,0)-(100,50) is inside it and goes -> fits at (0,0)
        (True, [R(0, 0, 50, 100), R(0, 0, 100, 50)], 0),
    ],
)
def test_release_merge(merge: bool, free_after: list[Rect], wide_gpu: int) -> None:
    p = make_placer("mra", max_gpus=2, merge_on_release=merge)
    assert p.place("a", 50, 100).rect == R(0, 0, 50, 100)
    assert p.place("b", 50, 50).rect == R(50, 0, 100, 50)
    assert p.place("c", 50, 50).rect == R(50, 50, 100, 100)
    p.release("b")
    p.release("a")
    assert sorted(p.free_rects(0), key=lambda r: (r.y, r.x, r.w)) == free_after
    assert p.place("wide", 100, 50).gpu == wide_gpu


def test_repack_on_release_moves_instances_and_reports_them() -> None:
    p = make_placer("mra", max_gpus=1, repack_threshold=2)
    p.place("a", 20, 20)  # (0,0)-(20,20)
    p.place("b", 20, 20)  # both free rects 8,000 -> bottom-left (20,0)-(40,20)
    assert p.take_moves() == []
    assert len(p.free_rects(0)) == 2  # (40,0)-(100,100), (0,20)-(100,100)
    # a leaves: (0,0)-(20,20) comes back and merges with (0,20)-(100,100) into (0,0)-(20,100):
    # 3 free rectangles > threshold 2 -> re-pack: GPU = one 100 x 100, b re-placed at (0,0)
    p.release("a")
    assert p.repacks == 1
    assert p.take_moves() == [Move("b", 0, R(20, 0, 40, 20), R(0, 0, 20, 20))]
    assert p.take_moves() == []  # drained
    assert p.binding("b").rect == R(0, 0, 20, 20)
    assert p.free_rects(0) == [R(20, 0, 100, 100), R(0, 20, 100, 100)]


def test_repack_on_place_reorders_by_area_without_moving_the_new_instance() -> None:
    p = make_placer("mra", max_gpus=1, repack_threshold=2)
    p.place("a", 30, 30)  # (0,0)-(30,30)
    # b = 50 x 50 -> (30,0)-(80,50); free: (80,0)-(100,100), (0,30)-(30,100), (0,50)-(100,100)
    # = 3 > 2 -> re-pack, largest first: b at (0,0), then a at the bottom-left of
    # (50,0)-(100,100) / (0,50)-(100,100) (tie 5,000, y = 0 first) -> (50,0)
    b = p.place("b", 50, 50)
    assert b == Binding("b", 0, R(0, 0, 50, 50))
    assert p.take_moves() == [Move("a", 0, R(0, 0, 30, 30), R(50, 0, 80, 30))]


def test_default_repack_threshold_is_documented_and_configurable() -> None:
    p = make_placer("mra", max_gpus=1)
    assert isinstance(p, MaxRectsPlacer)
    assert p.repack_threshold == DEFAULT_REPACK_THRESHOLD
    with pytest.raises(ValueError, match="repack_threshold"):
        make_placer("mra", max_gpus=1, repack_threshold=1)


def test_time_share_forces_full_sms_and_compacts_split_quota() -> None:
    p = make_placer("time-share", max_gpus=2)
    # 30 x 10 takes 30 % quota and all SMs
    assert p.place("a", 30, 10).rect == R(0, 0, 30, 100)
    assert p.place("b", 30, 90).rect == R(30, 0, 60, 100)
    assert p.place("c", 30, 50).rect == R(60, 0, 90, 100)
    p.release("b")
    # free quota 30 + 10 = 40 % but in two gaps (30..60, 90..100): KubeShare admits 40 % by
    # the sum, so the GPU is compacted (c: 60 -> 30) and d goes to x = 60
    assert p.free_rects(0) == [R(30, 0, 60, 100), R(90, 0, 100, 100)]
    assert p.place("d", 40, 5) == Binding("d", 0, R(60, 0, 100, 100))
    assert p.take_moves() == [Move("c", 0, R(60, 0, 90, 100), R(30, 0, 60, 100))]
    assert p.place("e", 10, 10).gpu == 1  # GPU 0 has 0 % left


def test_move_within_a_gpu_keeps_its_old_fields() -> None:
    # Move built the old way (no old_gpu) is a move within one GPU
    m = Move("b", 3, R(20, 0, 40, 20), R(0, 0, 20, 20))
    assert (m.gpu, m.old_gpu, m.new_gpu, m.is_cross_gpu) == (3, 3, 3, False)
    assert m == Move("b", 3, R(20, 0, 40, 20), R(0, 0, 20, 20), old_gpu=3)


# -- API and errors ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_errors(name: str) -> None:
    p = make_placer(name, max_gpus=1)
    with pytest.raises(ValueError, match=r"'big'.*larger than a GPU"):
        p.place("big", 120, 50)
    with pytest.raises(ValueError, match=r"'tall'.*larger than a GPU"):
        p.place("tall", 50, 100.5)
    with pytest.raises(ValueError, match="'zero'"):
        p.place("zero", 0, 50)
    with pytest.raises(ValueError, match="'nan'"):
        p.place("nan", float("nan"), 50)
    p.place("a", 60, 60)
    with pytest.raises(ValueError, match="'a' is already placed"):
        p.place("a", 10, 10)
    # 60 x 60 twice cannot share one 100 x 100 GPU in any placer
    with pytest.raises(NoCapacity, match=r"'b'.*max_gpus=1"):
        p.place("b", 60, 60)
    with pytest.raises(UnknownInstance, match="'ghost'"):
        p.release("ghost")
    with pytest.raises(KeyError):
        p.release("b")  # the rejected instance was never placed
    with pytest.raises(ValueError, match="gpu must be in"):
        p.free_rects(1)
    assert p.gpus_used() == 1


def test_make_placer_errors() -> None:
    with pytest.raises(
        UnknownPlacer,
        match="unknown placer 'nope'.*best-fit, first-fit, mra, mra-defrag, mra-room, time-share",
    ):
        make_placer("nope", max_gpus=1)
    with pytest.raises(ValueError, match="max_gpus"):
        make_placer("mra", max_gpus=0)
    with pytest.raises(ValueError, match="defrag is an option of the 'mra' placer only"):
        make_placer("best-fit", max_gpus=1, defrag=True)
    with pytest.raises(ValueError, match="'mra-defrag' always defragments"):
        make_placer("mra-defrag", max_gpus=1, defrag=False)
    with pytest.raises(ValueError, match="sparse_pct"):
        make_placer("mra-defrag", max_gpus=1, sparse_pct=120)
    with pytest.raises(ValueError, match="margin_pct"):
        make_placer("mra", max_gpus=1, defrag=True, margin_pct=-1)
    with pytest.raises(ValueError, match="max_drains"):
        DefragMaxRectsPlacer(1).defragment(max_drains=-1)
    for bad in (
        {"room_max_moves": -1},
        {"room_gpus": -1},
        {"room_tries": -1},
        {"migration_burst": -1},
        {"migration_burst": float("inf")},
        {"max_migrations_per_release": -0.1},
        {"max_migrations_per_release": float("nan")},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            make_placer("mra-room", max_gpus=1, **bad)


def test_defrag_option_of_mra() -> None:
    # "mra" stays the paper's placer; defrag=True (or the name "mra-defrag") adds the extension
    plain = make_placer("mra", max_gpus=2)
    assert type(plain) is MaxRectsPlacer and plain.name == "mra"
    assert type(make_placer("mra", max_gpus=2, defrag=False)) is MaxRectsPlacer
    d = make_placer("mra", max_gpus=2, defrag=True, repack_threshold=8, sparse_pct=30)
    assert isinstance(d, DefragMaxRectsPlacer) and d.name == "mra-defrag"
    assert (d.repack_threshold, d.sparse_pct, d.margin_pct) == (8, 30, DEFAULT_DEFRAG_MARGIN_PCT)
    e = make_placer("mra-defrag", max_gpus=2, defrag=True)
    assert isinstance(e, DefragMaxRectsPlacer) and e.sparse_pct == DEFAULT_DEFRAG_SPARSE_PCT


@pytest.mark.parametrize("name", ALL)
def test_place_share_and_gpu_reuse(name: str) -> None:
    p = make_placer(name, max_gpus=3)
    # GpuShare: width = quota_request x 100 = 40, height = sm_pct = 100 (full SMs everywhere)
    b = p.place_share("s", GpuShare(sm_pct=100, quota_request=0.4, quota_limit=0.6))
    assert (b.gpu, b.rect) == (0, R(0, 0, 40, 100))
    p.place("x", 80, 100)  # 80 > 60 left on GPU 0 -> GPU 1
    assert p.gpus_used() == 2
    p.release("s")
    assert p.gpus_used() == 1
    assert p.free_rects(0) == [FULL_GPU]
    # GPU 0 is empty again: the next instance that GPU 1 cannot hold reopens GPU 0, not GPU 2
    assert p.place("y", 90, 100).gpu == 0
    assert set(p.bindings()) == {"x", "y"}
    assert p.instances_on(1) == {"x": R(0, 0, 80, 100)}


# -- properties ------------------------------------------------------------------------------------

GRID = 5  # requests are multiples of 5 %, so every coordinate is too: check on a 20 x 20 grid
VARIANTS = [(n, {}) for n in ALL] + [
    ("mra", {"repack_threshold": 2}),  # re-packs (and moves) all the time
    ("mra", {"merge_on_release": False}),  # the letter of the paper
    # drains whenever a GPU can be emptied (every GPU is sparse, no margin), and re-packs often
    ("mra-defrag", {"sparse_pct": 100, "margin_pct": 0}),
    ("mra", {"defrag": True, "sparse_pct": 100, "margin_pct": 0, "repack_threshold": 2}),
    # drains and makes room whenever it can, under a tight budget, re-packing often
    (
        "mra-room",
        {
            "sparse_pct": 100,
            "margin_pct": 0,
            "repack_threshold": 4,
            "max_migrations_per_release": 0.5,
            "migration_burst": 2,
        },
    ),
]

ops = st.lists(
    st.tuples(st.integers(0, 2), st.integers(1, 20), st.integers(1, 20), st.integers(0, 10_000)),
    min_size=1,
    max_size=40,
)


def _mask(rects: list[Rect]) -> np.ndarray:
    m = np.zeros((20, 20), dtype=np.int32)
    for r in rects:
        m[round(r.x) // GRID : round(r.x2) // GRID, round(r.y) // GRID : round(r.y2) // GRID] += 1
    return m


def _check(p: Placer, name: str, view: dict[str, tuple[int, Rect]]) -> list[Move]:
    """Every invariant the module doc promises, plus: the mechanism's view (bindings as
    returned, updated by ``take_moves``) equals the placer's. Returns the moves taken."""
    moves = p.take_moves()
    for mv in moves:
        assert view[mv.instance_id] == (mv.old_gpu, mv.old)
        assert (mv.new.w, mv.new.h) == (mv.old.w, mv.old.h)
        assert mv.is_cross_gpu == (mv.old_gpu != mv.gpu)
        view[mv.instance_id] = (mv.gpu, mv.new)
    assert {i: (b.gpu, b.rect) for i, b in p.bindings().items()} == view
    used = 0
    for g in range(p.max_gpus):
        alloc = list(p.instances_on(g).values())
        free = p.free_rects(g)
        used += bool(alloc)
        assert all(r.inside_gpu() for r in alloc + free)
        a = _mask(alloc)
        assert a.max(initial=0) <= 1, f"{name}: overlapping instances on GPU {g}"
        f = _mask(free) > 0
        assert not (f & (a > 0)).any(), f"{name}: a free rectangle intersects an instance"
        assert (f | (a > 0)).all(), f"{name}: free space not covered by the free list"
        if name != "time-share":
            assert remove_contained(free) == free, f"{name}: redundant free rectangle"
        if not alloc:
            assert free == [FULL_GPU]
    assert p.gpus_used() == used
    return moves


def _check_cross_gpu_moves(
    p: Placer, moves: list[Move], in_use: set[int], used_before: int, *, released: bool
) -> None:
    """Cross-GPU moves (defragmentation) happen only on release, from at most one GPU, which
    they leave empty (all-or-nothing), and only to GPUs that were already in use; a release
    never adds a GPU. "mra-room" also moves on place: from the GPU the new instance went to,
    to other GPUs in use, and never opens a GPU; it keeps its migration budget. Placers other
    than "mra-defrag" and "mra-room" never move across GPUs."""
    cross = [m for m in moves if m.is_cross_gpu]
    if isinstance(p, RoomDefragPlacer):
        rate = p.max_migrations_per_release
        if rate is not None:
            assert p.migrations <= rate * p.releases + p.migration_burst + 1e-9
    if not released and isinstance(p, RoomDefragPlacer) and cross:
        sources = {m.old_gpu for m in cross}
        assert len(sources) == 1 and len(cross) <= p.room_max_moves
        (src,) = sources
        assert src is not None and p.instances_on(src)  # the new instance is there
        assert {m.gpu for m in cross} <= in_use - sources
        assert p.gpus_used() == used_before
        return
    if not released or not isinstance(p, DefragMaxRectsPlacer):
        assert not cross
        return
    sources = {m.old_gpu for m in cross}
    assert len(sources) <= 1
    assert {m.gpu for m in cross} <= in_use - sources
    for g in sources:
        assert g is not None and not p.instances_on(g)
    assert p.gpus_used() <= used_before - len(sources)


@pytest.mark.parametrize(("name", "kw"), VARIANTS, ids=[f"{n}{kw or ''}" for n, kw in VARIANTS])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seq=ops)
def test_invariants_under_random_place_release(
    name: str, kw: dict[str, object], seq: list[tuple[int, int, int, int]]
) -> None:
    p = make_placer(name, max_gpus=3, **kw)
    view: dict[str, tuple[int, Rect]] = {}
    for k, (op, wq, hq, pick) in enumerate(seq):
        in_use = {g for g, _ in view.values()}
        used_before = p.gpus_used()
        released = op == 0 and bool(view)
        if released:
            iid = sorted(view)[pick % len(view)]
            p.release(iid)
            del view[iid]
        else:
            w, h = wq * GRID, hq * GRID
            try:
                b = p.place(f"i{k}", w, h)
            except NoCapacity:
                # never spurious
                if name == "time-share":  # KubeShare's test: no GPU has w % quota left
                    assert all(
                        100 - sum(r.w for r in p.instances_on(g).values()) < w
                        for g in range(p.max_gpus)
                    )
                else:  # no GPU's free list has a rectangle that fits
                    assert not any(r.fits(w, h) for g in range(p.max_gpus) for r in p.free_rects(g))
            else:
                assert (b.rect.w, b.rect.h) == (w, 100 if name == "time-share" else h)
                view[b.instance_id] = (b.gpu, b.rect)
        moves = _check(p, name, view)
        _check_cross_gpu_moves(p, moves, in_use, used_before, released=released)
    # releasing everything restores every GPU to one empty 100 x 100 rectangle
    for iid in sorted(view):
        p.release(iid)
        del view[iid]
        _check(p, name, view)
    assert p.gpus_used() == 0
    assert all(p.free_rects(g) == [FULL_GPU] for g in range(p.max_gpus))
    assert p.place("full", 100, 100).gpu == 0


@pytest.mark.parametrize("name", SPATIAL)
@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.tuples(st.integers(1, 20), st.integers(1, 20)), min_size=1, max_size=25))
def test_first_instance_and_exact_fits(name: str, sizes: list[tuple[int, int]]) -> None:
    """Placing into empty GPUs only: the first instance sits at (0,0) of GPU 0, and no GPU is
    opened while an open one still has a free rectangle that fits (all three placers)."""
    p = make_placer(name, max_gpus=len(sizes))
    for k, (wq, hq) in enumerate(sizes):
        w, h = wq * GRID, hq * GRID
        fits_open = any(
            r.fits(w, h) for g in range(p.max_gpus) if p.instances_on(g) for r in p.free_rects(g)
        )
        before = p.gpus_used()
        b = p.place(f"i{k}", w, h)
        if k == 0:
            assert (b.gpu, b.rect.x, b.rect.y) == (0, 0, 0)
        assert p.gpus_used() == before + (0 if fits_open else 1)


@pytest.mark.parametrize(
    ("name", "kw"), [("mra-defrag", {}), ("mra-room", {"room_max_moves": 0}), ("mra-room", {})]
)
@settings(max_examples=40, deadline=None)
@given(seq=ops)
def test_defrag_that_never_fires_is_exactly_mra(
    name: str, kw: dict[str, object], seq: list[tuple[int, int, int, int]]
) -> None:
    """With no GPU sparse (``sparse_pct=0``) "mra-defrag" makes the very decisions of "mra"
    (same bindings, free lists and re-pack moves): the extension only adds cross-GPU drains,
    and placement itself is MRA's. So does "mra-room" that never makes room — and, with
    room, whenever no instance moved across GPUs (checked until the first such move)."""
    ref = make_placer("mra", max_gpus=3, repack_threshold=4)
    off = make_placer(name, max_gpus=3, repack_threshold=4, sparse_pct=0, **kw)
    live: list[str] = []
    for k, (op, wq, hq, pick) in enumerate(seq):
        if op == 0 and live:
            iid = live.pop(pick % len(live))
            ref.release(iid)
            off.release(iid)
        else:
            try:
                b = ref.place(f"i{k}", wq * GRID, hq * GRID)
            except NoCapacity:
                if name == "mra-room" and not kw:  # it may make room where MRA has none
                    try:
                        off.place(f"i{k}", wq * GRID, hq * GRID)
                    except NoCapacity:
                        continue
                    assert any(m.is_cross_gpu for m in off.take_moves()), "placed without room"
                    return  # from here on the two differ by design
                with pytest.raises(NoCapacity):
                    off.place(f"i{k}", wq * GRID, hq * GRID)
                continue
            got = off.place(f"i{k}", wq * GRID, hq * GRID)
            moved = off.take_moves()
            if any(m.is_cross_gpu for m in moved):
                assert name == "mra-room" and not kw and got.gpu != b.gpu
                return  # from here on the two differ by design
            assert got == b
            assert moved == ref.take_moves()
            live.append(b.instance_id)
            continue
        assert off.take_moves() == ref.take_moves()
        assert off.bindings() == ref.bindings()
        assert [off.free_rects(g) for g in range(3)] == [ref.free_rects(g) for g in range(3)]
