"""``gshare load SCENARIO --url URL``: a scenario (``gshare.scenario``) against a live server.

1. **Deploy** (``deploy``): every function spec of the scenario (``Client.deploy``, an existing
   function is updated), then every workflow spec (``Client.deploy_workflow``); then wait until
   each function that keeps instances (``min_instances >= 1``) has a ready one — a failed start
   is an error naming the function and the server's reason.
2. **Inputs** (``request_bodies``): per workload, ``input`` (a file's bytes, sent as
   ``application/octet-stream``), ``input_json`` (``application/json``), or by default one
   item of the first function's first input (the workflow's first stage, or the function),
   read from its Open Inference Protocol metadata (``GET /v2/models/{name}``): zeros as raw
   little-endian bytes for FP32 / FP16 / FP64 / INT* tensors of fixed shape (a built-in reads
   raw float32 bytes), a short JSON list of token ids for an INT64 sequence, a short JSON
   string for BYTES. Anything else needs ``input`` or ``input_json``.
3. **Drive** (``drive``): the scenario's arrivals for the seed — ``scenario_arrivals``, the very
   times ``gshare simulate`` simulates — open loop: each request is sent at its time whatever
   is outstanding (``POST /workflow/{name}`` or ``POST /function/{name}``, one
   ``httpx.AsyncClient``), except that at most ``max_outstanding`` are in flight: an arrival
   beyond that is not sent and is counted as ``dropped_client`` (reported, never silent).
   Latency is client-side (send to answer); ``late_ms`` is how late the send was against its
   arrival time (the load generator's own lag); ``platform_ms`` is the latency beyond the
   instance's own measurements of a function request (``platform_share_ms``), ``exec_ms``
   the instance's compute time for it (``x-gshare-exec-ms``: its batch's), ``queue_ms`` its
   wait in the instance's queue and ``token_wait_ms`` its batch's wait for a time token
   (``x-gshare-queue-ms``, ``x-gshare-token-wait-ms``). After the last
   arrival the outstanding requests get ``timeout_s`` to answer; what has not is
   ``unfinished``. The generator's heap is frozen while it drives (``client_pauses``: its own
   garbage-collection pauses would otherwise be timed as the server's latency); the pauses
   left are in the summary (``client_gc``).
4. **Report**: the rows and summary of ``scenario_sim`` (same columns,
   ``scenario_rows.summarise``), plus per workflow the server's ``gshare_workflow_*`` counters
   (``/metrics``, the change over the run) and its cost per request when the server exports
   ``gshare_workflow_cost_usd``; per function the instances and devices it runs on at the end.

A request is a hit when it was answered with HTTP 200 within the SLO (the workflow's
``slo_ms``; the function's ``slo_ms``). A **generative** function's requests are streamed over
the OpenAI-compatible API with their trace token counts (``scenario_generate.
stream_completion``: TTFT, TPOT, tokens; a hit meets ``slo.ttft_ms`` and ``slo.tpot_ms``); its
summary has the simulator's TTFT / TPOT figures (``scenario_generate.summarise_generative``).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import httpx

from gshare.experiments.client_pauses import quiet_collector
from gshare.experiments.results import ExperimentResult
from gshare.experiments.scenario_arrivals import Arrival, request_tokens, scenario_arrivals
from gshare.experiments.scenario_generate import (
    GENERATIVE_COLUMNS,
    generative_functions,
    slo_of,
    stream_completion,
    summarise_generative,
)
from gshare.experiments.scenario_plots import latency_cdf_plot
from gshare.experiments.scenario_rows import REQUEST_COLUMNS, TIMING_COLUMNS, accounted, summarise
from gshare.scenario import Scenario, ScenarioError, Workload

Progress = Callable[[int, int, int, int, int], None]
"""``(sent, answered, outstanding, dropped, arrivals)`` after every change (the front end's
bar)."""

DEFAULT_MAX_OUTSTANDING = 256
DEFAULT_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 300.0
START_LEAD_S = 0.2
"""The first arrival is at ``START_LEAD_S`` + its time after the driver starts."""

_RAW_SIZES = {"FP32": 4, "FP16": 2, "FP64": 8, "INT64": 8, "INT32": 4, "INT16": 2, "INT8": 1,
              "UINT8": 1}  # fmt: skip


class LoadError(RuntimeError):
    """The live run cannot go on (a deployment failed, a function never became ready, no
    default input); the message is one line."""


# -- deploy -------------------------------------------------------------------------------------


def deploy(client: Any, scenario: Scenario, *, ready_timeout_s: float = READY_TIMEOUT_S) -> None:
    """Deploy the scenario's functions and workflows and wait for readiness (module doc).
    ``client``: a ``gshare.runtime.client.Client``."""
    from gshare.runtime.client import ClientError

    try:
        for spec in scenario.functions.values():
            client.deploy(spec)
        for name, path in scenario.workflow_files.items():
            del name
            client.deploy_workflow(path)
    except ClientError as e:
        raise LoadError(f"deploying the scenario failed: {e}") from None
    deadline = time.monotonic() + ready_timeout_s
    for name, spec in scenario.functions.items():
        if spec.min_instances < 1:
            continue
        while True:
            try:
                doc = client.get(name)
            except ClientError as e:
                raise LoadError(f"function {name!r}: {e}") from None
            if doc.get("availableReplicas"):
                break
            if doc.get("start_error"):
                raise LoadError(str(doc["start_error"]))  # "function 'x' failed to start: ..."
            if time.monotonic() > deadline:
                raise LoadError(
                    f"function {name!r} has no ready instance after {ready_timeout_s:g} s "
                    f"(last decision: {doc.get('last_decision')})"
                )
            time.sleep(0.2)


# -- inputs -------------------------------------------------------------------------------------


def _first_function(scenario: Scenario, w: Workload) -> str:
    if w.workflow is None:
        return str(w.function)
    wf = scenario.workflows[w.workflow]
    return wf.function_of(wf.topological_order()[0])


def default_body(metadata: Mapping[str, Any], function: str) -> tuple[bytes, str]:
    """One item of the function's first input (module doc) from its OIP model metadata."""
    inputs = metadata.get("inputs") or []
    if not inputs:
        raise LoadError(
            f"function {function!r} declares no inputs in its metadata: give the workload "
            "input (a file) or input_json"
        )
    first = inputs[0]
    dtype = str(first.get("datatype", ""))
    shape = [int(d) for d in first.get("shape", [])]
    item = shape[1:] if shape and shape[0] == -1 else shape
    if dtype in _RAW_SIZES and item and all(d > 0 for d in item):
        n = 1
        for d in item:
            n *= d
        return bytes(n * _RAW_SIZES[dtype]), "application/octet-stream"
    if dtype in ("INT64", "INT32") and len(item) == 1 and item[0] == -1:
        return json.dumps([101, 1104, 1101, 1108, 1108, 1111, 102]).encode(), "application/json"
    if dtype == "BYTES":
        return json.dumps("hello").encode(), "application/json"
    raise LoadError(
        f"no default input for function {function!r} (input {first.get('name')!r} "
        f"{dtype} {shape}): give the workload input (a file) or input_json"
    )


