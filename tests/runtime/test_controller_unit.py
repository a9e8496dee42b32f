"""The controller without Ray or an instance process: a real ``Controller``, ``Gateway`` and
``StateStore``, an in-process node agent that speaks the typed contract of
``runtime.messages`` (``AgentHandle``), a real Unix socket per "instance" for the gateway to
connect to, and an injected clock. Each test drives the loop by calling ``reconcile`` /
``cold_starts`` itself."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gshare.policy.control import ControlParams
from gshare.runtime.control.loop import Controller
from gshare.runtime.control.observe import STARTING_POLL_MIN_S, STARTING_POLL_S, starting_poll_s
from gshare.runtime.control.records import ControllerConfig
from gshare.runtime.control.state import StateStore
from gshare.runtime.gateway.errors import HttpError
from gshare.runtime.gateway.router import Gateway
from gshare.runtime.instance import protocol as P
from gshare.runtime.instance.launch import InstanceLaunch
from gshare.runtime.messages import (
    AgentGone,
    InstanceState,
    InstanceStatus,
    LiveState,
    NodeInfo,
    NodeStatus,
)
from gshare.runtime.metrics import Metrics
from gshare.spec import parse_function_spec

NODE = "node-a"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@dataclass
class FakeAgent:
    """A node agent in the test's process: instances are Unix-socket listeners that accept
    connections and never answer (so requests stay in flight). ``fail_starts`` makes the next
    starts fail; ``restart(iid)`` simulates a crash and a restart in place."""

    run_dir: Path
    node_id: str = NODE
    fail_starts: int = 0
    gone: bool = False
    instances: dict[str, InstanceStatus] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    connections: dict[str, int] = field(default_factory=dict)
    _servers: dict[str, asyncio.AbstractServer] = field(default_factory=dict)

    async def status(self) -> NodeStatus:
        if self.gone:
            raise AgentGone("the agent died")
        return NodeStatus(self.node_id, "127.0.0.1", 0.0, tuple(self.instances.values()))

    async def start_instance(self, launch: InstanceLaunch) -> None:
        iid = launch.instance_id
        self.started.append(iid)
        if self.fail_starts > 0:
            self.fail_starts -= 1
            self.instances[iid] = InstanceStatus(
                iid, launch.function, InstanceState.FAILED, 0, error="ImportError: no module x"
            )
            return
        path = str(self.run_dir / f"{iid}.sock")

        def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections[iid] = self.connections.get(iid, 0) + 1

        self._servers[iid] = await asyncio.start_unix_server(on_connect, path)
        self.instances[iid] = InstanceStatus(
            iid, launch.function, InstanceState.READY, 0, uds_path=path
        )

    async def stop_instance(self, instance_id: str) -> None:
        self.stopped.append(instance_id)
        self.instances.pop(instance_id, None)
        srv = self._servers.pop(instance_id, None)
        if srv is not None:
            srv.close()

    async def describe(self, spec: dict[str, Any], extra_sys_path: list[str]) -> dict[str, Any]:
        return {"ok": True, "inputs": []}

    async def set_share(self, instance_id: str, quota_request: float, quota_limit: float) -> None:
        pass

    def set_state(self, iid: str, state: InstanceState, incarnation: int | None = None) -> None:
        st = self.instances[iid]
        inc = st.incarnation if incarnation is None else incarnation
        self.instances[iid] = replace(st, state=state, incarnation=inc)

    async def close(self) -> None:
        for srv in self._servers.values():
            srv.close()


@contextlib.asynccontextmanager
async def world(tmp_path: Path, **spec: Any):  # type: ignore[no-untyped-def]
    clock = Clock()
    metrics = Metrics()
    gw = Gateway(clock=clock, request_timeout_s=3600.0, metrics=metrics)
    store = StateStore.open(tmp_path / "state")
    ctl = Controller(
        store,
        gw,
        ControllerConfig(control=ControlParams(start_backoff_s=2.0), drain_timeout_s=30.0),
        metrics=metrics,
        gateway_node_id=NODE,
        clock=clock,
    )
    agent = FakeAgent(tmp_path)
    ctl.add_agent(agent, NodeInfo(NODE, ("cpu",), cpu_count=2))
    base = {
        "name": "f",
        "handler": "gshare.runtime.demo_handlers:Echo",
        "device": "cpu",
        "resources": {"sm_pct": 50, "quota_request": 0.5, "quota_limit": 0.5},
        "max_instances": 2,
        "keep_alive_s": 60,
    }
    ctl.register(parse_function_spec({**base, **spec}), 1, [])
    try:
        yield ctl, gw, agent, clock
    finally:
        gw.fail_all(503, "test over")
        await agent.close()


def submit(gw: Gateway, n: int = 1) -> list[Any]:
    return [gw.submit("f", P.OP_INVOKE, P.ENC_RAW, b"x") for _ in range(n)]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_cold_request_starts_an_instance_and_connects(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path) as (ctl, gw, agent, clock):
            submit(gw)  # no instance: queued at the gateway
            assert gw.queued("f") == 1
            await ctl.cold_starts()
            assert agent.started == ["f-1"]
            await ctl.observe()  # the agent reports it ready: the gateway connects
            assert ctl.instances["f-1"].state is LiveState.READY
            assert gw.is_connected("f", "f-1") and gw.queued("f") == 0
            assert gw.inflight("f", "f-1") == 1

    run(go())


def test_failed_start_backs_off_and_fails_the_queue(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path) as (ctl, gw, agent, clock):
            agent.fail_starts = 2
            (p,) = submit(gw)
            await ctl.cold_starts()
            await ctl.observe()  # FAILED: released, back-off 2 s, the queued request fails
            assert ctl.instances == {} and agent.stopped == ["f-1"]
            err = p.future.exception()
            assert isinstance(err, HttpError) and err.status == 503 and "ImportError" in err.message
            fs = ctl.functions["f"]
            assert fs.control.start_failures == 1 and fs.control.backoff_until_s == clock.t + 2.0
            assert "ImportError" in (fs.start_error or "")
            submit(gw)
            clock.t += 1.0  # inside the back-off: nothing starts
            await ctl.cold_starts()
            assert agent.started == ["f-1"]
            clock.t += 1.0  # back-off over: the next start (which fails too) doubles it
            await ctl.cold_starts()
            await ctl.observe()
            assert agent.started == ["f-1", "f-2"]
            assert fs.control.start_failures == 2 and fs.control.backoff_until_s == clock.t + 4.0
            clock.t += 4.0  # the third start succeeds and resets the count
            submit(gw)
            await ctl.cold_starts()
            await ctl.observe()
            assert ctl.instances["f-3"].state is LiveState.READY
            assert fs.control.start_failures == 0 and fs.start_error is None

    run(go())


def test_restart_in_place_reconnects(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path) as (ctl, gw, agent, clock):
            submit(gw)
            await ctl.cold_starts()
            await ctl.observe()
            await asyncio.sleep(0.05)  # let the listener see the connection
            assert agent.connections == {"f-1": 1}
            agent.set_state("f-1", InstanceState.STARTING, incarnation=1)  # crashed, restarting
            await ctl.observe()
            assert ctl.instances["f-1"].state is LiveState.RESTARTING
            assert not gw.is_connected("f", "f-1")
            agent.set_state("f-1", InstanceState.READY)  # the new incarnation is up
            await ctl.observe()
            await asyncio.sleep(0.05)  # let the listener see the second connection
            inst = ctl.instances["f-1"]
            assert inst.state is LiveState.READY and inst.incarnation == 1
            assert agent.connections == {"f-1": 2} and gw.is_connected("f", "f-1")

    run(go())


def test_drain_waits_for_in_flight_then_times_out(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path) as (ctl, gw, agent, clock):
            submit(gw)
            await ctl.cold_starts()
            await ctl.observe()
            assert gw.inflight("f", "f-1") == 1  # the fake instance never answers
            ctl.drain(ctl.instances["f-1"], "test")
            clock.t += 29.0  # within drain_timeout_s = 30: still draining
            await ctl.reconcile()
            assert "f-1" in ctl.instances and agent.stopped == []
            clock.t += 2.0  # past the timeout: stopped although a request is in flight
            await ctl.reconcile()
            assert "f-1" not in ctl.instances and agent.stopped == ["f-1"]

    run(go())


def test_keep_alive_then_scale_to_zero(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path, keep_alive_s=60) as (ctl, gw, agent, clock):
            submit(gw)
            await ctl.cold_starts()
            await ctl.observe()
            clock.t += 600.0  # long past the keep-alive, but a request is in flight: busy
            busy_at = clock.t
            await ctl.reconcile()
            assert "f-1" in ctl.instances
            gw.fail_all(503, "answer everything")  # nothing outstanding from now on
            idle_since = gw.idle_since_s("f")
            assert idle_since is not None
            clock.t = idle_since + 59.0
            await ctl.reconcile()
            assert ctl.instances["f-1"].state is LiveState.READY  # kept alive
            clock.t = idle_since + 60.5
            await ctl.reconcile()  # scaled to zero: drained (nothing in flight) and stopped
            assert ctl.instances == {} and agent.stopped == ["f-1"]
            assert ctl.functions["f"].predicted_rps == 0.0
            # each period tick's clock reading is kept (the end of its rate sample's period),
            # and the control API reports them; cold starts and observations are not ticks
            assert list(ctl.ticks_s) == [busy_at, idle_since + 59.0, idle_since + 60.5]

    run(go())


def test_lost_agent_loses_its_instances(tmp_path: Path) -> None:
    async def go() -> None:
        async with world(tmp_path) as (ctl, gw, agent, clock):
            submit(gw)
            await ctl.cold_starts()
            await ctl.observe()
            agent.gone = True
            await ctl.observe()
            assert not ctl.agents[NODE].alive and ctl.instances == {}
            assert not ctl.ready()

    run(go())


def test_a_request_that_times_out_without_room_says_why(tmp_path: Path) -> None:
    """f's instance holds 60 % x 60 % of the only device, so g's (60 % x 60 %) cannot be
    placed: g's request waits (room may free up) and, timed out, names the placer's reason;
    once an instance of g is placed the reason is gone."""
    share = {"sm_pct": 60, "quota_request": 0.6, "quota_limit": 0.6}

    async def go() -> None:
        async with world(tmp_path, resources=share) as (ctl, gw, agent, clock):
            submit(gw)
            await ctl.cold_starts()
            await ctl.observe()
            assert agent.started == ["f-1"]
            g = {"name": "g", "handler": "gshare.runtime.demo_handlers:Echo", "device": "cpu"}
            ctl.register(parse_function_spec({**g, "resources": share}), 1, [])
            gw.request_timeout_s = 0.2
            p = gw.submit("g", P.OP_INVOKE, P.ENC_RAW, b"x")
            await ctl.cold_starts()
            assert agent.started == ["f-1"]  # no room for g
            reason = gw.routes["g"].waiting_reason
            assert reason is not None and "no room for another instance" in reason
            try:
                await gw.wait(p)
                raise AssertionError("g's request was answered without an instance")
            except HttpError as e:
                assert e.status == 504 and "no room for another instance" in e.message, e
            await ctl.stop_instance("f-1")  # room again
            gw.request_timeout_s = 3600.0
            gw.submit("g", P.OP_INVOKE, P.ENC_RAW, b"x")
            await ctl.cold_starts()
            assert [i.split("-")[0] for i in agent.started] == ["f", "g"]
            assert gw.routes["g"].waiting_reason is None

    run(go())


def test_a_start_that_cannot_be_placed_is_logged_once_and_says_why(tmp_path: Path) -> None:
    """g (min_instances 1) cannot be placed beside f: the controller retries every period,
    but its log says so once — the scaling line and the placer's reason — and repeats the
    line only after REPEAT_SCALE_LOG_S, saying what it is still waiting for."""
    from gshare.runtime.control.loop import REPEAT_SCALE_LOG_S

    share = {"sm_pct": 60, "quota_request": 0.6, "quota_limit": 0.6}

    async def go() -> None:
        async with world(tmp_path, resources=share) as (ctl, gw, agent, clock):
            submit(gw)
            await ctl.cold_starts()
            await ctl.observe()
            g = {"name": "g", "handler": "gshare.runtime.demo_handlers:Echo", "device": "cpu"}
            ctl.register(parse_function_spec({**g, "resources": share, "min_instances": 1}), 1, [])

            def lines(word: str) -> list[str]:
                return [e.message for e in ctl.state.events("g", 500) if word in e.message]

            for _ in range(10):  # ten periods, ten failed placements
                await ctl.reconcile()
                clock.t += 1.0
            assert agent.started == ["f-1"]
            assert len(lines("scale:")) == 1, lines("scale:")
            assert len(lines("no room for another instance")) == 1
            clock.t += REPEAT_SCALE_LOG_S
            await ctl.reconcile()
            again = lines("scale:")
            assert len(again) == 2 and "still waiting: no room for another instance" in again[1]

    run(go())


def test_a_starting_instance_is_polled_at_an_eighth_of_its_age_within_bounds() -> None:
    """A fork that is ready in ~100 ms is seen within ~20 ms; a slow model load is polled a few
    times a second, never more often than every ``STARTING_POLL_MIN_S``."""
    ages_s = [0.0, 0.05, 0.16, 0.4, 1.0, 2.0, 60.0]
    polls = [starting_poll_s(a) for a in ages_s]
    assert polls == sorted(polls)  # never faster as the start takes longer
    assert polls[0] == STARTING_POLL_MIN_S and polls[-1] == STARTING_POLL_S
    assert starting_poll_s(0.8) == 0.1  # between the bounds: an eighth of the age
