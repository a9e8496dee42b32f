"""Dominator-based SLO distribution (ESG §3.3): split a workflow into groups of at most ``g``
stages and give every group a share (quota) of the end-to-end SLO.

Who calls it: ``gshare.policy.workflow.replan.plan_remaining`` before every stage dispatch,
on the stages that remain, with the remaining latency budget; ESG_1Q then searches each group
with target ``budget * quota``. Pure: plain mappings in, a frozen ``SloSplit`` out.

What holds for the result (tested):

* every stage is in exactly one group; a group is a chain of consecutive stages (each stage
  after the first runs after the previous one) of at most ``max_group_size`` stages;
* along any source-to-sink path the groups' SLOs add up to at most the total SLO, and to
  exactly the total along at least one (parallel branches each get the whole share of the
  reduced node they belong to);
* a group's share is proportional to its ANL among the items it is split with.

``immediate_dominators`` is written here (Cooper, Harvey & Kennedy, "A Simple, Fast Dominance
Algorithm", 2001) rather than taken from networkx, because importing networkx pulls in
``socket`` and ``threading`` and ``gshare.policy`` must not; the tests check it against
``networkx.immediate_dominators``.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from gshare.workflows.dag import kahn_order

DEFAULT_MAX_GROUP_SIZE: Final[int] = 3
"""ESG's default maximum group size ``g`` (§5.4)."""
VIRTUAL_ROOT: Final[str] = "<root>"
"""Root added above several source stages so that the dominator tree is a tree. Not a valid
stage name in specs (they start with a letter or digit)."""
STRUCTURE_CACHE_SIZE: Final[int] = 1024
"""Groupings ``split_slo`` keeps (one per remaining-stage set, ANL labels and group size)."""


# -- dominators --------------------------------------------------------------------------------


def immediate_dominators(successors: Mapping[str, Sequence[str]], root: str) -> dict[str, str]:
    """``{node: its immediate dominator}`` for every node reachable from ``root`` except
    ``root`` itself (networkx's convention). ``successors`` maps a node to its successors;
    nodes only named as successors count as nodes without successors.

    Cooper-Harvey-Kennedy: iterate ``idom(b) = intersect(processed predecessors of b)`` in
    reverse postorder until nothing changes.
    """
    order: list[str] = []  # postorder
    seen = {root}
    stack: list[tuple[str, int]] = [(root, 0)]
    while stack:
        node, i = stack[-1]
        succ = successors.get(node, ())
        if i < len(succ):
            stack[-1] = (node, i + 1)
            nxt = succ[i]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, 0))
        else:
            order.append(node)
            stack.pop()
    po = {n: i for i, n in enumerate(order)}
    preds: dict[str, list[str]] = {n: [] for n in order}
    for n in order:
        for s in successors.get(n, ()):
            preds[s].append(n)
    idom: dict[str, str] = {root: root}
    rpo = order[::-1]
    changed = True
    while changed:
        changed = False
        for b in rpo[1:]:
            new: str | None = None
            for p in preds[b]:
                if p not in idom:
                    continue
                if new is None:
                    new = p
                    continue
                a, c = p, new
                while a != c:
                    while po[a] < po[c]:
                        a = idom[a]
                    while po[c] < po[a]:
                        c = idom[c]
                new = a
            if new is not None and idom.get(b) != new:
                idom[b] = new
                changed = True
    del idom[root]
    return idom


# -- ANL ---------------------------------------------------------------------------------------


