"""The embedded default of ``gshare serve``: one machine, no Ray. The node agent is a child
process of the server (``node.agent_process``) behind a ``ProcessAgentHandle``.

Checked here, with real processes: the handle's calls run concurrently (a ``describe`` that
hangs in the user's import does not hold up ``status``), an agent's death reaches the handle at
once (every waiting and later call raises ``AgentGone``) and takes its template with it; the
agent dies with its parent (its death signal); ``gshare serve`` serves, and the front ends
(``import gshare``, ``gshare simulate``, ``gshare experiment``) run, with ``ray`` made
unimportable in the whole process tree, and ``--address`` without Ray is one line naming the
extra to install; the embedded server's process tree listens on no port but the gateway's.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import psutil
import pytest

from gshare.runtime.control.agents import ProcessAgentHandle
from gshare.runtime.messages import AgentGone
from gshare.runtime.node.agent_process import spawn_agent
from gshare.testing import ServeProcess, wait_until

REPO = Path(__file__).resolve().parents[2]

RAY_BLOCKER = '''
import sys


class _NoRay:
    """Makes ``ray`` unimportable, as if it were not installed."""

    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoRay())
'''

ECHO = {
    "name": "echo",
    "handler": "gshare.runtime.demo_handlers:Echo",
    "device": "cpu",
    "min_instances": 1,
}


def _no_ray_dir(tmp: Path) -> Path:
    """A folder whose ``sitecustomize`` blocks ``ray`` in every Python started with it on
    ``PYTHONPATH`` (the server, its agent, template and instances inherit it)."""
    d = tmp / "no-ray"
    d.mkdir()
    (d / "sitecustomize.py").write_text(RAY_BLOCKER)
    return d


def test_the_blocker_blocks_ray(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(_no_ray_dir(tmp_path))}
    r = subprocess.run(
        [sys.executable, "-c", "import ray"], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode != 0 and "No module named 'ray'" in r.stderr


def test_the_front_ends_work_without_ray(tmp_path: Path) -> None:
    """``import gshare`` (and its client), ``gshare simulate`` and ``gshare experiment`` with
    ``ray`` unimportable."""
    env = {**os.environ, "PYTHONPATH": str(_no_ray_dir(tmp_path))}
    for args in (
        ["-c", "import gshare, gshare.cli, gshare.runtime.server; print(gshare.Client)"],
        ["-m", "gshare.cli", "simulate", str(REPO / "examples/scenarios/mlp-chain.yaml")]
        + ["--quick", "--out", str(tmp_path / "sim")],
        ["-m", "gshare.cli", "experiment", "run", "fast-spatial", "--quick"]
        + ["--out", str(tmp_path / "exp")],
    ):
        r = subprocess.run(
            [sys.executable, *args], env=env, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, (args, r.stderr[-2000:])
    assert (tmp_path / "sim" / "mlp-chain-simulate" / "results.json").is_file()
    assert (tmp_path / "exp" / "fast-spatial" / "results.json").is_file()


def test_serve_without_ray_installed(tmp_path: Path) -> None:
    """``gshare serve`` (embedded), deploy, invoke and the client commands with ``ray``
    unimportable everywhere; ``--address`` then says which extra to install, in one line."""
    blocker = _no_ray_dir(tmp_path)
    with ServeProcess(
        state_dir=tmp_path / "state", pythonpath=[blocker], tiny_models=True, cwd=REPO
    ) as srv:
        c = srv.client()
        c.deploy(ECHO)
        wait_until(lambda: c.get("echo")["available_replicas"] == 1, 120, "a ready instance")
        r = httpx.post(srv.url + "/function/echo", content=b"no ray", timeout=60)
        assert r.status_code == 200 and r.content == b"no ray"
        listed = srv.cli("list")
        assert listed.returncode == 0 and "echo" in listed.stdout
        assert c.info()["nodes"][0]["launcher"] == "fork"
    assert "No module named 'ray'" not in srv.log()
    env = {**os.environ, "PYTHONPATH": str(blocker)}
    for args in (["--address", "127.0.0.1:6379"], ["--cluster", "ray"]):
        r = subprocess.run(
            [sys.executable, "-m", "gshare.cli", "serve", *args, "--port", "0"]
            + ["--state", str(tmp_path / "state2")],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
        assert "gshare[cluster]" in r.stderr and r.stderr.startswith("gshare: error:")


def test_cluster_option_errors_are_one_line(tmp_path: Path) -> None:
    for args, fragment in (
        (["--cluster", "nope"], "unknown cluster 'nope' (known: local, ray)"),
        (["--cluster", "local", "--address", "10.0.0.1:6379"], "--address needs Ray"),
        (["--cluster", "local", "--launcher", "ray"], "--launcher ray needs Ray"),
    ):
        r = subprocess.run(
            [sys.executable, "-m", "gshare.cli", "serve", *args, "--port", "0"]
            + ["--state", str(tmp_path / "state")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
        assert fragment in r.stderr, r.stderr


def test_embedded_server_listens_on_no_port_but_the_gateways(tmp_path: Path) -> None:
    with ServeProcess(state_dir=tmp_path / "state", tiny_models=True, cwd=REPO) as srv:
        c = srv.client()
        c.deploy(ECHO)
        wait_until(lambda: c.get("echo")["available_replicas"] == 1, 120, "a ready instance")
        tree = srv.tree()
        assert len(tree) >= 4  # server, agent, template, instance
        listening = {
            (p.pid, conn.laddr.port)
            for p in tree
            for conn in p.net_connections(kind="inet")
            if conn.status == psutil.CONN_LISTEN
        }
        assert listening == {(srv.pid, srv.port)}


def _agent_init(run_dir: Path) -> dict[str, object]:
    return {
        "node_id": "local-test-node",
        "run_dir": str(run_dir),
        "store_root": None,
        "launcher": "fork",
        "node_ip": "127.0.0.1",
    }


def test_agent_calls_run_concurrently_and_a_death_is_seen_at_once(short_tmp: Path) -> None:
    """A ``describe`` whose import waits for a file does not hold up ``status``; ``kill -9``
    of the agent fails the waiting call and every later one with ``AgentGone``, calls
    ``on_gone`` once, and the agent's template dies with it."""
    flag = short_tmp / "go"
    (short_tmp / "waits_at_import.py").write_text(
        textwrap.dedent(
            f"""
            import os, time
            while not os.path.exists({str(flag)!r}):
                time.sleep(0.02)

            class Handler:
                def load(self):
                    pass

                def predict(self, x):
                    return x
            """
        )
    )
    spec = {"name": "slow", "handler": "waits_at_import:Handler", "device": "cpu"}

    async def scenario() -> None:
        gone: list[ProcessAgentHandle] = []
        proc, sock = spawn_agent(_agent_init(short_tmp / "run"))
        h = ProcessAgentHandle("local-test-node", proc, sock, on_gone=gone.append)
        try:
            info = await h.open()
            assert info.devices == ("cpu",) and info.extra["pid"] == proc.pid
            describe = asyncio.create_task(h.describe(spec, [str(short_tmp)]))
            status = await h.status()  # answered while describe waits in the import
            assert status.node_id == "local-test-node" and not describe.done()
            flag.touch()
            described = await describe
            assert described["ok"], described
            children = psutil.Process(proc.pid).children(recursive=True)
            assert children  # the template
            second = asyncio.create_task(h.describe(spec, [str(short_tmp)]))
            await asyncio.sleep(0)
            os.kill(proc.pid, signal.SIGKILL)
            with pytest.raises(AgentGone):
                await second
            with pytest.raises(AgentGone):
                await h.status()
            assert gone == [h] and h.gone is not None
            _, alive = psutil.wait_procs(children, timeout=30)
            assert not alive
        finally:
            await h.shutdown(timeout_s=5)

    asyncio.run(scenario())


def test_an_agent_dies_with_its_parent(short_tmp: Path) -> None:
    """The death signal: ``kill -9`` of the process that spawned the agent (once the agent has
    built its node) kills the agent, and its template with it."""
    code = (
        "import sys, time\n"
        "from gshare.runtime.node.agent_process import recv, spawn_agent\n"
        "init = {'node_id': 'local-x', 'run_dir': sys.argv[1], 'node_ip': '127.0.0.1'}\n"
        "proc, sock = spawn_agent(init)\n"
        "rid, ok, info = recv(sock)\n"
        "print(proc.pid, ok, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code, str(short_tmp / "run")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        pid, ok = parent.stdout.readline().split()
        assert ok == "True"
        agent = psutil.Process(int(pid))
        assert agent.ppid() == parent.pid
        family = [agent, *agent.children(recursive=True)]  # the agent and its template
        parent.kill()
        parent.wait()
        _, alive = psutil.wait_procs(family, timeout=30)
        assert not alive, alive
    finally:
        parent.kill()
        parent.wait()
