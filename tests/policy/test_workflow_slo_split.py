"""Dominator-based SLO distribution: dominators vs networkx, ANL, hand-checked splits, and
structural properties on random DAGs."""

from __future__ import annotations

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gshare.policy.workflow import slo_split
from gshare.policy.workflow.slo_split import (
    anl_labels,
    immediate_dominators,
    split_slo,
)

# -- dominators --------------------------------------------------------------------------------


@st.composite
def random_dags(draw: st.DrawFn) -> dict[str, list[str]]:
    """Nodes n0..n{k-1}; edges only from lower to higher index (acyclic)."""
    k = draw(st.integers(1, 9))
    succ: dict[str, list[str]] = {f"n{i}": [] for i in range(k)}
    for j in range(1, k):
        for i in range(j):
            if draw(st.booleans()):
                succ[f"n{i}"].append(f"n{j}")
    return succ


@settings(max_examples=200, deadline=None)
@given(random_dags())
def test_immediate_dominators_match_networkx(succ: dict[str, list[str]]) -> None:
    g = nx.DiGraph()
    g.add_nodes_from(succ)
    g.add_edges_from((u, v) for u, vs in succ.items() for v in vs)
    assert immediate_dominators(succ, "n0") == nx.immediate_dominators(g, "n0")


def test_dominators_of_a_diamond() -> None:
    # a -> b, a -> c, b -> d, c -> d: the join d is dominated by a only
    assert immediate_dominators({"a": ["b", "c"], "b": ["d"], "c": ["d"]}, "a") == {
        "b": "a",
        "c": "a",
        "d": "a",
    }


# -- ANL ---------------------------------------------------------------------------------------


def test_anl_labels_average_normalised_lengths() -> None:
    # config 0: f=10, g=30 -> 0.25, 0.75; config 1: f=20, g=20 -> 0.5, 0.5
    # ANL(f) = (0.25 + 0.5) / 2 = 0.375, ANL(g) = (0.75 + 0.5) / 2 = 0.625
    assert anl_labels({"f": [10, 20], "g": [30, 20]}) == pytest.approx({"f": 0.375, "g": 0.625})
    with pytest.raises(ValueError, match="same number of configurations"):
        anl_labels({"f": [1], "g": [1, 2]})


# -- hand-checked splits -----------------------------------------------------------------------


def _groups(split: object) -> list[tuple[tuple[str, ...], float]]:
    return [(g.stages, round(g.slo_ms, 6)) for g in split.groups]  # type: ignore[attr-defined]


def test_chain_of_five_with_g3() -> None:
    # a -> b -> c -> d -> e, ANL 0.1, 0.2, 0.3, 0.2, 0.2; g = 3:
    # groups [a b c] (ANL 0.6) and [d e] (0.4); SLO 1000 -> 600 and 400
    preds = {"a": [], "b": ["a"], "c": ["b"], "d": ["c"], "e": ["d"]}
    anl = {"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.2, "e": 0.2}
    s = split_slo(preds, anl, 1000.0)
    assert s.structure == "[a b c] [d e]"
    assert _groups(s) == [(("a", "b", "c"), 600.0), (("d", "e"), 400.0)]
    assert [g.quota for g in s.groups] == pytest.approx([0.6, 0.4])
    # g = 2: [a b] 0.3, [c d] 0.5, [e] 0.2 -> 300, 500, 200
    s2 = split_slo(preds, anl, 1000.0, max_group_size=2)
    assert _groups(s2) == [(("a", "b"), 300.0), (("c", "d"), 500.0), (("e",), 200.0)]


def test_diamond() -> None:
    # a -> {b, c} -> d; ANL a 0.1, b 0.3, c 0.2, d 0.4.
    # reduce(a): b, c are parallel -> R with ANL max(0.3, 0.2) = 0.3; d is the join after R.
    # top list [a] R [d], ANL 0.1 + 0.3 + 0.4 = 0.8; SLO 800 -> a 100, R 300, d 400;
    # both branches get R's whole 300.
    preds = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}
    s = split_slo(preds, {"a": 0.1, "b": 0.3, "c": 0.2, "d": 0.4}, 800.0)
    assert s.structure == "[a] {[b] | [c]} [d]"
    assert _groups(s) == [(("a",), 100.0), (("b",), 300.0), (("c",), 300.0), (("d",), 400.0)]


