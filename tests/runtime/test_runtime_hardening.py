"""Issue 15 against a real ``gshare serve``: read deadlines and the connection cap (item 11),
cancellation of abandoned requests (item 5), SLO-aware shedding (item 12), a JSON body without
a Content-Type (item 13) and error bodies without source locations (item 13).

Each test fails on the code before the issue: partial requests and idle connections stayed open
for ever, 10,300 connections were accepted, abandoned requests all ran, 429 came only at 10,000
queued requests, JSON without a Content-Type was read as float32, and error bodies ended with
"(at models.py:384)".
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gshare.testing import ServeProcess, wait_until

REPO = Path(__file__).resolve().parents[2]
READ_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 100
PER_CLIENT = 40  # well above the 24 clients of the shedding test, below the greedy one's 50
WRITE_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    s = ServeProcess(
        "--read-timeout-s",
        str(READ_TIMEOUT_S),
        "--max-connections",
        str(MAX_CONNECTIONS),
        "--max-connections-per-client",
        str(PER_CLIENT),
        "--write-timeout-s",
        str(WRITE_TIMEOUT_S),
        state_dir=tmp_path_factory.mktemp("hardening") / "state",
        tiny_models=True,
        cwd=REPO,
    ).start()
    try:
        yield s
    finally:
        stopped = s.stop()
        assert stopped.code == 0 and not stopped.killed, f"{stopped}\n{s.log()}"


def _connect(srv: ServeProcess, source: str = "127.0.0.1") -> socket.socket:
    """A connection from ``source`` (any 127.x address: each is another client address)."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=15, source_address=(source, 0))
    return s


