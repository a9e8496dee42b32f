"""The ``gshare`` command line (typer): the app, its shared options and helpers, the
experiment commands and ``main``; the live runtime's commands are in ``cli.serving``, the
scenario commands (``simulate``, ``load``) in ``cli.scenarios``.

Every error is one line on stderr and a non-zero exit (2 for bad usage), never a traceback.
"""

from __future__ import annotations

import enum
import json
import sys
import time
from pathlib import Path
from typing import Any

import click
import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    name="gshare",
    help="gshare: serverless DL inference on shared GPUs, and its trace-driven simulator.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)
experiment_app = typer.Typer(
    help="List and run the simulator's named experiments.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)
app.add_typer(experiment_app, name="experiment")


def _version(value: bool) -> None:
    if value:
        import gshare

        print(f"gshare {gshare.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print gshare's version."
    ),
) -> None:
    """gshare: serverless DL inference on shared GPUs, and its trace-driven simulator."""


# Wide tables when the output is a file or a pipe (CI logs), the terminal's width otherwise.
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


class Output(enum.StrEnum):
    """``--output``: a table for people, JSON for scripts."""

    TABLE = "table"
    JSON = "json"


OUTPUT_OPTION = typer.Option(
    Output.TABLE, "--output", "-o", help="table (for people) or json (for scripts)."
)


def _print_json(doc: Any) -> None:
    print(json.dumps(doc, indent=2, default=str))


class CliError(Exception):
    """A user-facing error: printed as one line, exit code ``code``."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


@experiment_app.command("list")
def experiment_list() -> None:
    """List the registered experiments."""
    from gshare.experiments import registry

    table = Table("name", "reproduces", box=None)
    for exp in registry.all_experiments():
        table.add_row(exp.name, exp.description)
    console.print(table)


@experiment_app.command("params")
def experiment_params(
    name: str = typer.Argument(..., help="Experiment name (see `gshare experiment list`)."),
    quick: bool = typer.Option(False, "--quick", help="The --quick version's parameters."),
) -> None:
    """Print an experiment's parameters (YAML): what `gshare experiment run --set` changes."""
    import yaml

    from gshare.experiments import registry
    from gshare.experiments.results import jsonable

    try:
        exp = registry.get(name)
    except registry.UnknownExperiment as e:
        raise CliError(str(e)) from None
    doc = jsonable(exp.params(quick))
    sys.stdout.write(yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100))


@experiment_app.command("run")
def experiment_run(
    name: str = typer.Argument(..., help="Experiment name (see `gshare experiment list`)."),
    quick: bool = typer.Option(False, "--quick", help="Run the small version (seconds)."),
    seed: int = typer.Option(0, "--seed", min=0, help="Random seed (runs are deterministic)."),
    seeds: int = typer.Option(
        1,
        "--seeds",
        min=1,
        max=100,
        help="Run this many seeds (SEED, SEED+1, ...): each in OUT/NAME/seed-K/, and "
        "OUT/NAME/results.json their summaries' median, 90 % interval (p05-p95), mean, std, "
        "min and max.",
    ),
    out: Path = typer.Option(Path("results"), "--out", help="Output folder."),
    sets: list[str] = typer.Option(  # noqa: B008
        [],
        "--set",
        help="Override a parameter, KEY=VALUE (YAML value; repeatable; dotted keys reach into "
        "mappings). `gshare experiment params NAME` lists them.",
    ),
) -> None:
    """Run an experiment; write OUT/NAME/results.json, rows.csv and PNG plots; print a table."""
    from gshare.experiments import registry
    from gshare.experiments.results import flatten, format_value

    try:
        exp = registry.get(name)
        params = registry.override(exp.params(quick), sets)
    except (registry.UnknownExperiment, registry.ParamError) as e:
        raise CliError(str(e)) from None
    changed = f", {len(sets)} parameter(s) set" if sets else ""
    which = f"seed {seed}" if seeds == 1 else f"seeds {seed}-{seed + seeds - 1}"
    err_console.print(
        f"[bold]{exp.name}[/] ({'quick' if quick else 'full'}, {which}{changed}): {exp.description}"
    )
    t0 = time.perf_counter()
    results = []
    for run_seed in range(seed, seed + seeds):
        t_run = time.perf_counter()
        with err_console.status(f"running {exp.name}, seed {run_seed} ..."):
            try:
                result = exp.run(params, run_seed)
            except Exception as e:
                if not sets:
                    raise  # not the user's input: a bug, shown whole
                raise CliError(
                    f"{exp.name} cannot run with {' '.join(sets)}: {type(e).__name__}: {e}"
                ) from None
        stamp(result, quick=quick, overrides=sets, t0=t_run)
        results.append(result)
    elapsed = time.perf_counter() - t0
    if seeds > 1:
        _write_seeds(exp.name, results, out, quick, sets, elapsed)
        return
    folder = save(result, out)

    cols = list(result.table_columns or (result.rows[0].keys() if result.rows else []))
    if cols:
        table = Table(*cols, title=f"{exp.name}: rows", box=None)
        for r in result.rows[:60]:
            table.add_row(*(format_value(r.get(c, "")) for c in cols))
        console.print(table)
        if len(result.rows) > 60:
            console.print(f"... {len(result.rows) - 60} more rows in {folder / 'rows.csv'}")
    summary = Table("summary", "value", title=f"{exp.name}: summary", box=None)
    for k, v in flatten(result.summary):
        summary.add_row(k, format_value(v))
    console.print(summary)
    console.print(f"wrote {folder}/results.json ({elapsed:.1f} s)")


