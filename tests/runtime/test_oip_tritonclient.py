"""Conformance of gshare's Open Inference Protocol with its reference client, ``tritonclient``,
over HTTP and gRPC, against one real ``gshare serve --grpc-port 0`` (module scope: Ray starts
once). Each test uses the client as its documentation shows it — ``set_data_from_numpy``,
``as_numpy``, the default binary tensor data over HTTP, raw contents over gRPC — and, where
it says so, JSON tensors (``binary_data=False``).

Functions: ``mlp`` (the built-in, tiny: FP32 [n, 64] → INT64 label and FP32 score per row),
``addsub`` (``demo_handlers.AddSub``: Triton's "simple" model with a ``scale`` parameter) and
``echo`` (``demo_handlers.Echo``: any tensor back as ``output0``; INT64 and BYTES here).
"""

from __future__ import annotations

import json
import os
import queue
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from gshare.testing import ServeProcess, payload_bytes, run_cli, wait_until

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SHARE = {"sm_pct": 50, "quota_request": 0.5, "quota_limit": 1.0}
FUNCTIONS: list[dict[str, Any]] = [
    {"name": "mlp", "model": "mlp", "batching": {"max_batch": 4, "max_wait_ms": 2}},
    {"name": "addsub", "handler": "gshare.runtime.demo_handlers:AddSub"},
    {"name": "echo", "handler": "gshare.runtime.demo_handlers:Echo"},
]
BAD_HANDLER = """\
class Broken:
    def load(self, weights, device):
        raise RuntimeError("this model cannot load")

    def predict(self, inputs):
        return inputs
"""


@dataclass
class Served:
    srv: ServeProcess
    http: httpclient.InferenceServerClient
    grpc: grpcclient.InferenceServerClient

    @property
    def url(self) -> str:
        return self.srv.url


def spec(f: dict[str, Any]) -> dict[str, Any]:
    return {"device": "cpu", "resources": SHARE, "min_instances": 1, "max_instances": 1, **f}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    state = tmp_path_factory.mktemp("gshare-oip") / "state"
    srv = ServeProcess(
        "--grpc-port", "0", "--max-body-mb", "2", state_dir=state, tiny_models=True, cwd=REPO
    ).start()
    try:
        grpc_address = json.loads((state / "server.json").read_text())["grpc"]
        for f in FUNCTIONS:
            srv.client().deploy(spec(f))
        http = httpclient.InferenceServerClient(srv.url.removeprefix("http://"))
        grpc = grpcclient.InferenceServerClient(grpc_address)
        wait_until(http.is_server_ready, 120, "every function to be ready")
        yield Served(srv, http, grpc)
        http.close()
        grpc.close()
    finally:
        stopped = srv.stop()
        assert stopped.code == 0 and not stopped.killed, f"{stopped}\n{srv.log()}"
        assert not stopped.left, f"processes left behind: {stopped.left}"


def http_input(name: str, x: np.ndarray, datatype: str, binary: bool = True) -> Any:
    i = httpclient.InferInput(name, list(x.shape), datatype)
    i.set_data_from_numpy(x, binary_data=binary)
    return i


def grpc_input(name: str, x: np.ndarray, datatype: str) -> Any:
    i = grpcclient.InferInput(name, list(x.shape), datatype)
    i.set_data_from_numpy(x)
    return i


# -- health and metadata -----------------------------------------------------------------------


