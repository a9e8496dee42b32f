"""Application-function-wise (AFW) queues: FIFO per queue, round-robin across queues."""

from __future__ import annotations

import pytest

from gshare.policy.workflow.queues import AfwJob, AfwKey, AfwQueues, next_queue

A1 = AfwKey("app1", "deblur")
A2 = AfwKey("app2", "deblur")  # same function, other application: a separate queue
B1 = AfwKey("app1", "classification")


def job(i: int, t: float = 0.0) -> AfwJob:
    return AfwJob(request_id=i, arrival_ms=t, enqueued_ms=t)


def test_round_robin_visits_queues_in_order_and_skips_empty_ones() -> None:
    q = AfwQueues().register(A1).register(A2).register(B1)
    q = q.push(A1, job(1)).push(A1, job(2)).push(B1, job(3))
    served = []
    for _ in range(4):
        key, q = next_queue(q)
        assert key is not None
        served.append(key)
    # A2 is empty and skipped; A1 and B1 alternate although A1 holds more jobs
    assert served == [A1, B1, A1, B1]


def test_served_queue_goes_to_the_back_of_the_round() -> None:
    q = AfwQueues().push(A1, job(1)).push(A2, job(2)).push(B1, job(3))
    key, q = next_queue(q)
    assert key == A1
    q = q.push(A1, job(4))  # new work for A1 does not let it jump the queue
    key, q = next_queue(q)
    assert key == A2
    key, q = next_queue(q)
    assert key == B1
    key, q = next_queue(q)
    assert key == A1


def test_ready_predicate_and_nothing_ready() -> None:
    q = AfwQueues().push(A1, job(1)).push(A2, job(2))
    key, q2 = next_queue(q, ready=lambda k, jobs: k.application == "app2")
    assert key == A2 and q2.cursor == 0  # wrapped past A2 (index 1) to 0
    none, q3 = next_queue(q, ready=lambda k, jobs: False)
    assert none is None and q3 is q
    assert next_queue(AfwQueues())[0] is None


def test_fifo_take_and_oldest_wait() -> None:
    q = AfwQueues().push(A1, job(1, 10.0)).push(A1, job(2, 15.0)).push(A1, job(3, 30.0))
    assert q.oldest_wait_ms(A1, now_ms=40.0) == 30.0  # job 1 enqueued at 10
    taken, q = q.take(A1, 2)
    assert [j.request_id for j in taken] == [1, 2]
    assert q.length(A1) == 1 and q.oldest_wait_ms(A1, 40.0) == 10.0
    taken, q = q.take(A1, 5)  # fewer than asked
    assert [j.request_id for j in taken] == [3] and q.total() == 0
    assert q.oldest_wait_ms(A1, 40.0) == 0.0
    with pytest.raises(KeyError, match="no AFW queue"):
        q.take(B1, 1)


def test_queues_are_immutable_values() -> None:
    q0 = AfwQueues()
    q1 = q0.push(A1, job(1))
    assert q0.total() == 0 and q1.total() == 1
