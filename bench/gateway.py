"""Requests/s and p99 latency through gshare's gateway vs Ray Serve: a trivial function, and a
1 MiB tensor over the Open Inference Protocol as HTTP/JSON, HTTP/binary and gRPC.

Same machine, same run, same client, same function:

* the function echoes its input, one instance / replica, no batching on either side
  (``max_batch: 1``; Ray Serve without ``@serve.batch``), a whole device share for gshare's
  instance (sm 100 %, quota 1.0) and ``max_ongoing_requests`` = the client's concurrency for
  Ray Serve's replica (it is never throttled below what the client sends). gshare runs
  ``gshare.runtime.demo_handlers:Echo``; Ray Serve a deployment doing the same work;
* the cases (``CASES``):
  - ``echo``: ``POST /function/echo`` with a 64-byte JSON body, answered unchanged (Ray Serve:
    ``await request.body()`` back);
  - ``oip-json``, ``oip-binary``, ``grpc``: one FP32 tensor of shape [1, 262144] (1 MiB) to
    ``echo`` over the Open Inference Protocol, answered as ``output0``. The requests are
    built by ``tritonclient`` (the protocol's reference client): JSON tensors in and out
    (``binary_data=False``: about 5 MB of JSON in, 2.8 MB out), its default binary tensor
    data (``Inference-Header-Content-Length``, binary in and out), and a gRPC
    ``ModelInferRequest`` with raw contents. On both systems the tensor is decoded, handed to
    the function as a torch tensor and encoded back by the same code
    (``gshare.runtime.oip.codec``, ``oip.grpc_messages``): the Ray Serve replica calls it in its
    ``__call__`` / ``ModelInfer`` (Ray Serve's gRPC proxy serving ``tritonclient``'s
    ``GRPCInferenceService``), so the figures compare the serving paths, not the codecs.
    Every answer is compared with the first, which is checked against the tensor sent;
* each server runs in its own process tree (``gshare serve --grpc-port 0`` with a temporary
  state directory; ``serve.run`` in a child process), started, warmed up, measured (every
  case), stopped — never both at once;
* the client is this process: an asyncio HTTP/1.1 load generator with ``--concurrency``
  keep-alive connections in a closed loop (each sends its next request when the previous
  answer arrived) for ``--duration-s`` after ``--warmup-s``, and for gRPC as many concurrent
  calls on one ``grpc.aio`` channel, requests pre-serialized; it costs far less CPU than
  either server;
* rounds alternate gshare / Ray Serve ``--rounds`` times and each system keeps its best round
  per case (the machine is shared; the best round is the least disturbed one).

Summary: ``throughput_ratio_vs_rayserve`` / ``p99_ratio_vs_rayserve`` (the ``echo`` case:
gshare rps ÷ Ray Serve rps, target ≥ 1; gshare p99 ÷ Ray Serve p99, lower is better),
``throughput_ratio_vs_rayserve_{json,binary,grpc}`` and ``p99_ratio_vs_rayserve_{...}`` for
the 1 MiB tensor cases (target ≥ 1 each), ``binary_over_json_1mb`` (gshare's binary rps ÷ its
JSON rps, target ≥ 1.5), plus each system's rps, p50, p99 and errors per case, and the machine
load.

    .venv/bin/python bench/gateway.py [--quick] [--json PATH] [--concurrency 16]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from _common import (
    bench_parser,
    machine_load,
    percentile,
    print_table,
    read_http_response,
    write_json,
)
from gshare.testing import ServeProcess, WaitTimeout, stop_process, wait_until

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
PAYLOAD = json.dumps({"x": list(range(16)), "hello": "gshare"}).encode()
TENSOR_SHAPE = (1, 262_144)
"""The OIP cases' FP32 tensor: 1 MiB."""
INFER = "/v2/models/echo/infer"
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"

ECHO_SPEC = """\
name: echo
handler: gshare.runtime.demo_handlers:Echo
device: cpu
resources: {sm_pct: 100, quota_request: 1.0, quota_limit: 1.0}
batching: {max_batch: 1, max_wait_ms: 0}
min_instances: 1
max_instances: 1
"""