def request_bodies(scenario: Scenario, url: str) -> list[tuple[bytes, str]]:
    """The body and content type of every workload's requests (module doc; a generative
    function's are built per request: empty here)."""
    out: list[tuple[bytes, str]] = []
    meta: dict[str, Mapping[str, Any]] = {}
    gen = set(generative_functions(scenario))
    with httpx.Client(base_url=url, timeout=30) as http:
        for i, w in enumerate(scenario.workloads):
            if w.function in gen:
                out.append((b"", ""))
                continue
            if w.input is not None:
                out.append((Path(w.input).read_bytes(), "application/octet-stream"))
                continue
            if w.input_json is not None:
                out.append((json.dumps(w.input_json).encode(), "application/json"))
                continue
            fn = _first_function(scenario, w)
            if fn not in meta:
                try:
                    r = http.get(f"/v2/models/{fn}")
                    r.raise_for_status()
                    meta[fn] = r.json()
                except (httpx.HTTPError, ValueError) as e:
                    raise LoadError(
                        f"workloads.{i}: cannot read the metadata of {fn!r} for a default "
                        f"input ({e}): give input or input_json"
                    ) from None
            try:
                out.append(default_body(meta[fn], fn))
            except LoadError as e:
                raise LoadError(f"workloads.{i}: {e}") from None
    return out


# -- drive --------------------------------------------------------------------------------------


