"""Triton's system shared-memory extension against one real ``gshare serve --grpc-port 0``,
used through ``tritonclient`` exactly as Triton's examples do (simple_http_shm_client.py,
simple_grpc_shm_client.py): ``create_shared_memory_region`` / ``set_shared_memory_region``,
``register_system_shared_memory``, inputs and outputs ``set_shared_memory(region, size,
offset)``, ``get_contents_as_numpy``, status and unregister — over HTTP and gRPC.

Functions: ``addsub`` (Triton's "simple" model: INPUT0, INPUT1 FP32 [n, 16] → OUTPUT0 sum,
OUTPUT1 difference) and ``echo`` (any tensor back as ``output0``). Region keys carry the test
process's pid: /dev/shm is shared with whatever else runs on the machine.
"""

from __future__ import annotations

import json
import os
import queue
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from gshare.testing import ServeProcess, payload_bytes, wait_until

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SHARE = {"sm_pct": 50, "quota_request": 0.5, "quota_limit": 1.0}
FUNCTIONS: list[dict[str, Any]] = [
    {"name": "addsub", "handler": "gshare.runtime.demo_handlers:AddSub"},
    {"name": "echo", "handler": "gshare.runtime.demo_handlers:Echo"},
]
PID = os.getpid()


@dataclass
class Served:
    srv: ServeProcess
    http: httpclient.InferenceServerClient
    grpc: grpcclient.InferenceServerClient

    def client(self, transport: str) -> Any:
        return self.http if transport == "http" else self.grpc


