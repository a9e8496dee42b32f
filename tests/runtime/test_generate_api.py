"""Generative functions end to end: one real ``gshare serve --grpc-port 0`` (module scope) with
the built-in ``causal-lm-tiny`` (random weights, byte tokenizer, CPU) served by its instance's
engine, reached by the clients users already have — the official ``openai`` client unchanged,
plain HTTP for the OIP generate extension, ``tritonclient.grpc``'s stream.

What is checked (behaviour and invariants, no timing): streamed text equals the non-streamed
greedy text on every API; a client that disconnects mid-stream stops its generation (the
instance's engine counts the cancellation and frees the KV); a stream that starts while another
runs joins its decode steps and leaves them (continuous batching), neither's tokens changing;
each bad input gets one clear 4xx in the API's own error shape and the server keeps serving;
TTFT admission sheds with 429.

Functions: ``gen`` (causal-lm-tiny, up to 8 sequences per step, held to one instance: a few
long generations run one at a time measure a low throughput per instance, and the autoscaler
would otherwise add instances that the joining stream could be routed to), ``gen-slo`` (the
same with a TTFT SLO no request can meet once a backlog is measured) and ``mlp`` (a one-shot
built-in).
"""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient

from gshare.runtime.control.configs import DEFAULT_BUSY_MS_PER_REQUEST
from gshare.testing import ServeProcess, wait_until

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SHARE = {"sm_pct": 50, "quota_request": 0.5, "quota_limit": 1.0}
FUNCTIONS: list[dict[str, Any]] = [
    {"name": "gen", "model": "causal-lm-tiny", "batching": {"max_batch": 8}, "max_instances": 1},
    {"name": "gen-slo", "model": "causal-lm-tiny", "slo": {"ttft_ms": 0.001}},
    {"name": "mlp", "model": "mlp"},
]
PROMPT = "gshare serves tokens"
LONG_PROMPT = "the quick brown fox"
LONG = 400
"""Tokens of the long generations (the tiny model's context is 512): ``LONG_PROMPT``'s greedy
completion runs to this length without an end-of-sequence token (checked in each test)."""


@dataclass
class Served:
    srv: ServeProcess
    grpc_address: str

    @property
    def url(self) -> str:
        return self.srv.url

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="anything", max_retries=0)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    state = tmp_path_factory.mktemp("gshare-gen") / "state"
    srv = ServeProcess("--grpc-port", "0", state_dir=state, tiny_models=True, cwd=REPO).start()
    try:
        c = srv.client()
        for f in FUNCTIONS:
            c.deploy({"device": "cpu", "resources": SHARE, "min_instances": 1, **f})
        for f in FUNCTIONS:
            wait_until(lambda n=f["name"]: c.get(n)["availableReplicas"], 120, f"{f['name']} up")
        yield Served(srv, json.loads((state / "server.json").read_text())["grpc"])
    finally:
        stopped = srv.stop()
        assert stopped.code == 0 and not stopped.killed, f"{stopped}\n{srv.log()}"
        assert not stopped.left, f"processes left behind: {stopped.left}"


