"""The device board: a small shared-memory file through which a device's instances follow FIKIT
(priority classes, gaps, fills) without a socket round trip per op.

Who writes and reads what (docs/DESIGN.md, "FIKIT live"):

* the **token server** (node agent) creates the board next to its socket
  (``board_path(socket)``: ``tokens0.sock`` -> ``tokens0.board``), writes the header's mode
  (``MODE_FIKIT`` or ``MODE_TOKENS``), assigns a slot to every client it registers (the slot's
  identity: a hash of the client id, and its priority) and, on every token event that changes
  the class plan (``policy.priority.plan_classes``), the **top priority** of the active clients;
* each **instance** maps it, finds its slot by its id and writes only its own slot: its task
  state (idle / busy / a gap open until a predicted end), the SK of a launch it holds waiting to
  fill a gap, its phase and its counters; at each preemption point it reads the header's top
  priority (one 8-byte load) and, when it waits below the top class, the top-class slots;
* a **fill claim** (rare: a lower-class instance dispatches one launch into a gap) is the only
  write that several processes make to the same fields (the header's fill window and fill end);
  it is serialised by ``flock`` on the board file;
* the **agent** reads the slots' counters for its status report.

Layout: an array of little-endian int64 (``memoryview.cast("q")``): a header of
``HEADER_FIELDS`` then ``MAX_SLOTS`` slots of ``SLOT_FIELDS``. Every field is one aligned 8-byte
word, written and read whole (CPython's memoryview item access copies 8 bytes with a fixed-size
``memcpy``, a single load / store on x86-64 and aarch64), so a reader never sees half a value;
fields written by different writers are never combined without the lock. Times are
``time.monotonic_ns()`` (CLOCK_MONOTONIC, the same in every process of the machine).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

MAGIC: Final[int] = 0x4753_4B42_0001  # "GSKB", layout version 1
HEADER_FIELDS: Final[int] = 8
SLOT_FIELDS: Final[int] = 16
MAX_SLOTS: Final[int] = 64
SIZE_BYTES: Final[int] = 8 * (HEADER_FIELDS + MAX_SLOTS * SLOT_FIELDS)

MODE_TOKENS: Final[int] = 0
"""Priorities only order the token queue (no FIKIT): instances ignore the board."""
MODE_FIKIT: Final[int] = 1
"""FIKIT across priority classes (``policy.priority.classes``), tokens within a class."""

# header fields
H_MAGIC, H_MODE, H_TOP, H_GEN, H_FILL_WINDOW, H_FILL_END = range(6)
NO_TOP: Final[int] = -1

# slot fields (S_IDENT and S_PRIO: the token server; the rest: the slot's instance)
S_IDENT = 0
"""Hash of the client id (``ident_of``); 0 = a free slot."""
S_PRIO = 1
S_STATE = 2
"""``STATE_IDLE`` (no task), ``STATE_BUSY`` (a task runs, no gap open), or > 0: a gap is open
and predicted to end at this ``monotonic_ns``."""
S_WAIT_SK = 3
"""> 0: the instance holds a launch waiting below the top class whose SK is this many ns."""
S_WAIT_SINCE = 4
S_PHASE = 5
"""``PHASE_OFF`` / ``PHASE_MEASURING`` / ``PHASE_SHARING``."""
S_RUNS = 6
"""Runs in the instance's profile (T)."""
S_PREEMPTIONS = 7
"""Launches (torch module calls) the instance held because a higher class was active."""
S_FILLS = 8
"""Launches it dispatched into a higher class's gap."""
S_MEASURE_NS = 9
"""Wall time of its measured runs (the measurement phase)."""
S_MAX_GAP_NS = 10
"""Largest SG of its fillable kernels (0: it never opens a gap): a lower instance polls for
fills only when its held launch fits this."""
S_GAPS = 11
"""Gaps it opened (published)."""
S_WAIT_NS = 12
"""Time its held launches waited for a higher class."""
S_PID = 13

STATE_IDLE: Final[int] = -1
STATE_BUSY: Final[int] = 0
PHASE_OFF, PHASE_MEASURING, PHASE_SHARING = 0, 1, 2
PHASE_NAMES: Final[dict[int, str]] = {0: "off", 1: "measuring", 2: "sharing"}


class BoardError(RuntimeError):
    """Not a board (wrong magic or size), or no slot for a client."""


