"""Requests/s and p99 latency of a trivial function through gshare's gateway vs Ray Serve.

Same machine, same run, same client, same function:

* the function echoes its request body (``gshare.runtime.demo_handlers:Echo`` in gshare; an
  ``async def __call__`` returning ``await request.body()`` in Ray Serve), one instance /
  replica, no batching on either side (``max_batch: 1``; Ray Serve without ``@serve.batch``),
  a whole device share for gshare's instance (sm 100 %, quota 1.0) and
  ``max_ongoing_requests`` = the client's concurrency for Ray Serve's replica (it is never
  throttled below what the client sends);
* each server runs in its own process tree (``gshare serve`` with a temporary state
  directory; ``serve.run`` in a child process), started, warmed up, measured, stopped — never
  both at once;
* the client is this process: a small asyncio HTTP/1.1 load generator with ``--concurrency``
  keep-alive connections in a closed loop (each sends its next request when the previous
  answer arrived) for ``--duration-s`` after ``--warmup-s``; it parses only the status line,
  Content-Length / chunked framing and the body, so it costs far less CPU than either server;
* rounds alternate gshare / Ray Serve ``--rounds`` times and each system keeps its best round
  (the machine is shared; the best round is the least disturbed one).

Summary: ``throughput_ratio_vs_rayserve`` (gshare rps ÷ Ray Serve rps, target ≥ 1) and
``p99_ratio_vs_rayserve`` (gshare p99 ÷ Ray Serve p99, lower is better), plus each system's
rps, p50, p99, errors, and the machine load.

    .venv/bin/python bench/gateway.py [--quick] [--json PATH] [--concurrency 16]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from _common import bench_parser, machine_load, percentile, print_table, write_json
from gshare.testing import ServeProcess, WaitTimeout, stop_process, wait_until

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
PAYLOAD = json.dumps({"x": list(range(16)), "hello": "gshare"}).encode()

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
    from starlette.requests import Request
    from starlette.responses import Response

    port, concurrency = int(sys.argv[1]), int(sys.argv[2])

    @serve.deployment(num_replicas=1, max_ongoing_requests=concurrency)
    class Echo:
        async def __call__(self, request: Request) -> Response:
            return Response(await request.body(), media_type="application/json")

    ray.init(address="local", include_dashboard=False, object_store_memory=256 << 20,
             logging_level="WARNING")
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(Echo.bind(), name="echo", route_prefix="/function/echo")
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the load generator --------------------------------------------------------------------------


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length = -1
    chunked = False
    for ln in lines[1:]:
        k, _, v = ln.partition(b":")
        k = k.strip().lower()
        if k == b"content-length":
            length = int(v.strip())
        elif k == b"transfer-encoding" and b"chunked" in v.lower():
            chunked = True
    if chunked:
        body = bytearray()
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            body += await reader.readexactly(size + 2)
            del body[-2:]
        return status, bytes(body)
    return status, await reader.readexactly(max(0, length))


async def _worker(
    port: int, path: str, t_start: float, t_end: float, lat: list[float], errors: list[str]
) -> int:
    req = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(PAYLOAD)}\r\n\r\n"
    ).encode() + PAYLOAD
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    n = 0
    try:
        while True:
            t0 = time.perf_counter()
            if t0 >= t_end:
                break
            writer.write(req)
            status, body = await _read_response(reader)
            t1 = time.perf_counter()
            if status != 200 or body != PAYLOAD:
                errors.append(f"HTTP {status}: {body[:120]!r}")
            elif t0 >= t_start:
                lat.append(t1 - t0)
                n += 1
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    return n


async def load(
    port: int, path: str, concurrency: int, warmup_s: float, duration_s: float
) -> dict[str, Any]:
    t_start = time.perf_counter() + warmup_s
    t_end = t_start + duration_s
    lat: list[float] = []
    errors: list[str] = []
    counts = await asyncio.gather(
        *(_worker(port, path, t_start, t_end, lat, errors) for _ in range(concurrency))
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


# -- the two systems -----------------------------------------------------------------------------


def run_gshare(args: Any, tmp: Path) -> dict[str, Any]:
    spec = tmp / "echo.yaml"
    spec.write_text(ECHO_SPEC)
    with ServeProcess(cwd=ROOT) as srv:  # a temporary state directory, any free port
        try:
            srv.client().deploy(spec.read_text())
        except Exception as e:
            raise SystemExit(f"gshare deploy failed: {e}") from None
        assert srv.proc is not None
        wait_http(srv.port, "/function/echo", 120, srv.proc)
        return asyncio.run(
            load(srv.port, "/function/echo", args.concurrency, args.warmup_s, args.duration_s)
        )


def run_rayserve(args: Any, tmp: Path) -> dict[str, Any]:
    port = free_port()
    app = tmp / "rayserve_echo.py"
    app.write_text(RAY_SERVE_APP)
    with open(tmp / f"rayserve-{port}.log", "wb") as log:
        proc = subprocess.Popen(
            [PY, str(app), str(port), str(args.concurrency)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_http(port, "/function/echo", 180, proc)
        return asyncio.run(
            load(port, "/function/echo", args.concurrency, args.warmup_s, args.duration_s)
        )
    finally:
        stop_process(proc)


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

    best: dict[str, dict[str, Any]] = {}
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gshare-bench-") as d:
        tmp = Path(d)
        for r in range(args.rounds):
            for name, fn in (("gshare", run_gshare), ("ray-serve", run_rayserve)):
                res = fn(args, tmp)
                res.update(system=name, round=r)
                rounds.append(res)
                print(
                    f"round {r} {name}: {res['rps']:.0f} rps, p50 {res['p50_ms']:.2f} ms, "
                    f"p99 {res['p99_ms']:.2f} ms, errors {res['errors']}",
                    file=sys.stderr,
                )
                if name not in best or res["rps"] > best[name]["rps"]:
                    best[name] = res
    g, s = best["gshare"], best["ray-serve"]
    summary: dict[str, Any] = {
        "throughput_ratio_vs_rayserve": g["rps"] / s["rps"] if s["rps"] else float("nan"),
        "p99_ratio_vs_rayserve": g["p99_ms"] / s["p99_ms"] if s["p99_ms"] else float("nan"),
        "gshare_rps": g["rps"],
        "rayserve_rps": s["rps"],
        "gshare_p50_ms": g["p50_ms"],
        "gshare_p99_ms": g["p99_ms"],
        "rayserve_p50_ms": s["p50_ms"],
        "rayserve_p99_ms": s["p99_ms"],
        "gshare_errors": sum(x["errors"] for x in rounds if x["system"] == "gshare"),
        "rayserve_errors": sum(x["errors"] for x in rounds if x["system"] == "ray-serve"),
        **machine_load(),
    }
    print_table(
        f"trivial function, {args.concurrency} connections, {args.duration_s:g} s per round, "
        f"best of {args.rounds}",
        ["system", "requests/s", "p50 ms", "p99 ms", "errors"],
        [[n, b["rps"], b["p50_ms"], b["p99_ms"], b["errors"]] for n, b in best.items()],
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
        },
        rows=rounds,
    )
    if g["errors"] or s["errors"]:
        print(
            f"errors: gshare {g['first_error']!r}, ray serve {s['first_error']!r}", file=sys.stderr
        )
    return summary


if __name__ == "__main__":
    main()