def metric(url: str, name: str, function: str = "gen") -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(f'{name}{{function="{function}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def sse_events(r: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in r.iter_lines():
        if line.startswith("data: "):
            yield json.loads(line[len("data: ") :])


def greedy(served: Served, prompt: str, max_tokens: int) -> tuple[str, str]:
    """(text, finish_reason) of the unstreamed greedy completion."""
    r = served.openai().completions.create(
        model="gen", prompt=prompt, max_tokens=max_tokens, temperature=0
    )
    return r.choices[0].text, str(r.choices[0].finish_reason)


# -- the OpenAI-compatible API -----------------------------------------------------------------


def test_openai_client_streams_a_completion_equal_to_the_unstreamed_one(served: Served) -> None:
    client = served.openai()
    full = client.completions.create(model="gen", prompt=PROMPT, max_tokens=24, temperature=0)
    assert full.object == "text_completion" and full.model == "gen"
    assert full.usage is not None and full.usage.completion_tokens == 24
    assert full.usage.prompt_tokens == len(PROMPT.encode()) + 1  # BOS + its bytes
    assert full.choices[0].finish_reason == "length"
    stream = client.completions.create(
        model="gen",
        prompt=PROMPT,
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    assert len([c for c in chunks if c.choices and c.choices[0].text]) > 1  # really streamed
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 24


def test_openai_client_streams_a_chat_completion(served: Served) -> None:
    client = served.openai()
    messages: Any = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
    ]
    full = client.chat.completions.create(
        model="gen", messages=messages, max_tokens=20, temperature=0
    )
    assert full.object == "chat.completion"
    assert full.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(
        model="gen", messages=messages, max_tokens=20, temperature=0, stream=True
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == full.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    # sampled with a seed: the same text twice, streamed or not
    kw: Any = {"model": "gen", "messages": messages, "max_tokens": 12, "seed": 7}
    a = client.chat.completions.create(temperature=1.0, **kw).choices[0].message.content
    s = client.chat.completions.create(temperature=1.0, stream=True, **kw)
    assert "".join(c.choices[0].delta.content or "" for c in s) == a


def test_models_lists_the_generative_functions(served: Served) -> None:
    ids = {m.id for m in served.openai().models.list()}
    assert {"gen", "gen-slo"} <= ids and "mlp" not in ids


# -- the OIP generate extension, one-shot invocation, gRPC ----------------------------------


def test_oip_generate_and_generate_stream_over_http(served: Served) -> None:
    want, reason = greedy(served, PROMPT, 16)
    body = {"text_input": PROMPT, "parameters": {"max_tokens": 16, "temperature": 0}}
    r = httpx.post(f"{served.url}/v2/models/gen/generate", json=body)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["model_name"] == "gen" and doc["model_version"] == "1"
    assert doc["text_output"] == want and doc["finish_reason"] == reason
    assert doc["usage"]["completion_tokens"] == 16
    url = f"{served.url}/v2/models/gen/generate_stream"
    with httpx.stream("POST", url, json={**body, "id": "r1"}) as s:
        assert s.headers["content-type"].startswith("text/event-stream")
        events = list(sse_events(s))
    assert all(e["id"] == "r1" for e in events)
    assert "".join(e["text_output"] for e in events) == want
    assert events[-1]["finish_reason"] == reason and len(events) > 2
    # the one-shot path of the same function: the whole completion in one answer
    one = httpx.post(
        f"{served.url}/function/gen",
        json={"prompt": PROMPT, "parameters": {"max_tokens": 16}},
    )
    assert one.status_code == 200 and one.json()["text"] == want


def test_grpc_model_stream_infer_streams_the_chunks(served: Served) -> None:
    want, _ = greedy(served, PROMPT, 16)
    got: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(served.grpc_address)
    try:
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        x = grpcclient.InferInput("text_input", [1], "BYTES")
        x.set_data_from_numpy(np.array([PROMPT.encode()], dtype=object))
        client.async_stream_infer(
            "gen", [x], request_id="g1", parameters={"max_tokens": 16, "temperature": 0.0}
        )
        texts: list[str] = []
        while True:
            result, error = got.get(timeout=60)
            assert error is None, error
            texts.append(result.as_numpy("text_output")[0].decode())
            params = result.get_response().parameters
            if "triton_final_response" in params:
                assert params["triton_final_response"].bool_param
                assert params["completion_tokens"].int64_param == 16
                break
        assert len(texts) > 2 and "".join(texts) == want
    finally:
        client.stop_stream()
        client.close()


# -- cancellation and continuous batching -------------------------------------------------------


def test_a_client_that_disconnects_mid_stream_stops_its_generation(served: Served) -> None:
    _, reason = greedy(served, LONG_PROMPT, LONG)
    assert reason == "length"  # it would run all LONG tokens if left alone
    before = metric(served.url, "gshare_generate_engine_cancelled_total")
    body = {"text_input": LONG_PROMPT, "parameters": {"max_tokens": LONG, "temperature": 0}}
    with (
        httpx.Client(timeout=30) as http,
        http.stream("POST", f"{served.url}/v2/models/gen/generate_stream", json=body) as s,
    ):
        events = sse_events(s)
        next(events), next(events)  # two chunks in, then the client goes away
    wait_until(
        lambda: metric(served.url, "gshare_generate_engine_cancelled_total") == before + 1,
        30,
        "the engine to cancel the abandoned sequence",
    )
    wait_until(
        lambda: (
            metric(served.url, "gshare_generate_kv_bytes") == 0
            and metric(served.url, "gshare_generate_running_sequences") == 0
        ),
        30,
        "its KV to be freed",
    )
    assert greedy(served, LONG_PROMPT, 8)[1] in ("stop", "length")  # the function goes on serving


def test_two_streams_share_decode_steps_joining_and_leaving_mid_stream(served: Served) -> None:
    short_prompt, short_n = "hello", 24
    want_long, reason = greedy(served, LONG_PROMPT, LONG)
    assert reason == "length"
    want_short, _ = greedy(served, short_prompt, short_n)
    url = f"{served.url}/v2/models/gen/generate_stream"

    def body(prompt: str, n: int) -> dict[str, Any]:
        return {"text_input": prompt, "parameters": {"max_tokens": n, "temperature": 0}}

    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", url, json=body(LONG_PROMPT, LONG)) as a,
    ):
        long_events = sse_events(a)
        head = [next(long_events)]  # the long stream is running...
        with http.stream("POST", url, json=body(short_prompt, short_n)) as b:
            short = list(sse_events(b))  # ...when the short one joins, runs and leaves
        tail = list(long_events)
    long_all = head + tail
    assert served.srv.client().get("gen")["replicas"] == 1  # both streams on the one instance
    assert "".join(e["text_output"] for e in short) == want_short
    assert "".join(e["text_output"] for e in long_all) == want_long  # tokens unchanged
    assert max(e.get("batch", 0) for e in short) >= 2  # it shared decode steps with the other
    assert [e.get("batch") for e in long_all if "batch" in e][-1] == 1  # alone again at the end


# -- admission and bad input ----------------------------------------------------------------------


def test_ttft_admission_sheds_what_would_miss_its_ttft(served: Served) -> None:
    client = served.openai()

    def one(i: int) -> int:
        try:
            client.completions.create(model="gen-slo", prompt=f"p{i}", max_tokens=32)
            return 200
        except openai.RateLimitError as e:
            assert e.body is not None and "TTFT SLO" in str(e.body)
            return 429

    codes: list[int] = []
    with ThreadPoolExecutor(8) as pool:
        for _wave in range(6):  # the first waves measure the interval between first tokens
            codes += list(pool.map(one, range(8)))
            if 429 in codes:
                break
    assert 429 in codes and 200 in codes
    shed = httpx.get(f"{served.url}/metrics").text
    assert 'gshare_requests_shed_total{function="gen-slo",reason="ttft"}' in shed


X = {"model": "gen", "prompt": "x"}
BAD_OPENAI: list[tuple[str, dict[str, Any], int, str | None, str]] = [
    ("completions", {"model": "gen"}, 400, "prompt", "prompt is required"),
    ("completions", {"model": "nope", "prompt": "x"}, 404, None, "not deployed"),
    ("completions", {"model": "mlp", "prompt": "x"}, 400, "model", "not generative"),
    ("completions", {**X, "max_tokens": 0}, 400, "max_tokens", "[1,"),
    ("completions", {**X, "max_tokens": "8"}, 400, "max_tokens", "integer"),
    ("completions", {**X, "max_tokens": 9999}, 400, None, "context"),
    ("completions", {**X, "temperature": "hot"}, 400, "temperature", "number"),
    ("completions", {**X, "n": 2}, 400, "n", "n = 1"),
    ("completions", {**X, "colour": 1}, 400, "colour", "Unrecognized"),
    ("completions", {"model": "gen", "prompt": ["a", "b"]}, 400, "prompt", "one per request"),
    ("chat/completions", {"model": "gen"}, 400, "messages", "messages is required"),
    ("chat/completions", {"model": "gen", "messages": [{"role": "cat", "content": "x"}]}, 400,
     "messages[0]", "role"),
    ("chat/completions", {"model": "gen", "messages": [{"role": "user", "content": 3}]}, 400,
     "messages[0].content", "string"),
]  # fmt: skip


@pytest.mark.parametrize(("route", "body", "status", "param", "words"), BAD_OPENAI)
def test_each_bad_openai_request_gets_one_clear_error(
    served: Served, route: str, body: dict[str, Any], status: int, param: str | None, words: str
) -> None:
    for stream in (False, True):
        r = httpx.post(f"{served.url}/v1/{route}", json={**body, "stream": stream}, timeout=30)
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert words in err["message"] and err["param"] == param
        assert err["type"] == "invalid_request_error"
    ok = httpx.post(
        f"{served.url}/v1/completions", json={"model": "gen", "prompt": "x", "max_tokens": 2}
    )
    assert ok.status_code == 200  # the server keeps serving


def test_bad_requests_over_the_openai_client_and_oip_generate(served: Served) -> None:
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        served.openai().completions.create(model="gen", prompt="x", max_tokens=-1)
    with pytest.raises(openai.NotFoundError):
        served.openai().completions.create(model="nope", prompt="x")
    url = f"{served.url}/v2/models"
    bad = [
        (f"{url}/gen/generate", {"parameters": {}}, 400, "text_input is required"),
        (f"{url}/gen/generate", {"text_input": "x", "colour": 1}, 400, "unknown field 'colour'"),
        (f"{url}/gen/generate", {"text_input": "x", "parameters": {"beam": 2}}, 400, "'beam'"),
        (f"{url}/gen/generate_stream", {"text_input": "x", "max_tokens": 0}, 400, "max_tokens"),
        (f"{url}/mlp/generate", {"text_input": "x"}, 400, "not generative"),
        (f"{url}/nope/generate", {"text_input": "x"}, 404, "not deployed"),
    ]
    for u, body, status, words in bad:
        r = httpx.post(u, json=body)
        assert r.status_code == status and words in r.json()["error"], (u, r.text)
    r = httpx.post(f"{url}/gen/generate", content=b"{not json")
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
    spec = {"name": "bad-slo", "model": "mlp", "slo": {"ttft_ms": 100}}
    r = httpx.post(
        f"{served.url}/system/functions",
        json=spec,
        headers={"authorization": f"Bearer {served.srv.token}"},
    )
    assert r.status_code == 400 and "generative functions only" in r.json()["error"]
    ok = httpx.post(f"{url}/gen/generate", json={"text_input": "x", "max_tokens": 2})
    assert ok.status_code == 200  # the server keeps serving


def test_the_autoscaler_sizes_a_generative_function_on_its_engines_busy_time(
    served: Served,
) -> None:
    """After the generations above, the throughput the autoscaler divides the arrival rate by
    is the share's quota over the engines' busy time per finished generation (which grows with
    the tokens each asks for), not the default busy time of a function never measured."""
    c = served.srv.client()

    def expected() -> float | None:
        busy_s = metric(served.url, "gshare_generate_engine_busy_seconds_total")
        done = metric(served.url, "gshare_generate_engine_finished_total")
        return SHARE["quota_request"] * 1000.0 / (1000.0 * busy_s / done) if done else None

    def matches() -> bool:
        want, got = expected(), c.get("gen")["config_throughput_rps"]
        return want is not None and len(got) == 1 and abs(got[0] - want) <= 0.02 * want

    wait_until(matches, 30, "the function's throughput from its engines' busy time")
    default = SHARE["quota_request"] * 1000.0 / DEFAULT_BUSY_MS_PER_REQUEST
    assert c.get("gen")["config_throughput_rps"][0] != pytest.approx(default)


def test_no_thread_or_stream_is_left_behind(served: Served) -> None:
    """After every test above: nothing queued or running in the engines."""
    wait_until(
        lambda: (
            metric(served.url, "gshare_generate_running_sequences") == 0
            and metric(served.url, "gshare_generate_waiting_sequences") == 0
        ),
        30,
        "the engines to be idle",
    )