RAY_SERVE_APP = textwrap.dedent(
    """
    import signal, sys, threading, time
    import ray
    from ray import serve
    from ray.serve.config import gRPCOptions
    from starlette.requests import Request
    from starlette.responses import Response

    port, grpc_port, concurrency = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

    @serve.deployment(num_replicas=1, max_ongoing_requests=concurrency)
    class Echo:
        async def __call__(self, request: Request) -> Response:
            body = await request.body()
            if not request.url.path.endswith("/infer"):
                return Response(body, media_type="application/json")
            # the Open Inference Protocol over HTTP: the codec gshare's instances run
            from gshare.runtime.oip.header import TRANSPORT_HTTP, wrap
            from gshare.runtime.oip.codec import http_parts
            from gshare.runtime.oip.payload import decode_request

            n = request.headers.get("inference-header-content-length")
            payload = wrap(TRANSPORT_HTTP, int(n) if n else -1, 1, [body])
            call, x = decode_request(payload, None, None)
            js, blobs = http_parts(call.header, "echo", call.version, x)
            if not blobs:
                return Response(js, media_type="application/json")
            return Response(
                b"".join([js, *blobs]),
                media_type="application/octet-stream",
                headers={"inference-header-content-length": str(len(js))},
            )

        async def ModelInfer(self, request):
            from gshare.runtime.oip.codec import to_handler_input
            from gshare.runtime.oip.grpc_messages import decode_message, encode_message

            header, arrays = decode_message(request)
            x = to_handler_input(header, arrays)
            return encode_message(header, "echo", 1, x)

    ray.init(address="local", include_dashboard=False, object_store_memory=256 << 20,
             logging_level="WARNING")
    serve.start(
        http_options={"host": "127.0.0.1", "port": port},
        grpc_options=gRPCOptions(
            port=grpc_port,
            grpc_servicer_functions=[
                "tritonclient.grpc.service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server"
            ],
        ),
    )
    serve.run(Echo.bind(), name="echo", route_prefix="/")
    print("READY", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(0.2):
        pass
    serve.shutdown()
    ray.shutdown()
    """
)
PB_SHIM = (
    "# tritonclient's generated messages name their module after the .proto file; Ray pickles\n"
    "# them by that name between its gRPC proxy and the replica.\n"
    "from tritonclient.grpc.service_pb2 import *  # noqa: F401,F403\n"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the requests ------------------------------------------------------------------------------


@dataclass
class Case:
    """One kind of request: HTTP (``path``, ``body``, ``headers``) or gRPC (``grpc`` True: the
    serialized ModelInferRequest in ``body``), and how to check its first answer."""

    name: str
    body: bytes
    path: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    grpc: bool = False
    check: Callable[[bytes, dict[str, str]], None] = lambda body, headers: None


def make_cases(
    shape: tuple[int, ...] = TENSOR_SHAPE, suffix: str = "", *, echo: bool = True
) -> list[Case]:
    """The cases (module doc): ``echo`` (unless ``echo`` is False) and the three OIP cases of
    one FP32 tensor of ``shape``, named with ``suffix`` (``oip-binary-4mb``)."""
    import tritonclient.http as th
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.http._utils import _get_inference_request

    x = np.random.default_rng(0).random(shape, dtype=np.float32)

    def body_of(binary: bool) -> tuple[bytes, int | None]:
        i = th.InferInput("INPUT0", list(shape), "FP32")
        i.set_data_from_numpy(x, binary_data=binary)
        outs = None if binary else [th.InferRequestedOutput("output0", binary_data=False)]
        return _get_inference_request([i], "", outs, 0, False, False, 0, None, None)

    def check_http(body: bytes, headers: dict[str, str]) -> None:
        n = headers.get("inference-header-content-length")
        r = th.InferResult.from_response_body(body, header_length=int(n) if n else None)
        if not np.array_equal(r.as_numpy("output0"), x):
            raise SystemExit("the OIP answer is not the tensor sent")

    def check_grpc(body: bytes, headers: dict[str, str]) -> None:
        r = pb.ModelInferResponse.FromString(body)
        got = np.frombuffer(r.raw_output_contents[0], np.float32).reshape(tuple(r.outputs[0].shape))
        if not np.array_equal(got, x):
            raise SystemExit("the gRPC answer is not the tensor sent")

    def check_echo(body: bytes, headers: dict[str, str]) -> None:
        if body != PAYLOAD:
            raise SystemExit(f"the echo answer differs: {body[:80]!r}")

    json_body, _ = body_of(binary=False)
    bin_body, json_len = body_of(binary=True)
    req = pb.ModelInferRequest(model_name="echo")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=list(shape))
    req.raw_input_contents.append(x.tobytes())
    ctype = {"content-type": "application/json"}
    cases = [Case("echo", PAYLOAD, "/function/echo", ctype, check=check_echo)] if echo else []
    return cases + [
        Case(f"oip-json{suffix}", json_body, INFER, ctype, check=check_http),
        Case(
            f"oip-binary{suffix}",
            bin_body,
            INFER,
            {"inference-header-content-length": str(json_len)},
            check=check_http,
        ),
        Case(f"grpc{suffix}", req.SerializeToString(), grpc=True, check=check_grpc),
    ]


