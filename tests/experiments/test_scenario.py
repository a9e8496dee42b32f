"""Scenarios (docs/DESIGN.md §15, "one scenario, two worlds"): the file format and its errors
(``gshare.scenario``), the arrival stream both worlds share (``experiments.scenario_arrivals``),
``gshare simulate`` end to end on the example, and the load generator's open loop
(``experiments.scenario_load.drive``) against an in-process transport. The live run of
``gshare load`` is ``tests/runtime/test_scenario_load.py``."""

from __future__ import annotations

import asyncio
import csv
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from gshare.cli import main
from gshare.experiments.scenario_arrivals import Arrival, scenario_arrivals, workload_times
from gshare.experiments.scenario_load import (
    default_body,
    drive,
    platform_share_ms,
    workflow_counters,
)
from gshare.experiments.scenario_sim import check_policies, function_profiles, simulate
from gshare.profiles import ProfilePoint
from gshare.scenario import ScenarioError, Trace, Workload, load_scenario

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "scenarios"
EXAMPLE = EXAMPLES / "mlp-chain.yaml"


def _doc() -> dict[str, Any]:
    """The example scenario with absolute paths (so a variant can live in ``tmp_path``)."""
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    doc["functions"] = [str(EXAMPLES / f) for f in doc["functions"]]
    doc["workflows"] = [str(EXAMPLES / f) for f in doc["workflows"]]
    doc["profiles"] = str(EXAMPLES / doc["profiles"])
    return doc