def test_health_and_metadata_over_both_transports(served: Served) -> None:
    h, g = served.http, served.grpc
    assert h.is_server_live() and g.is_server_live()
    assert h.is_server_ready() and g.is_server_ready()  # every function ready
    assert h.is_model_ready("mlp") and g.is_model_ready("mlp", "1")
    meta = h.get_server_metadata()
    assert meta["name"] == "gshare" and "binary_tensor_data" in meta["extensions"]
    assert g.get_server_metadata(as_json=True)["extensions"] == meta["extensions"]
    m = h.get_model_metadata("mlp")
    assert m["versions"] == ["1"]
    assert m["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
    assert m["outputs"] == [
        {"name": "label", "datatype": "INT64", "shape": [-1]},
        {"name": "score", "datatype": "FP32", "shape": [-1]},
    ]
    gm = g.get_model_metadata("addsub")
    assert [t.name for t in gm.inputs] == ["INPUT0", "INPUT1"]
    assert [(t.name, t.datatype, list(t.shape)) for t in gm.outputs] == [
        ("OUTPUT0", "FP32", [-1, 16]),
        ("OUTPUT1", "FP32", [-1, 16]),
    ]
    assert h.get_model_metadata("echo", model_version="1")["outputs"] == []  # none declared


# -- inference -------------------------------------------------------------------------------


def test_fp32_batch_over_http_binary_http_json_and_grpc(served: Served) -> None:
    x = np.random.default_rng(0).random((5, 64), dtype=np.float32)  # a batch of 5 rows
    answers = [
        served.http.infer("mlp", [http_input("input", x, "FP32")]),  # tritonclient's default
        served.http.infer(
            "mlp",
            [http_input("input", x, "FP32", binary=False)],
            outputs=[
                httpclient.InferRequestedOutput(n, binary_data=False) for n in ("label", "score")
            ],
        ),
        served.grpc.infer("mlp", [grpc_input("input", x, "FP32")]),
    ]
    labels = [a.as_numpy("label") for a in answers]
    scores = [a.as_numpy("score") for a in answers]
    for lab, sc in zip(labels, scores, strict=True):
        assert lab.shape == (5,) and lab.dtype == np.int64
        assert sc.shape == (5,) and sc.dtype == np.float32 and ((sc > 0) & (sc <= 1)).all()
        np.testing.assert_array_equal(lab, labels[0])  # one model, one answer, any transport
        np.testing.assert_allclose(sc, scores[0], rtol=1e-6)
    first = answers[0].get_response()
    assert first["model_name"] == "mlp" and first["model_version"] == "1"
    assert "data" not in first["outputs"][0]  # binary, as the client asked
    assert answers[1].get_response()["outputs"][0]["data"] == labels[0].tolist()  # JSON


def test_int64_and_bytes_tensors_come_back_unchanged(served: Served) -> None:
    ids = np.array([[1, -2, 2**40], [3, 4, 5]], dtype=np.int64)
    words = np.array([b"gshare", "héllo".encode(), b"\xff\x00raw"], dtype=object)
    for x, dt in ((ids, "INT64"), (words, "BYTES")):
        got = [
            served.http.infer("echo", [http_input("x", x, dt)]).as_numpy("output0"),
            served.grpc.infer("echo", [grpc_input("x", x, dt)]).as_numpy("output0"),
        ]
        if dt == "INT64":  # JSON carries numbers (BYTES: text only, and one element is not)
            json_in = served.http.infer(
                "echo",
                [http_input("x", x, dt, binary=False)],
                outputs=[httpclient.InferRequestedOutput("output0", binary_data=False)],
            )
            got.append(json_in.as_numpy("output0"))
        for y in got:
            assert y.shape == x.shape
            assert y.tolist() == x.tolist()


def test_large_tensors_travel_through_shared_memory_lanes(served: Served) -> None:
    """1 MiB over HTTP binary, HTTP JSON and gRPC: the answer is the tensor, and the tensor
    went between gateway and instance through the lanes (``instance.lanes``), not the socket."""
    x = np.random.default_rng(1).random((1, 1 << 18), dtype=np.float32)  # 1 MiB
    before = payload_bytes(served.url)
    got = [
        served.http.infer("echo", [http_input("x", x, "FP32")]).as_numpy("output0"),
        served.grpc.infer("echo", [grpc_input("x", x, "FP32")]).as_numpy("output0"),
    ]
    for y in got:
        np.testing.assert_array_equal(y, x)
    after = payload_bytes(served.url)

    def moved(direction: str, path: str) -> float:
        return after.get((direction, path), 0.0) - before.get((direction, path), 0.0)

    for direction in ("request", "response"):
        assert moved(direction, "lane") >= 2 * x.nbytes, direction
        assert moved(direction, "socket") < x.nbytes, f"a tensor {direction} took the socket"


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_large_tensors_in_shared_memory_regions_travel_through_the_lanes(
    served: Served, transport: str
) -> None:
    """Triton's system shared memory with lanes on: the input goes from its region into the
    request lane, the answer from the response lane into the output region (over HTTP it is
    lent, not copied out first), and the output region holds the tensor."""
    import tritonclient.utils.shared_memory as shm

    c = served.http if transport == "http" else served.grpc
    mod = httpclient if transport == "http" else grpcclient
    x = np.random.default_rng(3).random((1, 1 << 18), dtype=np.float32)
    keys = [f"/gshare-lanes-{os.getpid()}-{transport}-{d}" for d in ("in", "out")]
    handles = [shm.create_shared_memory_region(k.strip("/"), k, x.nbytes) for k in keys]
    try:
        shm.set_shared_memory_region(handles[0], [x])
        c.register_system_shared_memory("lane_in", keys[0], x.nbytes)
        c.register_system_shared_memory("lane_out", keys[1], x.nbytes)
        before = payload_bytes(served.url)
        for _ in range(3):  # the lent answers are given back: the lane keeps serving
            i = mod.InferInput("x", list(x.shape), "FP32")
            i.set_shared_memory("lane_in", x.nbytes)
            o = mod.InferRequestedOutput("output0")
            o.set_shared_memory("lane_out", x.nbytes)
            c.infer("echo", [i], outputs=[o])
            got = shm.get_contents_as_numpy(handles[1], np.float32, list(x.shape))
            np.testing.assert_array_equal(got, x)
        after = payload_bytes(served.url)
        for direction in ("request", "response"):
            lane = after[(direction, "lane")] - before.get((direction, "lane"), 0.0)
            assert lane >= 3 * x.nbytes, direction
    finally:
        c.unregister_system_shared_memory()
        for h in handles:
            shm.destroy_shared_memory_region(h)


def test_parameters_requested_outputs_and_request_id(served: Served) -> None:
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.ones((2, 16), dtype=np.float32)
    ins = [http_input("INPUT0", a, "FP32"), http_input("INPUT1", b, "FP32", binary=False)]
    r = served.http.infer(
        "addsub",
        ins,
        request_id="q-7",
        outputs=[httpclient.InferRequestedOutput("OUTPUT1")],
        parameters={"scale": 3},
    )
    resp = r.get_response()
    assert resp["id"] == "q-7" and [o["name"] for o in resp["outputs"]] == ["OUTPUT1"]
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), (a - b) * 3)
    gr = served.grpc.infer(
        "addsub",
        [grpc_input("INPUT0", a, "FP32"), grpc_input("INPUT1", b, "FP32")],
        request_id="q-8",
        parameters={"scale": 2},
    )
    assert gr.get_response().id == "q-8"
    np.testing.assert_array_equal(gr.as_numpy("OUTPUT0"), (a + b) * 2)
    np.testing.assert_array_equal(gr.as_numpy("OUTPUT1"), (a - b) * 2)


