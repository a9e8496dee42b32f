"""``control.observe``: a node's report read into typed observations, against the records.

Pure: each case builds the controller's records of one node's instances and the agent's report,
and checks the observations and their order (the controller applies them in that order; its
application is covered by ``test_controller_unit``)."""

from __future__ import annotations

import pytest

from gshare.policy.autoscale import ScaleConfig
from gshare.resources import GpuShare
from gshare.runtime.control.observe import (
    FikitReported,
    MemoryReported,
    Reported,
    ReportedFailed,
    ReportedReady,
    ReportedRestarting,
    Restarted,
    TokensUsed,
    Vanished,
    read_node_status,
    record_tokens,
)
from gshare.runtime.control.records import Device, LiveInstance
from gshare.runtime.messages import (
    FikitUsage,
    InstanceState,
    InstanceStatus,
    LiveState,
    MemoryUsage,
    NodeStatus,
    TokenUsage,
)

DEV = Device(0, "n1", 0, "cpu")
CFG = ScaleConfig(sm_pct=50, quota_pct=50, batch=1, throughput_rps=10, latency_ms=10)
SHARE = GpuShare(50, 0.5, 0.5)


def live(iid: str = "f-1", **kw: object) -> LiveInstance:
    inst = LiveInstance(iid, "f", CFG, SHARE, DEV, created_s=100.0)
    for k, v in kw.items():
        setattr(inst, k, v)
    return inst


def report(*instances: InstanceStatus, tokens: dict[str, TokenUsage] | None = None) -> NodeStatus:
    return NodeStatus("n1", "10.0.0.1", now_s=50.0, instances=instances, tokens=tokens or {})


def status(state: InstanceState = InstanceState.READY, **kw: object) -> InstanceStatus:
    base: dict[str, object] = {"instance_id": "f-1", "function": "f", "state": state}
    base.update(kw)
    return InstanceStatus(incarnation=int(base.pop("incarnation", 0)), **base)  # type: ignore[arg-type]


def kinds(obs: list[object]) -> list[type]:
    return [type(o) for o in obs]


def read(st: NodeStatus, *insts: LiveInstance, now_s: float = 105.0) -> list[object]:
    return list(read_node_status(st, insts, now_s=now_s, agent_timeout_s=10.0, local=True))


def test_ready_instance_reports_its_process_then_ready_then_tokens() -> None:
    tok = TokenUsage(total_used_ms=40.0, quota_request=0.5, quota_limit=0.5, sm_pct=50)
    st = report(status(pid=7, rss_mb=12.0, uds_path="/s", incarnation=3), tokens={"f-1": tok})
    obs = read(st, live())
    assert kinds(obs) == [Reported, ReportedReady, TokensUsed]
    assert obs[0] == Reported("f-1", 7, 12.0, None, "/s", None)
    assert obs[1] == ReportedReady("f-1", 3, "10.0.0.1", True, None)
    assert obs[2] == TokensUsed("f-1", 40.0, 50.0)


@pytest.mark.parametrize(
    ("now_s", "expected"),
    [
        (105.0, []),  # 5 s since it was asked to start: its agent may not list it yet
        (110.5, [Vanished]),  # 10.5 s > agent_timeout_s 10
    ],
)
def test_an_instance_missing_from_the_report_vanishes_only_after_the_timeout(
    now_s: float, expected: list[type]
) -> None:
    assert kinds(read(report(), live(), now_s=now_s)) == expected


def test_memory_and_fikit_reports_are_passed_over_while_profiling() -> None:
    st = report(status(memory=MemoryUsage(limit_mb=64.0), fikit=FikitUsage(phase="sharing")))
    assert kinds(read(st, live())) == [Reported, MemoryReported, FikitReported, ReportedReady]
    assert kinds(read(st, live(profiling=True))) == [Reported, ReportedReady]


def test_restarts_beyond_the_records_are_a_restart() -> None:
    st = report(status(InstanceState.STARTING, restarts=2, last_exit="signal 9"))
    assert kinds(read(st, live(restarts=2, state=LiveState.STARTING))) == [Reported]
    obs = read(st, live(restarts=1, state=LiveState.READY))
    assert kinds(obs) == [Reported, Restarted, ReportedRestarting]
    assert obs[1] == Restarted("f-1", 2, "signal 9")


def test_a_failed_start_ends_the_instance_observations() -> None:
    tok = TokenUsage(total_used_ms=1.0, quota_request=0.5, quota_limit=0.5, sm_pct=50)
    st = report(status(InstanceState.FAILED, error="ImportError: x"), tokens={"f-1": tok})
    obs = read(st, live())
    assert kinds(obs) == [Reported, ReportedFailed]
    assert obs[1] == ReportedFailed("f-1", "ImportError: x")
    st2 = report(status(InstanceState.FAILED))
    assert read(st2, live())[1] == ReportedFailed("f-1", "unknown error")


def test_reading_changes_no_record() -> None:
    inst = live(restarts=0)
    before = repr(inst)
    read(report(status(restarts=4, memory=MemoryUsage(limit_mb=8.0))), inst)
    assert repr(inst) == before


def test_achieved_share_is_busy_time_over_elapsed_time() -> None:
    inst = live()
    record_tokens(inst, TokensUsed("f-1", 100.0, 10.0))  # first report: no share yet
    assert inst.achieved_share is None
    record_tokens(inst, TokensUsed("f-1", 400.0, 11.0))  # 300 ms busy in 1,000 ms
    assert inst.achieved_share == pytest.approx(0.3)
    record_tokens(inst, TokensUsed("f-1", 400.0, 11.0))  # no time passed: kept
    assert inst.achieved_share == pytest.approx(0.3)


def test_idle_hold_is_the_held_time_beyond_the_busy_time_per_token_released() -> None:
    inst = live()
    record_tokens(inst, TokensUsed("f-1", 100.0, 10.0, total_held_ms=110.0, tokens=10))
    assert inst.token_idle_hold_ms is None  # first report: nothing to compare with
    # 20 tokens more, held 260 ms for 240 ms busy: 1 ms idle each
    record_tokens(inst, TokensUsed("f-1", 340.0, 11.0, total_held_ms=370.0, tokens=30))
    assert inst.token_idle_hold_ms == pytest.approx(1.0)
    record_tokens(inst, TokensUsed("f-1", 350.0, 12.0, total_held_ms=370.0, tokens=30))
    assert inst.token_idle_hold_ms == pytest.approx(1.0)  # no token released: kept
    assert (inst.token_held_ms, inst.tokens) == (370.0, 30)