def _write(tmp_path: Path, doc: Any, name: str = "s.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


# -- the format ---------------------------------------------------------------------------------


def test_the_example_scenario_loads() -> None:
    sc = load_scenario(EXAMPLE)
    assert sc.name == "mlp-chain" and sc.seed == 1
    assert list(sc.functions) == ["mlp-1", "mlp-2", "mlp-3", "mlp-solo"]
    assert list(sc.workflows) == ["mlp-chain"] and sc.workflows["mlp-chain"].slo_ms == 100
    assert sc.workflow_functions() == ["mlp-1", "mlp-2", "mlp-3"]
    assert [w.target for w in sc.function_workloads()] == ["mlp-solo"]
    assert sc.profiles is not None and all(sc.profiles.has_model(f) for f in sc.functions)
    assert sc.duration_s() == 60 and sc.duration_s(quick=True) == 10
    assert sc.cluster.devices == 1 and sc.policies.workflow == "esg"
    # the stage handler of the spec is resolved against the spec's folder
    assert str(sc.functions["mlp-2"].handler).startswith(str(EXAMPLES / "mlp-chain"))
    other = load_scenario(EXAMPLES / "resnet50-trace.yaml")
    assert other.workloads[0].trace is not None and other.workloads[0].trace.rate_rps == 300


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    keys: list[Any] = [int(k) if k.isdigit() else k for k in path.split(".")]
    d: Any = doc
    for k in keys[:-1]:
        d = d[k]
    if value is _DELETE:
        del d[keys[-1]]
    else:
        d[keys[-1]] = value


_DELETE = object()

BAD_FIELDS = [
    # (dotted path to set, value, the message must start with / contain)
    ("durations_s", 5, "durations_s: unknown field (allowed: name, description, seed,"),
    ("duration_s", _DELETE, "duration_s: required, must be a number in (0, 604800]"),
    ("duration_s", -1, "duration_s: must be a number in (0, 604800] (seconds), got -1"),
    ("duration_s", "long", "duration_s: must be a number in (0, 604800] (seconds), got 'long'"),
    ("seed", True, "seed: must be an integer >= 0, got True"),
    ("name", "a b", "name: must be 1..100 letters, digits"),
    ("warmup_s", 60, "warmup_s: must be a number in [0, duration_s=60), got 60"),
    ("functions", [], "functions: must be a non-empty list of function spec files"),
    ("cluster.nodes", 0, "cluster.nodes: must be an integer in [1, 100000], got 0"),
    ("cluster.gpus", 2, "cluster.gpus: unknown field (allowed: nodes, devices_per_node,"),
    ("cluster.remote_latency_ms", -2, "cluster.remote_latency_ms: must be a number >= 0"),
    ("policies.scheduler", "esg", "policies.scheduler: unknown field (allowed: workflow,"),
    ("workloads", [], "workloads: must be a non-empty list of workloads"),
    ("workloads.0.poisson.rate_rps", 0, "workloads.0.poisson.rate_rps: must be a number in (0,"),
    ("workloads.0.poisson.rate", 3, "workloads.0.poisson.rate: unknown field (allowed: rate_rps)"),
    ("workloads.0.poison", {"rate_rps": 1}, "workloads.0.poison: unknown field (allowed: workflow"),
    ("workloads.0.uniform", {"interval_ms": 5}, "workloads.0.poisson: exactly one arrival"),
    ("workloads.0.poisson", _DELETE, "workloads.0.poisson: exactly one arrival process"),
    ("workloads.0.function", "mlp-solo", "workloads.0.workflow: exactly one of workflow or"),
    ("workloads.1.uniform", {"lo_ms": 5}, "workloads.1.uniform.interval_ms: required (or both"),
    ("workloads.1.uniform", {"lo_ms": 9, "hi_ms": 5}, "workloads.1.uniform.hi_ms: must be a"),
    ("workloads.1.uniform", {"interval_ms": 5, "lo_ms": 1, "hi_ms": 9}, "not both"),
    (
        "workloads.1.uniform",
        {"interval_ms": 0},
        "workloads.1.uniform.interval_ms: must be a number >= 0.001 (ms), got 0",
    ),
    (  # an interval below the rate bound is refused, not drawn (it used to be a traceback)
        "workloads.1.uniform",
        {"interval_ms": 1e-9},
        "workloads.1.uniform.interval_ms: must be a number >= 0.001 (ms), got 1e-09",
    ),
    (  # within every per-field bound, but 6e7 arrivals: refused before any is drawn
        "workloads.0.poisson.rate_rps",
        1_000_000,
        "workloads: 6e+07 arrivals over duration_s=60 is more than the 5,000,000",
    ),
    ("workloads.1.input_json", [0.0], "workloads.1.input: give input or input_json, not both"),
    ("workloads.0.workflow", "nope", "workloads.0.workflow: unknown workflow 'nope'"),
    ("workloads.1.function", "nope", "workloads.1.function: unknown function 'nope'"),
    ("workloads.1.input", "missing.bin", "workloads.1.input: no file"),
    ("functions.0", "missing.yaml", "functions.0: no file"),
    ("workflows.0", "missing.yaml", "workflows.0: no file"),
    ("profiles", "missing.csv", "profiles: no file"),
    ("profiles", 3, "profiles: must be a profile CSV file"),
]


@pytest.mark.parametrize(("path", "value", "expect"), BAD_FIELDS)
def test_a_bad_field_is_one_line_naming_it(
    tmp_path: Path, path: str, value: Any, expect: str
) -> None:
    doc = _doc()
    if path == "workloads.1.input_json":
        (tmp_path / "in.bin").write_bytes(bytes(256))
        doc["workloads"][1]["input"] = str(tmp_path / "in.bin")
    _set(doc, path, value)
    p = _write(tmp_path, doc)
    with pytest.raises(ScenarioError) as e:
        load_scenario(p)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"{p}: "), msg
    assert expect in msg, msg


@pytest.mark.parametrize(
    ("trace", "expect"),
    [
        ({"format": "azure2018"}, "workloads.1.trace.format: must be one of azure2019, azure2021"),
        ({"format": "llm", "rank": 2}, "workloads.1.trace.rank: only for format azure2019"),
        ({"format": "azure2021", "start_minute": 3}, "trace.start_minute: only for format"),
        ({"format": "azure2019", "minutes": 0}, "workloads.1.trace.minutes: must be an integer"),
        ({"format": "llm", "path": "nope.csv"}, "workloads.1.trace.path: no file"),
        ({"format": "llm", "rate": 3}, "workloads.1.trace.rate: unknown field (allowed: format,"),
    ],
)
def test_a_bad_trace_is_one_line_naming_the_field(
    tmp_path: Path, trace: dict[str, Any], expect: str
) -> None:
    doc = _doc()
    doc["workloads"][1] = {"function": "mlp-solo", "trace": trace}
    with pytest.raises(ScenarioError) as e:
        load_scenario(_write(tmp_path, doc))
    assert "\n" not in str(e.value) and expect in str(e.value), str(e.value)


