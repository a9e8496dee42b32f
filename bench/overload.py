"""Overload: a closed loop of clients far beyond capacity on a function with a 20 ms SLO.

Usage: ``python bench/overload.py [--quick] [--json PATH] [--clients N] [--duration-s S]``

One ``gshare serve`` (a real server, ``gshare.testing.ServeProcess``), one function: the demo
handler ``Spin`` (``--spin-ms`` of CPU per request, 4 ms by default), ``slo_ms`` 20, one
instance (``min_instances`` = ``max_instances`` = 1: its capacity is fixed, so the figures are
not about autoscaling), batch 1. In the same run:

1. **capacity** -- a closed loop of ``--capacity-clients`` (4) for ``--duration-s``: the
   requests per second one instance serves when it is kept busy without a queue;
2. **overload** -- a closed loop of ``--clients`` (200; ``--quick`` 64) for the same time. A
   client sends, waits for the answer, and sends again at once; when it is shed (429) it waits
   what the answer's ``Retry-After`` says (whole seconds, x uniform 0.5-1.5), as a client
   honouring it does (urllib3's ``Retry``, most SDKs);
3. **overload, clients that ignore Retry-After** (a row, not the summary): the same, every
   client re-sending at once after a 429.

Summary (overload with well-behaved clients): ``goodput_rps`` (answers within the SLO per
second), ``capacity_rps``, ``goodput_over_capacity``, ``p99_ms_admitted`` (requests that were not
shed), ``shed_pct`` (429 among all answers), ``rss_growth_mb`` (the server process's resident
memory after the overload minus before it: the gateway's queues and connections), ``errors``
(answers other than 200 / 429), and ``done_when`` (the overload targets, docs/DESIGN.md
§12.2: ``p99_ms_admitted`` <= 10 x SLO, ``rss_growth_mb`` <= 50, ``goodput_rps`` >= 90 % of
``capacity_rps``).

The load generator is this process (asyncio, raw HTTP/1.1 keep-alive connections, one per
client); it shares the machine's two cores with the server, which the capacity phase does too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from _common import (
    bench_parser,
    machine_load,
    percentile,
    print_table,
    read_http_response,
    write_json,
)
from gshare.testing import ServeProcess, wait_until

REPO = Path(__file__).resolve().parents[1]
FUNCTION = "overload-fn"


@dataclass
class Phase:
    name: str
    clients: int
    duration_s: float
    honour_retry_after: bool
    latencies_ms: list[float] = field(default_factory=list)
    shed: int = 0
    errors: dict[int, int] = field(default_factory=dict)

    def row(self, slo_ms: float) -> dict[str, Any]:
        ok = len(self.latencies_ms)
        good = sum(1 for x in self.latencies_ms if x <= slo_ms)
        total = ok + self.shed + sum(self.errors.values())
        return {
            "phase": self.name,
            "clients": self.clients,
            "throughput_rps": ok / self.duration_s,
            "goodput_rps": good / self.duration_s,
            "p50_ms_admitted": percentile(self.latencies_ms, 50),
            "p99_ms_admitted": percentile(self.latencies_ms, 99),
            "shed_pct": 100.0 * self.shed / total if total else 0.0,
            "errors": sum(self.errors.values()),
            "error_codes": {str(k): v for k, v in sorted(self.errors.items())},
        }


def _request(port: int, body: bytes) -> bytes:
    return (
        f"POST /function/{FUNCTION} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _client(port: int, req: bytes, phase: Phase, t_end: float, rng: random.Random) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    try:
        while time.perf_counter() < t_end:
            t0 = time.perf_counter()
            writer.write(req)
            status, headers, _body = await read_http_response(reader)
            t1 = time.perf_counter()
            if t1 > t_end:
                break
            if status == 200:
                phase.latencies_ms.append((t1 - t0) * 1000.0)
            elif status == 429:
                phase.shed += 1
                if phase.honour_retry_after:
                    wait_s = float(headers.get("retry-after", "1") or 1)
                    await asyncio.sleep(wait_s * rng.uniform(0.5, 1.5))
            else:
                phase.errors[status] = phase.errors.get(status, 0) + 1
            if headers.get("connection", "").lower() == "close":
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _run(port: int, req: bytes, phase: Phase, seed: int) -> None:
    t_end = time.perf_counter() + phase.duration_s
    await asyncio.gather(
        *(
            _client(port, req, phase, t_end, random.Random(seed * 1000 + i))
            for i in range(phase.clients)
        )
    )


def _rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / (1 << 20)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = bench_parser(__doc__)
    parser.add_argument("--clients", type=int, default=None, help="overload clients (200)")
    parser.add_argument("--capacity-clients", type=int, default=4)
    parser.add_argument("--duration-s", type=float, default=None, help="per phase (20; quick 6)")
    parser.add_argument("--spin-ms", type=float, default=4.0)
    parser.add_argument("--slo-ms", type=float, default=20.0)
    parser.add_argument(
        "--max-wait-slo", type=float, default=None, help="gshare serve --max-wait-slo (default)"
    )
    args = parser.parse_args(argv)
    clients = args.clients or (64 if args.quick else 200)
    duration_s = args.duration_s or (6.0 if args.quick else 20.0)
    slo_ms = float(args.slo_ms)

    serve_args = [] if args.max_wait_slo is None else ["--max-wait-slo", str(args.max_wait_slo)]
    with ServeProcess(*serve_args, tiny_models=True, cwd=REPO) as srv:
        c = srv.client()
        c.deploy(
            {
                "name": FUNCTION,
                "handler": "gshare.runtime.demo_handlers:Spin",
                "device": "cpu",
                "slo_ms": slo_ms,
                "resources": {"sm_pct": 100, "quota_request": 1.0, "quota_limit": 1.0},
                "batching": {"max_batch": 1, "max_wait_ms": 0},
                "min_instances": 1,
                "max_instances": 1,
            }
        )
        wait_until(lambda: c.get(FUNCTION)["availableReplicas"] >= 1, 180, "the function")
        req = _request(srv.port, json.dumps({"spin_ms": args.spin_ms}).encode())
        warm = Phase("warm-up", args.capacity_clients, 2.0, True)
        asyncio.run(_run(srv.port, req, warm, args.seed))
        cap = Phase("capacity", args.capacity_clients, duration_s, True)
        asyncio.run(_run(srv.port, req, cap, args.seed))
        rss_before = _rss_mb(srv.pid)
        over = Phase("overload", clients, duration_s, True)
        asyncio.run(_run(srv.port, req, over, args.seed + 1))
        rss_after = _rss_mb(srv.pid)
        rude = Phase("overload, Retry-After ignored", clients, duration_s, False)
        asyncio.run(_run(srv.port, req, rude, args.seed + 2))
        rss_after_rude = _rss_mb(srv.pid)
        c.delete(FUNCTION)

    rows = [p.row(slo_ms) for p in (cap, over, rude)]
    capacity_rps = rows[0]["throughput_rps"]
    o = rows[1]
    summary: dict[str, Any] = {
        "goodput_rps": o["goodput_rps"],
        "capacity_rps": capacity_rps,
        "goodput_over_capacity": o["goodput_rps"] / capacity_rps if capacity_rps else None,
        "p99_ms_admitted": o["p99_ms_admitted"],
        "shed_pct": o["shed_pct"],
        "rss_growth_mb": rss_after - rss_before,
        "rss_growth_mb_rude": rss_after_rude - rss_before,
        "errors": o["errors"],
        "goodput_over_capacity_rude": rows[2]["goodput_rps"] / capacity_rps
        if capacity_rps
        else None,
        "p99_ms_admitted_rude": rows[2]["p99_ms_admitted"],
        "slo_ms": slo_ms,
        "clients": clients,
        "duration_s": duration_s,
        "spin_ms": args.spin_ms,
    }
    summary["done_when"] = {
        "p99_admitted_within_10x_slo": bool(o["p99_ms_admitted"] <= 10 * slo_ms),
        "rss_growth_within_50mb": bool(summary["rss_growth_mb"] <= 50),
        "goodput_at_least_90pct_of_capacity": bool(
            capacity_rps and o["goodput_rps"] >= 0.9 * capacity_rps
        ),
    }
    summary.update(machine_load())
    print_table(
        f"overload: {clients} clients on a {slo_ms:g} ms-SLO function ({args.spin_ms:g} ms of CPU)",
        ["phase", "clients", "ok/s", "goodput/s", "p50 ms", "p99 ms", "shed %", "errors"],
        [
            [
                r["phase"],
                r["clients"],
                r["throughput_rps"],
                r["goodput_rps"],
                r["p50_ms_admitted"],
                r["p99_ms_admitted"],
                r["shed_pct"],
                r["errors"],
            ]
            for r in rows
        ],
    )
    print(json.dumps({k: v for k, v in summary.items() if k != "done_when"}, indent=1))
    print("done_when:", summary["done_when"], file=sys.stderr)
    write_json(args.json, summary, rows=rows)
    return summary


if __name__ == "__main__":
    main()