def board_path(token_socket: str) -> str:
    """The board of the device whose token server listens on ``token_socket``."""
    base = token_socket[: -len(".sock")] if token_socket.endswith(".sock") else token_socket
    return base + ".board"


def ident_of(client_id: str) -> int:
    """A client's slot identity: 63 bits of BLAKE2b of its id, never 0."""
    h = int.from_bytes(hashlib.blake2b(client_id.encode(), digest_size=8).digest(), "little")
    return (h >> 1) or 1


def _slot_base(slot: int) -> int:
    return HEADER_FIELDS + slot * SLOT_FIELDS


@dataclass(frozen=True, slots=True)
class SlotUsage:
    """One slot's counters as the agent reports them (``runtime.messages.FikitUsage``)."""

    phase: str
    runs: int
    preemptions: int
    fills: int
    measure_s: float
    gaps: int
    wait_s: float


class _Mapped:
    """A mapped board file (both sides)."""

    def __init__(self, path: str, *, create: bool) -> None:
        self.path = path
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        self.fd = os.open(path, flags, 0o600)
        if create:  # every instance of the device writes its own slot, whatever its uid
            os.fchmod(self.fd, 0o666)
        try:
            if create:
                os.ftruncate(self.fd, SIZE_BYTES)
            elif os.fstat(self.fd).st_size < SIZE_BYTES:
                raise BoardError(f"{path} is not a device board (too small)")
            self.mm = mmap.mmap(self.fd, SIZE_BYTES)
        except BaseException:
            os.close(self.fd)
            raise
        self.q = memoryview(self.mm).cast("q")
        if not create and self.q[H_MAGIC] != MAGIC:
            self.close()
            raise BoardError(f"{path} is not a device board (bad magic)")

    @property
    def mode(self) -> int:
        return int(self.q[H_MODE])

    def top(self) -> int | None:
        t = int(self.q[H_TOP])
        return None if t == NO_TOP else t

    def slot_of(self, ident: int) -> int | None:
        q = self.q
        for s in range(MAX_SLOTS):
            if q[_slot_base(s) + S_IDENT] == ident:
                return s
        return None

    def usage(self, slot: int) -> SlotUsage:
        q, b = self.q, _slot_base(slot)
        return SlotUsage(
            phase=PHASE_NAMES.get(int(q[b + S_PHASE]), "off"),
            runs=int(q[b + S_RUNS]),
            preemptions=int(q[b + S_PREEMPTIONS]),
            fills=int(q[b + S_FILLS]),
            measure_s=q[b + S_MEASURE_NS] / 1e9,
            gaps=int(q[b + S_GAPS]),
            wait_s=q[b + S_WAIT_NS] / 1e9,
        )

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.q.release()
        with contextlib.suppress(Exception):
            self.mm.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


class BoardWriter(_Mapped):
    """The token server's side: creates the board, assigns slots, publishes the top class.
    Called under the token server's lock (one writer of these fields)."""

    def __init__(self, path: str, mode: int) -> None:
        super().__init__(path, create=True)
        q = self.q
        for i in range(len(q)):
            q[i] = 0
        q[H_MODE] = mode
        q[H_TOP] = NO_TOP
        q[H_MAGIC] = MAGIC

    def assign(self, client_id: str, priority: int) -> int:
        """Give ``client_id`` a slot (its old one if it has one): zeroed counters, its identity
        and priority. Raises ``BoardError`` when every slot is taken."""
        ident = ident_of(client_id)
        slot = self.slot_of(ident)
        if slot is None:
            slot = self.slot_of(0)
        if slot is None:
            raise BoardError(f"the board {self.path} has no free slot for {client_id!r}")
        b = _slot_base(slot)
        q = self.q
        q[b + S_IDENT] = 0
        for f in range(1, SLOT_FIELDS):
            q[b + f] = 0
        q[b + S_STATE] = STATE_IDLE
        q[b + S_PRIO] = priority
        q[b + S_IDENT] = ident
        return slot

    def free(self, client_id: str) -> None:
        slot = self.slot_of(ident_of(client_id))
        if slot is not None:
            self.q[_slot_base(slot) + S_IDENT] = 0

    def set_top(self, top: int | None) -> None:
        """Publish the class plan's top priority (None: nobody is active)."""
        value = NO_TOP if top is None else top
        if self.q[H_TOP] != value:
            self.q[H_TOP] = value
            self.q[H_GEN] += 1

    def usage_of(self, client_id: str) -> SlotUsage | None:
        slot = self.slot_of(ident_of(client_id))
        return None if slot is None else self.usage(slot)

    def remove_file(self) -> None:
        self.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


