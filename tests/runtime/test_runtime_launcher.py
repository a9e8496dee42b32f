"""The instance launcher (``runtime.launcher``): a real template process forks instances and
one-off calls. Checks: the template forks with one thread; calls return results and name
their errors; an instance forked from it serves and shares the template's import heap; the
template's exit takes every child with it."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gshare.policy.tokens import ClientSpec, TokenConfig
from gshare.runtime.instance import protocol as P
from gshare.runtime.instance.launch import InstanceLaunch, launch_to_dict
from gshare.runtime.node.launcher import Launcher, LauncherError
from gshare.runtime.tokens import TokenServer
from gshare.testing import TINY_MODELS_ENV, wait_until


@pytest.fixture(scope="module")
def launcher() -> Iterator[Launcher]:
    lau = Launcher(dict(TINY_MODELS_ENV))  # for the template and its children only
    lau.start()
    yield lau
    lau.stop()


@pytest.fixture()
def run_dir(short_tmp: Path) -> Path:
    return short_tmp  # conftest: a short path, for the instances' Unix sockets


@pytest.fixture()
def node(run_dir: Path) -> Iterator[tuple[TokenServer, Launcher]]:
    """A node's mechanisms: a token server and a template of its own (tiny models)."""
    ts = TokenServer(str(run_dir / "tokens.sock"), TokenConfig())
    ts.start()
    lau = Launcher(dict(TINY_MODELS_ENV))
    lau.start()
    try:
        yield ts, lau
    finally:
        lau.stop()
        ts.stop()


def test_the_template_is_single_threaded_and_answers_calls(launcher: Launcher) -> None:
    assert launcher.alive()
    proc = psutil.Process(launcher.pid)
    assert proc.num_threads() == 1  # a fork copies one thread: the template must have one
    assert "torch" in " ".join(m.path for m in proc.memory_maps())  # it imported the runtime
    assert launcher.call("os.path:join", ["a", "b"]) == "a/b"
    key = launcher.call(
        "gshare.runtime.node.tasks:describe_handler",
        [{"name": "m", "model": "mlp", "device": "cpu"}, []],
    )
    assert key["ok"] and key["inputs"][0]["shape"] == [-1, 64]


def test_call_errors_name_the_problem(launcher: Launcher) -> None:
    with pytest.raises(LauncherError, match="JSONDecodeError"):
        launcher.call("json:loads", ["{"])
    with pytest.raises(LauncherError, match="ModuleNotFoundError: No module named 'no_such_mod'"):
        launcher.call("no_such_mod:f", [])
    with pytest.raises(LauncherError, match="died without an answer"):
        launcher.call("os:_exit", [3])
    assert launcher.call("os.path:basename", ["/x/y"]) == "y"  # still serving


def _launch(run_dir: Path, ts: TokenServer, iid: str, model: str = "mlp") -> InstanceLaunch:
    ts.add_client(ClientSpec(iid, 100.0, 1.0, 1.0))
    return InstanceLaunch(
        instance_id=iid,
        function="f",
        spec={"name": "f", "model": model, "device": "cpu"},
        sm_pct=100.0,
        quota_request=1.0,
        quota_limit=1.0,
        mem_mb=0.0,
        priority=0,
        max_batch=4,
        max_wait_ms=1.0,
        token_socket=ts.socket_path,
        uds_path=str(run_dir / f"{iid}.sock"),
    )


