"""Issue 10, part 1 (live workflows): ``gshare deploy`` of a workflow spec, ``POST
/workflow/{name}`` through the stages' functions (a chain and a join), ``gshare list`` and
``gshare invoke --workflow``, the state kept across a restart, and clear errors for a missing
function at deploy time and for a deleted one at invoke time."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gshare.testing import ServeProcess, wait_until

REPO = Path(__file__).resolve().parents[2]

DIAMOND = """
name: diamond
slo_ms: 2000
stages:
  - {name: a, function: wrap-a}
  - {name: b, function: wrap-b, after: [a]}
  - {name: c, function: wrap-c, after: [a]}
  - {name: d, function: wrap-a, after: [b, c]}
"""


def wrap(name: str) -> dict[str, object]:
    return {"name": name, "handler": "gshare.runtime.demo_handlers:Wrap", "device": "cpu"}


@pytest.mark.slow
def test_a_workflow_is_deployed_run_kept_across_a_restart_and_fails_clearly(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    spec = tmp_path / "diamond.yaml"
    spec.write_text(DIAMOND)
    with ServeProcess(state_dir=state, tiny_models=True, cwd=REPO) as srv:
        c = srv.client()
        # a workflow naming a function that is not deployed is refused, naming it
        r = srv.cli("deploy", str(spec))
        assert r.returncode == 1 and "wrap-a" in r.stderr, r.stderr
        for n in ("wrap-a", "wrap-b", "wrap-c"):
            c.deploy(wrap(n))
        r = srv.cli("deploy", str(spec))
        assert r.returncode == 0 and "deployed workflow diamond" in r.stdout, r.stderr
        out = c.invoke_workflow("diamond", {"x": 1})
        # d (wrap-a) gets the join {"b": b's output, "c": c's output}
        assert out == {"in": {"b": {"in": {"in": {"x": 1}}}, "c": {"in": {"in": {"x": 1}}}}}
        r = srv.cli("invoke", "diamond", "--workflow", "--data", "[7]", auth=False)
        assert r.returncode == 0 and '"b"' in r.stdout, r.stderr
        # invoked as a function, a workflow's name says what it is (with the token: for sure)
        r = srv.cli("invoke", "diamond", "--data", "[7]")
        assert r.returncode == 1, r.stderr
        assert "'diamond' is a workflow; use gshare invoke --workflow diamond" in r.stderr
        r = srv.cli("invoke", "wrap-a", "--workflow", "--data", "[7]")
        assert "'wrap-a' is a function; use gshare invoke wrap-a" in r.stderr
        r = srv.cli("invoke", "nothing", "--data", "[7]")
        assert r.returncode == 1 and "is a" not in r.stderr and "not deployed" in r.stderr
        listed = srv.cli("list")
        assert "diamond" in listed.stdout and "b(wrap-b)" in listed.stdout
        metrics = httpx.get(srv.url + "/metrics", timeout=10).text
        assert 'gshare_workflow_slo_total{outcome="hit",workflow="diamond"}' in metrics
        # ESG (the default scheduler) ran every stage as a task with a quota, and billed it
        assert 'gshare_workflow_tasks_total{quota_pct="' in metrics
        info = c.info()
        # the controller's period ticks, on this host's monotonic clock: ascending, in the past
        ticks = info["control_ticks_s"]
        assert ticks and ticks == sorted(ticks) and ticks[-1] <= time.monotonic()
        assert info["workflow_policy"] == "esg"
        assert info["workflow_scheduler"]["queued"] == 0
        assert set(info["workflow_scheduler"]["options"]) == {"wrap-a", "wrap-b", "wrap-c"}
        cost = [
            ln for ln in metrics.splitlines() if ln.startswith("gshare_workflow_cost_usd_total")
        ]
        assert cost and float(cost[0].split()[-1]) > 0, cost
        assert (
            'gshare_workflow_stage_queue_seconds_count{stage="d",workflow="diamond"} 2.0' in metrics
        )
    # the state keeps the workflow
    with ServeProcess(state_dir=state, tiny_models=True, cwd=REPO) as srv:
        c = srv.client()
        wait_until(lambda: c.list_workflows(), 30, "the workflow restored")
        assert c.invoke_workflow("diamond", "z")["in"]["c"] == {"in": {"in": "z"}}
        # a deleted stage function: the workflow says which one, and which stages use it
        c.delete("wrap-b")
        r = httpx.post(srv.url + "/workflow/diamond", json={"x": 1}, timeout=60)
        assert r.status_code == 424, r.text
        assert "wrap-b" in r.json()["error"] and "diamond" in r.json()["error"]
        assert c.list_workflows()[0]["missing_functions"] == ["wrap-b"]
        r = httpx.post(srv.url + "/workflow/nope", json={}, timeout=60)
        assert r.status_code == 404 and "nope" in r.json()["error"]
        c.delete_workflow("diamond")
        assert c.list_workflows() == []


def test_an_unknown_workflow_policy_is_refused_in_one_line(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "gshare.cli",
            "serve",
            "--workflow-policy",
            "fifo",
            "--state",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0
    assert "unknown workflow policy 'fifo'" in r.stderr and "esg" in r.stderr, r.stderr
