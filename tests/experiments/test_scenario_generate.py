"""Generative functions in a scenario (``experiments.scenario_generate``): each request's token
counts come from the LLM trace's rows, the simulator predicts TTFT / TPOT and SLO attainment
with the live engine's policy, the load generator reads an OpenAI stream into the same
figures. The live run against a real server is ``tests/runtime/test_scenario_load.py``."""

from __future__ import annotations

import asyncio
import csv
import json
from pathlib import Path

import httpx
import pytest
import yaml

from gshare.experiments.scenario_arrivals import request_tokens, scenario_arrivals
from gshare.experiments.scenario_generate import prompt_text, stream_completion
from gshare.experiments.scenario_sim import simulate
from gshare.scenario import ScenarioError, load_scenario

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "scenarios"
EXAMPLE = EXAMPLES / "llm-code.yaml"
TRACE = REPO / "src" / "gshare" / "data" / "azure_llm_inference_2023_code.csv"


def _scenario(tmp_path: Path, **workload: object) -> Path:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["functions"] = [str(EXAMPLES / f) for f in doc["functions"]]
    doc["workloads"][0].update(workload)
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_token_counts_are_the_trace_rows_scaled_and_clamped() -> None:
    sc = load_scenario(EXAMPLE)
    arrivals = scenario_arrivals(sc, 6.0)
    tokens = request_tokens(sc, arrivals)
    assert sorted(tokens) == list(range(len(arrivals)))
    with open(TRACE, newline="") as f:
        rows = list(csv.DictReader(f))
    for k in range(5):  # the k-th arrival takes the k-th row (the shipped trace is in order)
        ctx, gen = int(rows[k]["ContextTokens"]), int(rows[k]["GeneratedTokens"])
        assert tokens[k] == (min(200, max(4, round(ctx / 64))), min(128, max(1, gen)))
    assert all(4 <= p <= 200 and 1 <= m <= 128 for p, m in tokens.values())


def test_tokens_are_for_generative_functions_and_bad_values_are_named(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"workloads\.0\.tokens\.max_prompt_tokens"):
        load_scenario(_scenario(tmp_path, tokens={"min_prompt_tokens": 8, "max_prompt_tokens": 4}))
    with pytest.raises(ScenarioError, match=r"workloads\.0\.tokens\.prompt_scale"):
        load_scenario(_scenario(tmp_path, tokens={"prompt_scale": 0}))
    doc = yaml.safe_load(EXAMPLE.read_text())
    (tmp_path / "mlp.yaml").write_text(yaml.safe_dump({"name": "gen", "model": "mlp"}))
    doc["functions"] = [str(tmp_path / "mlp.yaml")]
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ScenarioError, match=r"workloads\.0\.tokens: .*generative"):
        load_scenario(tmp_path / "m.yaml")


def test_a_prompt_has_the_requested_tokens() -> None:
    for n in (1, 4, 75, 200):
        text = prompt_text(n, 3)
        assert len(text.encode()) + 1 == n and text.isprintable()  # + BOS
    assert prompt_text(20, 1) != prompt_text(20, 2)


def test_simulate_predicts_ttft_tpot_and_slo_attainment() -> None:
    sc = load_scenario(EXAMPLE)
    res = simulate(sc, quick=True)
    arrivals = scenario_arrivals(sc, sc.duration_s(True))
    tokens = request_tokens(sc, arrivals)
    assert res.summary["all_accounted"] and len(res.rows) == len(arrivals)
    st = res.summary["functions"]["gen"]
    assert st["requests"] == sum(1 for a in arrivals if a.time_ms >= 3000.0)
    assert 0 < st["ttft_ms_p50"] <= st["ttft_ms_p99"]
    assert 0 < st["tpot_ms_p50"] <= st["tpot_ms_p99"]
    assert st["tokens_per_s"] > 0 and 0.0 <= st["slo_attainment"] <= 1.0
    assert st["ttft_slo_ms"] == 500 and st["tpot_slo_ms"] == 10
    assert st["steps"] > 0 and st["max_decode_batch"] >= 2  # the burst is batched
    for r in res.rows:
        assert (
            r["status"] == "ok"
            and (r["prompt_tokens"], r["completion_tokens"]) == tokens[int(r["request"])]
        )
        assert r["ttft_ms"] <= r["latency_ms"]
        assert r["hit"] == (r["ttft_ms"] <= 500 and (r["tpot_ms"] is None or r["tpot_ms"] <= 10))


def _sse(*events: object) -> bytes:
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


def test_the_load_generator_reads_a_stream_into_ttft_tpot_and_tokens() -> None:
    seen: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        if body["model"] == "shed":
            return httpx.Response(429, json={"error": {"message": "overloaded"}})
        chunk = {"choices": [{"text": "x", "index": 0, "finish_reason": None}]}
        usage = {"choices": [], "usage": {"completion_tokens": 3, "prompt_tokens": 5}}
        return httpx.Response(200, content=_sse(chunk, chunk, chunk, usage))

    async def run() -> list[dict[str, object]]:
        rows: list[dict[str, object]] = [{"request": 1}, {"request": 2}]
        async with httpx.AsyncClient(
            base_url="http://t", transport=httpx.MockTransport(handler)
        ) as http:
            await stream_completion(http, rows[0], "gen", 5, 3, (1000.0, 1000.0))
            await stream_completion(http, rows[1], "shed", 5, 3, (1000.0, None))
        return rows

    ok, shed = asyncio.run(run())
    assert ok["status"] == "ok" and ok["completion_tokens"] == 3 and ok["hit"]
    assert 0 <= ok["ttft_ms"] <= ok["latency_ms"] and ok["tpot_ms"] is not None  # type: ignore[operator]
    assert shed["status"] == "error" and shed["code"] == 429 and "overloaded" in str(shed["error"])
    body = seen[0]
    assert body["stream"] and body["ignore_eos"] and body["max_tokens"] == 3
    assert body["temperature"] == 0 and len(str(body["prompt"]).encode()) == 4