async def drive(
    url: str,
    arrivals: Sequence[Arrival],
    bodies: Sequence[tuple[bytes, str]],
    slos: Mapping[tuple[str, str], float | None],
    *,
    warmup_ms: float = 0.0,
    max_outstanding: int = DEFAULT_MAX_OUTSTANDING,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: Progress | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    generate: Mapping[int, tuple[int, int, float | None, float | None]] | None = None,
) -> list[dict[str, Any]]:
    """Send ``arrivals`` open loop (module doc); one row per arrival, in arrival order
    (``transport``: httpx's, for tests). ``generate``: per arrival index of a generative
    function, its prompt tokens, max tokens and SLO (``ttft_ms``, ``tpot_ms``): streamed."""
    gen = generate or {}
    rows: list[dict[str, Any]] = [{} for _ in arrivals]
    state = {"sent": 0, "answered": 0, "outstanding": 0, "dropped": 0}
    limits = httpx.Limits(
        max_connections=max_outstanding, max_keepalive_connections=max_outstanding
    )

    def report() -> None:
        if progress is not None:
            progress(
                state["sent"], state["answered"], state["outstanding"], state["dropped"],
                len(arrivals),
            )  # fmt: skip

    def base(i: int, a: Arrival) -> dict[str, Any]:
        return {
            "kind": a.kind,
            "name": a.target,
            "workload": a.workload,
            "request": i,
            "arrival_ms": a.time_ms,
            "latency_ms": None,
            "slo_ms": slos[(a.kind, a.target)],
            "hit": False,
            "status": "unfinished",
            "measured": a.time_ms >= warmup_ms,
            "cost_uusd": None,
            "code": None,
            "late_ms": None,
            "platform_ms": None,
            "exec_ms": None,
            "queue_ms": None,
            "token_wait_ms": None,
            "error": None,
        }

    async with httpx.AsyncClient(
        base_url=url, timeout=timeout_s, limits=limits, transport=transport
    ) as http:
        loop = asyncio.get_running_loop()

        async def one(i: int, a: Arrival, late_ms: float) -> None:
            row = rows[i]
            row["late_ms"] = late_ms
            body, ctype = bodies[a.workload]
            path = f"/workflow/{a.target}" if a.kind == "workflow" else f"/function/{a.target}"
            t0 = time.perf_counter()
            try:
                if i in gen:
                    p, m, ttft, tpot = gen[i]
                    await stream_completion(http, row, a.target, p, m, (ttft, tpot))
                    return
                r = await http.post(path, content=body, headers={"content-type": ctype})
                ms = (time.perf_counter() - t0) * 1000.0
                row["code"] = r.status_code
                if r.status_code == 200:
                    row["status"], row["latency_ms"] = "ok", ms
                    row["platform_ms"] = platform_share_ms(ms, r.headers)
                    row["exec_ms"] = _header_ms(r.headers, "x-gshare-exec-ms")
                    row["queue_ms"] = _header_ms(r.headers, "x-gshare-queue-ms")
                    row["token_wait_ms"] = _header_ms(r.headers, "x-gshare-token-wait-ms")
                    slo = row["slo_ms"]
                    row["hit"] = slo is not None and ms <= slo
                else:
                    row["status"] = "error"
                    row["error"] = _error_text(r)
            except httpx.TimeoutException:
                row["status"], row["error"] = "unfinished", f"no answer in {timeout_s:g} s"
            except httpx.HTTPError as e:
                row["status"], row["error"] = "error", f"{type(e).__name__}: {e}"
            finally:
                state["outstanding"] -= 1
                state["answered"] += 1
                report()

        tasks: list[asyncio.Task[None]] = []
        start = loop.time() + START_LEAD_S
        for i, a in enumerate(arrivals):
            rows[i] = base(i, a)
            due = start + a.time_ms / 1000.0
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if state["outstanding"] >= max_outstanding:
                rows[i]["status"] = "dropped_client"
                rows[i]["error"] = f"{max_outstanding} requests outstanding (--max-outstanding)"
                state["dropped"] += 1
                report()
                continue
            state["outstanding"] += 1
            state["sent"] += 1
            late = max(0.0, (loop.time() - due) * 1000.0)
            tasks.append(asyncio.create_task(one(i, a, late)))
            report()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s + 5.0)
        for t in tasks:
            if not t.done():
                t.cancel()
    return rows