def anl_labels(times_ms: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Average normalised length of every stage (ESG §3.3, step 2).

    ``times_ms[s][c]`` is the time of stage ``s`` in configuration ``c``; every stage lists
    the same configurations in the same order. ``ANL(s) = mean_c t_s(c) / sum_j t_j(c)``
    (configurations where every time is 0 are skipped). The labels add up to 1.
    """
    stages = list(times_ms)
    if not stages:
        return {}
    n = len(times_ms[stages[0]])
    if any(len(times_ms[s]) != n for s in stages):
        raise ValueError("anl_labels: every stage must list the same number of configurations")
    acc = dict.fromkeys(stages, 0.0)
    used = 0
    for c in range(n):
        total = sum(times_ms[s][c] for s in stages)
        if total <= 0:
            continue
        used += 1
        for s in stages:
            acc[s] += times_ms[s][c] / total
    if used == 0:
        return {s: 1.0 / len(stages) for s in stages}
    return {s: v / used for s, v in acc.items()}


# -- result ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SloGroup:
    """A group of consecutive stages searched together by ESG_1Q, with its SLO share."""

    stages: tuple[str, ...]
    """A chain, in execution order."""
    anl: float
    """Sum of the stages' ANL labels."""
    slo_ms: float
    """The group's SLO: ``quota * total``."""
    quota: float
    """The group's share of the total SLO (Appendix B's ``q``)."""


@dataclass(frozen=True, slots=True)
class SloSplit:
    """The groups of a workflow (in a topological order) and the SLO they split."""

    slo_ms: float
    groups: tuple[SloGroup, ...]
    structure: str
    """The reduced dominator tree as text, e.g. ``[a] {[b] | [c]} [d]``: ``[...]`` a group,
    ``{x | y}`` a node made by ``reduce`` with its parallel branches."""

    def group_of(self, stage: str) -> SloGroup:
        for g in self.groups:
            if stage in g.stages:
                return g
        raise KeyError(f"stage {stage!r} is in no group")


# -- the split ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _Group:
    stages: list[str]
    anl: float


@dataclass(slots=True)
class _Reduced:
    branches: list[list[_Item]]
    anl: float


_Item = str | _Group | _Reduced  # a str is a stage not yet grouped


def _anl(item: _Item, anl: Mapping[str, float]) -> float:
    return anl[item] if isinstance(item, str) else item.anl


# NOTE (ESG §3.3 "Dominator-based SLO distribution", four steps).
# 1. Dominator tree of the DAG (a virtual root above several sources).
# 2. ANL label of every stage (``anl_labels``).
# 3. Post-order over the dominator tree. A node x with one child continues as a list
#    (x, then the child's list). A node x with several children gets reduce(x), which turns
#    its children's subtrees into a list: the children are ordered by the DAG edges between
#    their dominator subtrees (the "child DAG"), which is decomposed recursively — several
#    weakly connected components are parallel branches and become one reduced node whose ANL
#    is the largest branch sum; one component is cut in series at a child that every other
#    child precedes or follows (a join, typically); a component that is neither (not
#    series-parallel) falls back to parallel levels by longest path. Every child of a node
#    with several children is slo_group-ed: the consecutive ungrouped stages of its list are
#    cut into groups of at most g; reduced nodes stay individual items (so their subsumed
#    groups do not grow). The root's list is grouped the same way.
# 4. The final list splits the SLO in proportion to its items' ANL; slo_assign gives every
#    branch of a reduced node that node's whole share, split again inside the branch in
#    proportion to ANL; this recurses until every group has its SLO.
# The paper's description of reduce ("combine its branches into one node") does not say how a
# join — which a diamond's split node also immediately dominates — is told apart from a branch,
# nor what happens when a split node dominates nested blocks (s -> {a, b, c}, {b, c} -> j1,
# {a, j1} -> j2: all five are children of s). The series-parallel decomposition above is our
# reading: on series-parallel DAGs every source-to-sink path gets exactly the whole SLO.


def split_slo(
    predecessors: Mapping[str, Sequence[str]],
    anl: Mapping[str, float],
    slo_ms: float,
    *,
    max_group_size: int = DEFAULT_MAX_GROUP_SIZE,
) -> SloSplit:
    """Group the stages of the DAG ``predecessors`` (stage -> the stages it runs after; the
    mapping order breaks ties) and split ``slo_ms`` among the groups by ``anl`` (stage ->
    ANL). ``ValueError`` on an empty DAG, a cycle, an unknown predecessor, a missing ANL or
    ``max_group_size < 1``.

    The grouping does not depend on ``slo_ms``: it is built once per (DAG, ANL, group size)
    (``_structure``, memoised: ESG re-plans the same remaining stages before every dispatch)
    and only the split of ``slo_ms`` runs per call."""
    final, anl_of = _structure(
        tuple((s, tuple(ps)) for s, ps in predecessors.items()),
        tuple((s, anl[s]) for s in predecessors if s in anl),
        max_group_size,
    )
    out: list[SloGroup] = []

    def assign(items: Sequence[_Item], share_ms: float) -> None:
        total = sum(_anl(i, anl_of) for i in items)
        for it in items:
            part = share_ms * (_anl(it, anl_of) / total if total > 0 else 1.0 / len(items))
            if isinstance(it, _Group):
                quota = part / slo_ms if slo_ms != 0 else 0.0
                out.append(SloGroup(tuple(it.stages), it.anl, part, quota))
            elif isinstance(it, _Reduced):
                for branch in it.branches:
                    assign(branch, part)

    assign(final, slo_ms)
    return SloSplit(slo_ms=slo_ms, groups=tuple(out), structure=_render(final))


@functools.lru_cache(maxsize=STRUCTURE_CACHE_SIZE)
def _structure(
    predecessors: tuple[tuple[str, tuple[str, ...]], ...],
    anl: tuple[tuple[str, float], ...],
    max_group_size: int,
) -> tuple[tuple[_Item, ...], Mapping[str, float]]:
    """``_build_structure`` memoised on hashable arguments (errors are not cached)."""
    return _build_structure(dict(predecessors), dict(anl), max_group_size)


def _build_structure(
    predecessors: Mapping[str, Sequence[str]],
    anl: Mapping[str, float],
    max_group_size: int,
) -> tuple[tuple[_Item, ...], Mapping[str, float]]:
    """Steps 1-3 of the module NOTE: the validated DAG's items (groups and reduced nodes) in
    order, and the ANL labels they were built with (read-only)."""
    if max_group_size < 1:
        raise ValueError(f"max_group_size must be >= 1, got {max_group_size}")
    if not predecessors:
        raise ValueError("split_slo: the DAG has no stages")
    if VIRTUAL_ROOT in predecessors:
        raise ValueError(f"{VIRTUAL_ROOT!r} is reserved")
    stages = list(predecessors)
    for s in stages:
        for p in predecessors[s]:
            if p not in predecessors:
                raise ValueError(f"stage {s!r} runs after unknown stage {p!r}")
        if s not in anl:
            raise ValueError(f"no ANL label for stage {s!r}")
    topo = kahn_order(predecessors)
    rank = {s: i for i, s in enumerate(topo)}
    succ: dict[str, list[str]] = {s: [] for s in stages}
    for s in topo:
        for p in predecessors[s]:
            succ[p].append(s)
    for s in succ:
        succ[s].sort(key=rank.__getitem__)
    sources = [s for s in topo if not predecessors[s]]
    if len(sources) == 1:
        root = sources[0]
    else:
        root = VIRTUAL_ROOT
        succ[root] = sources
        rank[root] = -1
    idom = immediate_dominators(succ, root)
    children: dict[str, list[str]] = {s: [] for s in succ}
    for node in sorted(idom, key=rank.__getitem__):
        children[idom[node]].append(node)
    subtree: dict[str, set[str]] = {}
    for node in sorted(children, key=rank.__getitem__, reverse=True):
        members = {node}
        for ch in children[node]:
            members |= subtree[ch]
        subtree[node] = members
    g = max_group_size

    def group(items: list[_Item]) -> list[_Item]:
        out: list[_Item] = []
        run: list[str] = []
        for it in [*items, None]:
            if isinstance(it, str):
                run.append(it)
                continue
            for i in range(0, len(run), g):
                chunk = run[i : i + g]
                out.append(_Group(chunk, sum(anl[s] for s in chunk)))
            run = []
            if it is not None:
                out.append(it)
        return out

    # child DAG among the children of one node: y1 -> y2 when a stage dominated by y1 (or y1
    # itself) has a DAG edge into y2 (an edge into a dominator subtree can only enter at its
    # head, so this captures every ordering between sibling subtrees)
    def child_edges(kids: list[str]) -> dict[str, set[str]]:
        heads = set(kids)
        out: dict[str, set[str]] = {y: set() for y in kids}
        for y in kids:
            for u in subtree[y]:
                out[y].update(v for v in succ[u] if v in heads and v != y)
        return out

    def reduce(kids: list[str], edges: dict[str, set[str]]) -> list[_Item]:
        """The items of a set of sibling subtrees (kids in topological order)."""
        if len(kids) == 1:
            return group(chain(kids[0]))
        members = set(kids)
        comps = _components(kids, edges)
        if len(comps) > 1:  # independent branches: one reduced node
            branches = [reduce(c, edges) for c in comps]
            return [_Reduced(branches, max(sum(_anl(i, anl) for i in b) for b in branches))]
        below = {y: _reach(y, edges, members) for y in kids}
        for v in kids:  # a series cut: every other sibling is before or after v
            before = [y for y in kids if v in below[y]]
            after = [y for y in kids if y in below[v]]
            if len(before) + len(after) == len(kids) - 1:
                return (
                    (reduce(before, edges) if before else [])
                    + group(chain(v))
                    + (reduce(after, edges) if after else [])
                )
        # not series-parallel: parallel levels (a sibling's level is 1 + the largest level of
        # the siblings with an edge into it)
        level: dict[str, int] = {}
        for y in kids:
            level[y] = 1 + max((level[z] for z in level if y in edges[z]), default=0)
        items: list[_Item] = []
        for k in sorted(set(level.values())):
            lvl = [y for y in kids if level[y] == k]
            if len(lvl) == 1:
                items += group(chain(lvl[0]))
            else:
                branches = [group(chain(y)) for y in lvl]
                items.append(
                    _Reduced(branches, max(sum(_anl(i, anl) for i in b) for b in branches))
                )
        return items

    def chain(x: str) -> list[_Item]:
        items: list[_Item] = [] if x == VIRTUAL_ROOT else [x]
        kids = children[x]
        if len(kids) == 1:
            items += chain(kids[0])
        elif len(kids) > 1:
            items += reduce(kids, child_edges(kids))
        return items

    return tuple(group(chain(root))), types.MappingProxyType(dict(anl))


def _components(nodes: list[str], edges: Mapping[str, set[str]]) -> list[list[str]]:
    """Weakly connected components of the sub-DAG on ``nodes``, each in ``nodes`` order."""
    inside = set(nodes)
    adj: dict[str, set[str]] = {n: set() for n in nodes}
    for u in nodes:
        for v in edges[u]:
            if v in inside:
                adj[u].add(v)
                adj[v].add(u)
    comp_of: dict[str, int] = {}
    for n in nodes:
        if n in comp_of:
            continue
        cid = len(set(comp_of.values()))
        stack = [n]
        comp_of[n] = cid
        while stack:
            u = stack.pop()
            for v in adj[u]:
                if v not in comp_of:
                    comp_of[v] = cid
                    stack.append(v)
    comps: dict[int, list[str]] = {}
    for n in nodes:
        comps.setdefault(comp_of[n], []).append(n)
    return list(comps.values())


def _reach(start: str, edges: Mapping[str, set[str]], inside: set[str]) -> set[str]:
    """Nodes of ``inside`` reachable from ``start`` (excluding it) along ``edges``."""
    seen: set[str] = set()
    stack = [start]
    while stack:
        u = stack.pop()
        for v in edges[u]:
            if v in inside and v not in seen:
                seen.add(v)
                stack.append(v)
    return seen


def _render(items: Sequence[_Item]) -> str:
    parts = []
    for it in items:
        if isinstance(it, _Group):
            parts.append("[" + " ".join(it.stages) + "]")
        elif isinstance(it, _Reduced):
            parts.append("{" + " | ".join(_render(b) for b in it.branches) + "}")
        else:
            parts.append(it)
    return " ".join(parts)
