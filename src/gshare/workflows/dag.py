"""DAG helpers shared by the workflow spec (data) and the workflow policies (pure).

Import-light on purpose: ``gshare.policy.workflow`` imports it, so it must pull in nothing but
the standard library's collections ABCs.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping


def kahn_order(predecessors: Mapping[str, Collection[str]]) -> list[str]:
    """Nodes of ``node -> predecessors`` in an execution order (Kahn's algorithm), ties broken
    by the mapping's order; predecessors that are not keys of the mapping are ignored.

    Raises ``ValueError`` naming a node on a cycle when there is one.
    """
    rank = {n: i for i, n in enumerate(predecessors)}
    indeg = {n: sum(1 for p in ps if p in rank) for n, ps in predecessors.items()}
    succ: dict[str, list[str]] = {n: [] for n in predecessors}
    for n, ps in predecessors.items():
        for p in ps:
            if p in succ:
                succ[p].append(n)
    ready = sorted((n for n, d in indeg.items() if d == 0), key=rank.__getitem__)
    out: list[str] = []
    while ready:
        n = ready.pop(0)
        out.append(n)
        for s in succ[n]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
                ready.sort(key=rank.__getitem__)
    if len(out) != len(predecessors):
        done = set(out)
        stuck = next(n for n in predecessors if n not in done)
        raise ValueError(f"the DAG has a cycle through stage {stuck!r}")
    return out


def render_stages(stages: Collection[Mapping[str, object]]) -> str:
    """One line for a workflow's stages (``name``, ``function``, ``after`` as a spec's or the
    API's stage dicts): stages by level — a stage's level is one more than its predecessors'
    highest — with ``->`` between levels and stages that run side by side in ``{a | b}``.
    ``gshare list`` and the demo print it; a chain reads ``a(f) -> b(g)``. Predecessors that
    are not stages are ignored."""
    preds: dict[str, list[str]] = {}
    label: dict[str, str] = {}
    for s in stages:
        name = str(s["name"])
        after = s.get("after") or ()
        preds[name] = [str(p) for p in after] if isinstance(after, (list, tuple)) else []
        label[name] = f"{name}({s['function']})"
    level: dict[str, int] = {}
    for n in kahn_order(preds):
        level[n] = 1 + max((level[p] for p in preds[n] if p in level), default=-1)
    by_level: dict[int, list[str]] = {}
    for n in preds:  # spec order within a level
        by_level.setdefault(level[n], []).append(label[n])
    parts = [
        names[0] if len(names) == 1 else "{" + " | ".join(names) + "}"
        for _, names in sorted(by_level.items())
    ]
    return " -> ".join(parts)
