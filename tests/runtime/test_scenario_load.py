"""``gshare load`` against a real ``gshare serve`` (DESIGN §15, "one scenario, two worlds"): the
example scenario is deployed (three chained mlp stages and a plain mlp function), its arrivals
for the seed — the very ones ``gshare simulate`` simulates — are sent open loop for 3 s, and
every arrival is accounted for in results.json (answered, or reported with its status). Then
``gshare simulate --profiles-from`` asks the same server for live profiles (none were
measured: the scenario's CSV is used). No timing is asserted."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from gshare.experiments.scenario_arrivals import scenario_arrivals
from gshare.scenario import load_scenario
from gshare.testing import ServeProcess, run_cli

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "scenarios" / "mlp-chain.yaml"
STATUSES = {"ok", "error", "unfinished", "dropped_client"}


def test_gshare_load_sends_the_scenario_and_accounts_for_every_arrival(
    served: ServeProcess, tmp_path: Path
) -> None:
    r = served.cli("load", str(EXAMPLE), "--duration-s", "3", "--out", str(tmp_path), timeout_s=400)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{served.log()}"
    folder = tmp_path / "mlp-chain-load"
    doc = json.loads((folder / "results.json").read_text())
    s, rows = doc["summary"], doc["rows"]
    arrivals = scenario_arrivals(load_scenario(EXAMPLE), 3.0)
    assert s["world"] == "live" and s["url"] == served.url
    assert s["arrivals"] == len(arrivals) == len(rows) and s["all_accounted"]
    # the simulator's arrivals, one request each (results.json keeps 6 decimals)
    assert [(x["arrival_ms"], x["kind"], x["name"]) for x in rows] == [
        (round(a.time_ms, 6), a.kind, a.target) for a in arrivals
    ]
    assert {x["status"] for x in rows} <= STATUSES
    for x in rows:
        if x["status"] == "ok":
            assert x["code"] == 200 and x["latency_ms"] > 0
            if x["kind"] == "function":  # the instance's timing headers, kept per request
                parts = [x["queue_ms"], x["token_wait_ms"], x["exec_ms"], x["platform_ms"]]
                assert all(v is not None and v >= 0.0 for v in parts), x
                assert sum(parts) == pytest.approx(x["latency_ms"], abs=0.01), x
        else:
            assert x["error"] and not x["hit"]
    assert sum(s["by_status"].values()) == len(arrivals)
    # the generator drove with its heap frozen and says what pauses of its own were left
    gcs = s["client_gc"]
    assert gcs["frozen_objects"] > 0 and gcs["pauses"] >= 0 and gcs["max_ms"] >= 0.0
    wf, fn = s["workflows"]["mlp-chain"], s["functions"]["mlp-solo"]
    for st in (wf, fn):
        assert 0.0 <= st["slo_hit_rate"] <= 1.0
        assert st["answered"] > 0, (st, [x["error"] for x in rows if x["error"]][:3])
        assert st["requests"] == (
            st["answered"] + st["errors"] + st["unfinished"] + st["dropped_client"]
        )
    assert wf["requests"] + fn["requests"] == len(arrivals)
    # the server's own count of the workflow's answered requests
    counters = wf["server"]["counters"]
    assert counters.get("gshare_workflow_requests_total{code=200}") == wf["answered"]
    assert fn["instances_end"] >= 1
    with open(folder / "rows.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == len(arrivals)
    assert (folder / "mlp-chain-load_latency_cdf.png").read_bytes()[:4] == b"\x89PNG"

    # simulate with --profiles-from this server: nothing was profiled live, the CSV is used
    r = run_cli(
        "simulate",
        str(EXAMPLE),
        "--quick",
        "--profiles-from",
        served.url,
        "--state",
        str(served.state_dir),
        "--out",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    sim = json.loads((tmp_path / "mlp-chain-simulate" / "results.json").read_text())["summary"]
    assert set(sim["workflows"]["mlp-chain"]["profiles"].values()) == {"scenario profiles"}


LLM_EXAMPLE = REPO / "examples" / "scenarios" / "llm-code.yaml"


def test_gshare_load_streams_the_llm_trace_with_its_token_counts(
    served: ServeProcess, tmp_path: Path
) -> None:
    from gshare.experiments.scenario_arrivals import request_tokens

    r = served.cli("load", str(LLM_EXAMPLE), "--out", str(tmp_path), timeout_s=400)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{served.log()}"
    doc = json.loads((tmp_path / "llm-code-load" / "results.json").read_text())
    s, rows = doc["summary"], doc["rows"]
    sc = load_scenario(LLM_EXAMPLE)
    arrivals = scenario_arrivals(sc, sc.duration_s())
    tokens = request_tokens(sc, arrivals)
    assert s["arrivals"] == len(arrivals) == len(rows) and s["all_accounted"]
    ok = [x for x in rows if x["status"] == "ok"]
    assert ok, [x["error"] for x in rows][:3]
    for x in ok:  # ignore_eos: every answered request got exactly the trace's tokens
        assert (x["prompt_tokens"], x["completion_tokens"]) == tokens[x["request"]]
        assert 0 < x["ttft_ms"] <= x["latency_ms"]
    for x in rows:
        if x["status"] != "ok":
            assert x["error"] and not x["hit"]
    st = s["functions"]["gen"]
    assert st["ttft_ms_p50"] <= st["ttft_ms_p99"] and st["tpot_ms_p50"] <= st["tpot_ms_p99"]
    assert st["tokens_per_s"] > 0 and 0.0 <= st["slo_attainment"] <= 1.0
    # the simulator's report of the same scenario has the same figures
    sim = simulate_summary(tmp_path)
    assert {k for k in st if k.startswith(("ttft", "tpot", "slo_att", "tokens"))} <= set(sim)


def simulate_summary(out: Path) -> dict[str, object]:
    r = run_cli("simulate", str(LLM_EXAMPLE), "--out", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads((out / "llm-code-simulate" / "results.json").read_text())
    st: dict[str, object] = doc["summary"]["functions"]["gen"]
    return st
