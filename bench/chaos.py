"""Fault injection: ``kill -9`` of each process kind of a live server under steady load.

Usage: ``python bench/chaos.py [--quick] [--json PATH] [--kinds instance,template,agent,server]
[--cluster local|ray]`` (``local``: the embedded default)

One ``gshare serve`` (``gshare.testing.ServeProcess``, ``--request-timeout-s 30``) and one
function (the demo handler ``Sleep``, 20 ms a request, ``min_instances`` 1, at most 2). For each
process kind, in this order, while ``--clients`` threads (4) send requests back to back:

* ``instance`` -- the function's instance (a process forked from the node's template);
* ``template`` -- the node's fork template (the instances' parent);
* ``agent`` -- the node agent (a child process of the server in the embedded default, a Ray
  actor with ``--cluster ray``: it holds the token servers and the template);
* ``server`` -- ``gshare serve`` itself; a supervisor's restart is played by starting it again
  on the same state directory one second later (what ``systemd``'s ``Restart=`` would do).

What users are promised, and what the bench checks (``tests/runtime/test_chaos.py`` runs the
``--quick`` form in ``make test`` and asserts it):

* **nothing accepted is lost silently** -- every request ends with its answer or an explicit
  error: an HTTP error with a message, or, when the server process itself dies, a refused or
  broken connection. ``lost`` counts the others (a client timeout: no answer at all), and
  ``dropped`` counts broken connections while the server process was alive. Both must be 0;
* **service comes back within ``BOUND_S``** of the kill: ``recovery_s`` is the time from the
  kill to the first successful answer to a request sent after it;
* **nothing is left after a clean stop** -- no process of any of the run's sessions, no run
  directory, shared-memory model store, memory cgroup or ``server.json``: ``leaks``.

Summary: per kind ``recovery_s_<kind>``, ``errors_<kind>`` (explicit), ``lost``, ``dropped``,
``leaks`` (a list) and ``done_when``.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from _common import bench_parser, machine_load, print_table, write_json
from gshare.runtime.instance.oscap import session_cgroup_dir
from gshare.testing import ServeProcess, wait_until

REPO = Path(__file__).resolve().parents[1]
KINDS = ("instance", "template", "agent", "server")
BOUND_S = {"instance": 30.0, "template": 60.0, "agent": 120.0, "server": 120.0}
"""How soon service must be back after the kill (generous: a 2-core VM shared with the tests)."""
REQUEST_TIMEOUT_S = 30.0
FUNCTION = "chaos"
SPEC = {
    "name": FUNCTION,
    "handler": "gshare.runtime.demo_handlers:Sleep",
    "device": "cpu",
    "resources": {"sm_pct": 50, "quota_request": 0.5, "quota_limit": 1.0},
    "min_instances": 1,
    "max_instances": 2,
}


@dataclass
class Outcome:
    sent_s: float
    done_s: float
    status: int | None
    """HTTP status, or None for a connection-level failure (see ``kind``)."""
    kind: str = ""
    """'' for an HTTP answer; 'refused', 'broken' or 'timeout' otherwise."""
    has_message: bool = True


@dataclass
class Load:
    """Client threads sending requests back to back to one URL (which may change: a restart)."""

    url: str
    clients: int
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        for _ in range(self.clients):
            t = threading.Thread(target=self._run, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(REQUEST_TIMEOUT_S + 60)

    def _run(self) -> None:
        body = {"sleep_ms": 20}
        with httpx.Client(timeout=REQUEST_TIMEOUT_S + 30) as h:
            while not self._stop.is_set():
                t0 = time.monotonic()
                try:
                    r = h.post(f"{self.url}/function/{FUNCTION}", json=body)
                    msg = True
                    if r.status_code != 200:
                        try:
                            msg = bool(r.json().get("error"))
                        except ValueError:
                            msg = False
                    out = Outcome(t0, time.monotonic(), r.status_code, "", msg)
                except httpx.ConnectError:
                    out = Outcome(t0, time.monotonic(), None, "refused")
                    time.sleep(0.05)
                except httpx.TimeoutException:
                    out = Outcome(t0, time.monotonic(), None, "timeout")
                except httpx.TransportError:
                    out = Outcome(t0, time.monotonic(), None, "broken")
                with self._lock:
                    self.outcomes.append(out)

    def since(self, t: float) -> list[Outcome]:
        with self._lock:
            return [o for o in self.outcomes if o.sent_s >= t]


def _status(srv: ServeProcess) -> dict[str, Any]:
    auth = {"authorization": f"Bearer {srv.token}"}
    r = httpx.get(f"{srv.url}/system/function/{FUNCTION}", headers=auth, timeout=10)
    doc: dict[str, Any] = r.json()
    return doc


def _ready_pid(srv: ServeProcess) -> int:
    def ready() -> int | None:
        for i in _status(srv)["instances"]:
            if i["state"] == "ready" and i.get("pid"):
                return int(i["pid"])
        return None

    return int(wait_until(ready, 180, "a ready instance"))


def _victim(kind: str, srv: ServeProcess) -> int:
    if kind == "instance":
        return _ready_pid(srv)
    if kind == "template":
        parent = psutil.Process(_ready_pid(srv)).parent()
        assert parent is not None
        return parent.pid
    if kind == "agent":
        return int(srv.client().info()["nodes"][0]["pid"])
    return srv.pid


def _sessions(srv: ServeProcess) -> set[str]:
    with open(srv.state_dir / "server.json") as f:
        return {str(json.load(f)["session"])}


def _leaks(sessions: set[str], run_dirs: set[str], stores: set[str], state: Path) -> list[str]:
    out: list[str] = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("GSHARE_SESSION") in sessions:
                out.append(f"process {p.pid} ({p.name()})")
        except psutil.Error:
            continue
    out += [f"run directory {d}" for d in run_dirs if os.path.exists(d)]
    out += [f"model store {d}" for s in stores if s for d in glob.glob(glob.escape(s) + "*")]
    for s in sessions:
        found = session_cgroup_dir(s)
        if found is not None and found[1].exists():
            out.append(f"memory cgroup {found[1]}")
    if (state / "server.json").exists():
        out.append("server.json")
    return out


def run(kinds: list[str], clients: int, steady_s: float, cluster: str = "local") -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="gshare-chaos-"))
    srv = ServeProcess(
        "--cluster",
        cluster,
        "--request-timeout-s",
        str(REQUEST_TIMEOUT_S),
        state_dir=tmp / "state",
        tiny_models=True,
        cwd=REPO,
    )
    srv.start()
    sessions: set[str] = set()
    run_dirs: set[str] = set()
    stores: set[str] = set()

    def remember() -> None:
        doc = json.loads((srv.state_dir / "server.json").read_text())
        sessions.add(doc["session"])
        run_dirs.add(doc["run_dir"])
        stores.add(doc.get("store_root") or "")

    remember()
    rows: list[dict[str, Any]] = []
    load: Load | None = None
    outcomes: list[Outcome] = []
    try:
        srv.client().deploy(SPEC)
        _ready_pid(srv)
        load = Load(srv.url, clients)
        load.start()
        window_start = time.monotonic()
        for kind in kinds:
            time.sleep(steady_s)
            pid = _victim(kind, srv)
            t_kill = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            if kind == "server":
                time.sleep(1.0)
                srv = ServeProcess(
                    "--cluster",
                    cluster,
                    "--request-timeout-s",
                    str(REQUEST_TIMEOUT_S),
                    state_dir=srv.state_dir,
                    tiny_models=True,
                    cwd=REPO,
                    port=srv.port,
                ).start()
                remember()

            def back(t: float = t_kill) -> float | None:
                ok = [o for o in load.since(t) if o.status == 200]  # type: ignore[union-attr]
                return min(o.done_s for o in ok) - t if ok else None

            recovery = None
            with contextlib.suppress(AssertionError):
                recovery = wait_until(back, BOUND_S[kind], f"service after killing the {kind}")
            time.sleep(steady_s)
            window = [o for o in load.since(window_start) if o.sent_s < time.monotonic()]
            window_start = time.monotonic()
            errors = [o for o in window if o.status not in (200, None)]
            rows.append(
                {
                    "kind": kind,
                    "pid": pid,
                    "recovery_s": recovery,
                    "bound_s": BOUND_S[kind],
                    "requests": len(window),
                    "errors": len(errors),
                    "error_codes": sorted({o.status for o in errors if o.status}),
                    "errors_without_message": sum(1 for o in errors if not o.has_message),
                    "refused": sum(1 for o in window if o.kind == "refused"),
                    "broken": sum(1 for o in window if o.kind == "broken"),
                    "timeouts": sum(1 for o in window if o.kind == "timeout"),
                }
            )
        load.stop()
        outcomes = load.outcomes
        load = None
    finally:
        if load is not None:
            load.stop()
        stopped = srv.stop()
    kill_server_at = {r["kind"] for r in rows}
    # over every request of the run (a window's edges must not hide one)
    lost = sum(
        1
        for o in outcomes
        if o.kind == "timeout" or (o.status not in (None, 200) and not o.has_message)
    )
    dropped = sum(r["broken"] + r["refused"] for r in rows if r["kind"] != "server")
    leaks = _leaks(sessions, run_dirs, stores, srv.state_dir)
    shutil.rmtree(tmp, ignore_errors=True)
    summary: dict[str, Any] = {
        "lost": lost,
        "dropped": dropped,
        "leaks": leaks,
        "clean_stop": stopped.code == 0 and not stopped.killed,
        "kinds": sorted(kill_server_at, key=KINDS.index),
    }
    for r in rows:
        summary[f"recovery_s_{r['kind']}"] = r["recovery_s"]
        summary[f"errors_{r['kind']}"] = r["errors"]
    summary["done_when"] = {
        "nothing_lost": lost == 0 and dropped == 0,
        "service_back_within_bound": all(r["recovery_s"] is not None for r in rows),
        "nothing_leaked": not leaks and summary["clean_stop"],
    }
    summary["rows"] = rows
    return summary


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = bench_parser(__doc__)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--cluster", choices=("local", "ray"), default="local")
    parser.add_argument("--steady-s", type=float, default=None, help="load before/after (5)")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        parser.error(f"unknown kinds {bad} (known: {', '.join(KINDS)})")
    steady_s = args.steady_s or (2.0 if args.quick else 5.0)
    summary = run(kinds, args.clients, steady_s, args.cluster)
    rows = summary.pop("rows")
    summary.update(machine_load())
    print_table(
        "kill -9 under load",
        ["kind", "recovery s", "bound s", "requests", "errors", "codes", "refused", "lost"],
        [
            [
                r["kind"],
                r["recovery_s"],
                r["bound_s"],
                r["requests"],
                r["errors"],
                ",".join(map(str, r["error_codes"])),
                r["refused"],
                r["timeouts"] + r["errors_without_message"],
            ]
            for r in rows
        ],
    )
    print(json.dumps({k: v for k, v in summary.items() if k != "done_when"}, indent=1))
    print("done_when:", summary["done_when"], file=sys.stderr)
    write_json(args.json, summary, rows=rows)
    summary["rows"] = rows
    return summary


if __name__ == "__main__":
    main()
