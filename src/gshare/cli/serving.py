"""The live runtime's commands — ``gshare serve``, ``deploy``, ``list``, ``invoke``,
``delete``, ``describe``, ``logs``, ``profile`` — registered on ``gshare.cli.app``."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from gshare.cli import (
    OUTPUT_OPTION,
    STATE_OPTION,
    TOKEN_OPTION,
    URL_OPTION,
    CliError,
    Output,
    _call,
    _client,
    _print_json,
    app,
    console,
    err_console,
)
from gshare.runtime.instance.lanes import DEFAULT_REQUEST_LANE_MB
from gshare.workflows.dag import render_stages


@app.command("serve")
def serve_cmd(
    address: str | None = typer.Option(
        None,
        "--address",
        help="Join this Ray cluster (needs gshare[cluster]; default: one machine, no Ray).",
    ),
    cluster: str | None = typer.Option(
        None,
        "--cluster",
        help=(
            "local (the default: one machine, the node agent a child process, no Ray) or ray "
            "(start a local Ray cluster on purpose; needs gshare[cluster])."
        ),
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on."),
    port: int = typer.Option(
        8080, "--port", min=0, max=65535, help="Port to listen on (0: any free port)."
    ),
    state: Path | None = typer.Option(
        None, "--state", help="State directory (default $GSHARE_STATE or ~/.gshare)."
    ),
    max_body_mb: float = typer.Option(
        16.0, "--max-body-mb", min=0.001, help="Largest request body accepted (413 beyond)."
    ),
    request_timeout_s: float = typer.Option(
        120.0,
        "--request-timeout-s",
        min=0.1,
        help="Longest a request waits for its answer (504 beyond).",
    ),
    read_timeout_s: float = typer.Option(
        30.0,
        "--read-timeout-s",
        min=0.1,
        help="Longest a request's headers and body may take to arrive (the connection is closed).",
    ),
    max_connections: int = typer.Option(
        4096, "--max-connections", min=1, help="Most HTTP connections open at once."
    ),
    max_connections_per_client: int | None = typer.Option(
        None,
        "--max-connections-per-client",
        min=1,
        help="Most connections from one client address (default: a quarter of --max-connections).",
    ),
    write_timeout_s: float = typer.Option(
        30.0,
        "--write-timeout-s",
        min=0.1,
        help="Longest a response may wait for its client to read it (the connection is cut).",
    ),
    max_wait_slo: float = typer.Option(
        0.75,
        "--max-wait-slo",
        min=0.0,
        help=(
            "Shed a request (429) when its predicted latency exceeds this many SLOs of its "
            "function (functions with slo_ms; 0: only the queue cap sheds)."
        ),
    ),
    placer: str = typer.Option(
        "mra", "--placer", help="Placement policy (policy.placement.PLACERS)."
    ),
    autoscaler: str = typer.Option(
        "gshare-burst", "--autoscaler", help="Autoscaling policy (policy.autoscale.AUTOSCALERS)."
    ),
    workflow_policy: str = typer.Option(
        "esg",
        "--workflow-policy",
        help=(
            "Workflow stage scheduler: esg (default), fast-gshare, infless, orion, aquatope, "
            "or direct (each stage through its function's own queue)."
        ),
    ),
    period_s: float = typer.Option(
        1.0, "--period-s", min=0.05, help="Controller reconcile period."
    ),
    launcher: str = typer.Option(
        "fork",
        "--launcher",
        help=(
            "How instance processes start: fork (from a pre-imported template per node: "
            "shared imports, fast cold starts) or ray (one Ray actor each)."
        ),
    ),
    grpc_port: int | None = typer.Option(
        None,
        "--grpc-port",
        min=0,
        max=65535,
        help=(
            "Also serve the KServe v2 / Triton gRPC API (inference.GRPCInferenceService) on "
            "this port (0: any free port; default: no gRPC)."
        ),
    ),
    shared_memory: bool = typer.Option(
        True,
        "--shared-memory/--no-shared-memory",
        help=(
            "Serve Triton's system shared-memory extension: clients on this host may register "
            "/dev/shm objects owned by the server's user and send tensors through them. Turn "
            "it off where the API is reachable by clients you would not let read such objects."
        ),
    ),
    lane_mb: int = typer.Option(
        DEFAULT_REQUEST_LANE_MB,
        "--lane-mb",
        min=0,
        max=4096,
        help=(
            "Shared memory between the gateway and each instance on its node, MiB of address "
            "space (requests; answers get half; memory is used only as far as data in flight "
            "needs it): payloads of 64 KiB or more go through it instead of the socket. 0: "
            "everything through the socket."
        ),
    ),
    priority_sharing: str = typer.Option(
        "fikit",
        "--priority-sharing",
        help=(
            "How a device shares between functions of different priority: fikit (the higher "
            "class preempts at the next op, lower classes fill its idle gaps; tokens within a "
            "class) or tokens (priorities only order the token queue)."
        ),
    ),
    device_mem_mb: float | None = typer.Option(
        None,
        "--device-mem-mb",
        min=1.0,
        help=(
            "Memory of each node's CPU device that instances' memory limits reserve from, "
            "MiB (default: 90 % of the node's RAM; a GPU's own memory on CUDA)."
        ),
    ),
) -> None:
    """Run the gateway, the controller and the node agents until Ctrl-C / SIGTERM: one agent on
    this machine (no Ray) by default, one per Ray node with --cluster ray or --address."""
    from gshare.runtime.server import ServeError, ServeOptions, run_server

    try:
        run_server(
            ServeOptions(
                address=address,
                cluster=cluster,
                host=host,
                port=port,
                state=str(state) if state is not None else None,
                max_body_mb=max_body_mb,
                request_timeout_s=request_timeout_s,
                read_timeout_s=read_timeout_s,
                max_connections=max_connections,
                max_connections_per_client=max_connections_per_client,
                write_timeout_s=write_timeout_s,
                max_wait_slo_factor=max_wait_slo,
                placer=placer,
                autoscaler=autoscaler,
                workflow_policy=workflow_policy,
                workflow_policy_factory=_workflow_policy_factory(workflow_policy),
                period_s=period_s,
                launcher=launcher,
                device_mem_mb=device_mem_mb,
                grpc_port=grpc_port,
                shared_memory=shared_memory,
                lane_mb=lane_mb,
                priority_sharing=priority_sharing,
            )
        )
    except ServeError as e:
        raise CliError(str(e), code=1) from None


def _workflow_policy_factory(name: str) -> Any:
    """Aquatope's factory (its Bayesian optimiser is in ``gshare.experiments``, above the
    runtime); None for the others (the runtime builds them by name)."""
    if name != "aquatope":
        return None
    from gshare.experiments.offline_bo import bo_optimiser
    from gshare.policy.workflow.esg import make_share_policy

    def make(perf: Any) -> Any:
        return make_share_policy("aquatope", perf=perf, seed=0, optimiser=bo_optimiser(perf))

    return make


@app.command("deploy")
def deploy_cmd(
    file: Path = typer.Argument(..., help="Function spec (YAML)."),
    url: str | None = URL_OPTION,
    token: str | None = TOKEN_OPTION,
    state: Path | None = STATE_OPTION,
) -> None:
    """Deploy (or update) a function, or a workflow (a spec with ``stages``), from YAML."""
    if not file.is_file():
        raise CliError(f"no such spec file: {file}")
    if _is_workflow_spec(file):
        with _client(url, token, state) as c:
            out = _call(c.deploy_workflow, file)
        console.print(
            f"deployed workflow {out['name']} (version {out['version']}, {out['stages']} stages)"
        )
        return
    with _client(url, token, state) as c:
        out = _call(c.deploy, file)
    console.print(f"deployed {out['name']} (version {out['version']}, {out['config_source']})")


def _is_workflow_spec(file: Path) -> bool:
    """A YAML mapping with ``stages`` is a workflow (the server validates the rest)."""
    from gshare.documents import DocumentError, load_yaml

    try:
        doc = load_yaml(file.read_bytes())
    except (DocumentError, OSError):
        return False  # the function path reports the problem
    return isinstance(doc, dict) and "stages" in doc


@app.command("list")
def list_cmd(
    url: str | None = URL_OPTION,
    token: str | None = TOKEN_OPTION,
    state: Path | None = STATE_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """List deployed functions and their instances."""
    with _client(url, token, state) as c:
        fns = _call(c.list)
        nodes = [] if output is Output.JSON else _call(c.info).get("nodes", [])
        flows = [] if output is Output.JSON else _call(c.list_workflows)
    if output is Output.JSON:
        _print_json(fns)
        return
    table = Table(
        "name",
        "model/handler",
        "priority",
        "phase",
        "invocations",
        "ready/replicas",
        "rps (pred)",
        "instances",
        box=None,
    )
    for f in fns:
        insts = ", ".join(
            f"{i['id']}:{i['state']}"
            + (
                f" {i['achieved_share']:.2f}/{i['quota_request']:g}"
                if i.get("achieved_share") is not None
                else ""
            )
            for i in f["instances"]
        )
        table.add_row(
            f["name"],
            str(f["image"]),
            str(f.get("priority", "-")),
            str((f.get("fikit") or {}).get("phase", "-")),
            str(f["invocationCount"]),
            f"{f['availableReplicas']}/{f['replicas']}",
            f"{f['observed_rps']:.1f} ({f['predicted_rps']:.1f})",
            insts or "-",
        )
    console.print(table)
    if flows:
        wt = Table("workflow", "slo ms", "stages", "missing functions", box=None)
        for w in flows:
            wt.add_row(
                w["name"],
                f"{w['slo_ms']:g}",
                render_stages(w["stages"]),
                ", ".join(w["missing_functions"]) or "-",
            )
        console.print(wt)
    if nodes:
        per_node: dict[str, int] = {}
        for f in fns:
            for i in f["instances"]:
                per_node[str(i.get("node_id", ""))] = per_node.get(str(i.get("node_id", "")), 0) + 1
        nt = Table("node", "address", "state", "devices", "instances", box=None)
        for n in nodes:
            nid = str(n.get("node_id", ""))
            nt.add_row(
                nid[:12],
                str(n.get("node_ip", "-")),
                "alive" if n.get("alive") else "lost",
                ", ".join(n.get("devices", [])),
                str(per_node.get(nid, 0)),
            )
        console.print(nt)


def _read_source(source: str, what: str) -> bytes:
    """The bytes of ``-`` (standard input) or a file path (``@path`` or ``path``)."""
    if source == "-":
        return sys.stdin.buffer.read()
    path = Path(source[1:] if source.startswith("@") else source)
    try:
        return path.read_bytes()
    except OSError as e:
        raise CliError(f"{what}: cannot read {str(path)!r}: {e.strerror or e}") from None


@app.command("invoke")
def invoke_cmd(
    name: str = typer.Argument(..., help="Function name."),
    data: str | None = typer.Option(
        None,
        "--data",
        "-d",
        help="JSON request body: inline, @FILE (read from a file) or - (standard input).",
    ),
    file: str | None = typer.Option(
        None,
        "--file",
        help="Send these bytes raw: a file path, or - for standard input (JSON if it ends "
        "in .json).",
    ),
    url: str | None = URL_OPTION,
    workflow: bool = typer.Option(
        False, "--workflow", help="NAME is a workflow: run its stages (POST /workflow/NAME)."
    ),
    token: str | None = TOKEN_OPTION,
    state: Path | None = STATE_OPTION,
) -> None:
    """Invoke a function (or with --workflow a workflow) and print its answer (JSON, or raw
    bytes to stdout). Invoking needs no token; with one (--token, --state) a 404 says whether
    NAME is deployed as the other kind."""
    if data is not None and file is not None:
        raise CliError("give --data or --file, not both")
    if data is not None:
        raw = _read_source(data, "--data") if data == "-" or data.startswith("@") else None
        text = data if raw is None else raw.decode("utf-8", errors="replace")
        try:
            json.loads(text)
        except RecursionError:
            raise CliError("--data is nested too deeply to be JSON a function accepts") from None
        except ValueError as e:
            where = "--data" if raw is None else f"--data {data}"
            raise CliError(f"{where} is not valid JSON: {e}") from None
        body, ctype = text.encode(), "application/json"
    elif file is not None:
        body = _read_source(file, "--file")
        ctype = "application/json" if file.endswith(".json") else "application/octet-stream"
    else:
        body, ctype = b"null", "application/json"
    from gshare.runtime.client import ClientError

    with _client(url, token, state) as c:
        try:
            r = (c.invoke_workflow_raw if workflow else c.invoke_raw)(name, body, ctype)
        except ClientError as e:
            raise CliError(_not_deployed_hint(c, name, workflow, e), code=1) from None
    if r.headers.get("content-type", "").startswith("application/json"):
        print(r.text)
    else:
        sys.stdout.buffer.write(r.content)
        sys.stdout.flush()


def _not_deployed_hint(c: Any, name: str, workflow: bool, e: Any) -> str:
    """The error of a failed invoke (a ``ClientError``); for a 404, whether NAME is deployed
    as the other kind (asked with the token when the CLI finds one; a hint otherwise)."""
    from gshare.runtime.client import ClientError

    if e.status != 404:
        return str(e)
    other = "function" if workflow else "workflow"
    try:
        names = [f["name"] for f in (c.list() if workflow else c.list_workflows())]
    except ClientError:  # no token here: the hint, unconfirmed
        flag = "without --workflow" if workflow else "with --workflow"
        return f"{e} (if {name!r} is a {other}, invoke it {flag})"
    if name in names:
        cmd = f"gshare invoke {name}" if workflow else f"gshare invoke --workflow {name}"
        return f"{e}: {name!r} is a {other}; use {cmd}"
    return str(e)


@app.command("delete")
def delete_cmd(
    name: str = typer.Argument(..., help="Function name."),
    url: str | None = URL_OPTION,
    token: str | None = TOKEN_OPTION,
    state: Path | None = STATE_OPTION,
    workflow: bool = typer.Option(False, "--workflow", help="NAME is a workflow."),
) -> None:
    """Delete a function (its instances stop; queued requests get 410), or a workflow."""
    with _client(url, token, state) as c:
        _call(c.delete_workflow if workflow else c.delete, name)
    console.print(f"deleted {'workflow ' if workflow else ''}{name}")


@app.command("describe")
def describe_cmd(
    name: str = typer.Argument(..., help="Function name."),
    url: str | None = URL_OPTION,
    token: str | None = TOKEN_OPTION,
    state: Path | None = STATE_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Show one function: its spec, configuration source, memory sizing and every instance."""
    with _client(url, token, state) as c:
        f = _call(c.get, name)
    if output is Output.JSON:
        _print_json(f)
        return
    mem = f.get("memory")
    rows = [
        ("name", f["name"]),
        ("model/handler", str(f["image"])),
        ("spec", f.get("spec_summary") or "-"),
        ("ready/replicas", f"{f['availableReplicas']}/{f['replicas']}"),
        ("invocations", str(f["invocationCount"])),
        ("rate", f"{f['observed_rps']:.2f} req/s observed, {f['predicted_rps']:.2f} predicted"),
        ("queued", str(f["queued"])),
        ("configurations", f"{f['configs']} from {f['config_source']}"),
        ("last decision", f["last_decision"] or "-"),
        ("memory", _memory_text(mem)),
        ("start error", f["start_error"] or "-"),
        ("waiting", f.get("waiting_reason") or "-"),
    ]
    head = Table(box=None, show_header=False)
    for k, v in rows:
        head.add_row(k, v)
    console.print(head)
    if mem:
        console.print(
            "  (mem limit: the instance's own memory, what it allocated beyond the runtime; rss "
            "also counts the shared weights and libraries, so it may be above the limit)",
            highlight=False,
        )
    table = Table(
        "instance",
        "state",
        "device",
        "SM %",
        "quota req/limit",
        "achieved",
        "mem limit MiB",
        "rss MiB",
        "restarts",
        box=None,
    )
    for i in f["instances"]:
        table.add_row(
            i["id"],
            i["state"],
            str(i["device"]),
            f"{i['sm_pct']:g}",
            f"{i['quota_request']:g}/{i['quota_limit']:g}",
            "-" if i["achieved_share"] is None else f"{i['achieved_share']:.3f}",
            f"{i['mem_mb']:.0f}" if i["mem_mb"] else "-",
            f"{i['rss_mb']:.0f}",
            str(i["restarts"]) + (f" ({i['last_exit']})" if i.get("last_exit") else ""),
        )
    console.print(table)