def test_referenced_specs_and_files_report_their_own_errors(tmp_path: Path) -> None:
    bad_fn = yaml.safe_load((EXAMPLES / "mlp-chain" / "mlp-solo.yaml").read_text())
    bad_fn["resources"]["sm_pct"] = 150
    doc = _doc()
    doc["functions"][3] = str(_write(tmp_path, bad_fn, "fn.yaml"))
    with pytest.raises(ScenarioError) as e:
        load_scenario(_write(tmp_path, doc))
    assert "functions.3: " in str(e.value) and "resources.sm_pct: must be a number in (0, 100]" in (
        str(e.value)
    )
    # a workflow over a function the scenario does not define
    doc = _doc()
    doc["functions"] = doc["functions"][1:]
    with pytest.raises(ScenarioError) as e:
        load_scenario(_write(tmp_path, doc))
    assert "workflows.0: " in str(e.value) and "unknown function 'mlp-1'" in str(e.value)
    # the same function twice
    doc = _doc()
    doc["functions"].append(doc["functions"][0])
    with pytest.raises(ScenarioError, match=r"functions\.4: function 'mlp-1' is already defined"):
        load_scenario(_write(tmp_path, doc))
    # a profile CSV that is not one
    doc = _doc()
    (tmp_path / "p.csv").write_text("model,sm_pct\nmlp,oops\n")
    doc["profiles"] = str(tmp_path / "p.csv")
    with pytest.raises(ScenarioError, match=r"^.*: profiles: .*bad profile row"):
        load_scenario(_write(tmp_path, doc))
    # not a mapping, bad YAML, no file
    for text, expect in (
        ("- 1\n- 2\n", "a scenario must be a mapping"),
        ("name: [\n", "the scenario"),
    ):
        p = tmp_path / "t.yaml"
        p.write_text(text)
        with pytest.raises(ScenarioError, match=expect):
            load_scenario(p)
    with pytest.raises(ScenarioError, match="cannot read scenario"):
        load_scenario(tmp_path / "absent.yaml")


def test_policy_names_are_checked_naming_the_field(tmp_path: Path) -> None:
    sc = load_scenario(EXAMPLE)
    assert check_policies(sc) == ("esg", "gshare-burst")
    assert check_policies(sc, "orion") == ("orion", "gshare-burst")
    assert check_policies(sc, "target-util") == ("esg", "target-util")
    with pytest.raises(ScenarioError, match=r"^--policy: unknown policy 'nope' \(workflow"):
        check_policies(sc, "nope")
    doc = _doc()
    doc["policies"] = {"workflow": "fastest", "autoscaler": "gshare-burst"}
    with pytest.raises(ScenarioError, match=r"^policies\.workflow: unknown workflow scheduler"):
        check_policies(load_scenario(_write(tmp_path, doc)))
    doc["policies"] = {"autoscaler": "hpa"}
    with pytest.raises(ScenarioError, match=r"^policies\.autoscaler: unknown autoscaler 'hpa'"):
        check_policies(load_scenario(_write(tmp_path, doc)))


def test_profiles_come_from_live_rows_then_the_file_then_the_v100_table(tmp_path: Path) -> None:
    sc = load_scenario(EXAMPLE)
    live = {"mlp-1": [ProfilePoint("mlp-1", 50.0, 100.0, 1, 9.0)]}
    got = function_profiles(sc, ["mlp-1", "mlp-2"], live)
    assert got["mlp-1"].source == "live" and got["mlp-2"].source == "scenario profiles"
    assert got["mlp-1"].table.latency_ms("mlp-1", 50.0) == 9.0
    doc = _doc()
    del doc["profiles"]
    doc["functions"].append(str(REPO / "examples" / "resnet50.yaml"))
    bare = load_scenario(_write(tmp_path, doc))
    assert function_profiles(bare, ["resnet50"])["resnet50"].source == "shipped V100"
    with pytest.raises(ScenarioError) as e:
        function_profiles(bare, ["mlp-solo"])
    msg = str(e.value)
    assert "'mlp-solo' has no profile (model 'mlp' is not in the shipped V100 table)" in msg
    assert "--profiles-from URL" in msg and "profiles:" in msg and "\n" not in msg