def test_grpc_stream_answers_every_request(served: Served) -> None:
    got: queue.Queue[Any] = queue.Queue()
    served.grpc.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        for k in range(3):
            x = np.full((1, 2), k, dtype=np.int64)
            served.grpc.async_stream_infer("echo", [grpc_input("x", x, "INT64")], request_id=str(k))
        seen = {}
        for _ in range(3):
            result, error = got.get(timeout=60)
            assert error is None, error
            seen[result.get_response().id] = result.as_numpy("output0").tolist()
    finally:
        served.grpc.stop_stream()
    assert seen == {str(k): [[k, k]] for k in range(3)}


# -- bad requests ------------------------------------------------------------------------------


def error_of(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as e:
        call()
    return e.value


def test_bad_requests_are_clear_errors_on_both_transports(served: Served) -> None:
    h, g = served.http, served.grpc
    x = np.zeros((1, 64), np.float32)
    cases: list[tuple[Any, Any, str, str]] = [
        # (HTTP call, gRPC call, HTTP status / gRPC code, message)
        (
            lambda: h.infer("ghost", [http_input("input", x, "FP32")]),
            lambda: g.infer("ghost", [grpc_input("input", x, "FP32")]),
            "404|NOT_FOUND",
            "model 'ghost' is not deployed",
        ),
        (
            lambda: h.infer("mlp", [http_input("input", x, "FP32")], model_version="9"),
            lambda: g.infer("mlp", [grpc_input("input", x, "FP32")], model_version="9"),
            "404|NOT_FOUND",
            "has no version '9' (it serves version 1)",
        ),
        (
            lambda: h.infer("mlp", [http_input("pixels", x, "FP32")]),
            lambda: g.infer("mlp", [grpc_input("pixels", x, "FP32")]),
            "400|INVALID_ARGUMENT",
            "unknown input 'pixels' (the model takes: input)",
        ),
        (
            lambda: h.infer("mlp", [http_input("input", np.zeros((1, 3), np.float32), "FP32")]),
            lambda: g.infer("mlp", [grpc_input("input", np.zeros((1, 3), np.float32), "FP32")]),
            "400|INVALID_ARGUMENT",
            "shape must be [-1, 64] (-1: any), got [1, 3]",
        ),
        (
            lambda: h.infer("mlp", [http_input("input", x.astype(np.float64), "FP64")]),
            lambda: g.infer("mlp", [grpc_input("input", x.astype(np.float64), "FP64")]),
            "400|INVALID_ARGUMENT",
            "datatype must be FP32, got FP64",
        ),
        (
            lambda: h.infer(
                "mlp",
                [http_input("input", x, "FP32")],
                outputs=[httpclient.InferRequestedOutput("logits")],
            ),
            lambda: g.infer(
                "mlp",
                [grpc_input("input", x, "FP32")],
                outputs=[grpcclient.InferRequestedOutput("logits")],
            ),
            "400|INVALID_ARGUMENT",
            "unknown output 'logits' (the model gives: label, score)",
        ),
        (
            lambda: h.infer(
                "mlp",
                [http_input("input", x, "FP32")],
                outputs=[httpclient.InferRequestedOutput("score", class_count=2)],
            ),
            lambda: g.infer(
                "mlp",
                [grpc_input("input", x, "FP32")],
                outputs=[grpcclient.InferRequestedOutput("score", class_count=2)],
            ),
            "400|INVALID_ARGUMENT",
            "classification extension is not supported",
        ),
    ]
    for http_call, grpc_call, codes, message in cases:
        http_code, grpc_code = codes.split("|")
        e = error_of(http_call)
        assert e.status() == http_code and message in e.message(), (message, e)
        e = error_of(grpc_call)
        assert e.status() == f"StatusCode.{grpc_code}" and message in e.message(), (message, e)
    # still serving
    assert h.infer("mlp", [http_input("input", x, "FP32")]).as_numpy("label").shape == (1,)


def test_malformed_http_bodies_get_one_error_shape(served: Served) -> None:
    url = served.url
    js = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [2],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 8},
                }
            ]
        }
    ).encode()
    blob = struct.pack("<2f", 1.0, 2.0)
    cases: list[tuple[str, str, dict[str, Any], int, str]] = [
        # a binary body without Inference-Header-Content-Length: told what is missing
        ("POST", "/v2/models/echo/infer", {"content": js + blob}, 400,
         "no 'Inference-Header-Content-Length' header"),
        ("POST", "/v2/models/echo/infer",
         {"content": js + blob, "headers": {"Inference-Header-Content-Length": "9999"}}, 400,
         "must be the length of the body's JSON part"),
        ("POST", "/v2/models/echo/infer",
         {"content": js + blob[:4], "headers": {"Inference-Header-Content-Length": str(len(js))}},
         400, "but the inputs' binary_data_size add up to 8"),
        ("POST", "/v2/models/echo/infer", {"content": b"x" * (3 << 20)}, 413, "exceeds the limit"),
        ("POST", "/v2/models/echo/infer",
         {"content": b"{", "headers": {"Content-Encoding": "gzip"}}, 415,
         "Content-Encoding 'gzip' is not supported"),
        ("GET", "/v2/models/echo/infer", {}, 405, "use POST"),
        ("POST", "/v2/models/echo", {}, 405, "POST is not allowed on /v2/models/echo"),
        ("GET", "/v2/nowhere", {}, 404, "no route GET /v2/nowhere"),
        ("GET", "/v2/models/ghost/config", {}, 404, "model 'ghost' is not deployed"),
        ("POST", "/v2/repository/index", {"content": b"[1]"}, 400, '{"ready": true|false}'),
    ]  # fmt: skip
    for method, path, kw, code, message in cases:
        r = httpx.request(method, url + path, timeout=60, **kw)
        assert r.status_code == code, (path, r.status_code, r.text)
        assert message in r.json()["error"], (message, r.text)
    # the right header makes the same body work
    r = httpx.post(
        url + "/v2/models/echo/infer",
        content=js + blob,
        headers={"Inference-Header-Content-Length": str(len(js))},
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [1.0, 2.0]


# -- Triton's extensions, versions, readiness -------------------------------------------------


def test_model_config_statistics_and_repository_index(served: Served) -> None:
    h, g = served.http, served.grpc
    cfg = h.get_model_config("mlp")
    assert cfg["input"] == [{"name": "input", "data_type": "TYPE_FP32", "dims": [-1, 64]}]
    assert cfg["dynamic_batching"]["preferred_batch_size"] == [4]  # the spec's max_batch
    gcfg = g.get_model_config("mlp").config
    assert gcfg.name == "mlp" and [o.name for o in gcfg.output] == ["label", "score"]

    def successes() -> tuple[int, int]:
        hs = h.get_inference_statistics("addsub")["model_stats"][0]
        gs = g.get_inference_statistics("addsub").model_stats[0]
        return hs["inference_stats"]["success"]["count"], gs.inference_stats.success.count

    before = successes()
    a = np.zeros((1, 16), np.float32)
    for _ in range(3):
        h.infer("addsub", [http_input("INPUT0", a, "FP32"), http_input("INPUT1", a, "FP32")])
    assert successes() == (before[0] + 3, before[1] + 3)
    index = {m["name"]: m for m in h.get_model_repository_index()}
    assert {n: (m["version"], m["state"]) for n, m in index.items()} == {
        n: ("1", "READY") for n in ("addsub", "echo", "mlp")
    }
    assert sorted(m.name for m in g.get_model_repository_index().models) == sorted(index)


def test_update_bumps_the_version_everywhere(served: Served) -> None:
    c = served.srv.client()
    c.deploy(spec({"name": "echo", "handler": "gshare.runtime.demo_handlers:Echo", "priority": 3}))
    wait_until(lambda: served.http.is_model_ready("echo", "2"), 120, "echo version 2")
    assert served.http.get_model_metadata("echo")["versions"] == ["2"]
    x = np.ones((1, 2), np.int64)
    assert (
        served.http.infer("echo", [http_input("x", x, "INT64")]).get_response()["model_version"]
        == "2"
    )
    assert (
        served.grpc.infer("echo", [grpc_input("x", x, "INT64")], model_version="2")
        .get_response()
        .model_version
        == "2"
    )
    e = error_of(
        lambda: served.http.infer("echo", [http_input("x", x, "INT64")], model_version="1")
    )
    assert e.status() == "404" and "(it serves version 2)" in e.message()


def test_server_ready_means_every_function_is_ready(served: Served, tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text(BAD_HANDLER)
    c = served.srv.client()
    c.deploy(spec({"name": "broken", "handler": f"{tmp_path / 'broken.py'}:Broken"}))
    try:
        wait_until(lambda: not served.http.is_server_ready(), 120, "the server to be not ready")
        r = httpx.get(served.url + "/v2/health/ready", timeout=30)
        assert r.status_code == 503 and "function 'broken' is not ready" in r.json()["error"]

        def model_ready() -> httpx.Response:
            return httpx.get(served.url + "/v2/models/broken/ready", timeout=30)

        # LOADING while its first start runs, then UNAVAILABLE with the start's error
        r = wait_until(
            lambda: (x := model_ready()).status_code == 503 and "cannot load" in x.text and x,
            120,
            "broken's start to fail",
        )
        assert "this model cannot load" in r.json()["error"] and r.json()["state"] == "UNAVAILABLE"
        assert not served.grpc.is_server_ready() and served.grpc.is_model_ready("mlp")
        index = {m.name: m for m in served.grpc.get_model_repository_index().models}
        assert index["broken"].state == "UNAVAILABLE" and "cannot load" in index["broken"].reason
    finally:
        c.delete("broken")
    wait_until(served.http.is_server_ready, 60, "the server to be ready again")


def test_a_busy_grpc_port_fails_at_once(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = run_cli("serve", "--port", "0", "--grpc-port", str(port), "--state", str(tmp_path))
    assert r.returncode == 1  # before Ray starts: no server, nothing to stop
    assert f"gRPC port: cannot listen on 127.0.0.1:{port}" in r.stderr
