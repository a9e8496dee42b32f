"""Multi-node: throughput of a CPU-bound function on two single-core Ray nodes vs one, and a node
loss under load.

Usage: ``python bench/multinode.py [--quick] [--json PATH] [--duration-s S] [--clients N]``

The nodes are raylets on this host made with Ray's own cluster utilities
(``ray.cluster_utils.Cluster``), each confined to one core: a raylet started while this process's
affinity is {c} passes it to every process it starts (its workers, the node agent, the fork
template, the instances). ``gshare serve --address`` runs on the head with both cores; traffic
to the worker node's instance goes over TCP (authenticated), as across hosts.

1. **one node** -- the head (core 0) only; the function (demo handler ``Spin``, ``--spin-ms`` of
   CPU per request, 10 ms) has one instance of a whole node (SM 100 %, quota 1); a closed loop
   of ``--clients`` (8) for ``--duration-s`` (20; quick 6): ``throughput_1_node_rps``;
2. **two nodes** -- a worker (core 1) joins, the function is scaled to two instances (one per
   node: each fills its node's device); same load: ``throughput_2_nodes_rps``;
3. **node loss** -- under the same load the worker is removed without grace (its raylet and
   every process on it die) and a replacement worker (core 1) is added at once, as a cluster
   manager would. ``lost_requests``: requests never answered (a client timeout, or an error
   without a message); ``failed_requests_on_node_loss``: explicit errors; ``recovery_s``: from the
   loss to the first 1-s window whose throughput is back to 90 % of the two-node throughput.

Summary: ``throughput_ratio_2_vs_1_nodes`` (target >= 1.6), ``lost_requests`` (target 0),
``failed_requests_on_node_loss``, ``recovery_s``, ``done_when``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from _common import bench_parser, machine_load, print_table, read_http_response, write_json
from gshare.testing import ServeProcess, wait_until

REPO = Path(__file__).resolve().parents[1]
FUNCTION = "mn-spin"


@dataclass
class Run:
    ok_s: list[float] = field(default_factory=list)
    """Completion times (monotonic) of the 200 answers."""
    failed: list[tuple[float, int, str]] = field(default_factory=list)
    lost: int = 0


def spec(n: int) -> dict[str, Any]:
    return {
        "name": FUNCTION,
        "handler": "gshare.runtime.demo_handlers:Spin",
        "device": "cpu",
        "resources": {"sm_pct": 100, "quota_request": 1.0, "quota_limit": 1.0},
        "batching": {"max_batch": 1, "max_wait_ms": 0},
        "min_instances": n,
        "max_instances": n,
    }


async def _client(port: int, req: bytes, run: Run, t_end: float) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    try:
        while time.monotonic() < t_end:
            try:
                status, _h, body = await asyncio.wait_for(read_after_send(reader, writer, req), 90)
            except TimeoutError:
                run.lost += 1
                return
            now = time.monotonic()
            if status == 200:
                run.ok_s.append(now)
            else:
                try:
                    msg = str(json.loads(body).get("error", ""))
                except ValueError:
                    msg = ""
                if msg:
                    run.failed.append((now, status, msg))
                else:
                    run.lost += 1
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def read_after_send(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, req: bytes
) -> tuple[int, dict[str, str], bytes]:
    writer.write(req)
    return await read_http_response(reader)


async def _load(port: int, req: bytes, clients: int, duration_s: float, run: Run) -> None:
    t_end = time.monotonic() + duration_s
    await asyncio.gather(*(_client(port, req, run, t_end) for _ in range(clients)))


def _request(port: int, spin_ms: float) -> bytes:
    body = json.dumps({"spin_ms": spin_ms}).encode()
    return (
        f"POST /function/{FUNCTION} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def _ready(srv: ServeProcess) -> int:
    return int(srv.client().get(FUNCTION)["availableReplicas"])


@contextlib.contextmanager
def _affinity(cores: set[int]) -> Any:
    """This process's CPU affinity set to ``cores`` while a node is started (its processes
    inherit it), restored after."""
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, old)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from ray.cluster_utils import Cluster

    parser = bench_parser(__doc__)
    parser.add_argument("--duration-s", type=float, default=None)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--spin-ms", type=float, default=10.0)
    args = parser.parse_args(argv)
    duration_s = args.duration_s or (6.0 if args.quick else 20.0)
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        print("multinode: needs two cores", file=sys.stderr)
        return {}
    c0, c1 = {cores[0]}, {cores[1]}
    with _affinity(c0):
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    rows: list[dict[str, Any]] = []
    try:
        with ServeProcess(
            "--address", cluster.address, "--request-timeout-s", "60", tiny_models=True, cwd=REPO
        ) as srv:
            c = srv.client()
            req = _request(srv.port, args.spin_ms)
            c.deploy(spec(1))
            wait_until(lambda: _ready(srv) >= 1, 180, "one instance")
            asyncio.run(_load(srv.port, req, args.clients, 2.0, Run()))  # warm-up
            one = Run()
            asyncio.run(_load(srv.port, req, args.clients, duration_s, one))
            with _affinity(c1):
                worker = cluster.add_node(num_cpus=1)
            wait_until(lambda: len(c.info()["nodes"]) >= 2, 90, "the worker's agent")
            c.deploy(spec(2))
            wait_until(lambda: _ready(srv) >= 2, 180, "two instances")
            nodes = {i["node_id"] for i in c.get(FUNCTION)["instances"]}
            assert len(nodes) == 2, f"both instances on one node: {nodes}"
            asyncio.run(_load(srv.port, req, args.clients, 2.0, Run()))  # warm-up
            two = Run()
            asyncio.run(_load(srv.port, req, args.clients, duration_s, two))
            tput1 = len(one.ok_s) / duration_s
            tput2 = len(two.ok_s) / duration_s
            rows += [
                {"run": "one node", "nodes": 1, "throughput_rps": tput1},
                {"run": "two nodes", "nodes": 2, "throughput_rps": tput2},
            ]
            # node loss under load, a replacement joins at once (Ray's cluster utilities must
            # run in the main thread: the load runs in another one)
            loss = Run()
            t_loss: list[float] = []
            loader = threading.Thread(
                target=lambda: asyncio.run(
                    _load(srv.port, req, args.clients, duration_s + 30.0, loss)
                ),
                daemon=True,
            )
            loader.start()
            time.sleep(min(3.0, duration_s / 4))
            t_loss.append(time.monotonic())
            cluster.remove_node(worker, allow_graceful=False)
            with _affinity(c1):
                cluster.add_node(num_cpus=1)
            loader.join(duration_s + 150.0)
            t0 = t_loss[0]
            recovery_s = None
            horizon = max(loss.ok_s, default=t0)
            t = t0
            while t + 1.0 <= horizon:
                n = sum(1 for x in loss.ok_s if t <= x < t + 1.0)
                if n >= 0.9 * tput2:
                    recovery_s = t - t0
                    break
                t += 0.25
            failed = [f for f in loss.failed if f[0] >= t0]
            rows.append(
                {
                    "run": "node loss (replacement joins)",
                    "nodes": 2,
                    "throughput_rps": len(loss.ok_s) / (duration_s + 30.0),
                    "failed": len(failed),
                    "lost": loss.lost,
                    "recovery_s": recovery_s,
                    "error_codes": sorted({f[1] for f in failed}),
                }
            )
            with contextlib.suppress(httpx.HTTPError):
                c.delete(FUNCTION)
    finally:
        cluster.shutdown()
    summary: dict[str, Any] = {
        "throughput_1_node_rps": tput1,
        "throughput_2_nodes_rps": tput2,
        "throughput_ratio_2_vs_1_nodes": tput2 / tput1 if tput1 else None,
        "lost_requests": one.lost + two.lost + loss.lost,
        "failed_requests_on_node_loss": rows[-1]["failed"],
        "recovery_s": recovery_s,
        "clients": args.clients,
        "spin_ms": args.spin_ms,
        "duration_s": duration_s,
    }
    summary["done_when"] = {
        "ratio_at_least_1_6": bool((summary["throughput_ratio_2_vs_1_nodes"] or 0) >= 1.6),
        "nothing_lost": summary["lost_requests"] == 0,
        "recovery_reported": recovery_s is not None,
    }
    summary.update(machine_load())
    print_table(
        "multi-node (raylets on one host, one core each)",
        ["run", "nodes", "ok/s", "failed", "lost", "recovery s"],
        [
            [
                r["run"],
                r["nodes"],
                r["throughput_rps"],
                r.get("failed", 0),
                r.get("lost", 0),
                r.get("recovery_s"),
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