# -- arrivals -----------------------------------------------------------------------------------


def test_arrivals_are_deterministic_sorted_and_follow_each_process() -> None:
    sc = load_scenario(EXAMPLE)
    a = scenario_arrivals(sc, 10.0)
    assert a == scenario_arrivals(sc, 10.0, seed=1)
    assert a != scenario_arrivals(sc, 10.0, seed=2)
    assert [x.time_ms for x in a] == sorted(x.time_ms for x in a)
    assert all(0 <= x.time_ms < 10_000 for x in a)
    solo = [x.time_ms for x in a if x.target == "mlp-solo"]
    assert solo == [50.0 * k for k in range(1, 200)]  # uniform: every 50 ms from 50 ms
    chain = [x for x in a if x.target == "mlp-chain"]
    assert 70 <= len(chain) <= 130 and all(x.kind == "workflow" for x in chain)  # ~10/s
    # a ranged uniform process
    w = Workload.model_validate({"function": "f", "uniform": {"lo_ms": 10, "hi_ms": 20}})
    gaps = np.diff(workload_times(w, 0, 5_000, 0))
    assert gaps.min() >= 10 and gaps.max() <= 20


@pytest.mark.parametrize(
    ("trace", "low", "high"),
    [
        ({"format": "azure2021", "rate_rps": 20}, 150, 260),
        ({"format": "llm", "rate_rps": 30}, 20, 600),  # bursty: its first 10 s are quiet
        ({"format": "azure2019", "rate_rps": 25, "start_minute": 600, "minutes": 1}, 200, 300),
        ({"format": "azure2019", "start_minute": 600, "minutes": 1, "rank": 2}, 150, 300),
        ({"format": "azure2021", "repeat": False}, 0, 199),
    ],
)
def test_trace_arrivals_replay_the_shipped_traces(
    trace: dict[str, Any], low: int, high: int
) -> None:
    w = Workload(function="f", trace=Trace.model_validate(trace))
    t = workload_times(w, 0, 10_000.0, 3)
    assert low <= len(t) <= high, len(t)
    assert np.all(np.diff(t) >= 0) and (len(t) == 0 or (t[0] >= 0 and t[-1] < 10_000))
    assert np.array_equal(t, workload_times(w, 0, 10_000.0, 3))


def test_an_azure2019_rank_beyond_the_busy_functions_is_an_error() -> None:
    w = Workload(
        function="f",
        trace=Trace(format="azure2019", start_minute=600, minutes=1, rank=100_000),
    )
    with pytest.raises(ScenarioError, match=r"trace\.rank: minutes \[600, 601\) of the azure"):
        workload_times(w, 0, 1000.0, 0)


