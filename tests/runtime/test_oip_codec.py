"""The Open Inference Protocol codec without a server: requests built by ``tritonclient`` (the
protocol's reference client) decode to the arrays it was given, responses encoded here read
back with ``tritonclient``'s own parsers, and every malformed request is an ``OipError`` naming
its problem. Plus Triton's extension documents (``triton_ext``) on small tables.

Property tests (hypothesis): any tensor of any datatype survives request → handler → response
→ client, over HTTP JSON, HTTP binary and gRPC raw contents.
"""

from __future__ import annotations

import re
import struct
from typing import Any

import numpy as np
import orjson
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tritonclient.grpc import InferInput as GrpcInput
from tritonclient.grpc import InferResult as GrpcResult
from tritonclient.grpc import service_pb2 as pb
from tritonclient.http import InferInput, InferRequestedOutput, InferResult
from tritonclient.http._utils import _get_inference_request

from gshare.runtime.gateway.triton_ext import (
    InferenceStats,
    model_config,
    readiness,
    repository_index,
)
from gshare.runtime.instance import protocol as P
from gshare.runtime.oip.codec import handler_outputs
from gshare.runtime.oip.header import (
    TRANSPORT_GRPC,
    TRANSPORT_HTTP,
    OipError,
    check_inputs,
    parse_header,
    wrap,
)
from gshare.runtime.oip.payload import decode_request, encode_response

NUMERIC = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
    "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
    "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
}  # fmt: skip


def http_request(
    inputs: list[InferInput], outputs: list[InferRequestedOutput] | None = None, **params: Any
) -> bytes:
    """The ``ENC_OIP`` payload the gateway forwards for tritonclient's request."""
    body, json_size = _get_inference_request(
        inputs, "req-1", outputs, 0, False, False, 0, None, params or None
    )
    return wrap(TRANSPORT_HTTP, -1 if json_size is None else json_size, 7, [body])


def http_answer(enc: int, data: bytes) -> InferResult:
    """tritonclient's reading of the response the gateway sends for ``(enc, data)``."""
    if enc == P.ENC_OIP_BINARY:
        (json_len,) = struct.unpack_from("<I", data)
        return InferResult.from_response_body(data[4:], header_length=json_len)
    assert enc == P.ENC_JSON
    return InferResult.from_response_body(data)


def grpc_request(inputs: list[GrpcInput]) -> bytes:
    req = pb.ModelInferRequest(model_name="m", id="req-1")
    for i in inputs:
        req.inputs.append(i._get_tensor())
        req.raw_input_contents.append(i._get_content())
    return wrap(TRANSPORT_GRPC, -1, 7, [req.SerializeToString()])


def echo(payload: Any) -> Any:
    """The handler's view back as its output (what ``demo_handlers.Echo`` returns)."""
    return payload


# -- round trips ---------------------------------------------------------------------------------


arrays = st.sampled_from(sorted(NUMERIC)).flatmap(
    lambda dt: st.tuples(
        st.just(dt),
        hnp.arrays(
            NUMERIC[dt],
            hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=5),
            elements={"allow_nan": False, "allow_infinity": False} if dt.startswith("FP") else None,
        ),
    )
)


def same(got: np.ndarray, want: np.ndarray, datatype: str) -> None:
    assert got.shape == want.shape
    if datatype == "UINT16":  # torch has no uint16: the handler got int32, the response is INT32
        want = want.astype(np.int32)
    elif datatype in ("UINT32", "UINT64"):
        want = want.astype(np.int64)
    np.testing.assert_array_equal(got, want)


@settings(max_examples=60, deadline=None)
@given(arrays, st.booleans(), st.booleans())
def test_http_round_trip_any_datatype(
    case: tuple[str, np.ndarray], binary_in: bool, binary_out: bool
) -> None:
    datatype, x = case
    if datatype == "UINT64":
        x = x % np.uint64(2**63)  # the handler's torch tensor is int64
    i = InferInput("x", list(x.shape), datatype)
    i.set_data_from_numpy(x, binary_data=binary_in)
    out = [InferRequestedOutput("output0", binary_data=binary_out)]
    call, payload = decode_request(http_request([i], out), None, None)
    assert call.version == 7 and call.header.id == "req-1"
    enc, data = encode_response(call, "m", echo(payload))
    r = http_answer(enc, data)
    assert r.get_response()["model_version"] == "7" and r.get_response()["id"] == "req-1"
    same(
        r.as_numpy("output0"),
        x.astype(np.float32) if datatype == "FP16" and not binary_out else x,
        datatype,
    )