def test_forked_instance_serves_shares_the_imports_and_dies_with_the_template(
    run_dir: Path, node: tuple[TokenServer, Launcher]
) -> None:
    ts, lau = node
    launches = [_launch(run_dir, ts, f"i{k}") for k in range(2)]
    pids = [
        lau.launch(launch_to_dict(la), str(run_dir / f"{la.instance_id}.log")) for la in launches
    ]
    for la in launches:
        wait_until(
            lambda la=la: Path(la.uds_path + ".ready").exists(), 60, f"{la.instance_id} ready"
        )
    infos = [json.loads(Path(la.uds_path + ".ready").read_text()) for la in launches]
    assert [i["pid"] for i in infos] == pids
    for pid in pids:
        assert psutil.Process(pid).ppid() == lau.pid  # forked by the template
    status, body = P.call_once(
        launches[0].uds_path, P.OP_INVOKE, P.ENC_JSON, json.dumps([0.5] * 64).encode()
    )
    assert status == P.ST_OK, body
    assert 0 <= json.loads(body)["label"] < 10  # the MLP's top class of 10
    # The import heap (Python, torch, transformers) is the template's, shared copy-on-write:
    # most of an instance's resident memory is not its own (a process that imported the
    # runtime itself holds ~300 MB privately: over 3/4 of its RSS).
    for pid in pids:
        mem = psutil.Process(pid).memory_full_info()
        assert mem.uss < 0.25 * mem.rss, mem
    # SIGTERM stops one instance; the template reports its exit.
    os.kill(pids[1], signal.SIGTERM)
    wait_until(lambda: lau.exit_code(pids[1]) is not None, 30, "the exit to be reported")
    assert lau.exit_code(pids[1]) == 0
    template = psutil.Process(lau.pid)
    lau.stop()  # the agent goes away: the template and every instance with it
    wait_until(
        lambda: (
            not psutil.pid_exists(pids[0])
            or psutil.Process(pids[0]).status() == psutil.STATUS_ZOMBIE
        ),
        30,
        "the instance to die with the template",
    )
    assert not template.is_running()


