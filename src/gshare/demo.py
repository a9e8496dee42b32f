"""``make demo`` (live part): two functions share this machine with different quotas, then an
image workflow runs under an open-loop load against its SLO.

    .venv/bin/python -m gshare.demo [--duration-s 30] [--concurrency 3]
                                    [--workflow-duration-s 15] [--workflow-rps 1]
                                    [--workflow-policy esg|direct|...]

1. starts ``gshare serve`` in the background (a temporary state directory, any free port);
2. deploys ``examples/demo-vision.yaml`` (ResNet-50, 60 % of every window) and
   ``examples/demo-text.yaml`` (BERT-base, 30 %): both take every core, so the token scheduler
   runs them one at a time and each should get its quota when both are saturated;
3. waits for both instances, then drives each function with a closed loop of
   ``--concurrency`` requests for ``--duration-s`` seconds, with a live display;
4. prints, per function: requests, errors, p50/p99 latency, the device share its instance
   achieved (time charged by the token server over the load phase ÷ wall time) against the
   share it requested, and its instances;
5. deletes both, deploys ``examples/swin2sr.yaml`` and ``examples/resnet50.yaml`` and the
   workflow ``examples/workflows/image-classification.yaml`` (super-resolution, then
   classification of its output), and drives the workflow with an open-loop Poisson load
   (``--workflow-rps`` requests per second for ``--workflow-duration-s`` seconds, a 64x64 image
   each, every answer awaited);
6. prints the workflow's requests, errors, SLO hit rate, p50/p99 end-to-end latency (measured by
   this client) and the server's ``gshare_workflow_slo_total`` counters from ``/metrics``;
7. stops the server (SIGTERM) and checks that none of its processes is left.

Every number comes from the running system: latencies from this client, shares from the
token servers' accounting (``/system/function/{name}``), instances from the controller.

The server is started, checked for readiness and stopped by ``gshare.testing.ServeProcess``,
the harness the tests and benches use too. This module is a client program (layer 3,
docs/DESIGN.md §1): it talks to the runtime over HTTP only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.live import Live
from rich.table import Table

from gshare.runtime.client import Client
from gshare.testing import ServeProcess, ServeStartError
from gshare.workflows.dag import render_stages

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if not EXAMPLES.is_dir():  # not an editable install: run from the repository root
    EXAMPLES = Path.cwd() / "examples"
SPECS = ("demo-vision.yaml", "demo-text.yaml")
WORKFLOW = "workflows/image-classification.yaml"
WORKFLOW_FUNCTIONS = ("swin2sr.yaml", "resnet50.yaml")
console = Console(width=None if sys.stdout.isatty() else 150)


def percentile_ms(latencies_s: list[float], q: float) -> float:
    """The ``q``-th percentile of latencies in seconds, in ms (nan when there are none)."""
    xs = sorted(latencies_s)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, int(q / 100.0 * len(xs)))] * 1000.0


@dataclass
class Load:
    name: str
    payload: bytes
    content_type: str
    latencies_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    first_share: tuple[float, float] | None = None
    last_share: tuple[float, float] | None = None
    requested: float = 0.0
    instances: list[dict[str, Any]] = field(default_factory=list)

    def pct(self, q: float) -> float:
        return percentile_ms(self.latencies_s, q)

    @property
    def achieved(self) -> float | None:
        if self.first_share is None or self.last_share is None:
            return None
        (u0, t0), (u1, t1) = self.first_share, self.last_share
        return (u1 - u0) / ((t1 - t0) * 1000.0) if t1 > t0 else None


def _payload(model: str) -> tuple[bytes, str]:
    if model == "resnet50":
        import numpy as np

        img = np.random.default_rng(0).random((3, 224, 224), dtype=np.float32)
        return img.astype("<f4").tobytes(), "application/octet-stream"
    return json.dumps(
        "gshare shares one machine between two functions, in space and in time"
    ).encode(), "application/json"


def start_server(state: Path, log: Path, *args: str) -> ServeProcess:
    srv = ServeProcess(*args, state_dir=state, log_path=log, start_timeout_s=180)
    t0 = time.monotonic()
    with console.status("starting gshare serve (Ray, node agent, gateway) ..."):
        try:
            srv.start()
        except ServeStartError as e:
            raise SystemExit(str(e)) from None
    console.print(f"gshare serve is up at {srv.url} ({time.monotonic() - t0:.1f} s)")
    return srv


def _share_point(st: dict[str, Any]) -> tuple[float, float] | None:
    for i in st["instances"]:
        if i.get("token_used_ms") is not None and i.get("token_clock_s") is not None:
            return float(i["token_used_ms"]), float(i["token_clock_s"])
    return None


async def _drive(
    url: str, loads: list[Load], client: Client, duration_s: float, concurrency: int
) -> None:
    end = time.monotonic() + duration_s
    t_start = time.monotonic()

    async def worker(http: httpx.AsyncClient, ld: Load) -> None:
        while time.monotonic() < end:
            t0 = time.perf_counter()
            try:
                r = await http.post(
                    f"/function/{ld.name}",
                    content=ld.payload,
                    headers={"content-type": ld.content_type},
                )
                if r.status_code == 200:
                    ld.latencies_s.append(time.perf_counter() - t0)
                else:
                    ld.errors.append(f"HTTP {r.status_code}: {r.text[:100]}")
            except httpx.HTTPError as e:
                ld.errors.append(str(e))

    def render() -> Table:
        el = time.monotonic() - t_start
        t = Table(
            title=f"load: {min(el, duration_s):.0f} / {duration_s:.0f} s, "
            f"{concurrency} requests in flight per function",
            box=None,
        )
        for c in (
            "function",
            "requests",
            "errors",
            "rps",
            "p50 ms",
            "p99 ms",
            "share now / requested",
        ):
            t.add_column(c, justify="left" if c == "function" else "right")
        for ld in loads:
            now = ld.instances[0].get("achieved_share") if ld.instances else None
            t.add_row(
                ld.name,
                str(len(ld.latencies_s)),
                str(len(ld.errors)),
                f"{len(ld.latencies_s) / max(el, 1e-9):.1f}",
                f"{ld.pct(50):.0f}",
                f"{ld.pct(99):.0f}",
                f"{'-' if now is None else f'{now:.2f}'} / {ld.requested:.2f}",
            )
        return t

    async def sampler(live: Live) -> None:
        while time.monotonic() < end:
            for ld in loads:
                with contextlib.suppress(Exception):
                    st = await asyncio.to_thread(client.get, ld.name)
                    ld.instances = st["instances"]
                    pt = _share_point(st)
                    if pt is not None:
                        if ld.first_share is None:
                            ld.first_share = pt
                        ld.last_share = pt
            live.update(render())
            await asyncio.sleep(1.0)

    limits = httpx.Limits(max_connections=concurrency * len(loads) + 4)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as http:
        with Live(render(), console=console, refresh_per_second=4) as live:
            await asyncio.gather(
                sampler(live), *(worker(http, ld) for ld in loads for _ in range(concurrency))
            )
            live.update(render())


# -- the workflow part ------------------------------------------------------------------------


@dataclass
class WorkflowLoad:
    name: str
    slo_ms: float
    latencies_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    sent: int = 0

    def pct(self, q: float) -> float:
        return percentile_ms(self.latencies_s, q)

    @property
    def hits(self) -> int:
        return sum(1 for x in self.latencies_s if x * 1000.0 <= self.slo_ms)

    @property
    def hit_rate(self) -> float:
        """SLO hits over all requests answered (an error is a miss)."""
        n = len(self.latencies_s) + len(self.errors)
        return self.hits / n if n else float("nan")


def _workflow_payload() -> bytes:
    """A 64x64 image (swin2sr's input size) as raw little-endian float32 bytes."""
    import numpy as np

    return np.random.default_rng(1).random((3, 64, 64), dtype=np.float32).astype("<f4").tobytes()


async def _drive_workflow(
    url: str, wl: WorkflowLoad, payload: bytes, duration_s: float, rps: float
) -> None:
    """Open loop: Poisson arrivals at ``rps`` for ``duration_s``; every request is awaited."""
    import random

    rng = random.Random(7)
    t_start = time.monotonic()
    end = t_start + duration_s

    async def one(http: httpx.AsyncClient) -> None:
        t0 = time.perf_counter()
        try:
            r = await http.post(
                f"/workflow/{wl.name}",
                content=payload,
                headers={"content-type": "application/octet-stream"},
            )
            if r.status_code == 200:
                wl.latencies_s.append(time.perf_counter() - t0)
            else:
                wl.errors.append(f"HTTP {r.status_code}: {r.text[:200]}")
        except httpx.HTTPError as e:
            wl.errors.append(f"{type(e).__name__}: {e}")

    def render() -> Table:
        el = min(time.monotonic() - t_start, duration_s)
        t = Table(
            title=f"workflow {wl.name}: {el:.0f} / {duration_s:.0f} s of Poisson arrivals at "
            f"{rps:g}/s, SLO {wl.slo_ms:g} ms",
            box=None,
        )
        for c in ("sent", "answered", "errors", "SLO hit rate", "p50 ms", "p99 ms"):
            t.add_column(c, justify="right")
        hr = wl.hit_rate
        t.add_row(
            str(wl.sent),
            str(len(wl.latencies_s)),
            str(len(wl.errors)),
            "-" if hr != hr else f"{hr:.1%}",
            f"{wl.pct(50):.0f}",
            f"{wl.pct(99):.0f}",
        )
        return t

    tasks: list[asyncio.Task[None]] = []
    # a request not answered within 30 s (or 10 SLOs) is an error: the demo stays short
    timeout_s = max(30.0, 10.0 * wl.slo_ms / 1000.0)
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s) as http:
        with Live(render(), console=console, refresh_per_second=4) as live:
            nxt = time.monotonic() + rng.expovariate(rps)
            while nxt < end:
                await asyncio.sleep(max(0.0, nxt - time.monotonic()))
                tasks.append(asyncio.create_task(one(http)))
                wl.sent += 1
                live.update(render())
                nxt += rng.expovariate(rps)
            while any(not t.done() for t in tasks):
                await asyncio.sleep(0.25)
                live.update(render())
            live.update(render())