@settings(max_examples=40, deadline=None)
@given(arrays)
def test_grpc_round_trip_any_datatype(case: tuple[str, np.ndarray]) -> None:
    datatype, x = case
    if datatype == "UINT64":
        x = x % np.uint64(2**63)
    i = GrpcInput("x", list(x.shape), datatype)
    i.set_data_from_numpy(x)
    call, payload = decode_request(grpc_request([i]), None, None)
    enc, data = encode_response(call, "m", echo(payload))
    assert enc == P.ENC_PROTOBUF
    r = GrpcResult(pb.ModelInferResponse.FromString(data))
    assert r.get_response().model_version == "7"
    same(r.as_numpy("output0"), x, datatype)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(max_size=12), min_size=0, max_size=6), st.booleans(), st.booleans())
def test_bytes_round_trip(items: list[bytes], binary_in: bool, binary_out: bool) -> None:
    x = np.array(items, dtype=object)
    utf8 = all(_is_utf8(b) for b in items)
    if not binary_in and not utf8:
        return  # JSON carries text only
    i = InferInput("s", [len(items)], "BYTES")
    i.set_data_from_numpy(x, binary_data=binary_in)
    call, payload = decode_request(
        http_request([i], [InferRequestedOutput("output0", binary_data=binary_out)]), None, None
    )
    # the handler sees text where it is UTF-8, bytes elsewhere
    assert payload == [b.decode() if _is_utf8(b) else b for b in items]
    if not binary_out and not utf8:
        with pytest.raises(OipError, match="not UTF-8 text: request it as binary data"):
            encode_response(call, "m", payload)
        return
    got = http_answer(*encode_response(call, "m", payload)).as_numpy("output0")
    assert [g if isinstance(g, bytes) else str(g).encode() for g in got.reshape(-1)] == items


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_non_finite_floats_travel_as_binary_data_only() -> None:
    x = np.array([np.inf, -np.inf, 1.0], np.float32)
    i = InferInput("x", [3], "FP32")
    i.set_data_from_numpy(x)
    call, payload = decode_request(http_request([i]), None, None)  # binary output by default
    np.testing.assert_array_equal(
        http_answer(*encode_response(call, "m", payload)).as_numpy("output0"), x
    )
    call, payload = decode_request(
        http_request([i], [InferRequestedOutput("output0", binary_data=False)]), None, None
    )
    with pytest.raises(OipError, match="NaN or infinite values, which JSON cannot carry"):
        encode_response(call, "m", payload)


def test_several_inputs_reach_the_handler_as_named_tensors_sharing_the_body() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    ids = np.array([[1, 2, 3]], dtype=np.int64)
    i0, i1 = InferInput("a", [2, 3], "FP32"), InferInput("ids", [1, 3], "INT64")
    i0.set_data_from_numpy(a)
    i1.set_data_from_numpy(ids, binary_data=False)
    call, payload = decode_request(http_request([i0, i1], scale=2, tag="x"), None, None)
    assert set(payload) == {"a", "ids"}
    assert payload["a"].dtype == torch.float32 and payload["ids"].dtype == torch.int64
    assert torch.equal(payload["a"], torch.from_numpy(a))
    payload["a"] += 1  # writable: the handler may compute in place
    # the request's parameters are the handler's, without the binary extension's own
    assert call.header.parameters == {"scale": 2, "tag": "x"}
    assert call.header.binary_output  # tritonclient asks for binary outputs by default


def test_requested_outputs_pick_and_order_and_choose_binary_per_output() -> None:
    i = InferInput("x", [2], "FP32")
    i.set_data_from_numpy(np.array([1.0, 2.0], np.float32))
    outs = [InferRequestedOutput("b", binary_data=False), InferRequestedOutput("a")]
    call, _ = decode_request(http_request([i], outs), None, None)
    enc, data = encode_response(call, "m", {"a": [1.5, 2.5], "b": [1, 2], "c": "dropped"})
    assert enc == P.ENC_OIP_BINARY
    r = http_answer(enc, data)
    assert [o["name"] for o in r.get_response()["outputs"]] == ["b", "a"]
    assert r.get_output("b")["data"] == [1, 2]  # JSON as asked
    assert r.get_output("a")["parameters"]["binary_data_size"] == 8  # 2 x FP32
    np.testing.assert_array_equal(r.as_numpy("a"), np.array([1.5, 2.5], np.float32))
    # asking for an output the handler does not give is the caller's error
    call, _ = decode_request(http_request([i], [InferRequestedOutput("zz")]), None, None)
    with pytest.raises(OipError, match="unknown output 'zz' \\(the model gives: a\\)"):
        encode_response(call, "m", {"a": [1.0]})


