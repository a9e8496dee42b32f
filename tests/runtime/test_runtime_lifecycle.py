"""``gshare serve`` start, stop and restart: state survives a restart, a shutdown (SIGTERM or
SIGINT) leaves no process behind, startup errors are one line; CLI errors are one line."""

from __future__ import annotations

import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest

from gshare.testing import ServeProcess, run_cli, wait_until

StartGshare = Callable[..., ServeProcess]

ECHO = """\
name: echo
handler: gshare.runtime.demo_handlers:Echo
device: cpu
batching: {max_batch: 2, max_wait_ms: 1}
"""


def gshare(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout_s=60)


@pytest.mark.slow
def test_restart_serves_deployed_functions_and_shutdown_leaves_no_process(
    tmp_path: Path, start_gshare: StartGshare
) -> None:
    state = tmp_path / "state"
    spec = tmp_path / "echo.yaml"
    spec.write_text(ECHO)

    first = start_gshare(state_dir=state)
    assert first.cli("deploy", str(spec)).returncode == 0
    r = httpx.post(first.url + "/function/echo", content=b"one", timeout=120)
    assert r.status_code == 200 and r.content == b"one"
    wait_until(lambda: first.client().get("echo")["availableReplicas"] == 1, 30, "a ready instance")
    assert len(first.tree()) >= 4  # server, agent, template, instance (embedded, the default)
    stopped = first.stop(signal.SIGTERM)
    assert stopped.clean, f"{stopped}\n{first.log()}"  # exit code 0, every process gone

    second = start_gshare(state_dir=state)
    fns = second.client().list()
    assert [f["name"] for f in fns] == ["echo"]
    r = httpx.post(second.url + "/function/echo", content=b"two", timeout=120)
    assert r.status_code == 200 and r.content == b"two"
    assert any("restored" in ln for ln in second.client().logs("echo"))
    stopped = second.stop(signal.SIGINT)  # Ctrl-C
    assert stopped.clean, f"{stopped}\n{second.log()}"


@pytest.mark.slow
def test_ray_launcher_runs_each_instance_as_a_ray_actor(
    tmp_path: Path, start_gshare: StartGshare
) -> None:
    """``--launcher ray``: the same instance, in a Ray worker process of its own; the default
    forks it from the node's template instead (its parent is the template, not a raylet)."""
    spec = tmp_path / "echo.yaml"
    spec.write_text(ECHO)
    for launcher in ("ray", "fork"):
        server = start_gshare("--launcher", launcher, state_dir=tmp_path / f"state-{launcher}")
        assert server.cli("deploy", str(spec)).returncode == 0
        r = httpx.post(server.url + "/function/echo", content=launcher.encode(), timeout=120)
        assert r.status_code == 200 and r.content == launcher.encode()
        st = wait_until(
            lambda s=server: (g := s.client().get("echo"))["instances"] and g, 30, "status"
        )
        pid = st["instances"][0]["pid"]
        parent = psutil.Process(pid).parent()
        assert parent is not None
        node = next(n for n in server.client().info()["nodes"])
        assert node["launcher"] == launcher
        if launcher == "ray":
            assert "raylet" in parent.name()
        else:
            assert parent.cmdline()[-1] == "gshare.runtime.node.launcher"
        stopped = server.stop(signal.SIGTERM)
        assert stopped.clean, f"{stopped}\n{server.log()}"


def test_busy_port_is_a_one_line_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = gshare("serve", "--port", str(port), "--state", str(tmp_path / "state"))
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0
    assert r.stderr.startswith(f"gshare: error: cannot listen on 127.0.0.1:{port}")


def test_unknown_launcher_is_a_one_line_error(tmp_path: Path) -> None:
    r = gshare("serve", "--launcher", "nope", "--state", str(tmp_path / "state"))
    assert r.returncode == 1
    assert r.stderr.strip() == "gshare: error: unknown launcher 'nope' (known: fork, ray)"


def test_unknown_placer_is_a_one_line_error(tmp_path: Path) -> None:
    r = gshare("serve", "--placer", "nope", "--state", str(tmp_path / "state"))
    assert r.returncode == 1
    assert (
        r.stderr.strip() == "gshare: error: unknown placer 'nope' "
        "(known: best-fit, first-fit, mra, mra-defrag, mra-room, time-share)"
    )


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    r = gshare("deploy", str(tmp_path / "missing.yaml"))
    assert (
        r.returncode == 2
        and r.stderr.strip() == f"gshare: error: no such spec file: {tmp_path / 'missing.yaml'}"
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: mlp\nresources: {sm_pct: 150, quota_request: 0.5}\n")
    r = gshare("deploy", str(bad), "--url", "http://127.0.0.1:9", "--token", "t")
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert (
        "resources.sm_pct: must be a number in (0, 100], got 150" in r.stderr
    )  # checked before sending
    r = gshare("invoke", "echo", "--data", "[1]", "--url", "http://127.0.0.1:9")
    assert (
        r.returncode == 1
        and r.stderr.count("\n") == 1
        and "cannot reach the gshare server" in r.stderr
    )
    r = gshare("invoke", "echo", "--data", "{bad", "--url", "http://127.0.0.1:9")
    assert r.returncode == 2 and r.stderr.startswith("gshare: error: --data is not valid JSON")
    r = gshare("list", "--url", "http://127.0.0.1:9", "--state", str(tmp_path / "no-state"))
    assert r.returncode == 1 and "no control-API token" in r.stderr and r.stderr.count("\n") == 1
    r = gshare("profile", "x", "--sm", "a,b", "--url", "http://127.0.0.1:9", "--token", "t")
    assert r.returncode == 2 and "--sm: expected a comma-separated list" in r.stderr


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("binary.yaml", b"\x00\x01\x02\xff\xfe", "not UTF-8"),
        ("utf16.yaml", "name: x\nmodel: mlp\n".encode("utf-16"), "not UTF-8"),
        ("deep.yaml", ("a: " + "[" * 2000 + "]" * 2000).encode(), "nested more than"),
        ("twice.yaml", b"name: x\nname: y\nmodel: mlp\n", "appears twice"),
    ],
)
def test_cli_hostile_spec_files_are_one_line(
    tmp_path: Path, name: str, content: bytes, fragment: str
) -> None:
    """Specs that used to print a traceback (docs/DESIGN.md §12.3): one line naming the problem."""
    f = tmp_path / name
    f.write_bytes(content)
    r = gshare("deploy", str(f), "--url", "http://127.0.0.1:9", "--token", "t")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("gshare: error:") and fragment in r.stderr
    assert "Traceback" not in r.stderr