def test_an_instance_that_cannot_start_says_why(launcher: Launcher, run_dir: Path) -> None:
    ts = TokenServer(str(run_dir / "tokens.sock"), TokenConfig())
    ts.start()
    try:
        bad = _launch(run_dir, ts, "bad")
        bad_dict = launch_to_dict(bad)
        bad_dict["spec"] = {"name": "f", "handler": "no_such_module:Handler", "device": "cpu"}
        log = run_dir / "bad.log"
        pid = launcher.launch(bad_dict, str(log))
        wait_until(lambda: launcher.exit_code(pid) is not None, 60, "the failed start to exit")
        assert launcher.exit_code(pid) == 1
        reason = Path(bad.uds_path + ".exit").read_text()
        assert reason.startswith("failed to start:") and "no_such_module" in reason
        assert "Traceback" in log.read_text()  # the details are in the instance's log
        assert not Path(bad.uds_path + ".ready").exists()
    finally:
        ts.stop()


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA device")
def test_forked_instance_uses_cuda_with_its_mps_share(
    run_dir: Path, node: tuple[TokenServer, Launcher]
) -> None:
    """Where CUDA exists: the template never initialises CUDA, so an instance forked from it
    creates its own context, after its launch env (the MPS thread percentage) is in place."""
    ts, lau = node
    base = _launch(run_dir, ts, "g0")
    la = launch_to_dict(base)
    la.update(
        device="cuda:0",
        spec={"name": "f", "model": "mlp", "device": "cuda"},
        env={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"},
    )
    pid = lau.launch(la, str(run_dir / "g0.log"))
    wait_until(
        lambda: Path(base.uds_path + ".ready").exists() or lau.exit_code(pid) is not None,
        120,
        "the CUDA instance to start",
    )
    assert Path(base.uds_path + ".ready").exists(), (run_dir / "g0.log").read_text()
    status, body = P.call_once(
        base.uds_path, P.OP_INVOKE, P.ENC_JSON, json.dumps([0.5] * 64).encode()
    )
    assert status == P.ST_OK, body


@pytest.mark.parametrize("event", ["reconnect", "restarting"])
def test_a_replaced_gateway_connection_lets_its_requests_finish(
    run_dir: Path, node: tuple[TokenServer, Launcher], event: str
) -> None:
    """The controller reconnects to an instance when it sees a new incarnation, and drops its
    connection when the agent reports it restarting; with fast restarts, and status snapshots
    older than the controller's connects, that connection may already reach the new
    incarnation and carry requests. They finish on it: no retry is counted (two counted
    retries fail a request with a 502)."""
    import asyncio

    from gshare.runtime.gateway.router import Gateway

    ts, lau = node
    la = _launch(run_dir, ts, "s0")
    d = launch_to_dict(la)
    d["spec"] = {"name": "f", "handler": "gshare.runtime.demo_handlers:Sleep", "device": "cpu"}
    pid = lau.launch(d, str(run_dir / "s0.log"))
    wait_until(lambda: Path(la.uds_path + ".ready").exists(), 60, "the instance to start")

    async def scenario() -> tuple[int, int, bytes]:
        gw = Gateway()
        gw.add_function("f", None, 1)
        await gw.instance_ready("f", "s0", uds_path=la.uds_path, tcp=None, max_batch=1)
        p = gw.submit("f", P.OP_INVOKE, P.ENC_JSON, b'{"sleep_ms": 500}')
        await asyncio.sleep(0.1)  # running on the first connection
        if event == "reconnect":
            await gw.instance_ready("f", "s0", uds_path=la.uds_path, tcp=None, max_batch=1)
        else:
            gw.instance_restarting("f", "s0")
        status, _enc, payload, _m = await gw.wait(p)
        return status, p.attempts, payload

    status, attempts, payload = asyncio.run(scenario())
    assert status == P.ST_OK, payload
    assert attempts == 0
    assert json.loads(payload)["pid"] == pid


def _tcp_exchange(port: int, frames: list[bytes]) -> int | None:
    """Send ``frames`` on a new TCP connection; the status of the first answer, or None when
    the instance closed the connection without one."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"".join(frames))
        reader = P.FrameReader(P.RESP_FIXED)
        while True:
            try:
                data = s.recv(1 << 16)
            except ConnectionResetError:
                return None
            if not data:
                return None
            for frame in reader.feed(data):
                return int(P.RESP_REST.unpack_from(frame)[1])


def test_a_tcp_listener_binds_the_node_address_and_needs_the_channel_secret(
    run_dir: Path, node: tuple[TokenServer, Launcher]
) -> None:
    """Issue 15, item 13: on a cluster, instances listened on TCP 0.0.0.0 and served whoever
    connected. Now the listener binds the node's address, and a connection must present the
    instance's channel secret first (``OP_AUTH``); anything else is closed unanswered."""
    import dataclasses

    ts, lau = node
    la = dataclasses.replace(
        _launch(run_dir, ts, "tcp0"), listen_tcp=True, tcp_host="127.0.0.1", channel_secret="s3"
    )
    lau.launch(launch_to_dict(la), str(run_dir / "tcp0.log"))
    wait_until(lambda: Path(la.uds_path + ".ready").exists(), 60, "the instance")
    info = json.loads(Path(la.uds_path + ".ready").read_text())
    port = int(info["tcp_port"])
    listening = [
        c.laddr
        for c in psutil.Process(info["pid"]).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]
    assert [a.ip for a in listening] == ["127.0.0.1"], listening
    body = json.dumps([0.5] * 64).encode()
    invoke = P.encode_request(1, P.OP_INVOKE, P.ENC_JSON, body)
    assert _tcp_exchange(port, [invoke]) is None  # no secret
    wrong = P.encode_request(0, P.OP_AUTH, P.ENC_RAW, b"guess")
    assert _tcp_exchange(port, [wrong, invoke]) is None
    right = P.encode_request(0, P.OP_AUTH, P.ENC_RAW, b"s3")
    assert _tcp_exchange(port, [right, invoke]) == P.ST_OK


class _Lines:
    """A stand-in for the template process as the launcher's reader sees it: its stdout."""

    def __init__(self, *msgs: dict[str, object]) -> None:
        self.stdout = [json.dumps(m) + "\n" for m in msgs]


def test_a_reused_pid_does_not_carry_an_earlier_childs_exit() -> None:
    """The kernel hands pids out again (32768 of them by default); the template's exit report
    for an earlier child must not mark a new instance with the same pid as exited."""
    from concurrent.futures import Future

    lau = Launcher()
    lau._exits[4242] = 1  # an instance that exited long ago
    launched: Future[object] = Future()
    answered: Future[object] = Future()
    lau._pending.update({7: (launched, True), 8: (answered, False)})
    lau._exits[4243] = 0
    lau._read(
        _Lines(  # type: ignore[arg-type]
            {"id": 7, "result": 4242},  # a new instance got pid 4242 again
            {"id": 8, "result": 4243},  # a call's answer that happens to be a number
            {"event": "exit", "pid": 9999, "code": 2},
        )
    )
    assert launched.result(0) == 4242 and lau.exit_code(4242) is None
    assert answered.result(0) == 4243 and lau.exit_code(4243) == 0  # not a launch: kept
    assert lau.exit_code(9999) == 2
    assert not lau._pending
    # the new instance's own exit, reported after its launch was answered, is recorded
    lau._read(_Lines({"event": "exit", "pid": 4242, "code": -9}))  # type: ignore[arg-type]
    assert lau.exit_code(4242) == -9