def test_diamond_with_chains_in_the_branches() -> None:
    # s -> x1 -> x2 -> x3 -> x4 -> j, s -> y -> j; every ANL 0.1, g = 3.
    # branch x: [x1 x2 x3] (0.3), [x4] (0.1), sum 0.4; branch y: [y] 0.1 -> R = 0.4.
    # top [s] R [j]: 0.1 + 0.4 + 0.1 = 0.6; SLO 600 -> s 100, R 400, j 100.
    # in branch x: 400 * 0.3/0.4 = 300 and 400 * 0.1/0.4 = 100; branch y: 400.
    preds = {
        "s": [],
        "x1": ["s"],
        "x2": ["x1"],
        "x3": ["x2"],
        "x4": ["x3"],
        "y": ["s"],
        "j": ["x4", "y"],
    }
    s = split_slo(preds, dict.fromkeys(preds, 0.1), 600.0)
    assert s.structure == "[s] {[x1 x2 x3] [x4] | [y]} [j]"
    assert _groups(s) == [
        (("s",), 100.0),
        (("x1", "x2", "x3"), 300.0),
        (("x4",), 100.0),
        (("y",), 400.0),
        (("j",), 100.0),
    ]


def test_nested_splits() -> None:
    # a -> {b, c}; b -> {b1, b2} -> b3; b3, c -> d.
    # ANL: a .1, b .1, b1 .1, b2 .2, b3 .1, c .2, d .2.
    # inner R1 = max(b1, b2) = 0.2; branch b = b + R1 + b3 = 0.1 + 0.2 + 0.1 = 0.4;
    # outer R2 = max(0.4, c = 0.2) = 0.4; top [a] R2 [d] = 0.1 + 0.4 + 0.2 = 0.7.
    # SLO 700 -> a 100, R2 400, d 200. Branch b: b 400 * .1/.4 = 100, R1 400 * .2/.4 = 200
    # (b1 and b2 200 each), b3 100; branch c: 400.
    preds = {
        "a": [],
        "b": ["a"],
        "b1": ["b"],
        "b2": ["b"],
        "b3": ["b1", "b2"],
        "c": ["a"],
        "d": ["b3", "c"],
    }
    anl = {"a": 0.1, "b": 0.1, "b1": 0.1, "b2": 0.2, "b3": 0.1, "c": 0.2, "d": 0.2}
    s = split_slo(preds, anl, 700.0)
    assert s.structure == "[a] {[b] {[b1] | [b2]} [b3] | [c]} [d]"
    assert _groups(s) == [
        (("a",), 100.0),
        (("b",), 100.0),
        (("b1",), 200.0),
        (("b2",), 200.0),
        (("b3",), 100.0),
        (("c",), 400.0),
        (("d",), 200.0),
    ]


def test_several_sources_get_a_virtual_root() -> None:
    # x, y -> z; ANL x .2, y .3, z .5: R = max(.2, .3) = .3; list R [z] = 0.8;
    # SLO 80 -> R 30 (x and y 30 each), z 50
    s = split_slo({"x": [], "y": [], "z": ["x", "y"]}, {"x": 0.2, "y": 0.3, "z": 0.5}, 80.0)
    assert s.structure == "{[x] | [y]} [z]"
    assert _groups(s) == [(("x",), 30.0), (("y",), 30.0), (("z",), 50.0)]
    assert s.group_of("z").quota == pytest.approx(50 / 80)


def test_split_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="no stages"):
        split_slo({}, {}, 10.0)
    with pytest.raises(ValueError, match="unknown stage 'q'"):
        split_slo({"a": ["q"]}, {"a": 1.0}, 10.0)
    with pytest.raises(ValueError, match="no ANL label for stage 'a'"):
        split_slo({"a": []}, {}, 10.0)
    with pytest.raises(ValueError, match="cycle"):
        split_slo({"a": ["b"], "b": ["a"]}, {"a": 1.0, "b": 1.0}, 10.0)
    with pytest.raises(ValueError, match="max_group_size must be >= 1"):
        split_slo({"a": []}, {"a": 1.0}, 10.0, max_group_size=0)


# -- properties on random DAGs -----------------------------------------------------------------


def _paths(preds: dict[str, list[str]]) -> list[list[str]]:
    succ: dict[str, list[str]] = {n: [] for n in preds}
    for n, ps in preds.items():
        for p in ps:
            succ[p].append(n)
    out: list[list[str]] = []

    def walk(path: list[str]) -> None:
        nxt = succ[path[-1]]
        if not nxt:
            out.append(path)
        for s in nxt:
            walk([*path, s])

    for src in (n for n, ps in preds.items() if not ps):
        walk([src])
    return out