def _memory_text(mem: dict[str, Any] | None) -> str:
    """``describe``'s memory line: the plan the function's next instances start with."""
    if not mem:
        return "no limit"
    top = f"{mem['max_mb']:.0f} MiB" if mem["max_mb"] else "what the device has free"
    text = (
        f"starts at {mem['init_mb']:.0f} MiB, grows by {mem['step_mb']:.0f} MiB steps up to {top}"
    )
    if mem["auto"]:
        n = mem["measured_batches"]
        text += (
            f" (auto: solved from {n} measured batches)"
            if n
            else " (auto: a first guess until batches are measured)"
        )
    return text


FOLLOW_PERIOD_S = 1.0
"""How often ``gshare logs -f`` asks for new lines."""


@app.command("logs")
def logs_cmd(
    name: str = typer.Argument(..., help="Function name."),
    tail: int = typer.Option(100, "--tail", min=0, help="Number of lines."),
    follow: bool = typer.Option(
        False, "--follow", "-f", help="Keep printing new lines until Ctrl-C."
    ),
    url: str | None = URL_OPTION,
    token: str | None = TOKEN_OPTION,
    state: Path | None = STATE_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Show a function's log: deployments, scaling decisions, instance starts, crashes."""

    def emit(lines: list[str]) -> None:
        for line in lines:
            print(json.dumps({"function": name, "line": line}) if output is Output.JSON else line)
        sys.stdout.flush()

    with _client(url, token, state) as c:
        lines = _call(c.logs, name, tail)
        if output is Output.JSON and not follow:
            _print_json({"name": name, "lines": lines})
            return
        emit(lines)
        if not follow:
            return
        seen = lines
        try:
            while True:
                time.sleep(FOLLOW_PERIOD_S)
                now = _call(c.logs, name, max(tail, 200))
                emit(_new_lines(seen, now))
                seen = now
        except KeyboardInterrupt:
            return


def _new_lines(before: list[str], now: list[str]) -> list[str]:
    """The lines of ``now`` after the last place where it repeats the end of ``before`` (both
    are the last lines of one growing log); all of ``now`` when they do not overlap."""
    if not before:
        return now
    for i in range(len(now), 0, -1):
        k = min(i, len(before))
        if now[i - k : i] == before[-k:]:
            return now[i:]
    return now


def _num_list(text: str | None, what: str, integer: bool = False) -> list[Any] | None:
    if text is None:
        return None
    try:
        vals = [int(x) if integer else float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CliError(
            f"{what}: expected a comma-separated list of "
            f"{'integers' if integer else 'numbers'}, got {text!r}"
        ) from None
    if not vals:
        raise CliError(f"{what}: empty list")
    return vals


@app.command("profile")
def profile_cmd(
    name: str = typer.Argument(..., help="Function name."),
    sm: str | None = typer.Option(
        None,
        "--sm",
        help="SM (core) shares to sweep, %, e.g. 50,100 (default: one per core count).",
    ),
    quota: str | None = typer.Option(
        None, "--quota", help="Time quotas to sweep, %, e.g. 25,50,100."
    ),
    batch: str | None = typer.Option(
        None,
        "--batch",
        help="Batch sizes to sweep, e.g. 1,2,4 (default: powers of 2 up to max_batch, at most 8).",
    ),
    trial_s: float = typer.Option(
        1.0, "--trial-s", min=0.05, max=60, help="Closed-loop load per point, seconds."
    ),
    url: str | None = URL_OPTION,
    token: str | None = TOKEN_OPTION,
    state: Path | None = STATE_OPTION,
) -> None:
    """FaST-Profiler on the live runtime: sweep (SM share, quota, batch) under closed-loop
    load and write the rows to the profile table the autoscaler reads."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    grid = {
        "sm_pct": _num_list(sm, "--sm"),
        "quota_pct": _num_list(quota, "--quota"),
        "batch": _num_list(batch, "--batch", integer=True),
        "trial_s": trial_s,
    }
    with _client(url, token, state) as c:
        job = _call(c.start_profile, name, **grid)
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TextColumn("{task.fields[current]}"),
            TimeElapsedColumn(),
            console=err_console,
            transient=False,
        ) as progress:
            task = progress.add_task(
                f"profiling {name}", total=job["total"], current=job["current"]
            )
            while job["state"] == "running":
                time.sleep(0.3)
                job = _call(c.profile_status, name)
                progress.update(task, completed=job["done"], current=job["current"])
    if job["state"] != "done":
        raise CliError(f"profiling {name} {job['state']}: {job['error']}", code=1)
    table = Table(
        "sm %",
        "quota %",
        "batch",
        "latency ms",
        "throughput rps",
        title=f"{name}: live profile",
        box=None,
    )
    for r in job["rows"]:
        table.add_row(
            f"{r['sm_pct']:g}",
            f"{r['quota_pct']:g}",
            str(r["batch"]),
            f"{r['latency_ms']:.2f}",
            f"{r['throughput_rps']:.1f}",
        )
    console.print(table)
    console.print(f"wrote {len(job['rows'])} rows to the live profile table of {name}")
