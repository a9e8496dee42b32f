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
