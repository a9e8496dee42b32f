"""policy.priority.classes: how a device combines FIKIT's priority classes with time tokens.

Table-driven tests of ``plan_classes`` and a run of the real ``TokenScheduler`` behind it: two
functions of the top class share the device by their quotas, a lower-class function gets no
token while they are active and is asked to yield the one it holds when they arrive.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gshare.policy.priority import ClientClass, plan_classes
from gshare.policy.tokens import ClientSpec, Grant, TokenConfig, TokenScheduler


@pytest.mark.parametrize(
    ("clients", "top", "token", "fill", "revoke"),
    [
        # nobody active: everyone may ask (plain token scheduling)
        ([("a", 9, False, False), ("b", 2, False, False)], None, {"a", "b"}, set(), set()),
        # one class: the plan is the token scheduler alone
        ([("a", 5, True, False), ("b", 5, True, True)], 5, {"a", "b"}, set(), set()),
        # b (2) is active alone: it is the top class; idle a (9) may still ask (and take over)
        ([("a", 9, False, False), ("b", 2, True, True)], 2, {"a", "b"}, set(), set()),
        # a (9) active: b (2) only fills gaps and must yield the token it holds
        ([("a", 9, True, False), ("b", 2, True, True)], 9, {"a"}, {"b"}, {"b"}),
        # three classes: c (7) active -> a and c (>= 7) may ask, b (2) and d (5) fill
        (
            [("a", 9, False, False), ("b", 2, True, False), ("c", 7, True, True),
             ("d", 5, False, False)],
            7,
            {"a", "c"},
            {"b", "d"},
            set(),
        ),
    ],
)  # fmt: skip
def test_plan_table(
    clients: list[tuple[str, int, bool, bool]],
    top: int | None,
    token: set[str],
    fill: set[str],
    revoke: set[str],
) -> None:
    plan = plan_classes(ClientClass(c, p, a, h) for c, p, a, h in clients)
    assert plan.top_priority == top
    assert plan.token_clients == token and plan.fill_clients == fill and plan.revoke == revoke
    assert all(plan.may_request_token(c) for c in token)
    assert not any(plan.may_request_token(c) for c in fill)


CLIENTS = st.lists(
    st.tuples(st.integers(0, 9), st.booleans(), st.booleans()), min_size=1, max_size=8
)


@given(cs=CLIENTS)
def test_no_token_below_the_top_class(cs: list[tuple[int, bool, bool]]) -> None:
    plan = plan_classes(ClientClass(f"c{i}", p, a, h) for i, (p, a, h) in enumerate(cs))
    ids = {f"c{i}" for i in range(len(cs))}
    assert plan.token_clients | plan.fill_clients == ids
    assert not plan.token_clients & plan.fill_clients
    for i, (p, _, h) in enumerate(cs):
        cid = f"c{i}"
        if plan.top_priority is not None and p < plan.top_priority:
            assert cid in plan.fill_clients and (cid in plan.revoke) == h
        else:
            assert cid in plan.token_clients and cid not in plan.revoke


def test_token_server_driven_by_the_plan() -> None:
    # A token server that forwards requests only when the plan allows. hi1 and hi2 (priority 7,
    # request 0.5 each) share the device by the token scheduler; lo (priority 2) waits while
    # either is active. Window 40 ms, dynamic quota off: a token is the remaining quota.
    ts = TokenScheduler(TokenConfig(dynamic_quota=False, elastic=False))
    prio = {"hi1": 7, "hi2": 7, "lo": 2}
    for cid, p in prio.items():
        ts.add_client(ClientSpec(cid, 100.0, 0.5, 0.5, p), 0.0)
    active: set[str] = set()
    waiting: set[str] = set()
    holding: dict[str, Grant] = {}

    def plan():  # type: ignore[no-untyped-def]
        return plan_classes(
            ClientClass(c, p, c in active or c in holding, c in holding) for c, p in prio.items()
        )

    def forward(now: float) -> list[Grant]:
        grants: list[Grant] = []
        for c in sorted(waiting):
            if plan().may_request_token(c):
                waiting.discard(c)
                grants += ts.request(c, now)
        for g in grants:
            holding[g.client_id] = g
        return grants

    def ask(c: str, now: float) -> list[Grant]:
        active.add(c)
        waiting.add(c)
        return forward(now)

    # lo is alone at 0: it is the top class and gets a token (its 20 ms)
    assert [g.client_id for g in ask("lo", 0.0)] == ["lo"]
    # hi1 arrives at 5: lo must yield at its next preemption point (task switching)
    ask("hi1", 5.0)
    assert plan().revoke == {"lo"}
    del holding["lo"]
    active.discard("lo")
    g = ts.release("lo", 5.2, 5.2)  # it yields 0.2 ms later; the scheduler grants hi1
    for x in g:
        holding[x.client_id] = x
    assert set(holding) == {"hi1"}
    # lo asks again while hi1 is active: not forwarded (it runs only as FIKIT fills)
    ask("lo", 6.0)
    assert "lo" in waiting and "lo" not in holding
    # hi2 asks: the same class, the token scheduler queues it (one device, SM 100 % each)
    ask("hi2", 7.0)
    assert "hi2" not in waiting
    # hi1 releases at 25.2 (its 20 ms): hi2 gets the device by the token scheduler
    del holding["hi1"]
    active.discard("hi1")
    for x in ts.release("hi1", 20.0, 25.2):
        holding[x.client_id] = x
    assert set(holding) == {"hi2"}
    assert "lo" in waiting  # hi2 is still active: lo still waits
    # hi2 finishes: nobody above lo is active, lo's request is forwarded
    del holding["hi2"]
    active.discard("hi2")
    for x in ts.release("hi2", 20.0, 45.2):
        holding[x.client_id] = x
    assert [g.client_id for g in forward(45.2)] == ["lo"]
