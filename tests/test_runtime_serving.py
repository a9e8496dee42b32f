"""Runtime tests against one real ``gshare serve`` (module-scoped: Ray starts once).

Every test talks to the server over HTTP — through the CLI (subprocesses), ``gshare.Client``
or raw httpx — and the instances are real processes (tiny built-in models, or the small
handlers of ``gshare.runtime.demo_handlers``). No timing is asserted; waits have generous
timeouts.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from gshare.runtime.client import ClientError
from test_runtime_support import ServerProcess, alive, wait_until

ECHO = """\
name: echo
handler: gshare.runtime.demo_handlers:Echo
device: cpu
resources: {sm_pct: 50, quota_request: 0.5, quota_limit: 1.0}
batching: {max_batch: 4, max_wait_ms: 1}
min_instances: 1
max_instances: 1
"""
MLP = {
    "name": "mlp",
    "model": "mlp",
    "device": "cpu",
    "resources": {"sm_pct": 50, "quota_request": 0.5, "quota_limit": 1.0},
    "batching": {"max_batch": 4, "max_wait_ms": 2},
    "max_instances": 1,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    base = tmp_path_factory.mktemp("gshare-serve")
    srv = ServerProcess(base / "state", "--max-body-mb", "1", "--request-timeout-s", "90").start()
    try:
        yield srv
    finally:
        procs = srv.tree()
        code = srv.stop()
        left = wait_until(lambda: not alive(procs), 30, "the server's processes to exit") and alive(procs)
        assert code == 0, srv.log()
        assert not left


@pytest.fixture(scope="module")
def echo(server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> str:
    spec = tmp_path_factory.mktemp("specs") / "echo.yaml"
    spec.write_text(ECHO)
    r = server.cli("deploy", str(spec))
    assert r.returncode == 0, r.stderr
    assert "deployed echo" in r.stdout
    return "echo"


def post(server: ServerProcess, path: str, **kw: Any) -> httpx.Response:
    return httpx.post(server.url + path, timeout=120, **kw)


def status(server: ServerProcess, name: str) -> dict[str, Any]:
    return server.client().get(name)


# -- health, auth --------------------------------------------------------------------------------


def test_health_endpoints(server: ServerProcess) -> None:
    assert httpx.get(server.url + "/v2/health/live").json() == {"live": True}
    r = httpx.get(server.url + "/v2/health/ready")
    assert r.status_code == 200 and r.json()["ready"] is True


def test_control_api_needs_the_token(server: ServerProcess) -> None:
    r = httpx.get(server.url + "/system/functions")
    assert r.status_code == 401
    assert "Bearer" in r.json()["error"]
    r = httpx.get(server.url + "/system/functions", headers={"authorization": "Bearer wrong"})
    assert r.status_code == 401
    r = httpx.post(server.url + "/system/functions", content=ECHO)
    assert r.status_code == 401
    r = httpx.get(server.url + "/system/functions", headers={"authorization": f"Bearer {server.token()}"})
    assert r.status_code == 200 and isinstance(r.json(), list)
    # the token file is private
    assert (server.state_dir / "token").stat().st_mode & 0o777 == 0o600


# -- CLI and Python API --------------------------------------------------------------------------


def test_cli_deploy_invoke_list_logs_delete(server: ServerProcess, echo: str, tmp_path: Path) -> None:
    r = server.cli("invoke", "echo", "--data", '{"a": [1, 2, 3]}', auth=False)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"a": [1, 2, 3]}
    raw = tmp_path / "blob.bin"
    raw.write_bytes(b"\x00\x01raw bytes\xff")
    r = subprocess_bytes(server, "invoke", "echo", "--file", str(raw))
    assert r == b"\x00\x01raw bytes\xff"
    r = server.cli("list")
    assert r.returncode == 0 and "echo" in r.stdout and "ready" in r.stdout
    r = server.cli("logs", "echo")
    assert r.returncode == 0 and "deployed (version 1)" in r.stdout and "ready (pid" in r.stdout

    other = tmp_path / "tmp-echo.yaml"
    other.write_text(ECHO.replace("name: echo", "name: tmp-echo").replace("min_instances: 1", "min_instances: 0"))
    assert server.cli("deploy", str(other)).returncode == 0
    r = server.cli("invoke", "tmp-echo", "--data", "[1]", auth=False)  # cold start
    assert r.returncode == 0 and json.loads(r.stdout) == [1], r.stderr
    r = server.cli("delete", "tmp-echo")
    assert r.returncode == 0 and "deleted tmp-echo" in r.stdout
    r = server.cli("invoke", "tmp-echo", "--data", "[1]", auth=False)
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0 and "not deployed" in r.stderr and r.stderr.startswith("gshare: error:")


def subprocess_bytes(server: ServerProcess, *args: str) -> bytes:
    import subprocess
    import sys

    from test_runtime_support import REPO

    out = subprocess.run(
        [sys.executable, "-m", "gshare.cli", *args, "--url", server.url], capture_output=True, cwd=REPO, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_python_client_api(server: ServerProcess, echo: str) -> None:
    from gshare import Client, FunctionSpec

    with Client(server.url, state_dir=server.state_dir) as c:
        spec = FunctionSpec(name="api-echo", handler="gshare.runtime.demo_handlers:Echo", device="cpu", max_instances=1)
        out = c.deploy(spec)
        assert out["name"] == "api-echo" and out["version"] == 1
        assert c.invoke("api-echo", {"k": "v"}) == {"k": "v"}
        assert c.invoke("api-echo", b"bytes") == b"bytes"
        names = [f["name"] for f in c.list()]
        assert "api-echo" in names and "echo" in names
        again = c.deploy(spec)  # deploy of an existing function updates it
        assert again["version"] == 2
        c.delete("api-echo")
        with pytest.raises(ClientError) as e:
            c.get("api-echo")
        assert e.value.status == 404


# -- Open Inference Protocol ---------------------------------------------------------------------


def _tensor(shape: list[int], datatype: str = "FP32", value: Any = 0.5, name: str = "input") -> dict[str, Any]:
    n = 1
    for d in shape:
        n *= d
    return {"name": name, "shape": shape, "datatype": datatype, "data": [value] * n}


def test_oip_infer_good_and_bad_tensors(server: ServerProcess) -> None:
    c = server.client()
    c.deploy(MLP)
    meta = httpx.get(server.url + "/v2/models/mlp").json()
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
    assert httpx.get(server.url + "/v2/models/mlp/ready").status_code == 200
    out = c.infer("mlp", [_tensor([2, 64])], request_id="r1")
    assert out["model_name"] == "mlp" and out["id"] == "r1"
    by_name = {o["name"]: o for o in out["outputs"]}
    assert by_name["label"]["shape"] == [2] and by_name["label"]["datatype"] == "INT64"
    assert by_name["score"]["datatype"] == "FP32" and len(by_name["score"]["data"]) == 2

    bad: list[tuple[Any, str]] = [
        ({"inputs": [_tensor([1, 3])]}, "shape must be [-1, 64]"),
        ({"inputs": [_tensor([1, 64], "INT64", 1)]}, "datatype must be FP32"),
        ({"inputs": [{**_tensor([1, 64]), "data": [0.5] * 10}]}, "has 10 elements but shape [1, 64] needs 64"),
        ({"inputs": [_tensor([1, 64], name="x")]}, "unknown input 'x'"),
        ({"inputs": [_tensor([1, 64], "FLOAT")]}, "unknown datatype 'FLOAT'"),
        ({"inputs": [_tensor([1, 64], "FP32", "a")]}, "not a valid FP32 value"),
        ({"inputs": []}, "'inputs' must be a non-empty list"),
        ({"outputs": []}, "'inputs' must be a non-empty list"),
        ([1, 2], "must be a JSON object"),
    ]
    for body, msg in bad:
        r = post(server, "/v2/models/mlp/infer", json=body)
        assert r.status_code == 400, (body, r.text)
        assert msg in r.json()["error"], (msg, r.text)
    r = post(server, "/v2/models/mlp/infer", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]
    r = post(server, "/v2/models/nope/infer", json={"inputs": [_tensor([1, 64])]})
    assert r.status_code == 404 and "not deployed" in r.json()["error"]
    assert httpx.get(server.url + "/v2/models/nope").status_code == 404
    # still serving after the bad requests
    assert c.infer("mlp", [_tensor([1, 64])])["outputs"]


# -- bad inputs ------------------------------------------------------------------------------------


def test_bad_inputs_get_4xx_and_the_server_keeps_serving(server: ServerProcess, echo: str) -> None:
    h = {"authorization": f"Bearer {server.token()}"}
    cases: list[tuple[str, str, dict[str, Any], int, str]] = [
        ("POST", "/function/nope", {"content": b"x"}, 404, "function 'nope' is not deployed"),
        ("POST", "/function/echo", {"content": b"{oops", "headers": {"content-type": "application/json"}}, 400, "malformed JSON"),
        ("POST", "/function/echo", {"content": b"x" * (2 << 20)}, 413, "exceeds the limit"),
        ("GET", "/function/echo", {}, 405, "use POST"),
        ("POST", "/system/functions", {"content": "name: Bad_Name\nmodel: mlp\n", "headers": h}, 400, "name: must be a DNS label"),
        ("POST", "/system/functions", {"content": "name: x\nmodel: mlp\nresources: {sm_pct: 150, quota_request: 0.5}\n", "headers": h}, 400, "resources.sm_pct: must be a number in (0, 100], got 150"),
        ("POST", "/system/functions", {"content": "name: x\nhandler: no_such_module:Thing\n", "headers": h}, 400, "no_such_module"),
        ("POST", "/system/functions", {"content": "[: not yaml", "headers": h}, 400, "not valid YAML"),
        ("POST", "/system/functions", {"content": ECHO, "headers": h}, 409, "already exists"),
        ("PUT", "/system/functions", {"content": ECHO.replace("name: echo", "name: ghost"), "headers": h}, 404, "not deployed"),
        ("DELETE", "/system/functions", {"content": b"{}", "headers": h}, 400, "functionName"),
        ("DELETE", "/system/functions", {"content": json.dumps({"functionName": "ghost"}), "headers": h}, 404, "not deployed"),
        ("GET", "/system/logs", {"headers": h}, 400, "'name' is required"),
        ("POST", "/system/profile/ghost", {"content": b"{}", "headers": h}, 404, "not deployed"),
    ]
    for method, path, kw, code, msg in cases:
        r = httpx.request(method, server.url + path, timeout=60, **kw)
        assert r.status_code == code, (method, path, r.status_code, r.text)
        assert msg in r.json()["error"], (msg, r.text)
    # the handler rejecting its input is the caller's fault too
    r = post(server, "/function/echo", content=b"still fine")
    assert r.status_code == 200 and r.content == b"still fine"


def test_function_errors_are_explicit(server: ServerProcess) -> None:
    c = server.client()
    c.deploy({"name": "sleepy-err", "handler": "gshare.runtime.demo_handlers:Sleep", "device": "cpu", "max_instances": 1})
    r = post(server, "/function/sleepy-err", json={"sleep_ms": "soon"})
    assert r.status_code == 400
    assert "rejected the input" in r.json()["error"] and "sleep_ms must be a number" in r.json()["error"]
    assert c.invoke("sleepy-err", {"sleep_ms": 1})["slept_ms"] == 1
    c.delete("sleepy-err")


def test_metrics_endpoint(server: ServerProcess, echo: str) -> None:
    for _ in range(5):
        assert post(server, "/function/echo", content=b"m").status_code == 200
    wait_until(lambda: "gshare_achieved_share{" in httpx.get(server.url + "/metrics").text, 15, "share gauges")
    text = httpx.get(server.url + "/metrics").text
    for needle in (
        'gshare_requests_total{code="200",function="echo"}',
        'gshare_request_latency_seconds_bucket{function="echo"',
        'gshare_token_wait_seconds_count{function="echo"}',
        'gshare_slo_violations_total{function="echo"}',
        'gshare_instances{function="echo",state="ready"} 1.0',
        'gshare_requested_share{function="echo",instance=',
        'gshare_achieved_share{function="echo",instance=',
    ):
        assert needle in text, needle


# -- failures: crash, memory limit ----------------------------------------------------------------


def test_killed_instance_requests_are_retried_or_failed_explicitly(server: ServerProcess) -> None:
    c = server.client()
    c.deploy({"name": "sleepy", "handler": "gshare.runtime.demo_handlers:Sleep", "device": "cpu",
              "batching": {"max_batch": 1, "max_wait_ms": 0}, "min_instances": 1, "max_instances": 1})
    inst = wait_until(lambda: [i for i in status(server, "sleepy")["instances"] if i["state"] == "ready"], 90, "sleepy ready")[0]
    results: list[httpx.Response] = []

    def call() -> None:
        results.append(post(server, "/function/sleepy", json={"sleep_ms": 1500}))

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    wait_until(lambda: status(server, "sleepy")["instances"] and True, 5, "status")
    import time

    time.sleep(0.6)  # the first request is running, the others queued at the instance
    os.kill(inst["pid"], signal.SIGKILL)
    for t in threads:
        t.join(120)
    assert len(results) == 3  # nothing is lost
    for r in results:
        if r.status_code != 200:
            assert r.status_code == 502 and "crashed" in r.json()["error"], r.text
    assert any(r.status_code == 200 and r.json()["pid"] != inst["pid"] for r in results)
    st = wait_until(lambda: (s := status(server, "sleepy"))["instances"][0]["restarts"] >= 1 and s, 30, "the restart to be reported")
    assert st["instances"][0]["pid"] != inst["pid"]
    assert c.invoke("sleepy", {"sleep_ms": 1})["slept_ms"] == 1
    logs = c.logs("sleepy")
    assert any("crashed and restarted" in ln for ln in logs)
    c.delete("sleepy")


def test_a_killed_template_takes_its_instances_and_both_come_back(server: ServerProcess) -> None:
    """The node's instance template (``runtime.launcher``) dies: its instances die with it (no
    orphans); the agent starts a new template and restarts the instances from it."""
    c = server.client()
    c.deploy({"name": "tmpl", "handler": "gshare.runtime.demo_handlers:Echo", "device": "cpu",
              "min_instances": 1, "max_instances": 1})
    inst = wait_until(lambda: [i for i in status(server, "tmpl")["instances"] if i["state"] == "ready"], 90, "tmpl ready")[0]
    template = psutil.Process(inst["pid"]).parent()
    assert template is not None and template.cmdline()[-1] == "gshare.runtime.node.launcher"
    template.kill()
    wait_until(lambda: not psutil.pid_exists(inst["pid"]) or psutil.Process(inst["pid"]).status() == psutil.STATUS_ZOMBIE,
               10, "the instance to die with its template")
    new = wait_until(
        lambda: [i for i in status(server, "tmpl")["instances"] if i["state"] == "ready" and i["pid"] != inst["pid"]],
        90, "the instance to be restarted",
    )[0]
    new_template = psutil.Process(new["pid"]).parent()
    assert new_template is not None and new_template.pid != template.pid
    assert c.invoke_raw("tmpl", b"back").content == b"back"
    c.delete("tmpl")


def test_memory_limit_restarts_the_instance_and_fails_its_requests(server: ServerProcess) -> None:
    c = server.client()
    c.deploy({"name": "hog", "handler": "gshare.runtime.demo_handlers:MemoryHog", "device": "cpu",
              "resources": {"sm_pct": 50, "quota_request": 0.5, "quota_limit": 1.0, "mem_mb": 500},
              "min_instances": 1, "max_instances": 1})
    assert c.invoke("hog", {"hold_mb": 8})["held_mb"] == 8
    r = post(server, "/function/hog", json={"hold_mb": 700})
    assert r.status_code == 503
    msg = r.json()["error"]
    assert "exceeded its memory limit" in msg and "mem_mb 500 MiB" in msg
    # restarted in place; serves again
    wait_until(lambda: status(server, "hog")["instances"][0]["restarts"] >= 1, 30, "the restart")
    assert c.invoke("hog", {"hold_mb": 8})["held_mb"] == 8
    c.delete("hog")


# -- autoscaling ----------------------------------------------------------------------------------


def test_scale_to_zero_after_keep_alive_and_cold_start_again(server: ServerProcess) -> None:
    c = server.client()
    c.deploy({"name": "idle", "handler": "gshare.runtime.demo_handlers:Echo", "device": "cpu",
              "keep_alive_s": 1, "max_instances": 2})
    assert status(server, "idle")["replicas"] == 0  # nothing runs before the first request
    assert c.invoke("idle", [1]) == [1]  # queued during the cold start, then served
    wait_until(lambda: status(server, "idle")["replicas"] == 0, 30, "scale to zero")
    assert c.invoke("idle", [2]) == [2]
    logs = "\n".join(c.logs("idle"))
    assert "scaled down" in logs
    c.delete("idle")


def test_keep_alive_counts_from_the_last_answer_not_the_arrival(server: ServerProcess) -> None:
    """A request that runs (or waits through a cold start) longer than ``keep_alive_s`` keeps
    its instance: idleness starts when the function last answered, and requests in flight
    keep it warm, so the next request finds the same process."""
    c = server.client()
    c.deploy({"name": "longreq", "handler": "gshare.runtime.demo_handlers:Sleep", "device": "cpu",
              "keep_alive_s": 1, "max_instances": 1, "batching": {"max_batch": 1, "max_wait_ms": 0}})
    first = c.invoke("longreq", {"sleep_ms": 2500})  # 2.5 s in flight > keep_alive_s
    second = c.invoke("longreq", {"sleep_ms": 1})
    assert second["pid"] == first["pid"]
    assert "scaled down" not in "\n".join(c.logs("longreq"))
    c.delete("longreq")


@pytest.mark.slow
def test_profile_writes_the_table_the_autoscaler_reads(server: ServerProcess) -> None:
    c = server.client()
    c.deploy({"name": "auto-mlp", "model": "mlp", "device": "cpu", "max_instances": 2,
              "batching": {"max_batch": 2, "max_wait_ms": 2}})
    assert status(server, "auto-mlp")["config_source"].startswith("default share")
    r = server.cli("profile", "auto-mlp", "--sm", "50", "--quota", "50,100", "--batch", "1,2", "--trial-s", "0.2")
    assert r.returncode == 0, r.stderr
    assert "wrote 4 rows" in r.stdout
    st = status(server, "auto-mlp")
    assert st["config_source"].startswith("live profile") and st["configs"] == 4
    assert c.invoke("auto-mlp", [0.5] * 64)["label"] in range(10)
    c.delete("auto-mlp")