def stamp(result: Any, *, quick: bool, overrides: list[str], t0: float) -> None:
    """Set ``result.provenance`` (``experiments.results.provenance``) for a run that began at
    ``t0`` (``time.perf_counter``): every front end that writes a ``results.json`` calls it."""
    from gshare.experiments.results import provenance

    result.provenance = provenance(
        quick=quick, overrides=overrides, wall_s=time.perf_counter() - t0
    )


def save(result: Any, out: Path, folder_name: str | None = None) -> Path:
    """``experiments.results.write_result``, an unwritable ``out`` as one error line."""
    from gshare.experiments.results import write_result

    try:
        return write_result(result, out, folder_name)
    except OSError as e:
        raise CliError(f"cannot write results to {out}: {e.strerror or e}", code=1) from None


SEED_STATS = ("median", "p05", "p95", "mean", "std", "min", "max")
"""The columns of a ``--seeds`` table (``experiments.results.aggregate_summaries``)."""


def _write_seeds(
    name: str, results: list[Any], out: Path, quick: bool, sets: list[str], elapsed: float
) -> None:
    """``--seeds``: every run in OUT/NAME/seed-K/, the aggregate in OUT/NAME/results.json."""
    from gshare.experiments.results import (
        aggregate_summaries,
        flatten,
        format_value,
        jsonable,
        provenance,
    )

    folder = out / name
    for r in results:
        save(r, folder, f"seed-{r.seed}")
    try:
        doc = {
            "experiment": name,
            "seeds": [r.seed for r in results],
            "params": jsonable(results[0].params),
            "summary": jsonable(aggregate_summaries([r.summary for r in results])),
            "provenance": jsonable(provenance(quick=quick, overrides=sets, wall_s=elapsed)),
        }
        (folder / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    except OSError as e:
        raise CliError(f"cannot write results to {out}: {e.strerror or e}", code=1) from None
    rows: dict[str, dict[str, Any]] = {}
    for k, v in flatten(doc["summary"]):
        head, _, stat = k.rpartition(".")
        if stat in SEED_STATS:
            rows.setdefault(head, {})[stat] = v
    title = f"{name}: over {len(results)} seeds (p05-p95: the 90 % interval)"
    table = Table("summary", *SEED_STATS, title=title, box=None)
    for k, stats in rows.items():
        table.add_row(k, *(format_value(stats.get(c, "")) for c in SEED_STATS))
    console.print(table)
    console.print(f"wrote {folder}/results.json and seed-*/ ({elapsed:.1f} s)")


# -- the live runtime ---------------------------------------------------------------------------

URL_OPTION = typer.Option(
    None, "--url", help="Server URL (default $GSHARE_URL or http://127.0.0.1:8080)."
)
TOKEN_OPTION = typer.Option(
    None, "--token", help="Control-API token (default: read from the state directory)."
)
STATE_OPTION = typer.Option(
    None,
    "--state",
    help="The server's state directory, to read its token (default $GSHARE_STATE or ~/.gshare).",
)


def _client(url: str | None, token: str | None, state: Path | None) -> Any:
    from gshare.runtime.client import Client, ClientError

    try:
        return Client(url, token, state_dir=state)
    except ClientError as e:
        raise CliError(str(e)) from None


def _call(fn: Any, *args: Any, **kw: Any) -> Any:
    """Run a client call; a ``ClientError`` becomes a one-line CLI error (exit 1)."""
    from gshare.runtime.client import ClientError

    try:
        return fn(*args, **kw)
    except ClientError as e:
        raise CliError(str(e), code=1) from None


def _default_url() -> str:
    import os

    from gshare.runtime.client import DEFAULT_URL

    return os.environ.get("GSHARE_URL") or DEFAULT_URL


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the typer app and turn every error into one line."""
    command = typer.main.get_command(app)
    try:
        command.main(args=argv, prog_name="gshare", standalone_mode=False)
    except CliError as e:
        err_console.print(f"gshare: error: {e}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(e.code)
    except click.exceptions.NoArgsIsHelpError as e:
        click.echo(e.ctx.get_help() if e.ctx else "", err=True)
        sys.exit(2)
    except click.UsageError as e:
        err_console.print(
            f"gshare: error: {e.format_message()}", markup=False, highlight=False, soft_wrap=True
        )
        sys.exit(2)
    except click.exceptions.Abort:
        err_console.print("gshare: aborted", markup=False, soft_wrap=True)
        sys.exit(130)
    except click.ClickException as e:
        err_console.print(
            f"gshare: error: {e.format_message()}", markup=False, highlight=False, soft_wrap=True
        )
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)


# the commands of the other modules register on ``app`` when imported
from gshare.cli import serving  # noqa: E402, I001  (serving first: the help lists in order)
from gshare.cli import scenarios  # noqa: E402

__all__ = ["app", "main", "scenarios", "serving"]