def test_handler_outputs_follow_torch_defaults() -> None:
    # Python floats are FP32 (torch's default dtype), ints INT64, strings BYTES, numpy kept
    out = dict(
        handler_outputs(
            {
                "f": [0.5],
                "i": 3,
                "s": ["x"],
                "d": np.zeros(2),
                "t": torch.ones(1, dtype=torch.bfloat16),
            }
        )
    )
    assert {k: v.dtype.name for k, v in out.items()} == {
        "f": "float32",
        "i": "int64",
        "s": "object",
        "d": "float64",
        "t": "float32",
    }
    assert [n for n, _ in handler_outputs(torch.zeros(2))] == ["output0"]


# -- malformed requests -------------------------------------------------------------------------


def T(name: str = "x", shape: Any = (2,), datatype: str = "FP32", **kw: Any) -> dict[str, Any]:
    t: dict[str, Any] = {"name": name, "shape": list(shape), "datatype": datatype}
    t.update(kw)
    if "data" not in kw and "parameters" not in kw:
        t["data"] = [1.0] * int(np.prod(shape))
    return t


BAD_JSON: list[tuple[Any, str]] = [
    ([1], "must be a JSON object"),
    ({}, "'inputs' must be a non-empty list"),
    ({"inputs": [T(), T()]}, "input 'x': given twice"),
    ({"inputs": [T(shape=[-1])]}, "non-negative integers"),
    ({"inputs": [T(datatype="BF16")]}, "unknown datatype 'BF16'"),
    ({"inputs": [T(data=[1.0])]}, "'data' has 1 elements but shape [2] needs 2"),  # flat: 1 != 2
    ({"inputs": [T(shape=[2, 2], data=[[1.0, 2.0], [3.0]])]}, "not a regular nested list"),
    ({"inputs": [T(shape=[2, 2], data=[[1.0], [2.0]])]}, "has 2 elements but shape [2, 2] needs 4"),
    ({"inputs": [T(data=[1.0, "2"])]}, "element '2' is not a valid FP32 value"),
    ({"inputs": [T(data=[True, False])]}, "element True is not a valid FP32 value"),
    ({"inputs": [T(datatype="INT32", data=[1, 2.5])]}, "element 2.5 is not a valid INT32 value"),
    ({"inputs": [T(datatype="UINT8", data=[1, 256])]}, "element 256 is out of the range of UINT8"),
    ({"inputs": [T(datatype="INT8", data=[-129, 0])]}, "element -129 is out of the range of INT8"),
    ({"inputs": [T(datatype="BOOL", data=[True, 0])]}, "element 0 is not a valid BOOL value"),
    ({"inputs": [T(datatype="BYTES", data=["a", 1])]}, "element 1 is not a valid BYTES value"),
    ({"inputs": [T(parameters={"binary_data_size": 8})]}, "no 'Inference-Header-Content-Length'"),
    ({"inputs": [T()], "outputs": [{"name": "y", "parameters": {"classification": 3}}]},
     "classification extension is not supported"),
    ({"inputs": [T()], "outputs": [{"name": "y"}, {"name": "y"}]}, "output 'y': requested twice"),
    ({"inputs": [T()], "parameters": {"binary_data_output": "yes"}}, "must be true or false"),
    ({"inputs": [T()], "id": 5}, "'id' must be a string"),
]  # fmt: skip


@pytest.mark.parametrize(("doc", "message"), BAD_JSON)
def test_malformed_json_requests_name_their_problem(doc: Any, message: str) -> None:
    with pytest.raises(OipError) as e:
        decode_request(wrap(TRANSPORT_HTTP, -1, 1, [orjson.dumps(doc)]), None, None)
    assert message in str(e.value)