TIMING_HEADERS: Final = ("x-gshare-queue-ms", "x-gshare-token-wait-ms", "x-gshare-exec-ms")
"""The instance's measurements of a function request that the gateway returns as headers (its
queue, its wait for the time token, its compute; ``runtime.gateway.asgi.timing_headers``)."""


def platform_share_ms(latency_ms: float, headers: Mapping[str, str]) -> float | None:
    """The platform's share of an answered function request: the client's latency beyond the
    instance's queue, token wait and compute (``TIMING_HEADERS``) — the HTTP exchange, the
    gateway, the hop to the instance and any wait for an instance at the gateway, what the
    simulator draws per request as ``platform_ms``. None when a header is missing or not a
    number (a workflow's answer, a server without them)."""
    parts = [_header_ms(headers, h) for h in TIMING_HEADERS]
    if any(v is None for v in parts):
        return None
    return max(0.0, latency_ms - sum(v for v in parts if v is not None))


def _header_ms(headers: Mapping[str, str], name: str) -> float | None:
    """A timing header's value in ms; None when it is missing or not a finite number."""
    try:
        v = float(headers[name])
    except (KeyError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _error_text(r: httpx.Response) -> str:
    try:
        doc = r.json()
        if isinstance(doc, dict) and "error" in doc:
            return f"HTTP {r.status_code}: {doc['error']}"[:300]
    except ValueError:
        pass
    return f"HTTP {r.status_code}: {r.text[:200]}"


# -- server metrics -------------------------------------------------------------------------------


def workflow_counters(text: str) -> dict[str, dict[str, float]]:
    """``gshare_workflow_*`` samples of a ``/metrics`` text per workflow, keyed
    ``name{other labels}`` (histogram buckets and ``_created`` left out)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith("gshare_workflow"):
            continue
        for s in fam.samples:
            if s.name.endswith(("_bucket", "_created")) or "workflow" not in s.labels:
                continue
            other = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "workflow")
            key = f"{s.name}{{{other}}}" if other else s.name
            out.setdefault(s.labels["workflow"], {})[key] = float(s.value)
    return out


def _metrics(url: str) -> str:
    try:
        return httpx.get(url.rstrip("/") + "/metrics", timeout=30).text
    except httpx.HTTPError:
        return ""


def _server_figures(
    before: Mapping[str, Mapping[str, float]], after: Mapping[str, Mapping[str, float]], name: str
) -> dict[str, Any]:
    b, a = before.get(name, {}), after.get(name, {})
    delta = {k: round(v - b.get(k, 0.0), 9) for k, v in sorted(a.items())}
    ok = sum(v for k, v in delta.items() if k.startswith("gshare_workflow_requests_total{code=200"))
    hit = delta.get("gshare_workflow_slo_total{outcome=hit}", 0.0)
    miss = delta.get("gshare_workflow_slo_total{outcome=miss}", 0.0)
    cost = delta.get("gshare_workflow_cost_usd_total")
    return {
        "counters": delta,
        "answered_ok": ok,
        "slo_hit_rate": hit / (hit + miss) if hit + miss else None,
        "cost_uusd": cost * 1e6 if cost is not None else None,
        "cost_per_request_usd": cost / ok if cost is not None and ok else None,
    }


def _placement(client: Any, name: str) -> dict[str, Any]:
    from gshare.runtime.client import ClientError

    try:
        doc = client.get(name)
    except ClientError:
        return {}
    insts = doc.get("instances") or []
    return {
        "instances_end": len(insts),
        "devices_end": len({(i.get("node_id"), i.get("device")) for i in insts}),
    }


# -- the command ----------------------------------------------------------------------------------


def run_load(
    scenario: Scenario,
    url: str,
    *,
    token: str | None = None,
    state_dir: Path | None = None,
    duration_s: float | None = None,
    seed: int | None = None,
    max_outstanding: int = DEFAULT_MAX_OUTSTANDING,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    ready_timeout_s: float = READY_TIMEOUT_S,
    progress: Progress | None = None,
    on_phase: Callable[[str], None] | None = None,
) -> ExperimentResult:
    """Deploy, drive and report (module doc). ``LoadError`` / ``ScenarioError`` with one line
    when it cannot run."""
    from gshare.runtime.client import Client, ClientError

    if max_outstanding < 1:
        raise ScenarioError(f"--max-outstanding: must be an integer >= 1, got {max_outstanding}")
    dur = duration_s if duration_s is not None else scenario.duration_s()
    s = scenario.seed if seed is None else seed
    arrivals = scenario_arrivals(scenario, dur, s)
    say = on_phase or (lambda _m: None)
    try:
        client = Client(url, token, state_dir=state_dir, timeout_s=60.0)
    except ClientError as e:
        raise LoadError(str(e)) from None
    with client:
        say(f"deploying {len(scenario.functions)} functions, {len(scenario.workflows)} workflows")
        deploy(client, scenario, ready_timeout_s=ready_timeout_s)
        bodies = request_bodies(scenario, client.url)
        generate = {
            i: (p, m, *slo_of(scenario, arrivals[i].target))
            for i, (p, m) in request_tokens(scenario, arrivals).items()
        }
        slos: dict[tuple[str, str], float | None] = {}
        for w in scenario.workloads:
            slos[(w.kind, w.target)] = (
                scenario.workflows[w.target].slo_ms
                if w.kind == "workflow"
                else scenario.functions[w.target].slo_ms
            )
        try:
            info = client.info()
        except ClientError:
            info = {}
        before = workflow_counters(_metrics(client.url))
        say(f"sending {len(arrivals)} requests over {dur:g} s (seed {s})")
        t0 = time.perf_counter()
        with quiet_collector() as pauses:
            rows = asyncio.run(
                drive(
                    client.url,
                    arrivals,
                    bodies,
                    slos,
                    warmup_ms=scenario.doc.warmup_s * 1000.0,
                    max_outstanding=max_outstanding,
                    timeout_s=timeout_s,
                    progress=progress,
                    generate=generate,
                )
            )
        wall_s = time.perf_counter() - t0
        after = workflow_counters(_metrics(client.url))
        placement = {n: _placement(client, n) for n in scenario.functions}
    summary: dict[str, Any] = {
        "scenario": scenario.name,
        "world": "live",
        "file": str(scenario.path),
        "url": client.url,
        "seed": s,
        "duration_s": dur,
        "wall_s": wall_s,
        "max_outstanding": max_outstanding,
        "server": {
            k: info[k] for k in ("version", "autoscaler", "placer", "workflow_policy") if k in info
        },  # fmt: skip
        "policies": {
            "workflow": scenario.policies.workflow,
            "autoscaler": scenario.policies.autoscaler,
        },
        **accounted(rows, arrivals),
    }
    lates = [float(r["late_ms"]) for r in rows if r.get("late_ms") is not None]
    summary["late_ms_p99"] = sorted(lates)[int(0.99 * (len(lates) - 1))] if lates else None
    # the generator's own collector pauses left after the freeze (each one delays every answer
    # that arrives during it: ``client_pauses``)
    summary["client_gc"] = pauses.summary()
    per = summarise(rows, scenario)
    for name, st in per["workflows"].items():
        server = _server_figures(before, after, name)
        st["server"] = server
        c = server["cost_per_request_usd"]
        st["cost_per_request_usd"] = c
        st["cost_per_1m_requests_usd"] = c * 1e6 if c is not None else None
    for name, st in per["functions"].items():
        st.update(placement.get(name, {}))
    for name, st in summarise_generative(rows, scenario).items():
        per["functions"][name].update(st)
    summary.update(per)
    exp = f"{scenario.name}-load"
    return ExperimentResult(
        experiment=exp,
        seed=s,
        params={
            "scenario": str(scenario.path),
            "url": client.url,
            "duration_s": dur,
            "max_outstanding": max_outstanding,
            "timeout_s": timeout_s,
        },
        rows=rows,
        summary=summary,
        plots=[latency_cdf_plot(f"{scenario.name}: live ({client.url})", exp)],
        table_columns=(
            *REQUEST_COLUMNS,
            "code",
            "late_ms",
            *TIMING_COLUMNS,
            "error",
            *(GENERATIVE_COLUMNS if generate else ()),
        ),
    )


__all__ = [
    "DEFAULT_MAX_OUTSTANDING",
    "TIMING_HEADERS",
    "LoadError",
    "default_body",
    "deploy",
    "drive",
    "platform_share_ms",
    "request_bodies",
    "run_load",
    "workflow_counters",
]