def spec(f: dict[str, Any]) -> dict[str, Any]:
    return {"device": "cpu", "resources": SHARE, "min_instances": 1, "max_instances": 1, **f}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    state = tmp_path_factory.mktemp("gshare-shm") / "state"
    # --lane-mb 0: here every payload between gateway and instance takes the socket, so the
    # large-payload socket path is served end to end too (the lanes: test_oip_tritonclient)
    srv = ServeProcess(
        "--grpc-port", "0", "--lane-mb", "0", state_dir=state, tiny_models=True, cwd=REPO
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


@pytest.fixture
def regions(served: Served) -> Iterator[Callable[[str, int], Any]]:
    """``make(name, byte_size)``: a client region with key ``/gshare-test-PID-name``; every
    one is unregistered from the server and destroyed after the test."""
    made: list[Any] = []

    def make(name: str, byte_size: int) -> Any:
        h = shm.create_shared_memory_region(name, key(name), byte_size)
        made.append(h)
        return h

    yield make
    served.http.unregister_system_shared_memory()
    for h in made:
        shm.destroy_shared_memory_region(h)


def key(name: str) -> str:
    return f"/gshare-test-{PID}-{name}"


def error_of(call: Callable[[], object]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as e:
        call()
    return e.value


def infer_input(transport: str, name: str, shape: list[int], datatype: str) -> Any:
    mod = httpclient if transport == "http" else grpcclient
    return mod.InferInput(name, shape, datatype)


def requested(transport: str, name: str) -> Any:
    mod = httpclient if transport == "http" else grpcclient
    return mod.InferRequestedOutput(name)


def output_of(result: Any, transport: str, name: str) -> tuple[list[int], str, dict[str, Any]]:
    """(shape, datatype, parameters) of an output of an answer."""
    if transport == "http":
        o = result.get_output(name)
        assert "data" not in o, o  # in the region, not in the answer
        return o["shape"], o["datatype"], o.get("parameters", {})
    o = result.get_output(name)
    params = {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in o.parameters.items()}
    return list(o.shape), o.datatype, params


# -- inference -------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_tritons_simple_shm_example(
    served: Served, regions: Callable[[str, int], Any], transport: str
) -> None:
    """Triton's simple_{http,grpc}_shm_client.py: both inputs in one region (INPUT1 at
    offset 64), both outputs in another (OUTPUT1 at offset 64)."""
    c = served.client(transport)
    a = np.arange(16, dtype=np.int32).astype(np.float32).reshape(1, 16)
    b = np.full((1, 16), 2.0, dtype=np.float32)
    out_h = regions(f"out-{transport}", 128)
    in_h = regions(f"in-{transport}", 128)
    shm.set_shared_memory_region(in_h, [a])
    shm.set_shared_memory_region(in_h, [b], offset=64)
    c.register_system_shared_memory("output_data", key(f"out-{transport}"), 128)
    c.register_system_shared_memory("input_data", key(f"in-{transport}"), 128)
    i0 = infer_input(transport, "INPUT0", [1, 16], "FP32")
    i0.set_shared_memory("input_data", 64)
    i1 = infer_input(transport, "INPUT1", [1, 16], "FP32")
    i1.set_shared_memory("input_data", 64, offset=64)
    o0, o1 = requested(transport, "OUTPUT0"), requested(transport, "OUTPUT1")
    o0.set_shared_memory("output_data", 64)
    o1.set_shared_memory("output_data", 64, offset=64)
    r = c.infer("addsub", [i0, i1], outputs=[o0, o1])
    for name, off, want in (("OUTPUT0", 0, a + b), ("OUTPUT1", 64, a - b)):
        shape, dt, params = output_of(r, transport, name)
        assert params == {
            "shared_memory_region": "output_data",
            "shared_memory_byte_size": 64,
            "shared_memory_offset": off,
        }
        got = shm.get_contents_as_numpy(out_h, np.float32, shape, offset=off)
        assert dt == "FP32"
        np.testing.assert_array_equal(got, want)
    status = c.get_system_shared_memory_status()
    if transport == "http":
        assert sorted(status, key=lambda s: s["name"]) == [
            {"name": "input_data", "key": key("in-http"), "offset": 0, "byte_size": 128},
            {"name": "output_data", "key": key("out-http"), "offset": 0, "byte_size": 128},
        ]
    else:
        assert sorted(status.regions) == ["input_data", "output_data"]
        assert status.regions["input_data"].key == key("in-grpc")
        assert status.regions["input_data"].byte_size == 128
    c.unregister_system_shared_memory()
    assert len(served.http.get_system_shared_memory_status()) == 0


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_a_large_tensor_through_regions_takes_the_socket_without_lanes(
    served: Served, regions: Callable[[str, int], Any], transport: str
) -> None:
    """1 MiB in a region and back, on a server started with ``--lane-mb 0``: the tensor is
    right, and it went to the instance and back through the socket (no lane bytes)."""
    c = served.client(transport)
    x = np.random.default_rng(2).random((1, 1 << 18), dtype=np.float32)
    in_h = regions(f"big-in-{transport}", x.nbytes)
    out_h = regions(f"big-out-{transport}", x.nbytes)
    shm.set_shared_memory_region(in_h, [x])
    c.register_system_shared_memory("big_in", key(f"big-in-{transport}"), x.nbytes)
    c.register_system_shared_memory("big_out", key(f"big-out-{transport}"), x.nbytes)
    before = payload_bytes(served.srv.url)
    i = infer_input(transport, "x", [1, 1 << 18], "FP32")
    i.set_shared_memory("big_in", x.nbytes)
    o = requested(transport, "output0")
    o.set_shared_memory("big_out", x.nbytes)
    c.infer("echo", [i], outputs=[o])
    after = payload_bytes(served.srv.url)
    got = shm.get_contents_as_numpy(out_h, np.float32, [1, 1 << 18])
    np.testing.assert_array_equal(got, x)
    c.unregister_system_shared_memory("big_in")
    c.unregister_system_shared_memory("big_out")
    for direction in ("request", "response"):
        moved = after[(direction, "socket")] - before.get((direction, "socket"), 0.0)
        assert moved >= x.nbytes
        assert after.get((direction, "lane"), 0.0) == 0.0


DTYPES: list[tuple[str, np.ndarray]] = [
    ("FP16", np.array([[1.5, -2.25, 65504.0]], dtype=np.float16)),
    ("FP64", np.array([[1e300, -0.5]], dtype=np.float64)),
    ("INT64", np.array([[1, -2, 2**40]], dtype=np.int64)),
    ("UINT8", np.arange(10, dtype=np.uint8).reshape(2, 5)),
    ("BOOL", np.array([True, False, True])),
    ("BYTES", np.array([b"gshare", "héllo".encode(), b"\xff\x00raw"], dtype=object)),
]


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_every_dtype_round_trips_through_regions_at_an_offset(
    served: Served, regions: Callable[[str, int], Any], transport: str
) -> None:
    c = served.client(transport)
    in_h, out_h = regions(f"din-{transport}", 4096), regions(f"dout-{transport}", 4096)
    c.register_system_shared_memory("din", key(f"din-{transport}"), 4000, offset=96)
    c.register_system_shared_memory("dout", key(f"dout-{transport}"), 4096)
    for dt, x in DTYPES:
        raw = serialize_byte_tensor(x).item() if dt == "BYTES" else x.tobytes()
        in_off, out_off = 24, 40  # inside the regions
        in_h._mpsm_handle.buf[96 + in_off : 96 + in_off + len(raw)] = raw
        i = infer_input(transport, "x", list(x.shape), dt)
        i.set_shared_memory("din", len(raw), offset=in_off)
        o = requested(transport, "output0")
        o.set_shared_memory("dout", 4096 - out_off, offset=out_off)
        r = c.infer("echo", [i], outputs=[o])
        shape, got_dt, params = output_of(r, transport, "output0")
        assert (shape, got_dt) == (list(x.shape), dt)
        assert params["shared_memory_byte_size"] == len(raw)  # the bytes written
        assert params["shared_memory_offset"] == out_off
        np_dt = np.object_ if dt == "BYTES" else x.dtype
        got = shm.get_contents_as_numpy(out_h, np_dt, shape, offset=out_off)
        assert got.tolist() == x.tolist(), dt


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_shared_memory_mixes_with_ordinary_tensors(
    served: Served, regions: Callable[[str, int], Any], transport: str
) -> None:
    """One input in a region, the other as binary data; one output in a region, the other
    in the answer."""
    c = served.client(transport)
    a = np.random.default_rng(1).random((3, 16), dtype=np.float32)
    b = np.ones((3, 16), dtype=np.float32)
    h = regions(f"mix-{transport}", 1024)
    shm.set_shared_memory_region(h, [a], offset=8)
    c.register_system_shared_memory("mix", key(f"mix-{transport}"), 1024)
    i0 = infer_input(transport, "INPUT0", [3, 16], "FP32")
    i0.set_shared_memory("mix", a.nbytes, offset=8)
    i1 = infer_input(transport, "INPUT1", [3, 16], "FP32")
    i1.set_data_from_numpy(b)
    o0, o1 = requested(transport, "OUTPUT0"), requested(transport, "OUTPUT1")
    o1.set_shared_memory("mix", a.nbytes, offset=512)
    r = c.infer("addsub", [i0, i1], outputs=[o0, o1], parameters={"scale": 2})
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), (a + b) * 2)
    np.testing.assert_array_equal(
        shm.get_contents_as_numpy(h, np.float32, [3, 16], 512), (a - b) * 2
    )
    if transport == "http":  # an input in shared memory and JSON data beside it
        j1 = httpclient.InferInput("INPUT1", [3, 16], "FP32")
        j1.set_data_from_numpy(b, binary_data=False)
        out = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)]
        r = c.infer("addsub", [i0, j1], outputs=out)
        np.testing.assert_allclose(r.as_numpy("OUTPUT0"), a + b, rtol=1e-6)