def test_simulate_and_load_get_the_same_arrivals() -> None:
    """The simulator's requests are the arrivals; the load generator sends one request per
    arrival at its time (an instant in-process server)."""
    sc = load_scenario(EXAMPLE)
    arrivals = scenario_arrivals(sc, 1.5)
    sim = simulate(sc, duration_s=1.5)
    assert sorted((r["arrival_ms"], r["kind"], r["name"]) for r in sim.rows) == sorted(
        (a.time_ms, a.kind, a.target) for a in arrivals
    )
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        timing = {"x-gshare-queue-ms": "0.5", "x-gshare-token-wait-ms": "0.25",
                  "x-gshare-exec-ms": "1.0"}  # fmt: skip
        headers = timing if request.url.path.startswith("/function/") else {}
        return httpx.Response(200, json={"label": 1, "score": 0.5}, headers=headers)

    slos = {("workflow", "mlp-chain"): 100.0, ("function", "mlp-solo"): 25.0}
    bodies = [(b"\0" * 256, "application/octet-stream")] * 2
    rows = asyncio.run(
        drive("http://test", arrivals, bodies, slos, transport=httpx.MockTransport(answer))
    )
    assert [(r["arrival_ms"], r["kind"], r["name"]) for r in rows] == [
        (a.time_ms, a.kind, a.target) for a in arrivals
    ]
    assert all(r["status"] == "ok" and r["code"] == 200 for r in rows)
    assert all(r["hit"] == (r["latency_ms"] <= r["slo_ms"]) for r in rows)
    # the platform's share: the latency beyond the instance's timing headers, and the
    # instance's compute time (functions only)
    for r in rows:
        if r["kind"] == "function":
            assert r["platform_ms"] == pytest.approx(max(0.0, r["latency_ms"] - 1.75))
            assert r["exec_ms"] == 1.0
        else:
            assert r["platform_ms"] is None and r["exec_ms"] is None
    assert sorted(seen) == sorted(
        f"/workflow/{a.target}" if a.kind == "workflow" else f"/function/{a.target}"
        for a in arrivals
    )


def test_the_platform_share_needs_every_timing_header() -> None:
    full = {"x-gshare-queue-ms": "1", "x-gshare-token-wait-ms": "2", "x-gshare-exec-ms": "3"}
    assert platform_share_ms(10.0, full) == 4.0
    assert platform_share_ms(5.0, full) == 0.0  # never negative (clocks of two processes)
    assert platform_share_ms(10.0, {**full, "x-gshare-exec-ms": "n/a"}) is None
    assert platform_share_ms(10.0, {**full, "x-gshare-exec-ms": "nan"}) is None
    assert platform_share_ms(10.0, {"x-gshare-queue-ms": "1"}) is None