def binary_body(doc: dict[str, Any], blob: bytes) -> bytes:
    js = orjson.dumps(doc)
    return wrap(TRANSPORT_HTTP, len(js), 1, [js, blob])


BAD_BINARY: list[tuple[bytes, str]] = [
    # 2 x FP32 is 8 bytes, not 6
    (binary_body({"inputs": [T(parameters={"binary_data_size": 6})]}, b"\0" * 6),
     "binary_data_size is 6 bytes but shape [2] of FP32 needs 8"),
    # the body holds 9 bytes after the header, the sizes say 8
    (binary_body({"inputs": [T(parameters={"binary_data_size": 8})]}, b"\0" * 9),
     "9 bytes of binary tensor data after its JSON header, but the inputs' binary_data_size "
     "add up to 8"),
    (binary_body({"inputs": [T(parameters={"binary_data_size": 8}, data=[1.0, 2.0])]}, b"\0" * 8),
     "either 'data' or binary_data_size"),
    (binary_body({"inputs": [T(datatype="BOOL", parameters={"binary_data_size": 2})]}, b"\1\2"),
     "BOOL elements must be the bytes 0 or 1"),
    # BYTES: one element of length 1, then a length prefix promising 9 bytes that are not there
    (binary_body({"inputs": [T(datatype="BYTES", parameters={"binary_data_size": 9})]},
                 struct.pack("<I", 1) + b"a" + struct.pack("<I", 9)),
     "element 1 runs past its binary data"),
    (binary_body({"inputs": [T(datatype="BYTES", parameters={"binary_data_size": 5})]},
                 struct.pack("<I", 1) + b"a"),
     "holds 1 BYTES elements, shape [2] needs 2"),
    (wrap(TRANSPORT_HTTP, 5, 1, [b'{"inp', b"uts"]), "malformed JSON header"),
    # a binary body sent without its header length: told what is missing
    (wrap(TRANSPORT_HTTP, -1, 1,
          [orjson.dumps({"inputs": [T(parameters={"binary_data_size": 8})]}), b"\xff" * 8]),
     "has no 'Inference-Header-Content-Length' header"),
]  # fmt: skip


@pytest.mark.parametrize(("payload", "message"), BAD_BINARY)
def test_malformed_binary_requests_name_their_problem(payload: bytes, message: str) -> None:
    with pytest.raises(OipError) as e:
        decode_request(payload, None, None)
    assert message in str(e.value)


def test_inputs_are_checked_against_the_handler_spec() -> None:
    spec = [{"name": "input", "shape": [-1, 4], "datatype": "FP32"}]
    cases = [
        (T("input", (3, 4)), None),
        (T("other", (3, 4)), "unknown input 'other' (the model takes: input)"),
        (T("input", (3, 5)), "shape must be [-1, 4] (-1: any), got [3, 5]"),
        (T("input", (3, 4), "FP64"), "datatype must be FP32, got FP64"),
    ]
    for t, message in cases:
        header = parse_header({"inputs": [t]}, None)
        arrays = {t["name"]: np.zeros(t["shape"])}
        if message is None:
            check_inputs(arrays, header, spec)
        else:
            with pytest.raises(OipError, match=re.escape(message)):
                check_inputs(arrays, header, spec)


def test_grpc_typed_contents_and_mismatched_raw_contents() -> None:
    req = pb.ModelInferRequest(model_name="m")
    t = req.inputs.add(name="x", datatype="INT64", shape=[3])
    t.contents.int64_contents.extend([1, 2, 3])
    call, payload = decode_request(
        wrap(TRANSPORT_GRPC, -1, 1, [req.SerializeToString()]), None, None
    )
    assert payload.tolist() == [1, 2, 3] and payload.dtype == torch.int64
    req.raw_input_contents.extend([b"\0" * 24, b"extra"])
    with pytest.raises(OipError, match="raw_input_contents has 2 entries but the request has 1"):
        decode_request(wrap(TRANSPORT_GRPC, -1, 1, [req.SerializeToString()]), None, None)


# -- Triton's extensions ------------------------------------------------------------------------


def status(**kw: Any) -> dict[str, Any]:
    st = {
        "name": "f", "version": 3, "available_replicas": 0, "start_error": None,
        "spec": {"model": "mlp", "min_instances": 1, "max_instances": 4, "device": "cpu",
                 "batching": {"max_batch": 8, "max_wait_ms": 2.5},
                 "resources": {"sm_pct": 50, "quota_request": 0.4, "quota_limit": 0.8}},
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}],
        "outputs": [{"name": "label", "datatype": "INT64", "shape": [-1]}],
    }  # fmt: skip
    st.update(kw)
    return st


