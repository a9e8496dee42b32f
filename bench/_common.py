"""Small helpers shared by the benches (``bench/*.py``): options, a table, the JSON file.

A bench is run as ``.venv/bin/python bench/NAME.py [--quick] [--json PATH]`` from the repo
root; Python puts ``bench/`` on ``sys.path``, so a bench imports this module as ``_common``::

    from _common import bench_parser, machine_load, percentile, print_table, write_json

    parser = bench_parser(__doc__)          # --quick, --json PATH, --seed N
    parser.add_argument("--iters", type=int, default=1000)   # add your own
    args = parser.parse_args()
    ...
    print_table("token round trip", ["case", "p50 us"], [["uds", 21.3]])
    write_json(args.json, {"rtt_us_p50": 21.3}, rows=[...])   # {"summary": {...}, "rows": [...]}
    summary.update(machine_load())          # how busy the machine was (timings depend on it)

Benches of the live runtime start a real ``gshare serve`` with ``gshare.testing`` — the harness
the tests and ``make demo`` use (one readiness check: ``GET /v2/health/ready`` answers 200)::

    from gshare.testing import ServeProcess, stop_process, wait_until

    with ServeProcess("--launcher", "ray") as srv:     # temporary state directory, free port
        srv.client().deploy(...)

and stop a baseline's server (started with ``start_new_session=True``) with ``stop_process``.

Benches of the live token mechanism add ``--token-config JSON`` with
``add_token_config_option(parser)`` and read it with ``live_token_config(args)``.

Keep the API small.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gshare.stats import percentile  # the benches take it from here

_STARTED = time.perf_counter()
"""When the bench process imported this module (``provenance``'s wall time)."""

__all__ = [
    "add_token_config_option",
    "bench_parser",
    "live_token_config",
    "machine_load",
    "percentile",
    "print_table",
    "read_http_response",
    "write_json",
]


def bench_parser(doc: str | None) -> argparse.ArgumentParser:
    """An ``ArgumentParser`` with the options every bench takes: ``--quick`` (small sizes, for
    CI), ``--json PATH`` (write the results there) and ``--seed N`` (default 0). The first
    line of ``doc`` (the bench's module docstring) is the description."""
    first = (doc or "").strip().splitlines()
    parser = argparse.ArgumentParser(description=first[0] if first else None)
    parser.add_argument("--quick", action="store_true", help="small run (seconds), e.g. in CI")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write results")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def machine_load() -> dict[str, float]:
    """How busy the machine is right now: ``loadavg_1m`` and, where the kernel reports pressure
    stall information, ``cpu_pressure_pct`` (``/proc/pressure/cpu`` "some avg10": the share of
    the last 10 s in which runnable tasks waited for a CPU). Benches put these in their summary:
    latency figures on a shared machine mean little without them."""
    out = {"loadavg_1m": os.getloadavg()[0], "cpus": float(os.cpu_count() or 0)}
    try:
        with open("/proc/pressure/cpu") as f:
            some = f.readline().split()
        out["cpu_pressure_pct"] = float(some[1].split("=")[1])
    except (OSError, IndexError, ValueError):
        pass
    return out


def _cell(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:.3g}" if abs(v) < 1 else f"{v:,.2f}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def print_table(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    console: Console | None = None,
) -> None:
    """Print ``rows`` (one sequence of cells per row) under ``columns`` as a rich table; floats
    are shown with 3 significant digits below 1 and 2 decimals above."""
    table = Table(title=title)
    for i, c in enumerate(columns):
        table.add_column(c, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*(_cell(v) for v in row))
    (console or Console()).print(table)


def write_json(path: Path | str | None, summary: Mapping[str, Any], **extra: Any) -> None:
    """Write ``{"summary": summary, **extra, "provenance": ...}`` to ``path`` (parents
    created; ``experiments.results.provenance`` with the bench's command line); no-op for None.
    Non-finite floats are written as null."""
    if path is None:
        return
    from gshare.experiments.results import provenance

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    prov = provenance(
        quick="--quick" in sys.argv,
        overrides=sys.argv[1:],  # the bench's command line
        wall_s=time.perf_counter() - _STARTED,
    )
    doc = _finite({"summary": dict(summary), **extra, "provenance": prov})
    p.write_text(json.dumps(doc, indent=2) + "\n")


def _finite(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, Mapping):
        return {str(k): _finite(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_finite(x) for x in v]
    return v


def add_token_config_option(parser: argparse.ArgumentParser) -> None:
    """``--token-config JSON``: fields of the live agent's ``LIVE_TOKEN_CONFIG`` to override."""
    parser.add_argument(
        "--token-config",
        default="{}",
        metavar="JSON",
        help="TokenConfig fields to override in the live agent's LIVE_TOKEN_CONFIG, "
        "e.g. '{\"idle_token_ms\": 0}'",
    )


def live_token_config(args: argparse.Namespace) -> Any:
    """The ``TokenConfig`` a bench runs: ``LIVE_TOKEN_CONFIG`` with ``--token-config`` applied
    (a bad field or value exits with one line naming it)."""
    from dataclasses import replace

    from gshare.policy.tokens import TokenError
    from gshare.runtime.tokens import LIVE_TOKEN_CONFIG

    try:
        return replace(LIVE_TOKEN_CONFIG, **json.loads(args.token_config))
    except (ValueError, TypeError, TokenError) as e:
        raise SystemExit(f"--token-config: {e}") from None


async def read_http_response(
    reader: asyncio.StreamReader,
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response from ``reader``: (status, headers in lower case, body); bodies
    with ``Content-Length`` or chunked (the load generators of ``gateway.py``, ``overload.py``)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length = -1
    chunked = False
    headers: dict[str, str] = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(b":")
        k = k.strip().lower()
        headers[k.decode()] = v.strip().decode("latin-1")
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
        return status, headers, bytes(body)
    return status, headers, await reader.readexactly(max(0, length))