def test_grpc_stream_requests_use_shared_memory(
    served: Served, regions: Callable[[str, int], Any]
) -> None:
    g = served.grpc
    h = regions("stream", 64)
    g.register_system_shared_memory("stream", key("stream"), 64)
    got: queue.Queue[Any] = queue.Queue()
    g.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        for k in range(3):  # each writes its own 8 bytes: request k at offset 8k in, 32+8k out
            x = np.full((1, 2), k, dtype=np.int32)
            shm.set_shared_memory_region(h, [x], offset=8 * k)
            i = grpcclient.InferInput("x", [1, 2], "INT32")
            i.set_shared_memory("stream", 8, offset=8 * k)
            o = grpcclient.InferRequestedOutput("output0")
            o.set_shared_memory("stream", 8, offset=32 + 8 * k)
            g.async_stream_infer("echo", [i], outputs=[o], request_id=str(k))
        for _ in range(3):
            result, error = got.get(timeout=60)
            assert error is None, error
    finally:
        g.stop_stream()
    for k in range(3):
        assert shm.get_contents_as_numpy(h, np.int32, [1, 2], 32 + 8 * k).tolist() == [[k, k]]


# -- status, register, unregister ----------------------------------------------------------


def test_status_register_unregister_round_trips_across_transports(
    served: Served, regions: Callable[[str, int], Any]
) -> None:
    h, g = served.http, served.grpc
    regions("rt", 256)
    assert "system_shared_memory" in h.get_server_metadata()["extensions"]
    h.register_system_shared_memory("r1", key("rt"), 128)
    g.register_system_shared_memory("r2", key("rt"), 100, offset=128)
    assert h.get_system_shared_memory_status("r2") == [
        {"name": "r2", "key": key("rt"), "offset": 128, "byte_size": 100}
    ]
    gs = g.get_system_shared_memory_status("r1").regions
    assert list(gs) == ["r1"] and gs["r1"].byte_size == 128 and gs["r1"].offset == 0
    e = error_of(lambda: h.register_system_shared_memory("r1", key("rt"), 8))
    assert e.status() == "400" and "'r1' is already registered" in e.message()
    e = error_of(lambda: g.register_system_shared_memory("r1", key("rt"), 8))
    assert e.status() == "StatusCode.INVALID_ARGUMENT" and "already registered" in e.message()
    g.unregister_system_shared_memory("r1")
    assert [s["name"] for s in h.get_system_shared_memory_status()] == ["r2"]
    e = error_of(lambda: h.get_system_shared_memory_status("r1"))
    assert e.status() == "400" and "region 'r1' is not registered (registered: 'r2')" in e.message()
    h.unregister_system_shared_memory("r1")  # unknown: nothing to do (as Triton)
    h.unregister_system_shared_memory()
    assert h.get_system_shared_memory_status() == []
    assert len(g.get_system_shared_memory_status().regions) == 0


