"""The README's quick start works as written.

The commands are read from ``README.md`` itself — the shell lines of the first fenced block
after the heading "Quick start" — never copied here. The harness does what the README leaves
to the shell: it starts ``gshare serve`` (embedded, the default) on a free port with a
temporary state directory (``ServeProcess``), which also stands in for the wait loop, and
stops it at the end (the ``kill`` line). Every other line must be a ``gshare`` command; each
runs in order through ``bash -c`` with ``GSHARE_URL`` and ``GSHARE_STATE`` naming that server
and this interpreter's folder (``.venv/bin``: ``gshare``, ``python``) first on ``PATH``, and
must exit 0. The ``invoke`` line must print the built-in's ``{"label", "score"}`` answer.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from gshare.testing import ServeProcess

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"

HARNESS_LINES = (
    re.compile(r"^gshare serve\b"),  # started by ServeProcess, on a free port
    re.compile(r"^until\b"),  # the wait loop: ServeProcess.start waits for readiness
    re.compile(r"^kill\b"),  # the stop: ServeProcess.stop
)


def quickstart_commands(text: str) -> list[str]:
    """The command lines of the first fenced block after a heading that says "Quick start"
    (blank and comment-only lines dropped; trailing comments are left to the shell)."""
    lines = text.splitlines()
    heading = next(
        (i for i, line in enumerate(lines) if re.match(r"^#+\s.*quick start", line, re.I)),
        None,
    )
    assert heading is not None, "README.md has no 'Quick start' heading"
    start = next(i for i in range(heading + 1, len(lines)) if lines[i].startswith("```"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("```"))
    return [
        line.strip()
        for line in lines[start + 1 : end]
        if line.strip() and not line.strip().startswith("#")
    ]


def test_quickstart_block_is_found_and_short() -> None:
    commands = quickstart_commands(README.read_text())
    assert 5 <= len(commands) <= 10, commands
    assert any(HARNESS_LINES[0].match(c) for c in commands), "the quick start starts a server"
    assert any(c.startswith("gshare invoke ") for c in commands), "the quick start invokes"


def test_readme_quickstart_runs_as_written(tmp_path: Path) -> None:
    commands = quickstart_commands(README.read_text())
    to_run = [c for c in commands if not any(p.match(c) for p in HARNESS_LINES)]
    assert all(c.startswith("gshare ") for c in to_run), to_run
    bindir = str(Path(sys.executable).parent)
    assert (Path(bindir) / "gshare").exists(), f"no gshare command beside {sys.executable}"
    with ServeProcess(state_dir=tmp_path / "state", tiny_models=True) as srv:
        env = dict(os.environ)
        env.update(
            GSHARE_URL=srv.url,
            GSHARE_STATE=str(srv.state_dir),
            PATH=os.pathsep.join([bindir, env.get("PATH", "")]),
        )
        invoked = []
        for command in to_run:
            r = subprocess.run(
                ["bash", "-c", command],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                timeout=180,
            )
            assert r.returncode == 0, (
                f"{command!r} exited {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}\n"
                f"server log: {srv.log()}"
            )
            if command.startswith("gshare invoke "):
                invoked.append(json.loads(r.stdout))
        assert invoked, "no invoke line ran"
        for answer in invoked:
            assert isinstance(answer["label"], int), answer
            assert isinstance(answer["score"], float), answer
        stopped = srv.stop(signal.SIGINT)  # the README stops it with kill -INT
    assert stopped.clean, stopped
