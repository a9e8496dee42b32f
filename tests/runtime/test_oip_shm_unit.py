"""The gateway's shared-memory mechanism (``gateway.shm``) without a server: the registry's
checks on files under a temporary root, the cheap detection, and the request / answer rewrites
checked by decoding them with the instance's own codec (what the instance would see)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import orjson
import pytest

from gshare.runtime.gateway.errors import HttpError
from gshare.runtime.gateway.shm import (
    SharedMemoryRegistry,
    finish_grpc,
    finish_http,
    grpc_mentions_shm,
    mentions_shm,
    prepare_grpc,
    prepare_http,
)
from gshare.runtime.instance import protocol as P
from gshare.runtime.instance.protocol import payload_bytes
from gshare.runtime.oip.codec import decode_http, http_parts
from gshare.runtime.oip.grpc_messages import decode_grpc, encode_grpc, parameter_value, pb
from gshare.runtime.oip.header import TRANSPORT_GRPC, TRANSPORT_HTTP, unwrap


@pytest.fixture
def reg(tmp_path: Path) -> SharedMemoryRegistry:
    return SharedMemoryRegistry(root=tmp_path)


def obj(root: Path, name: str, data: bytes) -> str:
    (root / name).write_bytes(data)
    return "/" + name


def test_mentions_shm_is_a_substring_search_of_the_json_part_only() -> None:
    marker = b'{"parameters": {"shared_memory_region": "r"}}'
    assert mentions_shm([marker], -1)
    assert mentions_shm([marker[:20], marker[20:]], -1)  # split across chunks
    assert mentions_shm([marker[:20], marker[20:]], len(marker))
    assert not mentions_shm([b'{"inputs": []}', b"shared_memory_"], 14)  # in the binary part
    assert not mentions_shm([b'{"inputs": []}'], -1)


def test_register_checks_and_maps_at_an_unaligned_offset(
    reg: SharedMemoryRegistry, tmp_path: Path
) -> None:
    data = bytes(range(256)) * 40  # 10240 bytes
    k = obj(tmp_path, "a", data)
    r = reg.register("r", k, 5000, 1000)
    assert bytes(r.read(10, 4)) == data[5010:5014]
    r.write(0, b"\x01\x02")
    assert (tmp_path / "a").read_bytes()[5000:5002] == b"\x01\x02"  # shared, not a copy
    assert reg.status() == [{"name": "r", "key": k, "offset": 5000, "byte_size": 1000}]
    with pytest.raises(HttpError, match="already registered"):
        reg.register("r", k, 0, 8)
    with pytest.raises(HttpError, match="holds 10240 bytes: offset 10000 \\+ byte_size 1000"):
        reg.register("s", k, 10000, 1000)
    (tmp_path / "dir").mkdir()
    with pytest.raises(HttpError, match="is not a regular file"):
        reg.register("s", "/dir", 0, 8)
    (tmp_path / "link").symlink_to(tmp_path / "a")
    with pytest.raises(HttpError, match="is a symbolic link"):
        reg.register("s", "/link", 0, 8)
    with pytest.raises(HttpError, match="not a POSIX shared memory name"):
        reg.register("s", "/../a", 0, 8)
    assert [s["name"] for s in reg.status()] == ["r"]


def test_unregister_closes_even_with_a_view_alive(
    reg: SharedMemoryRegistry, tmp_path: Path
) -> None:
    r = reg.register("r", obj(tmp_path, "a", b"x" * 64), 0, 64)
    view = r.read(0, 8)  # a request would have released it; close must not fail anyway
    assert reg.unregister("r") == ["r"] and r.closed
    with pytest.raises(HttpError, match="'r' was unregistered while the request used it"):
        r.write(0, b"y")
    assert bytes(view) == b"x" * 8
    del view
    assert reg.unregister("r") == []  # unknown: nothing to do
    with pytest.raises(HttpError, match="region 'r' is not registered"):
        reg.status("r")


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_another_owner_is_refused(reg: SharedMemoryRegistry, tmp_path: Path) -> None:
    k = obj(tmp_path, "theirs", b"x" * 64)
    os.chown(tmp_path / "theirs", 65534, 65534)
    with pytest.raises(HttpError, match="owned by uid 65534, not by the server's uid 0"):
        reg.register("r", k, 0, 64)


def test_http_rewrite_reads_regions_and_keeps_other_tensors_in_order(
    reg: SharedMemoryRegistry, tmp_path: Path
) -> None:
    a = np.arange(6, dtype=np.float32)
    b = np.arange(4, dtype=np.int64)
    reg.register("in", obj(tmp_path, "in", b"\0" * 8 + a.tobytes()), 0, 32)
    reg.register("out", obj(tmp_path, "out", b"\0" * 64), 0, 64)
    doc = {
        "inputs": [
            {"name": "b", "shape": [4], "datatype": "INT64",
             "parameters": {"binary_data_size": 32}},
            {
                "name": "a",
                "shape": [6],
                "datatype": "FP32",
                "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": 24,
                               "shared_memory_offset": 8},
            },
            {"name": "c", "shape": [2], "datatype": "FP32", "data": [1.0, 2.0]},
        ],
        "outputs": [
            {"name": "a", "parameters": {"shared_memory_region": "out",
                                         "shared_memory_byte_size": 64, "binary_data": False}},
            {"name": "b", "parameters": {"binary_data": True}},
            {"name": "c"},
        ],
    }  # fmt: skip
    js = orjson.dumps(doc)
    body = js + b.tobytes()
    chunks = [body[:7], body[7 : len(js) + 5], body[len(js) + 5 :]]  # split inside each part
    assert mentions_shm(chunks, len(js))
    payload, outputs = prepare_http(reg, chunks, len(js), 3)
    transport, header_len, version, new_body = unwrap(payload_bytes(payload))
    assert (transport, version) == (TRANSPORT_HTTP, 3)
    header, arrays = decode_http(new_body, header_len)  # what the instance sees
    assert [t.name for t in header.inputs] == ["b", "a", "c"]
    assert arrays["a"].tolist() == a.tolist() and arrays["b"].tolist() == b.tolist()
    assert arrays["c"].tolist() == [1.0, 2.0]
    assert list(outputs) == ["a"]
    # the instance answers; the rewrite puts 'a' into its region
    answer = {"a": arrays["a"] * 2, "b": arrays["b"], "c": arrays["c"]}
    ajs, blobs = http_parts(header, "echo", 3, answer)
    renc, data = finish_http(
        P.ENC_OIP_BINARY, b"".join([struct.pack("<I", len(ajs)), ajs, *blobs]), outputs
    )
    assert renc == P.ENC_OIP_BINARY
    (n,) = struct.unpack_from("<I", data)
    resp = orjson.loads(data[4 : 4 + n])
    assert resp["outputs"][0]["parameters"] == {
        "shared_memory_region": "out",
        "shared_memory_byte_size": 24,
        "shared_memory_offset": 0,
    }
    assert "data" not in resp["outputs"][0]
    assert data[4 + n :] == b.tobytes()  # 'b' still in the answer, 'c' as JSON
    assert resp["outputs"][2]["data"] == [1.0, 2.0]
    got = np.frombuffer((tmp_path / "out").read_bytes()[:24], np.float32)
    assert got.tolist() == (a * 2).tolist()


def test_http_rewrite_of_a_json_body_with_every_output_in_regions(
    reg: SharedMemoryRegistry, tmp_path: Path
) -> None:
    reg.register("out", obj(tmp_path, "out", b"\0" * 16), 0, 16)
    doc = {
        "inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2]}],
        "outputs": [
            {
                "name": "x",
                "parameters": {"shared_memory_region": "out", "shared_memory_byte_size": 4},
            }
        ],
    }
    payload, outputs = prepare_http(reg, [orjson.dumps(doc)], -1, 1)
    _, header_len, _, body = unwrap(payload_bytes(payload))
    assert header_len == -1  # no binary part was needed
    header, arrays = decode_http(body, header_len)
    ajs, blobs = http_parts(header, "echo", 1, {"x": arrays["x"]})
    answer = b"".join([struct.pack("<I", len(ajs)), ajs, *blobs])
    with pytest.raises(
        HttpError, match="'x' is 8 bytes but its shared memory reference holds only 4"
    ):
        finish_http(P.ENC_OIP_BINARY, answer, outputs)


def test_grpc_rewrite_appends_raw_contents_in_input_order(
    reg: SharedMemoryRegistry, tmp_path: Path
) -> None:
    a = np.arange(3, dtype=np.float32)
    b = np.array([7, 8], dtype=np.int32)
    reg.register("in", obj(tmp_path, "in", a.tobytes()), 0, 12)
    reg.register("out", obj(tmp_path, "out", b"\0" * 16), 0, 16)
    req = pb.ModelInferRequest(model_name="echo", id="q")
    t = req.inputs.add(name="a", datatype="FP32", shape=[3])
    t.parameters["shared_memory_region"].string_param = "in"
    t.parameters["shared_memory_byte_size"].int64_param = 12
    req.inputs.add(name="b", datatype="INT32", shape=[2])
    req.raw_input_contents.append(b.tobytes())
    o = req.outputs.add(name="a")
    o.parameters["shared_memory_region"].string_param = "out"
    o.parameters["shared_memory_byte_size"].int64_param = 12
    o.parameters["shared_memory_offset"].int64_param = 4
    req.outputs.add(name="b")
    assert grpc_mentions_shm(req)
    payload, outputs = prepare_grpc(reg, req, 2)
    transport, _, version, body = unwrap(payload_bytes(payload))
    assert (transport, version) == (TRANSPORT_GRPC, 2)
    header, arrays = decode_grpc(body)
    assert arrays["a"].tolist() == a.tolist() and arrays["b"].tolist() == b.tolist()
    out = pb.ModelInferResponse.FromString(
        finish_grpc(encode_grpc(header, "echo", 2, dict(arrays)), outputs)
    )
    assert list(out.raw_output_contents) == [b"", b.tobytes()]  # aligned with the outputs
    params = {k: parameter_value(v) for k, v in out.outputs[0].parameters.items()}
    assert params == {
        "shared_memory_region": "out",
        "shared_memory_byte_size": 12,
        "shared_memory_offset": 4,
    }
    assert (tmp_path / "out").read_bytes()[4:16] == a.tobytes()


def test_grpc_typed_contents_cannot_mix_with_shared_memory(
    reg: SharedMemoryRegistry, tmp_path: Path
) -> None:
    reg.register("in", obj(tmp_path, "in", b"\0" * 8), 0, 8)
    req = pb.ModelInferRequest(model_name="echo")
    t = req.inputs.add(name="a", datatype="INT32", shape=[2])
    t.parameters["shared_memory_region"].string_param = "in"
    t.parameters["shared_memory_byte_size"].int64_param = 8
    req.inputs.add(name="b", datatype="INT32", shape=[1]).contents.int_contents.append(1)
    with pytest.raises(HttpError, match="input 'b': with inputs in shared memory, send the"):
        prepare_grpc(reg, req, 1)


def test_a_registry_turned_off_refuses_every_region(tmp_path: Path) -> None:
    off = SharedMemoryRegistry(root=tmp_path, enabled=False)
    k = obj(tmp_path, "a", b"\0" * 64)
    with pytest.raises(HttpError, match="turned off.*--no-shared-memory"):
        off.register("r", k, 0, 64)
    assert off.status() == []