def test_the_load_generator_drops_beyond_max_outstanding_and_reports_it() -> None:
    async def slow(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("bad"):
            return httpx.Response(500, json={"error": "bad"})
        await asyncio.sleep(0.8)  # far longer than the 5 ms the arrivals take
        return httpx.Response(200, json={})

    arrivals = [Arrival(float(t), "function", "f" if t < 3 else "bad", 0) for t in range(5)]
    rows = asyncio.run(
        drive(
            "http://test",
            arrivals,
            [(b"x", "application/octet-stream")],
            {("function", "f"): 1000.0, ("function", "bad"): 1000.0},
            max_outstanding=2,
            transport=httpx.MockTransport(slow),
        )
    )
    assert [r["status"] for r in rows] == ["ok", "ok"] + ["dropped_client"] * 3
    assert "--max-outstanding" in rows[2]["error"]
    rows = asyncio.run(
        drive(
            "http://test",
            arrivals[3:],
            [(b"x", "application/octet-stream")],
            {("function", "bad"): 1000.0},
            transport=httpx.MockTransport(slow),
        )
    )
    assert [r["status"] for r in rows] == ["error", "error"] and rows[0]["code"] == 500
    assert not any(r["hit"] for r in rows)


def test_default_inputs_come_from_the_model_metadata() -> None:
    fp32 = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]}
    assert default_body(fp32, "mlp") == (bytes(256), "application/octet-stream")
    img = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 8, 8]}]}
    assert len(default_body(img, "r")[0]) == 3 * 8 * 8 * 4
    ids = {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]}]}
    body, ctype = default_body(ids, "bert")
    assert ctype == "application/json" and json.loads(body)[0] == 101
    with pytest.raises(Exception, match="give the workload input"):
        default_body({"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, -1, 3]}]}, "x")


def test_workflow_counters_read_the_servers_metrics() -> None:
    text = (
        "# TYPE gshare_workflow_requests counter\n"
        'gshare_workflow_requests_total{code="200",workflow="w"} 7.0\n'
        "# TYPE gshare_workflow_cost_usd counter\n"
        'gshare_workflow_cost_usd_total{workflow="w"} 1.5e-06\n'
        "# TYPE gshare_workflow_latency_seconds histogram\n"
        'gshare_workflow_latency_seconds_bucket{le="0.1",workflow="w"} 7.0\n'
        'gshare_workflow_latency_seconds_count{workflow="w"} 7.0\n'
    )
    got = workflow_counters(text)
    assert got == {
        "w": {
            "gshare_workflow_requests_total{code=200}": 7.0,
            "gshare_workflow_cost_usd_total": 1.5e-06,
            "gshare_workflow_latency_seconds_count": 7.0,
        }
    }


# -- gshare simulate ------------------------------------------------------------------------------


def test_gshare_simulate_quick_writes_results_csv_and_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["simulate", str(EXAMPLE), "--quick", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "mlp-chain" in out and "wrote" in out
    folder = tmp_path / "mlp-chain-simulate"
    doc = json.loads((folder / "results.json").read_text())
    s = doc["summary"]
    assert doc["experiment"] == "mlp-chain-simulate" and s["world"] == "simulator"
    assert doc["provenance"]["quick"] is True and doc["provenance"]["overrides"] == []
    arrivals = scenario_arrivals(load_scenario(EXAMPLE), 10.0)
    assert s["arrivals"] == len(arrivals) == len(doc["rows"]) and s["all_accounted"]
    wf, fn = s["workflows"]["mlp-chain"], s["functions"]["mlp-solo"]
    for st in (wf, fn):
        assert 0.0 <= st["slo_hit_rate"] <= 1.0
        assert st["requests"] == st["answered"] + st["unfinished"] > 0
        assert 0 < st["p50_ms"] <= st["p99_ms"] < 10_000
    assert wf["requests"] + fn["requests"] == len(arrivals)
    assert wf["slo_ms"] == 100 and wf["cost_per_1m_requests_usd"] > 0
    assert fn["devices_max"] == 1 and fn["instances_mean"] >= 1
    with open(folder / "rows.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(arrivals) and {r["kind"] for r in rows} == {"workflow", "function"}
    png = folder / "mlp-chain-simulate_latency_cdf.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_gshare_simulate_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _doc()
    doc["cluster"]["gpus"] = 4
    for args, expect in (
        ([str(_write(tmp_path, doc))], "cluster.gpus: unknown field"),
        ([str(EXAMPLE), "--policy", "fastest"], "--policy: unknown policy 'fastest'"),
    ):
        with pytest.raises(SystemExit) as e:
            main(["simulate", *args, "--quick", "--out", str(tmp_path)])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("gshare: error: ") and expect in err and "\n" not in err, err


def test_every_workflow_policy_runs_the_example() -> None:
    sc = load_scenario(EXAMPLE)
    small_bo = {"n_bootstrap": 8, "n_rounds": 2, "n_samples": 8, "pool_size": 100, "n_local": 20}
    for policy in ("fast-gshare", "infless", "orion", "aquatope"):
        r = simulate(sc, duration_s=2.0, policy=policy, bo_params=small_bo)
        st = r.summary["workflows"]["mlp-chain"]
        assert r.summary["policies"]["workflow"] == policy and r.summary["all_accounted"]
        assert st["requests"] > 0 and 0.0 <= st["slo_hit_rate"] <= 1.0


def test_a_simulated_request_has_the_live_timing_columns_and_they_add_up() -> None:
    """The columns ``gshare load`` reads from the timing headers, from the simulator: queue,
    token wait, compute and platform add up to the latency; the priority-1 function beside the
    priority-8 one waits for tokens; a shed request has none."""
    from gshare.experiments.scenario_rows import TIMING_COLUMNS

    sc = load_scenario(EXAMPLES / "priority-pair.yaml")
    r = simulate(sc, quick=True, seed=3)
    fns = [x for x in r.rows if x["kind"] == "function"]
    ok = [x for x in fns if x["status"] == "ok"]
    assert ok and all(x[k] is not None and x[k] >= -1e-9 for x in ok for k in TIMING_COLUMNS)
    for x in ok:
        assert sum(x[k] for k in TIMING_COLUMNS) == pytest.approx(x["latency_ms"], abs=1e-6)
    assert max(x["token_wait_ms"] for x in ok if x["name"] == "prio-hi") > 0
    assert all(x[k] is None for x in fns if x["status"] != "ok" for k in TIMING_COLUMNS)