def maps_of(pid: int, path: str) -> int:
    return sum(1 for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if path in line)


def test_unregister_closes_the_mapping(served: Served, regions: Callable[[str, int], Any]) -> None:
    regions("mapped", 64)
    path = f"/dev/shm{key('mapped')}"
    served.http.register_system_shared_memory("mapped", key("mapped"), 64)
    assert maps_of(served.srv.pid, path) == 1
    served.grpc.unregister_system_shared_memory("mapped")
    assert maps_of(served.srv.pid, path) == 0


def test_bad_registrations_are_refused_with_the_reason(
    served: Served, regions: Callable[[str, int], Any], tmp_path: Path
) -> None:
    h, g = served.http, served.grpc
    regions("small", 64)
    link = Path(f"/dev/shm/gshare-test-{PID}-link")
    fifo = Path(f"/dev/shm/gshare-test-{PID}-fifo")
    link.symlink_to(f"/dev/shm{key('small')}")
    os.mkfifo(fifo)
    try:
        cases = [
            (key("ghost"), 8, 0, "does not exist: create it first"),
            ("/a/b", 8, 0, "is not a POSIX shared memory name"),
            (key("small"), 64, 8, "holds 64 bytes: offset 8 + byte_size 64 runs past its end"),
            (key("small"), 0, 0, "'byte_size' must be an integer > 0"),
            (str(link).removeprefix("/dev/shm"), 8, 0, "is a symbolic link"),
            (str(fifo).removeprefix("/dev/shm"), 8, 0, "is not a regular file"),
        ]
        for k, size, off, message in cases:
            e = error_of(
                lambda k=k, size=size, off=off: h.register_system_shared_memory("x", k, size, off)
            )
            assert e.status() == "400" and message in e.message(), (message, e)
            e = error_of(
                lambda k=k, size=size, off=off: g.register_system_shared_memory("x", k, size, off)
            )
            assert e.status() == "StatusCode.INVALID_ARGUMENT" and message in e.message()
        r = httpx.post(
            served.srv.url + "/v2/systemsharedmemory/region/x/register", content=b"[1]", timeout=30
        )
        assert r.status_code == 400 and '"byte_size": N}' in r.json()["error"]
        assert h.get_system_shared_memory_status() == []  # nothing half-registered
    finally:
        link.unlink()
        fifo.unlink()


def test_a_region_of_another_user_is_refused(
    served: Served, regions: Callable[[str, int], Any]
) -> None:
    if os.geteuid() != 0:
        pytest.skip("creating a shared-memory object owned by another uid needs root")
    regions("theirs", 64)
    os.chown(f"/dev/shm{key('theirs')}", 65534, 65534)  # nobody's
    e = error_of(lambda: served.http.register_system_shared_memory("theirs", key("theirs"), 64))
    assert e.status() == "400"
    assert "is owned by uid 65534, not by the server's uid 0" in e.message()


