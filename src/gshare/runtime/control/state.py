"""Persistent state of a ``gshare serve``: deployed functions, live profiles, events, the token.

Everything lives in one state directory (``--state``, default ``~/.gshare``, mode 0700):

* ``gshare.db`` — SQLite (WAL): ``functions`` (name → spec JSON, the OIP input description
  the first instance reported), ``profiles`` (the live profile table written by
  ``gshare profile``: function, sm_pct, quota_pct, batch → latency_ms; the autoscaler reads it
  through ``ProfileTable``) and ``events`` (per-function log lines: deployments, scale
  decisions, instance starts, crashes and restarts; ``gshare logs NAME`` shows them);
  ``kernel_profiles`` (FIKIT: a function's kernel profile — SK and SG per op id — measured by
  its first instances, ``policy.priority.KernelProfile.to_records``; kept with the code it
  measured, ``kernel_code_key``, so an update of the model or handler measures again, and kept
  across restarts and deletes like the profile rows);
* ``token`` — the bearer token of the control API (``/system/...``), generated at the first
  start, file mode 0600. The CLI reads it from here when ``--token`` is not given.

Who calls it: the server process only (gateway and controller share one ``StateStore``; the
profiler job writes rows through it). Node agents and instances never touch it. Methods are
thread-safe (one connection behind a lock); every call is a short transaction, so the
asyncio loop may call them directly.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gshare.profiles import ProfilePoint, ProfileTable

DEFAULT_STATE_DIR = "~/.gshare"
"""Where ``gshare serve`` keeps its state unless ``--state`` (or ``GSHARE_STATE``) says
otherwise."""
TOKEN_FILE = "token"
DB_FILE = "gshare.db"
MAX_EVENTS_PER_FUNCTION = 2000
"""Older events of a function are trimmed beyond this many lines."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS functions (
    name TEXT PRIMARY KEY,
    spec_json TEXT NOT NULL,
    io_json TEXT,
    version INTEGER NOT NULL DEFAULT 1,
    created_s REAL NOT NULL,
    updated_s REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS profiles (
    function TEXT NOT NULL,
    sm_pct REAL NOT NULL,
    quota_pct REAL NOT NULL,
    batch INTEGER NOT NULL,
    latency_ms REAL NOT NULL,
    measured_s REAL NOT NULL,
    PRIMARY KEY (function, sm_pct, quota_pct, batch)
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts_s REAL NOT NULL,
    function TEXT NOT NULL,
    instance TEXT,
    level TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_function ON events (function, id);
CREATE TABLE IF NOT EXISTS workflows (
    name TEXT PRIMARY KEY,
    spec_json TEXT NOT NULL,
    version INTEGER NOT NULL DEFAULT 1,
    updated_s REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS kernel_profiles (
    function TEXT PRIMARY KEY,
    code_key TEXT NOT NULL,
    runs INTEGER NOT NULL,
    profile_json TEXT NOT NULL,
    measured_s REAL NOT NULL
);
"""


def resolve_state_dir(state: str | os.PathLike[str] | None) -> Path:
    """The state directory: ``state`` if given, else ``$GSHARE_STATE``, else ``~/.gshare``."""
    raw = str(state) if state is not None else os.environ.get("GSHARE_STATE", DEFAULT_STATE_DIR)
    return Path(raw).expanduser()


def read_token(state_dir: Path) -> str | None:
    """The control-API token kept in ``state_dir`` (None when the server never started there)."""
    try:
        return (state_dir / TOKEN_FILE).read_text().strip() or None
    except OSError:
        return None


def ensure_token(state_dir: Path) -> str:
    """Return the token of ``state_dir``, generating it (32 random bytes, url-safe, file mode
    0600, created with O_EXCL so two servers never race to different tokens) when missing."""
    path = state_dir / TOKEN_FILE
    existing = read_token(state_dir)
    if existing:
        os.chmod(path, 0o600)
        return existing
    token = secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process won the race, or an empty file
        again = read_token(state_dir)
        if again:
            return again
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.chmod(path, 0o600)
    return token


@dataclass(frozen=True, slots=True)
class StoredFunction:
    """One row of ``functions``."""

    name: str
    spec: dict[str, Any]
    """The validated spec, as ``FunctionSpec.model_dump(mode="json")``."""
    io: dict[str, Any] | None
    """What an instance reported about the handler (OIP inputs/outputs), once known."""
    version: int
    created_s: float
    updated_s: float


@dataclass(frozen=True, slots=True)
class Event:
    """One log line of a function."""

    ts_s: float
    function: str
    instance: str | None
    level: str
    message: str

    def format(self) -> str:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.ts_s))
        frac = f"{self.ts_s % 1:.3f}"[1:]
        who = f" [{self.instance}]" if self.instance else ""
        return f"{stamp}{frac} {self.level:<5}{who} {self.message}"


class StateStore:
    """The SQLite state of one server (see the module doc). Create with ``open``."""

    def __init__(self, state_dir: Path, conn: sqlite3.Connection) -> None:
        self.state_dir = state_dir
        self._conn = conn
        self._lock = threading.RLock()

    @classmethod
    def open(cls, state_dir: Path) -> StateStore:
        """Create ``state_dir`` (mode 0700) and the database if needed. Raises ``OSError`` when
        the directory cannot be created or written, ``sqlite3.DatabaseError`` for a corrupt db."""
        state_dir.mkdir(parents=True, exist_ok=True)
        with suppress(OSError):
            os.chmod(state_dir, 0o700)
        conn = sqlite3.connect(
            state_dir / DB_FILE, check_same_thread=False, isolation_level=None, timeout=10.0
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.executescript(_SCHEMA)
        return cls(state_dir, conn)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    # -- functions -------------------------------------------------------------------------------

    def put_function(self, name: str, spec: Mapping[str, object]) -> StoredFunction:
        """Insert or replace a function's spec (bumping its version; the io description is
        kept only when the spec did not change its model or handler)."""
        now = time.time()
        text = json.dumps(spec, sort_keys=True)
        with self._tx() as c:
            row = c.execute(
                "SELECT spec_json, io_json, version, created_s FROM functions WHERE name = ?",
                (name,),
            ).fetchone()
            if row is None:
                c.execute(
                    "INSERT INTO functions "
                    "(name, spec_json, io_json, version, created_s, updated_s)"
                    " VALUES (?, ?, NULL, 1, ?, ?)",
                    (name, text, now, now),
                )
                return StoredFunction(name, dict(spec), None, 1, now, now)
            old = json.loads(row[0])
            same_code = all(old.get(k) == spec.get(k) for k in ("model", "handler", "weights"))
            io_json = row[1] if same_code else None
            c.execute(
                "UPDATE functions SET spec_json = ?, io_json = ?, version = ?, updated_s = ?"
                " WHERE name = ?",
                (text, io_json, row[2] + 1, now, name),
            )
            io = json.loads(io_json) if io_json else None
            return StoredFunction(name, dict(spec), io, row[2] + 1, row[3], now)

    def set_function_io(self, name: str, io: Mapping[str, object]) -> None:
        with self._tx() as c:
            c.execute("UPDATE functions SET io_json = ? WHERE name = ?", (json.dumps(io), name))

    def get_function(self, name: str) -> StoredFunction | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT name, spec_json, io_json, version, created_s, updated_s FROM functions"
                " WHERE name = ?",
                (name,),
            ).fetchone()
        return _stored(row) if row else None

    def list_functions(self) -> list[StoredFunction]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT name, spec_json, io_json, version, created_s, updated_s FROM functions"
                " ORDER BY name"
            ).fetchall()
        return [_stored(r) for r in rows]

    def delete_function(self, name: str) -> bool:
        """Remove a function (its events stay for ``gshare logs``; its profile rows too, so a
        redeploy under the same name reuses them). True when it existed."""
        with self._tx() as c:
            cur = c.execute("DELETE FROM functions WHERE name = ?", (name,))
            return cur.rowcount > 0

    # -- workflows -------------------------------------------------------------------------------

    def put_workflow(self, name: str, spec: Mapping[str, object]) -> int:
        """Insert or replace a workflow's spec; its new version."""
        now = time.time()
        text = json.dumps(spec, sort_keys=True)
        with self._tx() as c:
            row = c.execute("SELECT version FROM workflows WHERE name = ?", (name,)).fetchone()
            version = 1 if row is None else int(row[0]) + 1
            c.execute(
                "INSERT OR REPLACE INTO workflows (name, spec_json, version, updated_s)"
                " VALUES (?, ?, ?, ?)",
                (name, text, version, now),
            )
            return version

    def list_workflows(self) -> list[tuple[str, dict[str, Any], int]]:
        """(name, spec, version) of every deployed workflow, by name."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT name, spec_json, version FROM workflows ORDER BY name"
            ).fetchall()
        return [(r[0], json.loads(r[1]), int(r[2])) for r in rows]

    def delete_workflow(self, name: str) -> bool:
        with self._tx() as c:
            return c.execute("DELETE FROM workflows WHERE name = ?", (name,)).rowcount > 0

    # -- profiles --------------------------------------------------------------------------------

    def put_profile_rows(self, function: str, rows: Iterable[ProfilePoint]) -> int:
        """Insert or replace measured rows of ``function`` (``ProfilePoint.model`` is ignored:
        rows are keyed by the function name). Returns the number written."""
        now = time.time()
        n = 0
        with self._tx() as c:
            for r in rows:
                c.execute(
                    "INSERT OR REPLACE INTO profiles"
                    " (function, sm_pct, quota_pct, batch, latency_ms, measured_s)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (function, r.sm_pct, r.quota_pct, r.batch, r.latency_ms, now),
                )
                n += 1
        return n

    def profile_rows(self, function: str) -> list[ProfilePoint]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT sm_pct, quota_pct, batch, latency_ms FROM profiles WHERE function = ?"
                " ORDER BY batch, quota_pct, sm_pct",
                (function,),
            ).fetchall()
        return [ProfilePoint(function, r[0], r[1], int(r[2]), r[3]) for r in rows]

    def profile_table(self, function: str) -> ProfileTable | None:
        """The live profile table of one function (model name = function name), or None when
        it was never profiled."""
        rows = self.profile_rows(function)
        return ProfileTable(rows) if rows else None

    # -- FIKIT kernel profiles ---------------------------------------------------------------------

    def put_kernel_profile(
        self, function: str, code_key: str, profile: Mapping[str, object], runs: int
    ) -> None:
        """Keep a function's measured kernel profile (replacing an older one)."""
        with self._tx() as c:
            c.execute(
                "INSERT OR REPLACE INTO kernel_profiles"
                " (function, code_key, runs, profile_json, measured_s) VALUES (?, ?, ?, ?, ?)",
                (function, code_key, int(runs), json.dumps(profile), time.time()),
            )

    def kernel_profile(self, function: str, code_key: str) -> dict[str, Any] | None:
        """The kernel profile kept for ``function`` when it was measured on the same code
        (``code_key``), else None."""
        with self._lock:
            row = self._conn.execute(
                "SELECT code_key, profile_json FROM kernel_profiles WHERE function = ?",
                (function,),
            ).fetchone()
        if row is None or row[0] != code_key:
            return None
        try:
            doc = json.loads(row[1])
        except ValueError:
            return None
        return doc if isinstance(doc, dict) else None

    # -- events ----------------------------------------------------------------------------------

    def add_event(
        self, function: str, message: str, *, instance: str | None = None, level: str = "info"
    ) -> None:
        with self._tx() as c:
            cur = c.execute(
                "INSERT INTO events (ts_s, function, instance, level, message) "
                "VALUES (?, ?, ?, ?, ?)",
                (time.time(), function, instance, level, message),
            )
            last = cur.lastrowid or 0
            if last % 200 == 0:  # trim now and then, not on every insert
                c.execute(
                    "DELETE FROM events WHERE function = ? AND id <= ("
                    " SELECT id FROM events WHERE function = ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
                    (function, function, MAX_EVENTS_PER_FUNCTION),
                )

    def events(self, function: str, tail: int = 100) -> list[Event]:
        """The last ``tail`` events of ``function``, oldest first."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT ts_s, function, instance, level, message FROM events WHERE function = ?"
                " ORDER BY id DESC LIMIT ?",
                (function, max(0, tail)),
            ).fetchall()
        return [Event(*r) for r in reversed(rows)]


def kernel_code_key(spec: Mapping[str, object]) -> str:
    """What a kernel profile was measured on: the spec's model, handler, weights and device
    (another of them: other ops, measured again)."""
    return json.dumps({k: spec.get(k) for k in ("model", "handler", "weights", "device")})


def _stored(row: tuple[str, str, str | None, int, float, float]) -> StoredFunction:
    return StoredFunction(
        name=row[0],
        spec=json.loads(row[1]),
        io=json.loads(row[2]) if row[2] else None,
        version=int(row[3]),
        created_s=float(row[4]),
        updated_s=float(row[5]),
    )


__all__ = [
    "DEFAULT_STATE_DIR",
    "Event",
    "StateStore",
    "StoredFunction",
    "ensure_token",
    "kernel_code_key",
    "read_token",
    "resolve_state_dir",
]