def _check_structure(
    preds: dict[str, list[str]], anl: dict[str, float], g: int
) -> dict[str, float]:
    split = split_slo(preds, anl, 1000.0, max_group_size=g)
    seen = [s for grp in split.groups for s in grp.stages]
    assert sorted(seen) == sorted(preds)  # a partition
    for grp in split.groups:
        assert 1 <= len(grp.stages) <= g
        for prev, cur in zip(grp.stages, grp.stages[1:], strict=False):
            assert prev in preds[cur]  # a chain of consecutive stages
        assert grp.slo_ms == pytest.approx(1000.0 * grp.quota)
    slo = {s: grp.slo_ms / len(grp.stages) for grp in split.groups for s in grp.stages}
    per_group = {s: grp for grp in split.groups for s in grp.stages}
    for path in _paths(preds):
        groups_on_path = list(dict.fromkeys(id(per_group[s]) for s in path))
        total = sum(grp.slo_ms for grp in split.groups if id(grp) in groups_on_path)
        assert total <= 1000.0 + 1e-6
    return slo


@st.composite
def dags_with_anl(draw: st.DrawFn) -> tuple[dict[str, list[str]], dict[str, float]]:
    succ = draw(random_dags())
    preds: dict[str, list[str]] = {n: [] for n in succ}
    for u, vs in succ.items():
        for v in vs:
            preds[v].append(u)
    anl = {n: draw(st.floats(0.01, 1.0)) for n in preds}
    return preds, anl


@settings(max_examples=200, deadline=None)
@given(dags_with_anl(), st.integers(1, 4))
def test_split_is_a_partition_into_chains_within_the_slo(
    dag: tuple[dict[str, list[str]], dict[str, float]], g: int
) -> None:
    _check_structure(*dag, g)


@settings(max_examples=100, deadline=None)
@given(dags_with_anl(), st.integers(1, 4), st.floats(1.0, 5000.0))
def test_the_memoised_grouping_splits_as_a_fresh_one(
    dag: tuple[dict[str, list[str]], dict[str, float]], g: int, slo_ms: float
) -> None:
    """``split_slo`` builds a grouping once per (DAG, labels, g): a split served from the memo
    equals one built from scratch, at any budget, and other labels on the same DAG are never
    served the first labels' grouping."""
    preds, anl = dag
    first = next(iter(preds))
    relabelled = {**anl, first: anl[first] * 3.0 + 0.5}
    slo_split._structure.cache_clear()
    fresh = split_slo(preds, anl, slo_ms, max_group_size=g)
    slo_split._structure.cache_clear()
    fresh_relabelled = split_slo(preds, relabelled, slo_ms, max_group_size=g)
    split_slo(preds, anl, 1000.0, max_group_size=g)  # the memo now holds both groupings
    assert split_slo(preds, anl, slo_ms, max_group_size=g) == fresh
    assert split_slo(preds, relabelled, slo_ms, max_group_size=g) == fresh_relabelled


@st.composite
def series_parallel(draw: st.DrawFn, depth: int = 0) -> list[object]:
    """A series-parallel DAG as a nested list: a list is a series, a tuple parallel branches."""
    n = draw(st.integers(1, 3))
    out: list[object] = []
    for _ in range(n):
        if depth < 2 and draw(st.booleans()):
            out.append(
                tuple(draw(series_parallel(depth + 1)) for _ in range(draw(st.integers(2, 3))))
            )
        else:
            out.append("node")
    return out


def _build(sp: list[object]) -> dict[str, list[str]]:
    preds: dict[str, list[str]] = {}
    counter = iter(range(10_000))

    def series(items: list[object], entry: list[str]) -> list[str]:
        for it in items:
            if isinstance(it, tuple):
                exits: list[str] = []
                for branch in it:
                    exits += series(branch, entry)
                name = f"j{next(counter)}"  # a join closes every parallel block
                preds[name] = exits
                entry = [name]
            else:
                name = f"n{next(counter)}"
                preds[name] = list(entry)
                entry = [name]
        return entry

    series(sp, [])
    return preds


@settings(max_examples=150, deadline=None)
@given(series_parallel(), st.integers(1, 4), st.randoms(use_true_random=False))
def test_series_parallel_paths_get_exactly_the_slo(sp: list[object], g: int, rnd: object) -> None:
    preds = _build(sp)
    anl = {n: 0.05 + rnd.random() for n in preds}  # type: ignore[attr-defined]
    _check_structure(preds, anl, g)
    split = split_slo(preds, anl, 1000.0, max_group_size=g)
    per_group = {s: grp for grp in split.groups for s in grp.stages}
    for path in _paths(preds):
        groups = {id(per_group[s]): per_group[s] for s in path}
        assert sum(grp.slo_ms for grp in groups.values()) == pytest.approx(1000.0)