# -- the load generator --------------------------------------------------------------------------


def _request(port: int, case: Case) -> bytes:
    head = f"POST {case.path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
    for k, v in case.headers.items():
        head += f"{k}: {v}\r\n"
    return (head + f"Content-Length: {len(case.body)}\r\n\r\n").encode() + case.body


async def _http_worker(
    port: int,
    case: Case,
    expect: bytes,
    t_start: float,
    t_end: float,
    lat: list[float],
    errors: list[str],
) -> int:
    req = _request(port, case)
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 24)
    n = 0
    try:
        while True:
            t0 = time.perf_counter()
            if t0 >= t_end:
                break
            writer.write(req)
            status, _, body = await read_http_response(reader)
            t1 = time.perf_counter()
            if status != 200 or body != expect:
                errors.append(f"HTTP {status}: {body[:120]!r}")
            elif t0 >= t_start:
                lat.append(t1 - t0)
                n += 1
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    return n


async def _grpc_worker(
    call: Any,
    case: Case,
    expect: bytes,
    t_start: float,
    t_end: float,
    lat: list[float],
    errors: list[str],
) -> int:
    import grpc

    n = 0
    while True:
        t0 = time.perf_counter()
        if t0 >= t_end:
            break
        try:
            body = await call(case.body, timeout=120)
        except grpc.aio.AioRpcError as e:
            errors.append(f"gRPC {e.code()}: {e.details()}")
            continue
        t1 = time.perf_counter()
        if body != expect:
            errors.append(f"gRPC answer differs: {body[:80]!r}")
        elif t0 >= t_start:
            lat.append(t1 - t0)
            n += 1
    return n


async def first_answer(port: int, case: Case) -> bytes:
    """The answer to one request, checked (``Case.check``): what every later answer must be."""
    if case.grpc:
        import grpc

        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=_GRPC_OPTIONS) as ch:
            body: bytes = await ch.unary_unary(MODEL_INFER)(case.body, timeout=120)
            case.check(body, {})
            return body
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 24)
    try:
        writer.write(_request(port, case))
        status, headers, body = await read_http_response(reader)
    finally:
        writer.close()
    if status != 200:
        raise SystemExit(f"{case.name}: HTTP {status}: {body[:300]!r}")
    case.check(body, headers)
    return body


_GRPC_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


async def load(
    port: int, case: Case, concurrency: int, warmup_s: float, duration_s: float
) -> dict[str, Any]:
    expect = await first_answer(port, case)
    t_start = time.perf_counter() + warmup_s
    t_end = t_start + duration_s
    lat: list[float] = []
    errors: list[str] = []
    if case.grpc:
        import grpc

        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=_GRPC_OPTIONS) as ch:
            call = ch.unary_unary(MODEL_INFER)
            counts = await asyncio.gather(
                *(
                    _grpc_worker(call, case, expect, t_start, t_end, lat, errors)
                    for _ in range(concurrency)
                )
            )
    else:
        counts = await asyncio.gather(
            *(
                _http_worker(port, case, expect, t_start, t_end, lat, errors)
                for _ in range(concurrency)
            )
        )
    n = sum(counts)
    return {
        "requests": n,
        "rps": n / duration_s,
        "p50_ms": percentile(lat, 50) * 1000.0,
        "p99_ms": percentile(lat, 99) * 1000.0,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
    }