def test_cli_bad_url_deep_data_and_corrupt_state_are_one_line(tmp_path: Path) -> None:
    for url in ("::::", "http://[::1", "ftp://host"):
        r = gshare("list", "--url", url, "--token", "t")
        assert r.returncode == 2 and "is not a valid server URL" in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    r = gshare("invoke", "echo", "--data", f"@{deep}", "--url", "http://x:9")
    assert r.returncode == 2 and "nested too deeply" in r.stderr and r.stderr.count("\n") == 1
    state = tmp_path / "state"
    state.mkdir()
    (state / "gshare.db").write_bytes(b"this is not a database" * 100)
    r = gshare("serve", "--state", str(state), "--port", "0")
    assert r.returncode == 1 and "state database" in r.stderr and "unreadable" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_a_killed_node_agent_is_replaced_and_service_resumes(start_gshare: StartGshare) -> None:
    """Issue 15, item 1: ``kill -9`` of the node agent (it holds the token servers and the
    instance template) used to leave the server without capacity for good: every request
    waited 120 s and got 504. Now the server starts a new agent on the node, the controller
    starts the function's instances on it, and requests are served again."""
    import os

    srv = start_gshare()
    c = srv.client()
    c.deploy(
        {
            "name": "survivor",
            "handler": "gshare.runtime.demo_handlers:Echo",
            "device": "cpu",
            "min_instances": 1,
        }
    )
    wait_until(lambda: c.get("survivor")["available_replicas"] == 1, 120, "ready")
    old_pid = c.info()["nodes"][0]["pid"]
    os.kill(old_pid, signal.SIGKILL)

    def new_agent() -> bool:
        node = c.info()["nodes"][0]
        return bool(node["alive"] and node["pid"] != old_pid)

    wait_until(new_agent, 90, "a new node agent")
    wait_until(lambda: c.get("survivor")["available_replicas"] == 1, 120, "a new instance")
    assert c.invoke("survivor", {"back": True}) == {"back": True}
    logs = "\n".join(c.logs("survivor"))
    assert "lost with node" in logs


@pytest.mark.slow
@pytest.mark.parametrize("cluster", ["local", "ray"])
def test_a_start_reclaims_what_a_killed_server_left(
    tmp_path: Path, start_gshare: StartGshare, cluster: str
) -> None:
    """After ``kill -9`` of ``gshare serve``, what it left — on Ray its processes (Ray's, the
    agent, the template, instances); embedded, whose agent dies with the server (its death
    signal), none — and its run directory, shared-memory store and ``server.json`` are
    reclaimed by the next start on the same state directory; a second server on a state
    directory in use is refused."""
    import glob
    import json
    import os
    import time

    state = tmp_path / "state"
    first = start_gshare("--cluster", cluster, state_dir=state)
    c = first.client()
    c.deploy(
        {
            "name": "e",
            "handler": "gshare.runtime.demo_handlers:Echo",
            "device": "cpu",
            "min_instances": 1,
        }
    )
    wait_until(lambda: c.get("e")["available_replicas"] == 1, 120, "ready")
    spawned: list[int] = []  # a tenant's own process (new session): only its cgroup holds it
    if cluster == "local":
        c.deploy({"name": "t", "handler": "gshare.runtime.demo_handlers:TenantProbe",
                  "device": "cpu", "min_instances": 1})  # fmt: skip
        wait_until(lambda: c.get("t")["available_replicas"] == 1, 120, "t ready")
        spawned.append(int(c.invoke("t", {"attack": "spawn"})))
    doc = json.loads((state / "server.json").read_text())
    r = run_cli("serve", "--port", "0", state_dir=state, timeout_s=60)
    assert r.returncode == 1 and "another gshare server" in r.stderr  # in use: refused

    def session_procs() -> list[int]:
        out = []
        for p in psutil.process_iter():
            try:
                if p.environ().get("GSHARE_SESSION") == doc["session"]:
                    out.append(p.pid)
            except psutil.Error:
                continue
        return out

    assert len(session_procs()) >= 3  # (Ray,) the agent, the template, the instance ...
    os.kill(doc["pid"], signal.SIGKILL)
    if cluster == "local":  # the agent dies with the server, its template and instances too
        wait_until(
            lambda: not set(session_procs()) - set(spawned),
            30,
            "the server's processes to die with it",
        )
    else:
        time.sleep(1.0)
        assert session_procs()  # Ray's, left behind
    assert os.path.isdir(doc["run_dir"])  # left behind
    second = start_gshare("--cluster", cluster, state_dir=state)
    assert not session_procs()  # what the tenant started too (its cgroup: instance.walls)
    assert not os.path.exists(doc["run_dir"])
    assert doc["store_root"] is None or not glob.glob(doc["store_root"] + "*")
    c2 = second.client()
    wait_until(lambda: c2.get("e")["available_replicas"] == 1, 120, "restored and ready")
    assert c2.invoke("e", [7]) == [7]
