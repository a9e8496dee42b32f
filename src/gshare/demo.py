"""``make demo`` (live part): two functions share this machine with different quotas.

    .venv/bin/python -m gshare.demo [--duration-s 30] [--concurrency 3]

1. starts ``gshare serve`` in the background (a temporary state directory, any free port);
2. deploys ``examples/demo-vision.yaml`` (ResNet-50, 60 % of every window) and
   ``examples/demo-text.yaml`` (BERT-base, 30 %): both take every core, so the token scheduler
   runs them one at a time and each should get its quota when both are saturated;
3. waits for both instances, then drives each function with a closed loop of
   ``--concurrency`` requests for ``--duration-s`` seconds, with a live display;
4. prints, per function: requests, errors, p50/p99 latency, the device share its instance
   achieved (time charged by the token server over the load phase ÷ wall time) against the
   share it requested, and its instances;
5. stops the server (SIGTERM) and checks that none of its processes is left.

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

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if not EXAMPLES.is_dir():  # not an editable install: run from the repository root
    EXAMPLES = Path.cwd() / "examples"
SPECS = ("demo-vision.yaml", "demo-text.yaml")
console = Console(width=None if sys.stdout.isatty() else 150)


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
        xs = sorted(self.latencies_s)
        if not xs:
            return float("nan")
        return xs[min(len(xs) - 1, int(q / 100.0 * len(xs)))] * 1000.0

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


def start_server(state: Path, log: Path) -> ServeProcess:
    srv = ServeProcess(state_dir=state, log_path=log, start_timeout_s=180)
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


def stop_server(srv: ServeProcess) -> tuple[int, int]:
    """SIGTERM the server; return (exit code, processes of its tree still alive after it)."""
    stopped = srv.stop(timeout_s=120, gone_timeout_s=20)
    return stopped.code, len(stopped.left)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--duration-s", type=float, default=30.0, help="load phase length")
    ap.add_argument("--concurrency", type=int, default=3, help="requests in flight per function")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="gshare-demo-") as d:
        state, log = Path(d) / "state", Path(d) / "serve.log"
        srv = start_server(state, log)
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
        finally:
            code, left = stop_server(srv)
            console.print(f"gshare serve stopped (exit code {code}); processes left behind: {left}")
    return 0 if code == 0 and left == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