def wait_http(port: int, path: str, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
    """Until ``POST path`` with the payload answers 200 (the function is served), or exit if the
    server process died first."""
    import httpx

    def answered() -> bool:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with code {proc.returncode} before it was ready")
        r = httpx.post(
            f"http://127.0.0.1:{port}{path}",
            content=PAYLOAD,
            headers={"content-type": "application/json"},
            timeout=5,
        )
        return r.status_code == 200

    try:
        wait_until(
            answered, timeout_s, f"the server on port {port} to answer {path}", interval_s=0.3
        )
    except WaitTimeout as e:
        raise SystemExit(str(e)) from None


def measure(args: Any, http_port: int, grpc_port: int, cases: list[Case]) -> dict[str, Any]:
    out = {}
    for case in cases:
        port = grpc_port if case.grpc else http_port
        out[case.name] = asyncio.run(
            load(port, case, args.concurrency, args.warmup_s, args.duration_s)
        )
    return out


# -- the two systems -----------------------------------------------------------------------------


def run_gshare(
    args: Any,
    tmp: Path,
    cases: list[Case],
    more: Callable[[int], dict[str, dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """gshare's figures per case; ``more(http_port)`` adds cases measured on the same server."""
    spec = tmp / "echo.yaml"
    spec.write_text(ECHO_SPEC)
    # a temporary state directory, any free port (HTTP and gRPC)
    with ServeProcess("--grpc-port", "0", cwd=ROOT) as srv:
        try:
            srv.client().deploy(spec.read_text())
        except Exception as e:
            raise SystemExit(f"gshare deploy failed: {e}") from None
        assert srv.proc is not None
        wait_http(srv.port, "/function/echo", 120, srv.proc)
        grpc = json.loads((srv.state_dir / "server.json").read_text())["grpc"]
        out = measure(args, srv.port, int(grpc.rsplit(":", 1)[1]), cases)
        return out | (more(srv.port) if more is not None else {})


def run_rayserve(args: Any, tmp: Path, cases: list[Case]) -> dict[str, Any]:
    port, grpc_port = free_port(), free_port()
    app = tmp / "rayserve_echo.py"
    app.write_text(RAY_SERVE_APP)
    (tmp / "grpc_service_pb2.py").write_text(PB_SHIM)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp), os.environ.get("PYTHONPATH", "")]),
    }
    with open(tmp / f"rayserve-{port}.log", "wb") as log:
        proc = subprocess.Popen(
            [PY, str(app), str(port), str(grpc_port), str(args.concurrency)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    try:
        wait_http(port, "/function/echo", 180, proc)
        return measure(args, port, grpc_port, cases)
    finally:
        stop_process(proc)


System = Callable[[Any, Path, list[Case]], dict[str, Any]]
"""Runs one system: its server up, every case measured (``measure``), the server down."""

Best = dict[tuple[str, str], dict[str, Any]]
"""(system, case) -> that system's best round of that case (the most requests/s)."""


def alternate_rounds(
    args: Any, systems: Sequence[tuple[str, System]], cases: list[Case], prefix: str
) -> tuple[Best, list[dict[str, Any]], dict[str, str]]:
    """``args.rounds`` rounds, each running every system in turn (never two at once), in a
    temporary directory named with ``prefix``. Returns each (system, case)'s best round, every
    round's figures, and the systems that did not start (``SystemExit``: its reason; the
    server's log is printed), which are left out of that round, not fatal."""
    best: Best = {}
    rounds: list[dict[str, Any]] = []
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix=prefix) as d:
        for r in range(args.rounds):
            for system, fn in systems:
                try:
                    results = fn(args, Path(d), cases)
                except SystemExit as e:
                    failed[system] = str(e)
                    print(f"round {r} {system}: failed: {e}", file=sys.stderr)
                    for log in sorted(Path(d).glob(f"{system.replace('-', '')}*.log")):
                        print(log.read_text()[-3000:], file=sys.stderr)
                    continue
                for case, res in results.items():
                    res.update(system=system, case=case, round=r)
                    rounds.append(res)
                    print(
                        f"round {r} {system} {case}: {res['rps']:.0f} rps, "
                        f"p50 {res['p50_ms']:.2f} ms, p99 {res['p99_ms']:.2f} ms, "
                        f"errors {res['errors']}",
                        file=sys.stderr,
                    )
                    if (system, case) not in best or res["rps"] > best[(system, case)]["rps"]:
                        best[(system, case)] = res
    return best, rounds, failed


def print_errors(best: Best) -> None:
    """Each best round's first error, where it had any."""
    for (system, case), b in best.items():
        if b["errors"]:
            print(f"errors: {system} {case}: {b['first_error']!r}", file=sys.stderr)


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


SYSTEMS: tuple[tuple[str, System], ...] = (("gshare", run_gshare), ("ray-serve", run_rayserve))
SUFFIX = {"echo": "", "oip-json": "_json", "oip-binary": "_binary", "grpc": "_grpc"}
"""Summary-key suffix per case (``echo`` keeps the keys the README cites)."""


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = bench_parser(__doc__)
    parser.add_argument(
        "--concurrency", type=int, default=16, help="client connections (closed loop)"
    )
    parser.add_argument("--duration-s", type=float, default=None, help="measured seconds per round")
    parser.add_argument("--warmup-s", type=float, default=None)
    parser.add_argument(
        "--rounds", type=int, default=None, help="alternating rounds per system (best kept)"
    )
    args = parser.parse_args(argv)
    args.duration_s = args.duration_s or (4.0 if args.quick else 10.0)
    args.warmup_s = args.warmup_s if args.warmup_s is not None else (1.0 if args.quick else 2.0)
    args.rounds = args.rounds or (1 if args.quick else 2)
    cases = make_cases()

    best, rounds, failed = alternate_rounds(args, SYSTEMS, cases, "gshare-bench-")
    if failed:
        raise SystemExit(f"a system did not start: {failed}")
    summary: dict[str, Any] = {}
    for case, sfx in SUFFIX.items():
        g, s = best[("gshare", case)], best[("ray-serve", case)]
        summary[f"throughput_ratio_vs_rayserve{sfx}"] = ratio(g["rps"], s["rps"])
        summary[f"p99_ratio_vs_rayserve{sfx}"] = ratio(g["p99_ms"], s["p99_ms"])
    summary["binary_over_json_1mb"] = ratio(
        best[("gshare", "oip-binary")]["rps"], best[("gshare", "oip-json")]["rps"]
    )
    summary["rayserve_binary_over_json_1mb"] = ratio(
        best[("ray-serve", "oip-binary")]["rps"], best[("ray-serve", "oip-json")]["rps"]
    )
    for case, sfx in SUFFIX.items():
        for system, prefix in (("gshare", "gshare"), ("ray-serve", "rayserve")):
            b = best[(system, case)]
            summary[f"{prefix}_rps{sfx}"] = b["rps"]
            summary[f"{prefix}_p50_ms{sfx}"] = b["p50_ms"]
            summary[f"{prefix}_p99_ms{sfx}"] = b["p99_ms"]
            summary[f"{prefix}_errors{sfx}"] = sum(
                x["errors"] for x in rounds if x["system"] == system and x["case"] == case
            )
    summary.update(machine_load())
    print_table(
        f"{args.concurrency} connections, {args.duration_s:g} s per round, best of {args.rounds}; "
        f"OIP cases: one FP32 tensor of {np.prod(TENSOR_SHAPE) * 4 >> 20} MiB",
        ["case", "system", "requests/s", "p50 ms", "p99 ms", "errors", "ratio vs Ray Serve"],
        [
            [
                case,
                system,
                b["rps"],
                b["p50_ms"],
                b["p99_ms"],
                b["errors"],
                summary[f"throughput_ratio_vs_rayserve{SUFFIX[case]}"]
                if system == "gshare"
                else "",
            ]
            for (system, case), b in sorted(
                best.items(), key=lambda kv: (list(SUFFIX).index(kv[0][1]), kv[0][0])
            )
        ],
    )
    print_table("summary", ["key", "value"], [[k, v] for k, v in summary.items()])
    write_json(
        args.json,
        summary,
        benchmark="gateway",
        params={
            "concurrency": args.concurrency,
            "duration_s": args.duration_s,
            "warmup_s": args.warmup_s,
            "rounds": args.rounds,
            "payload_bytes": len(PAYLOAD),
            "tensor_shape": list(TENSOR_SHAPE),
            "request_bytes": {c.name: len(c.body) for c in cases},
        },
        rows=rounds,
    )
    print_errors(best)
    return summary


if __name__ == "__main__":
    main()