def test_cuda_shared_memory_is_not_supported(served: Served) -> None:
    e = error_of(lambda: served.http.get_cuda_shared_memory_status())
    assert e.status() == "400" and "CUDA shared memory is not supported" in e.message()
    e = error_of(lambda: served.http.unregister_cuda_shared_memory())
    assert e.status() == "400" and "CUDA shared memory is not supported" in e.message()
    e = error_of(lambda: served.grpc.get_cuda_shared_memory_status())
    assert e.status() == "StatusCode.INVALID_ARGUMENT" and "not supported" in e.message()


# -- bad references ------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_each_bad_reference_is_one_clear_400_and_the_server_keeps_serving(
    served: Served, regions: Callable[[str, int], Any], transport: str
) -> None:
    c = served.client(transport)
    h = regions(f"bad-{transport}", 256)
    c.register_system_shared_memory("bad", key(f"bad-{transport}"), 128, offset=64)
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    shm.set_shared_memory_region(h, [x], offset=64)

    def run(in_ref: tuple[str, int, int], out_ref: tuple[str, int, int] | None = None) -> Any:
        i0 = infer_input(transport, "INPUT0", [1, 16], "FP32")
        i0.set_shared_memory(*in_ref)
        i1 = infer_input(transport, "INPUT1", [1, 16], "FP32")
        i1.set_data_from_numpy(x)
        outs = None
        if out_ref is not None:
            o = requested(transport, "OUTPUT0")
            o.set_shared_memory(*out_ref)
            outs = [o]
        return c.infer("addsub", [i0, i1], outputs=outs)

    ok = ("bad", 64, 0)
    cases: list[tuple[tuple[str, int, int], tuple[str, int, int] | None, str]] = [
        (("ghost", 64, 0), None, "region 'ghost' is not registered (registered: 'bad')"),
        (("bad", 64, 100), None, "offset 100 + shared_memory_byte_size 64 runs past the end"),
        (("bad", 32, 0), None, "byte_size is 32 bytes but shape [1, 16] of FP32 needs 64"),
        (ok, ("ghost", 64, 0), "output 'OUTPUT0': shared memory region 'ghost' is not"),
        (ok, ("bad", 64, 80), "output 'OUTPUT0': shared_memory_offset 80 +"),
        (ok, ("bad", 16, 0), "'OUTPUT0' is 64 bytes but its shared memory reference holds only 16"),
    ]
    want = "400" if transport == "http" else "StatusCode.INVALID_ARGUMENT"
    for in_ref, out_ref, message in cases:
        e = error_of(lambda in_ref=in_ref, out_ref=out_ref: run(in_ref, out_ref))
        assert e.status() == want and message in e.message(), (message, e)
    # the same region, good references: still serving
    r = run(("bad", 64, 0), ("bad", 64, 64))
    got = shm.get_contents_as_numpy(h, np.float32, [1, 16], offset=64 + 64)
    np.testing.assert_array_equal(got, x + x)
    assert output_of(r, transport, "OUTPUT0")[2]["shared_memory_offset"] == 64


def test_malformed_shared_memory_parameters_over_http(
    served: Served, regions: Callable[[str, int], Any]
) -> None:
    regions("raw", 64)
    served.http.register_system_shared_memory("raw", key("raw"), 64)

    def post(params: dict[str, Any], **extra: Any) -> httpx.Response:
        doc = {
            "inputs": [
                {"name": "x", "shape": [2], "datatype": "FP32", "parameters": params, **extra}
            ]
        }
        return httpx.post(served.srv.url + "/v2/models/echo/infer", json=doc, timeout=60)

    ref = {"shared_memory_region": "raw", "shared_memory_byte_size": 8}
    cases: list[tuple[dict[str, Any], dict[str, Any], str]] = [
        ({"shared_memory_byte_size": 8}, {}, "shared_memory_region must name a registered region"),
        ({"shared_memory_region": "raw"}, {}, "shared_memory_byte_size must be an integer >= 0"),
        ({**ref, "shared_memory_offset": -1}, {}, "shared_memory_offset must be an integer >= 0"),
        (ref, {"data": [1, 2]}, "give either 'data' or shared memory, not both"),
    ]
    for params, extra, message in cases:
        r = post(params, **extra)
        assert r.status_code == 400 and message in r.json()["error"], (message, r.text)
    r = post({"shared_memory_region": "raw", "shared_memory_byte_size": 8})
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [0.0, 0.0]