def test_readiness_and_repository_index() -> None:
    # (available replicas, min_instances, start error) -> (ready, state)
    table = [
        (1, 1, None, True, "READY"),
        (0, 1, None, False, "LOADING"),  # its first instance is still starting
        (0, 0, None, True, "READY"),  # may scale to zero: a request starts one
        (2, 1, "boom", False, "UNAVAILABLE"),  # a start failed
    ]
    for replicas, min_inst, err, ready, state in table:
        st = status(available_replicas=replicas, start_error=err)
        st["spec"]["min_instances"] = min_inst
        r = readiness(st)
        assert (r.ready, r.state) == (ready, state)
    statuses = [status(name="a", available_replicas=1), status(name="b")]
    assert [m["state"] for m in repository_index(statuses, False)] == ["READY", "LOADING"]
    assert [m["name"] for m in repository_index(statuses, True)] == ["a"]


def test_model_config_maps_the_spec() -> None:
    c = model_config(status())
    assert c["input"] == [{"name": "input", "data_type": "TYPE_FP32", "dims": [-1, 64]}]
    assert c["output"] == [{"name": "label", "data_type": "TYPE_INT64", "dims": [-1]}]
    assert c["max_batch_size"] == 0  # shapes carry the request's own batch dimension
    assert c["dynamic_batching"] == {
        "preferred_batch_size": [8],
        "max_queue_delay_microseconds": 2500,  # 2.5 ms
    }
    assert c["instance_group"] == [{"name": "f", "kind": "KIND_CPU", "count": 4}]
    assert c["parameters"]["quota_request"] == {"string_value": "0.4"}
    # the kind is where the instances run: device auto on a CPU node is KIND_CPU, not GPU
    auto = status()
    auto["spec"]["device"] = "auto"
    assert model_config(auto)["instance_group"][0]["kind"] == "KIND_AUTO"  # none runs yet
    auto["instances"] = [{"device": "cpu"}]
    assert model_config(auto)["instance_group"][0]["kind"] == "KIND_CPU"
    auto["instances"] = [{"device": "cuda:0"}, {"device": "cpu"}]
    assert model_config(auto)["instance_group"][0]["kind"] == "KIND_GPU"
    # the document is a valid Triton ModelConfig (what the gRPC ModelConfig RPC sends)
    from gshare.runtime.oip.grpc_messages import from_dict

    msg = from_dict({"config": c}, pb.ModelConfigResponse())
    assert msg.config.input[0].dims == [-1, 64] and msg.config.max_batch_size == 0


def test_inference_stats_count_executions_per_batch() -> None:
    s = InferenceStats(wall_clock=lambda: 1000.0)
    # two requests answered by one batch of 2 (exec 10 ms each batch), one alone (4 ms),
    # one failure
    s.observe("f", 200, 0.030, (1.0, 0.0, 10.0, 2))
    s.observe("f", 200, 0.020, (1.0, 0.0, 10.0, 2))
    s.observe("f", 200, 0.005, (0.5, 0.0, 4.0, 1))
    s.observe("f", 503, 0.001, None)
    m = s.model_stats("f", 3)
    assert m["inference_count"] == 3 and m["execution_count"] == 2  # 1/2 + 1/2 + 1
    assert m["inference_stats"]["fail"] == {"count": 1, "ns": 1_000_000}
    assert m["inference_stats"]["success"]["ns"] == 55_000_000  # 30 + 20 + 5 ms
    assert m["inference_stats"]["compute_infer"]["ns"] == 24_000_000  # 10 + 10 + 4 ms
    assert m["inference_stats"]["queue"]["ns"] == 31_000_000  # 55 - 24 ms
    assert [(b["batch_size"], b["compute_infer"]) for b in m["batch_stats"]] == [
        (1, {"count": 1, "ns": 4_000_000}),
        (2, {"count": 1, "ns": 10_000_000}),  # one batch of 2: 10 ms once
    ]
    assert m["last_inference"] == 1_000_000
    s.forget("f")
    assert s.model_stats("f", 3)["inference_count"] == 0