def _workflow_metrics(url: str, workflow: str) -> tuple[dict[str, float], list[str]]:
    """From the server's ``/metrics``: ``gshare_workflow_slo_total`` of ``workflow`` by outcome
    (hit, miss), and per stage its mean queueing and execution time and its tasks by quota
    when the server's stage scheduler reports them (``--workflow-policy``, ESG by default)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10).text
    slo: dict[str, float] = {}
    sums: dict[tuple[str, str], float] = {}
    tasks: dict[str, list[str]] = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.labels.get("workflow") != workflow:
                continue
            stage = smp.labels.get("stage", "")
            if smp.name == "gshare_workflow_slo_total":
                slo[smp.labels.get("outcome", "?")] = smp.value
            elif smp.name.startswith(
                ("gshare_workflow_stage_queue_seconds_", "gshare_workflow_stage_exec_seconds_")
            ) and smp.name.endswith(("_sum", "_count")):
                sums[(stage, smp.name.removeprefix("gshare_workflow_stage_"))] = smp.value
            elif smp.name == "gshare_workflow_tasks_total" and smp.value:
                tasks.setdefault(stage, []).append(
                    f"{smp.value:.0f} at quota {smp.labels.get('quota_pct', '?')}%"
                )
    stages: list[str] = []
    for stage in dict.fromkeys(st for st, _ in sums):
        parts = []
        for what in ("queue", "exec"):
            n = sums.get((stage, f"{what}_seconds_count"), 0.0)
            if n:
                mean = sums.get((stage, f"{what}_seconds_sum"), 0.0) / n * 1000.0
                parts.append(f"{what} {mean:.0f} ms")
        if tasks.get(stage):
            parts.append("tasks " + ", ".join(tasks[stage]))
        stages.append(f"{stage}: " + ", ".join(parts))
    return slo, stages


def run_workflow_part(
    client: Client,
    url: str,
    log: Path,
    duration_s: float,
    rps: float,
    drop: list[str],
    policy: str | None = None,
) -> bool:
    """Step 5-6 of the module doc; True when the workflow answered at least one request."""
    for name in drop:  # frees the device (the demo functions take all of it) and the cores
        client.delete(name)
    for spec in WORKFLOW_FUNCTIONS:
        out = client.deploy(str(EXAMPLES / spec))
        res = out["spec"]["resources"]
        console.print(
            f"deployed {out['name']}: {out['spec']['model']}, sm {res['sm_pct']:g}%, quota "
            f"{res['quota_request']:g} (limit {res['quota_limit']:g}), "
            f"batch {out['spec']['batching']['max_batch']}, SLO {out['spec']['slo_ms']:g} ms"
        )
    name = client.deploy_workflow(EXAMPLES / WORKFLOW)["name"]
    wf = next(w for w in client.list_workflows() if w["name"] == name)
    wl = WorkflowLoad(name, float(wf["slo_ms"]))
    stages = render_stages(wf["stages"])
    console.print(
        f"deployed workflow {wl.name}: {stages}, SLO {wl.slo_ms:g} ms end to end; stages "
        f"scheduled by gshare serve --workflow-policy {policy or 'esg (the default)'}"
    )
    payload = _workflow_payload()
    with console.status("waiting for the workflow's functions ..."):
        t0 = time.monotonic()
        for spec in WORKFLOW_FUNCTIONS:
            name = spec.removesuffix(".yaml")
            while client.get(name)["availableReplicas"] < 1:
                if time.monotonic() - t0 > 300:
                    raise SystemExit(f"{name} not ready after 300 s; log: {log}")
                time.sleep(0.5)
        # one request through the chain: first-call warm-up is not part of the measurement
        client.invoke_workflow_raw(wl.name, payload)
    console.print(f"workflow ready ({time.monotonic() - t0:.1f} s)")
    asyncio.run(_drive_workflow(url, wl, payload, duration_s, rps))
    console.print()
    table = Table(
        title=f"gshare demo: workflow {wl.name}, {duration_s:g} s of open-loop Poisson load "
        f"at {rps:g} requests/s (client-measured, end to end)"
    )
    for c in ("workflow", "requests", "errors", "SLO ms", "SLO hit rate", "p50 ms", "p99 ms"):
        table.add_column(c, justify="left" if c == "workflow" else "right")
    hr = wl.hit_rate
    table.add_row(
        wl.name,
        str(len(wl.latencies_s) + len(wl.errors)),
        str(len(wl.errors)),
        f"{wl.slo_ms:g}",
        "-" if hr != hr else f"{hr:.1%} ({wl.hits})",
        f"{wl.pct(50):.0f}",
        f"{wl.pct(99):.0f}",
    )
    console.print(table)
    if wl.errors:
        console.print(f"{wl.name}: first error: {wl.errors[0]}")
    with contextlib.suppress(Exception):
        counters, stage_lines = _workflow_metrics(url, wl.name)
        hit, miss = counters.get("hit", 0.0), counters.get("miss", 0.0)
        rate = f"{hit / (hit + miss):.1%}" if hit + miss else "-"
        console.print(
            f"server: gshare_workflow_slo_total{{workflow={wl.name!r}}} hit {hit:.0f}, miss "
            f"{miss:.0f} ({rate} of the requests answered, warm-up included)"
        )
        for line in stage_lines:
            console.print(f"server: stage {line} (mean per request)")
    return bool(wl.latencies_s)


def stop_server(srv: ServeProcess) -> tuple[int, int]:
    """SIGTERM the server; return (exit code, processes of its tree still alive after it)."""
    stopped = srv.stop(timeout_s=120, gone_timeout_s=20)
    return stopped.code, len(stopped.left)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--duration-s", type=float, default=30.0, help="load phase length")
    ap.add_argument("--concurrency", type=int, default=3, help="requests in flight per function")
    ap.add_argument(
        "--workflow-duration-s", type=float, default=15.0, help="workflow load phase (0: skip)"
    )
    ap.add_argument(
        "--workflow-rps", type=float, default=1.0, help="workflow requests per second (Poisson)"
    )
    ap.add_argument(
        "--workflow-policy",
        default=None,
        help="gshare serve --workflow-policy (default: the server's, esg; direct: each stage "
        "through its function's own queue)",
    )
    args = ap.parse_args(argv)

    if args.workflow_rps <= 0:
        ap.error("--workflow-rps must be positive")
    wf_ok = True
    with tempfile.TemporaryDirectory(prefix="gshare-demo-") as d:
        state, log = Path(d) / "state", Path(d) / "serve.log"
        extra = [] if args.workflow_policy is None else ["--workflow-policy", args.workflow_policy]
        srv = start_server(state, log, *extra)
        url = srv.url
        try:
            with Client(url, state_dir=state) as client:
                loads: list[Load] = []
                for spec in SPECS:
                    out = client.deploy(str(EXAMPLES / spec))
                    payload, ctype = _payload(out["spec"]["model"])
                    ld = Load(
                        out["name"],
                        payload,
                        ctype,
                        requested=out["spec"]["resources"]["quota_request"],
                    )
                    loads.append(ld)
                    res = out["spec"]["resources"]
                    console.print(
                        f"deployed {ld.name}: {out['spec']['model']}, sm {res['sm_pct']:g}%, quota "
                        f"{res['quota_request']:g} (limit {res['quota_limit']:g}), "
                        f"batch {out['spec']['batching']['max_batch']}"
                    )
                with console.status(
                    "waiting for both instances (model build, weights into the node's store) ..."
                ):
                    t0 = time.monotonic()
                    for ld in loads:
                        while client.get(ld.name)["availableReplicas"] < 1:
                            if time.monotonic() - t0 > 300:
                                raise SystemExit(f"{ld.name} not ready after 300 s; log: {log}")
                            time.sleep(0.5)
                        # one request each: first-call warm-up is not part of the measurement
                        client.invoke_raw(ld.name, ld.payload, ld.content_type)
                console.print(f"both instances ready ({time.monotonic() - t0:.1f} s)")
                asyncio.run(_drive(url, loads, client, args.duration_s, args.concurrency))
                console.print()
                for ld in loads:
                    st = client.get(ld.name)
                    ld.instances = st["instances"]
                    pt = _share_point(st)
                    if pt is not None:
                        ld.last_share = pt

                table = Table(
                    title=f"gshare demo: {args.duration_s:g} s of closed-loop load "
                    f"({args.concurrency} in flight per function)"
                )
                for c in (
                    "function",
                    "requests",
                    "errors",
                    "p50 ms",
                    "p99 ms",
                    "achieved share",
                    "requested share",
                    "instances",
                ):
                    table.add_column(
                        c, justify="left" if c in ("function", "instances") else "right"
                    )
                for ld in loads:
                    insts = ", ".join(
                        f"{i['id']} ({i['state']}, cores {i['cores']}, restarts {i['restarts']})"
                        for i in ld.instances
                    )
                    ach = ld.achieved
                    table.add_row(
                        ld.name,
                        str(len(ld.latencies_s)),
                        str(len(ld.errors)),
                        f"{ld.pct(50):.0f}",
                        f"{ld.pct(99):.0f}",
                        "-" if ach is None else f"{ach:.2f}",
                        f"{ld.requested:.2f}",
                        insts or "-",
                    )
                console.print(table)
                for ld in loads:
                    if ld.errors:
                        console.print(f"{ld.name}: first error: {ld.errors[0]}")
                console.print(
                    "achieved share = device time the token server charged to the instance during "
                    "the load phase ÷ wall time; both functions are saturated, so each should get "
                    "about its quota."
                )
                if args.workflow_duration_s > 0:
                    console.print()
                    wf_ok = run_workflow_part(
                        client,
                        url,
                        log,
                        args.workflow_duration_s,
                        args.workflow_rps,
                        [ld.name for ld in loads],
                        args.workflow_policy,
                    )
        finally:
            code, left = stop_server(srv)
            console.print(f"gshare serve stopped (exit code {code}); processes left behind: {left}")
    return 0 if code == 0 and left == 0 and wf_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