def _refused(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the server closed at once (EOF or reset)."""
    time.sleep(0.3)  # let the server accept them all
    refused = 0
    for s in socks:
        s.settimeout(0.2)
        try:
            if s.recv(1) == b"":
                refused += 1
        except (ConnectionResetError, BrokenPipeError):
            refused += 1
        except TimeoutError:
            pass
    return refused


def _live_from(srv: ServeProcess, source: str) -> bool:
    """Whether a client at ``source`` gets ``/v2/health/live`` answered."""
    with contextlib.closing(_connect(srv, source)) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        data = b""
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while chunk := s.recv(65536):
                data += chunk
    return data.startswith(b"HTTP/1.1 200")


def _closed_by_server(s: socket.socket, within_s: float = 15.0) -> bool:
    """True when the server closes ``s`` (EOF or reset) before ``within_s``."""
    s.settimeout(within_s)
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def metric(srv: ServeProcess, name: str, **labels: str) -> float:
    text = httpx.get(srv.url + "/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


# -- item 11: read deadlines and the connection cap ---------------------------------------------


@pytest.mark.parametrize(
    "sent",
    [
        b"",  # connects and says nothing
        b"POST /function/x HTTP/1.1\r\nHost: a\r\n",  # headers stop half-way
        b"POST /function/x HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n0123456789",  # body
    ],
    ids=["idle", "partial-headers", "partial-body"],
)
def test_slow_or_silent_connections_are_closed(srv: ServeProcess, sent: bytes) -> None:
    s = _connect(srv)
    with contextlib.closing(s):
        if sent:
            s.sendall(sent)
        assert _closed_by_server(s), "the server kept a slow connection open"
    # and the server still serves
    assert httpx.get(srv.url + "/v2/health/live", timeout=10).status_code == 200


def test_connections_over_the_cap_are_closed_and_service_goes_on(srv: ServeProcess) -> None:
    # 120 connections from 4 client addresses, 30 each: under the per-client cap, over the
    # global one by 20
    socks = [_connect(srv, f"127.0.0.{2 + i % 4}") for i in range(MAX_CONNECTIONS + 20)]
    try:
        assert _refused(socks) >= 20
    finally:
        for s in socks:
            s.close()
    wait_until(
        lambda: httpx.get(srv.url + "/v2/health/live", timeout=5).status_code == 200,
        30,
        "the gateway to serve after the flood",
    )
    assert metric(srv, "gshare_connections_refused_total") >= 20


def test_one_client_cannot_take_every_connection(srv: ServeProcess) -> None:
    before = metric(srv, "gshare_connections_refused_per_client_total")
    greedy = [_connect(srv, "127.0.0.6") for _ in range(PER_CLIENT + 10)]
    try:
        assert _refused(greedy) >= 10  # its connections past its cap are closed at once ...
        assert _live_from(srv, "127.0.0.7")  # ... while another client is served
    finally:
        for s in greedy:
            s.close()
    assert metric(srv, "gshare_connections_refused_per_client_total") - before >= 10
    assert _live_from(srv, "127.0.0.6")  # its slots come back when it lets go


def test_a_client_that_stops_reading_is_cut_off(srv: ServeProcess) -> None:
    before = metric(srv, "gshare_connections_write_timeouts_total")
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    s.bind(("127.0.0.8", 0))
    s.connect(("127.0.0.1", srv.port))
    with contextlib.closing(s):
        # many pipelined requests for a large answer, none of it read: the gateway's write
        # buffer stays full, and past --write-timeout-s the connection is aborted
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n" * 3000)
        wait_until(
            lambda: metric(srv, "gshare_connections_write_timeouts_total") > before,
            30,
            "the gateway to cut off a client that does not read",
        )
        s.settimeout(10)
        ended = False
        try:
            while s.recv(1 << 20):  # what the kernel still held, then the end
                pass
            ended = True
        except (ConnectionResetError, BrokenPipeError):
            ended = True
        except TimeoutError:
            pass
        assert ended, "the connection is still open"
    assert httpx.get(srv.url + "/v2/health/live", timeout=10).status_code == 200


# -- item 5: cancellation of abandoned requests -------------------------------------------------


def test_abandoned_requests_are_not_run(srv: ServeProcess) -> None:
    c = srv.client()
    c.deploy(
        {
            "name": "counted",
            "handler": "gshare.runtime.demo_handlers:Counted",
            "device": "cpu",
            "batching": {"max_batch": 1, "max_wait_ms": 0},
            "min_instances": 1,
            "max_instances": 1,
        }
    )
    wait_until(lambda: c.get("counted")["availableReplicas"] >= 1, 120, "counted to be ready")
    first = c.invoke("counted", {"sleep_ms": 1})["runs"]
    body = json.dumps({"sleep_ms": 100}).encode()
    request = (
        b"POST /function/counted HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    socks = []
    for i in range(40):  # 40 x 100 ms of work if they all ran; 4 client addresses (the cap)
        s = _connect(srv, f"127.0.0.{10 + i % 4}")
        s.sendall(request)
        socks.append(s)
    time.sleep(0.3)
    for s in socks:  # every client goes away
        s.close()
    wait_until(
        lambda: metric(srv, "gshare_requests_cancelled_total", function="counted") >= 25,
        30,
        "the abandoned requests to be cancelled",
    )
    runs = c.invoke("counted", {"sleep_ms": 1})["runs"]
    assert runs - first - 1 < 15, f"{runs - first - 1} of 40 abandoned requests ran"
    assert metric(srv, "gshare_requests_total", function="counted", code="499") >= 25
    assert metric(srv, "gshare_requests_total", function="counted", code="200") < 15
    c.delete("counted")


# -- item 12: SLO-aware shedding -----------------------------------------------------------------


def test_overload_is_shed_early_for_a_function_with_an_slo(srv: ServeProcess) -> None:
    c = srv.client()
    for name, slo in (("slo-fn", 20), ("no-slo-fn", None)):
        spec = {
            "name": name,
            "handler": "gshare.runtime.demo_handlers:Spin",
            "device": "cpu",
            "batching": {"max_batch": 1, "max_wait_ms": 0},
            "min_instances": 1,
            "max_instances": 1,
        }
        if slo:
            spec["slo_ms"] = slo
        c.deploy(spec)
        wait_until(lambda n=name: c.get(n)["availableReplicas"] >= 1, 120, f"{name} ready")

    def burst(name: str) -> list[httpx.Response]:
        with httpx.Client(base_url=srv.url, timeout=60) as h, cf.ThreadPoolExecutor(24) as ex:
            return list(
                ex.map(
                    lambda _: h.post(f"/function/{name}", json={"spin_ms": 5}),
                    range(240),
                )
            )

    # the first burst measures the service interval; the second is shed
    burst("slo-fn")
    rs = burst("slo-fn")
    shed = [r for r in rs if r.status_code == 429]
    assert shed, "no request was shed under 24-way overload of a 20 ms SLO"
    assert "overloaded" in shed[0].json()["error"] and "SLO of 20 ms" in shed[0].json()["error"]
    assert all(r.status_code in (200, 429) for r in rs)
    assert metric(srv, "gshare_requests_shed_total", function="slo-fn", reason="slo") >= len(shed)
    # the estimate it sheds on is exported (the controller sets it each period): about the 5 ms
    # of CPU each request spins, one at a time
    wait_until(
        lambda: metric(srv, "gshare_admission_interval_seconds", function="slo-fn") > 0, 30,
        "the admission's interval gauge",
    )  # fmt: skip
    assert 0.004 <= metric(srv, "gshare_admission_interval_seconds", function="slo-fn") <= 0.05
    # and so are the gaps it averaged, one per answer that left others waiting after another
    gaps = metric(srv, "gshare_admission_gap_seconds_count", function="slo-fn")
    assert 0 < gaps < len(rs)
    # without an SLO nothing is shed before the queue cap
    rs = burst("no-slo-fn")
    assert all(r.status_code == 200 for r in rs)
    c.delete("slo-fn")
    c.delete("no-slo-fn")


# -- item 13: content types and error bodies -----------------------------------------------------


def test_json_without_content_type_is_json_and_errors_hide_source_locations(
    srv: ServeProcess,
) -> None:
    c = srv.client()
    c.deploy({"name": "echo-ct", "handler": "gshare.runtime.demo_handlers:Echo", "device": "cpu"})
    c.deploy(
        {"name": "failing", "handler": "gshare.runtime.demo_handlers:Failing", "device": "cpu"}
    )
    doc = {"x": [1, 2, 3]}
    r = httpx.post(srv.url + "/function/echo-ct", content=json.dumps(doc).encode(), timeout=120)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    assert r.json() == doc
    raw = b"\x00\x01not json"
    r = httpx.post(srv.url + "/function/echo-ct", content=raw, timeout=120)
    assert r.status_code == 200 and r.content == raw
    r = httpx.post(srv.url + "/function/failing", json={}, timeout=120)
    assert r.status_code == 500
    err = r.json()["error"]
    assert "the model is broken" in err
    assert not re.search(r"\.py:\d+", err), err
    # the traceback is in the instance's log file (the server's run directory) instead
    run_dir = Path(json.loads((srv.state_dir / "server.json").read_text())["run_dir"])
    logs = "".join(p.read_text(errors="replace") for p in run_dir.rglob("i-*.log"))
    assert "demo_handlers.py" in logs and "the model is broken" in logs
    c.delete("echo-ct")
    c.delete("failing")


def test_the_profiling_instance_is_not_reachable_by_callers(srv: ServeProcess) -> None:
    """``NAME~profile`` (the route of a function's profiling instance) once answered
    ``POST /function/NAME~profile`` while a profile ran."""
    c = srv.client()
    c.deploy({"name": "prof", "handler": "gshare.runtime.demo_handlers:Sleep", "device": "cpu"})
    auth = {"authorization": f"Bearer {srv.token}"}
    r = httpx.post(
        srv.url + "/system/profile/prof",
        json={"quota_pct": [50, 100], "batch": [1, 2], "trial_s": 2},
        headers=auth,
        timeout=30,
    )
    assert r.status_code == 202, r.text

    def measuring() -> bool:
        job = httpx.get(srv.url + "/system/profile/prof", headers=auth, timeout=10).json()
        assert job["state"] == "running", job
        return bool(job["done"] >= 1)

    wait_until(measuring, 180, "the profile's first point")  # its instance serves its route now
    for path in ("/function/prof~profile", "/v2/models/prof~profile/infer"):
        r = httpx.post(srv.url + path, json={"sleep_ms": 1}, timeout=30)
        assert r.status_code == 404, (path, r.status_code, r.text)
    job = httpx.get(srv.url + "/system/profile/prof", headers=auth, timeout=10).json()
    assert job["state"] == "running"
    c.delete("prof")


def _ray_join(address: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    code = f"import ray; ray.init(address={address!r}); print('JOINED', len(ray.nodes()))"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def ray_srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    s = ServeProcess(
        "--cluster",
        "ray",
        state_dir=tmp_path_factory.mktemp("hardening-ray") / "state",
        tiny_models=True,
        cwd=REPO,
    ).start()
    try:
        yield s
    finally:
        stopped = s.stop()
        assert stopped.code == 0 and not stopped.killed, f"{stopped}\n{s.log()}"


def test_ray_refuses_whoever_lacks_the_session_token(ray_srv: ServeProcess) -> None:
    """With ``--cluster ray`` (a local Ray on purpose), Ray listens on every interface (Ray
    cannot bind its gRPC servers to loopback), and anyone who reached a port could run code in
    the cluster. gshare starts it with Ray's token authentication and a per-session token: a
    process without the token cannot join, one with it can (so the refusal is the token's
    doing). The embedded default opens no such port (``test_embedded``)."""
    srv = ray_srv
    gcs_proc = next(p for p in srv.tree() if p.name() == "gcs_server")
    gcs = next(c.laddr.port for c in gcs_proc.net_connections(kind="inet") if c.status == "LISTEN")
    server_env = gcs_proc.environ()  # what the server set before Ray started
    assert server_env.get("RAY_AUTH_MODE") == "token" and server_env.get("RAY_AUTH_TOKEN")
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    address = f"127.0.0.1:{gcs}"
    stranger = _ray_join(address, base)
    assert stranger.returncode != 0 and "JOINED" not in stranger.stdout
    insider = _ray_join(
        address,
        {**base, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": server_env["RAY_AUTH_TOKEN"]},
    )
    assert insider.returncode == 0 and "JOINED" in insider.stdout, insider.stderr[-2000:]


def test_the_run_directory_is_private(srv: ServeProcess) -> None:
    run_dir = Path(json.loads((srv.state_dir / "server.json").read_text())["run_dir"])
    for d in (run_dir, run_dir.parent):
        st = os.lstat(d)
        assert st.st_uid == os.getuid() and st.st_mode & 0o077 == 0, (d, oct(st.st_mode))


@pytest.mark.skipif(
    __import__("gshare.runtime.instance.sandbox", fromlist=["x"]).landlock_abi() < 1,
    reason="the kernel has no Landlock: the state directory cannot be hidden (README)",
)
def test_handlers_cannot_read_the_control_token(srv: ServeProcess) -> None:
    """A handler that read the control token could control every tenant's functions. The
    instance hides the state directory from itself before it loads the handler
    (``instance.sandbox``; under root the walls' own uid stops it too: test_tenants): the
    token cannot be read, while the repository's files and temporary files work as before."""
    c = srv.client()
    c.deploy(
        {"name": "probe", "handler": "gshare.runtime.demo_handlers:FileProbe", "device": "cpu"}
    )
    token_file = next(p for p in srv.state_dir.iterdir() if "token" in p.name)
    denied = c.invoke("probe", {"path": str(token_file)})
    assert denied["read"].startswith("PermissionError"), denied
    assert denied["tmp_ok"] is True
    allowed = c.invoke("probe", {"path": str(REPO / "pyproject.toml")})
    assert isinstance(allowed["read"], int) and allowed["read"] > 0, allowed
    c.delete("probe")


def test_an_instance_socket_answers_only_who_proves_its_secret(srv: ServeProcess) -> None:
    """Another tenant's handler runs as the same user and can reach every instance's Unix
    socket: without the instance's channel secret it can neither drain nor invoke it (the
    connection is closed unanswered), and the victim keeps serving."""
    import glob
    import tempfile

    from gshare.runtime.instance import protocol as P

    c = srv.client()
    c.deploy({"name": "victim-uds", "handler": "gshare.runtime.demo_handlers:Echo",
              "device": "cpu", "min_instances": 1})  # fmt: skip
    wait_until(lambda: c.get("victim-uds")["availableReplicas"] >= 1, 120, "victim-uds ready")
    pattern = f"{tempfile.gettempdir()}/gshare-{os.getuid()}/*/node-*/i-victim-uds-*/i-*.sock"
    socks = glob.glob(pattern)
    assert socks, f"no instance socket matches {pattern}"
    for op, payload in ((P.OP_CONTROL, b'{"cmd": "drain"}'), (P.OP_INVOKE, b'"hi"')):
        with pytest.raises(P.ProtocolError):
            P.call_once(socks[0], op, P.ENC_JSON, payload, timeout_s=10)
        with pytest.raises(P.ProtocolError):  # a wrong secret is no better
            P.call_once(socks[0], op, P.ENC_JSON, payload, timeout_s=10, secret="guess")
    for _ in range(3):  # not drained: it answers, through the gateway
        assert c.invoke("victim-uds", "hello") is not None
    c.delete("victim-uds")
