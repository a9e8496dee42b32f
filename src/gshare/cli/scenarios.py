"""``gshare simulate`` and ``gshare load``: one scenario file, two worlds (registered on
``gshare.cli.app``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from gshare.cli import (
    STATE_OPTION,
    TOKEN_OPTION,
    URL_OPTION,
    CliError,
    _default_url,
    app,
    console,
    err_console,
    save,
    stamp,
)

# -- scenarios: one file, two worlds ------------------------------------------------------------

CLIENT_PAUSE_NOTE_MS = 5.0
"""``gshare load`` says so when its own garbage collection paused it this long or longer."""


def _given(**options: Any) -> list[str]:
    """The options given on the command line, as ``KEY=VALUE`` (the run's provenance)."""
    return [f"{k}={v}" for k, v in options.items() if v is not None]


def _load_scenario_file(path: Path) -> Any:
    from gshare.scenario import ScenarioError, load_scenario

    try:
        return load_scenario(path)
    except ScenarioError as e:
        raise CliError(str(e)) from None


def _scenario_tables(result: Any, world: str) -> None:
    """Print a result's per-workflow and per-function summary."""
    from gshare.experiments.results import format_value

    s = result.summary
    cols = ("requests", "answered", "slo_ms", "slo_hit_rate", "p50_ms", "p99_ms")
    for kind, extra in (
        ("workflows", ("cost_per_1m_requests_usd",)),
        (
            "functions",
            (
                "devices_mean",
                "devices_end",
                "instances_mean",
                "instances_end",
                "ttft_ms_p50",
                "ttft_ms_p99",
                "tpot_ms_p50",
                "tpot_ms_p99",
                "tokens_per_s",
                "slo_attainment",
            ),
        ),  # fmt: skip
    ):
        rows = s.get(kind) or {}
        if not rows:
            continue
        have = [c for c in (*cols, "errors", "dropped_client", "unfinished", *extra)
                if any(c in st for st in rows.values())]  # fmt: skip
        table = Table(kind[:-1], *have, title=f"{s['scenario']} ({world}): {kind}", box=None)
        for name, st in rows.items():
            table.add_row(name, *(format_value(st.get(c)) for c in have))
        console.print(table)
    by = ", ".join(f"{k} {v}" for k, v in sorted(s.get("by_status", {}).items()))
    console.print(f"{s['arrivals']} arrivals: {by}")


@app.command("simulate")
def simulate_cmd(
    scenario: Path = typer.Argument(..., help="Scenario file (YAML, see examples/scenarios/)."),
    out: Path = typer.Option(Path("results"), "--out", help="Output folder."),
    quick: bool = typer.Option(
        False, "--quick", help="Simulate the scenario's quick_duration_s (default 10 s)."
    ),
    profiles_from: str | None = typer.Option(
        None,
        "--profiles-from",
        help="A server URL: use its live profiles (`gshare profile NAME`) of the functions.",
    ),
    policy: str | None = typer.Option(
        None,
        "--policy",
        help="Replace the scenario's workflow scheduler (esg, fast-gshare, infless, orion, "
        "aquatope) or autoscaler (gshare-burst, fast-heuristic, target-util).",
    ),
    seed: int | None = typer.Option(None, "--seed", min=0, help="Replace the scenario's seed."),
    seeds: int = typer.Option(
        1,
        "--seeds",
        min=1,
        max=100,
        help="Run this many seeds (SEED, SEED+1, ...; SEED the scenario's or --seed): each in "
        "OUT/NAME-simulate/seed-K/, and OUT/NAME-simulate/results.json every figure's median "
        "and 90 % interval (p05-p95) over them.",
    ),
    token: str | None = TOKEN_OPTION,
    state: Path | None = STATE_OPTION,
) -> None:
    """Run a scenario in the simulator; write OUT/NAME-simulate/results.json, rows.csv (one row
    per request) and a latency CDF (PNG); print the summary. ``--seeds K``: K runs (arrivals and
    the simulator's noise drawn per seed) and the spread of every figure over them."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from gshare.experiments.scenario_sim import fetch_live_profiles, simulate
    from gshare.scenario import ScenarioError

    sc = _load_scenario_file(scenario)
    t0 = time.perf_counter()
    try:
        live = (
            fetch_live_profiles(profiles_from, list(sc.functions), token=token, state_dir=state)
            if profiles_from
            else None
        )
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[at]}"),
            TimeElapsedColumn(),
            console=err_console,
            transient=False,
        ) as progress:
            tasks: dict[str, Any] = {}

            def report(phase: str, done_ms: float, total_ms: float) -> None:
                if phase not in tasks:
                    tasks[phase] = progress.add_task(f"simulating {phase}", total=total_ms, at="")
                progress.update(
                    tasks[phase],
                    completed=done_ms,
                    at=f"{done_ms / 1000:.0f}/{total_ms / 1000:.0f} s simulated",
                )

            first = sc.seed if seed is None else seed
            results = []
            for s in range(first, first + seeds):
                t_run = time.perf_counter()
                result = simulate(
                    sc, quick=quick, seed=s, policy=policy, live_profiles=live, progress=report
                )
                stamp(result, quick=quick, overrides=[], t0=t_run)
                results.append(result)
                tasks.clear()
    except ScenarioError as e:
        raise CliError(str(e)) from None
    given = _given(policy=policy, seed=seed, seeds=seeds if seeds > 1 else None,
                   profiles_from=profiles_from)  # fmt: skip
    if seeds > 1:
        from gshare.cli import _write_seeds

        _write_seeds(f"{sc.name}-simulate", results, out, quick, given,
                     time.perf_counter() - t0)  # fmt: skip
        return
    stamp(result, quick=quick, overrides=given, t0=t0)
    folder = save(result, out)
    _scenario_tables(result, "simulator")
    console.print(f"wrote {folder}/results.json ({time.perf_counter() - t0:.1f} s)")


@app.command("load")
def load_cmd(
    scenario: Path = typer.Argument(..., help="Scenario file (YAML, see examples/scenarios/)."),
    url: str | None = URL_OPTION,
    duration_s: float | None = typer.Option(
        None, "--duration-s", min=0.001, help="Send this long (default: the scenario's)."
    ),
    out: Path = typer.Option(Path("results"), "--out", help="Output folder."),
    max_outstanding: int = typer.Option(
        256,
        "--max-outstanding",
        min=1,
        help="Requests in flight at most; an arrival beyond is not sent (dropped_client).",
    ),
    timeout_s: float = typer.Option(
        60.0, "--timeout-s", min=0.1, help="How long a request may take before it is unfinished."
    ),
    seed: int | None = typer.Option(None, "--seed", min=0, help="Replace the scenario's seed."),
    token: str | None = TOKEN_OPTION,
    state: Path | None = STATE_OPTION,
) -> None:
    """Deploy a scenario's functions and workflows on a live server and send its arrivals
    (the ones `gshare simulate` simulates for the seed), open loop; write results.json,
    rows.csv and a latency CDF (PNG) of the live measurements to OUT/NAME-load/."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from gshare.experiments.scenario_load import LoadError, run_load
    from gshare.scenario import ScenarioError

    sc = _load_scenario_file(scenario)
    t0 = time.perf_counter()
    try:
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TextColumn("{task.fields[note]}"),
            TimeElapsedColumn(),
            console=err_console,
            transient=False,
        ) as progress:
            task: list[Any] = []

            def phase(msg: str) -> None:
                progress.console.print(msg, markup=False, highlight=False)

            def report(sent: int, answered: int, outstanding: int, dropped: int, n: int) -> None:
                if not task:
                    task.append(progress.add_task("load", total=n, note=""))
                progress.update(
                    task[0],
                    completed=answered + dropped,
                    note=f"sent {sent}, outstanding {outstanding}, dropped {dropped}",
                )

            result = run_load(
                sc,
                url or _default_url(),
                token=token,
                state_dir=state,
                duration_s=duration_s,
                seed=seed,
                max_outstanding=max_outstanding,
                timeout_s=timeout_s,
                progress=report,
                on_phase=phase,
            )
    except (ScenarioError, LoadError) as e:
        raise CliError(str(e), code=1) from None
    stamp(result, quick=False, overrides=_given(url=url, seed=seed, duration_s=duration_s), t0=t0)
    folder = save(result, out)
    _scenario_tables(result, "live")
    gc_pauses = result.summary.get("client_gc") or {}
    if float(gc_pauses.get("max_ms", 0.0)) >= CLIENT_PAUSE_NOTE_MS:
        console.print(
            f"note: this load generator paused {gc_pauses['pauses']} times for its own garbage "
            f"collection (longest {gc_pauses['max_ms']:.1f} ms); answers arriving then are timed "
            "late by the pause"
        )
    console.print(f"wrote {folder}/results.json ({time.perf_counter() - t0:.1f} s)")