@dataclass(frozen=True, slots=True)
class TopTask:
    """A slot of the top class as a waiting instance reads it."""

    slot: int
    gap_end_ns: int | None
    """The open gap's predicted end; None while it runs (``STATE_BUSY``)."""
    max_gap_ns: int


@dataclass(frozen=True, slots=True)
class Waiter:
    """A slot below the top class holding a launch (``S_WAIT_SK`` > 0)."""

    slot: int
    priority: int
    sk_ns: int
    since_ns: int


class BoardClient(_Mapped):
    """An instance's side: its own slot's fields, the header, the other slots read-only (and the
    fill fields under ``lock``)."""

    def __init__(self, path: str, client_id: str) -> None:
        super().__init__(path, create=False)
        self.client_id = client_id
        self.ident = ident_of(client_id)
        self.slot = -1
        self.base = 0
        self.refind()

    def refind(self) -> None:
        """(Re)locate this client's slot (the token server re-registers a client whose share
        changes). Raises ``BoardError`` when it has none."""
        slot = self.slot_of(self.ident)
        if slot is None:
            raise BoardError(f"no slot for {self.client_id!r} on the board {self.path}")
        self.slot = slot
        self.base = _slot_base(slot)

    def still_mine(self) -> bool:
        return bool(self.q[self.base + S_IDENT] == self.ident)

    @property
    def priority(self) -> int:
        return int(self.q[self.base + S_PRIO])

    def put(self, field: int, value: int) -> None:
        self.q[self.base + field] = value

    def get(self, field: int) -> int:
        return int(self.q[self.base + field])

    def add(self, field: int, value: int = 1) -> None:
        i = self.base + field
        self.q[i] = self.q[i] + value

    def top_tasks(self, top: int) -> list[TopTask]:
        """The running tasks of class ``top`` (slots not idle)."""
        q = self.q
        out: list[TopTask] = []
        for s in range(MAX_SLOTS):
            b = _slot_base(s)
            if q[b + S_IDENT] == 0 or q[b + S_PRIO] != top:
                continue
            st = int(q[b + S_STATE])
            if st == STATE_IDLE:
                continue
            out.append(TopTask(s, st if st > 0 else None, int(q[b + S_MAX_GAP_NS])))
        return out

    def waiters(self, below: int) -> list[Waiter]:
        q = self.q
        out: list[Waiter] = []
        for s in range(MAX_SLOTS):
            b = _slot_base(s)
            if q[b + S_IDENT] == 0 or q[b + S_PRIO] >= below:
                continue
            sk = int(q[b + S_WAIT_SK])
            if sk > 0:
                out.append(Waiter(s, int(q[b + S_PRIO]), sk, int(q[b + S_WAIT_SINCE])))
        return out

    def fill_state(self) -> tuple[int, int]:
        """(the window the last fills were claimed into, their predicted end); under ``lock``."""
        return int(self.q[H_FILL_WINDOW]), int(self.q[H_FILL_END])

    def set_fill_state(self, window_ns: int, end_ns: int) -> None:
        self.q[H_FILL_WINDOW] = window_ns
        self.q[H_FILL_END] = end_ns

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """The board's lock for fill claims (``flock`` on the file)."""
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)


def open_board(token_socket: str, client_id: str) -> BoardClient | None:
    """The instance's board, or None when its device has none, it is in ``MODE_TOKENS``, or it
    has no slot (FIKIT is then off for this instance: today's token sharing)."""
    path = board_path(token_socket)
    if not token_socket or not Path(path).exists():
        return None
    try:
        b = BoardClient(path, client_id)
    except (OSError, BoardError, ValueError):
        return None
    if b.mode != MODE_FIKIT:
        b.close()
        return None
    return b


__all__ = [
    "MAX_SLOTS",
    "MODE_FIKIT",
    "MODE_TOKENS",
    "BoardClient",
    "BoardError",
    "BoardWriter",
    "SlotUsage",
    "TopTask",
    "Waiter",
    "board_path",
    "ident_of",
    "open_board",
]
