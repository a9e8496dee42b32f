"""The instance's batching thread against the IO thread that writes its answers
(``instance.server.InstanceServer._batch_loop``).

The server here is built without its cold start (no process, no model, no token server): the
batching loop and ``_run_batch`` are the real ones; the handler, the device gate and the wire
are stand-ins that record what happened in which order. The wire's "IO thread" writes a batch's
answers only when the test says so (``write_after_s`` later, or never), which makes the order
between the answers and the next batch observable without timing anything.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest

from gshare.runtime.instance import protocol as P
from gshare.runtime.instance import server as S
from gshare.runtime.instance.wire import Item


class Writer:
    def response_frame(self, req_id: int, *_: object) -> bytes:
        return str(req_id).encode()


class Wire:
    """The IO thread's side of ``DataPath.send``: ``written`` is set ``write_after_s`` after
    the batching thread hands the answers over (never, with None)."""

    def __init__(self, write_after_s: float | None) -> None:
        self.write_after_s = write_after_s
        self.sent: list[tuple[list[bytes], threading.Event]] = []

    def send(self, out: list[tuple[Any, bytes]], written: threading.Event | None = None) -> None:
        done = threading.Event()  # the writes themselves, whether the caller asked or not
        self.sent.append(([d for _, d in out], done))

        def write() -> None:
            done.set()
            if written is not None:
                written.set()

        if self.write_after_s is not None:
            threading.Timer(self.write_after_s, write).start()


class Gate:
    def bind_worker(self) -> None: ...
    def begin_batch(self) -> float:
        return time.perf_counter()

    def end_batch(self, t0: float, ok: bool) -> None: ...
    def end_burst(self, t_ask: float, t0: float) -> tuple[float, float]:
        return 1.0, 0.0

    def idle_tokens(self) -> None: ...
    def after_failure(self) -> None: ...


class Handler:
    """Records, at each ``predict``, whether every answer sent before it had been written."""

    def __init__(self, wire: Wire) -> None:
        self.wire = wire
        self.calls: list[tuple[int, bool]] = []

    def predict(self, inputs: list[object]) -> list[object]:
        done = all(w.is_set() for _, w in self.wire.sent)
        self.calls.append((len(self.wire.sent), done))
        return [{"ok": True} for _ in inputs]


def _server(wire: Wire) -> S.InstanceServer:
    srv = object.__new__(S.InstanceServer)
    srv.launch = SimpleNamespace(function="f", instance_id="f-1", predict_timeout_s=0.0)  # type: ignore[assignment]
    srv.max_batch, srv.max_wait_s = 1, 0.0
    srv._cond = threading.Condition()
    srv._queue = deque()
    srv._running = []
    srv._stop = threading.Event()
    srv._written = threading.Event()
    srv._predict_since = None
    srv.stats = {"requests": 0, "batches": 0, "busy_ms": 0.0, "token_wait_ms": 0.0}
    srv.handler = Handler(wire)  # type: ignore[assignment]
    srv._takes_parameters = False
    srv.gate = Gate()  # type: ignore[assignment]
    srv._wire = wire  # type: ignore[assignment]
    return srv


def _serve_two(wire: Wire) -> S.InstanceServer:
    """Queue two requests at once, run the batching loop until both are answered."""
    srv = _server(wire)
    now = time.perf_counter()
    for i in (1, 2):
        srv._queue.append(Item(i, P.OP_INVOKE, P.ENC_JSON, b"{}", Writer(), now))  # type: ignore[arg-type]
    t = threading.Thread(target=srv._batch_loop, daemon=True)
    t.start()
    deadline = time.monotonic() + 30.0
    while len(wire.sent) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    srv._stop.set()
    t.join(30.0)
    assert not t.is_alive()
    return srv


def test_the_next_queued_batch_starts_after_the_answers_before_it_are_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(S, "ANSWER_WRITE_WAIT_S", 30.0, raising=False)  # the cap out of the way
    wire = Wire(write_after_s=0.2)
    srv = _serve_two(wire)
    assert [d for d, _ in wire.sent] == [[b"1"], [b"2"]]
    # the second predict ran once the first batch's answers were written, not while the IO
    # thread still waited for the GIL the handler would hold
    assert srv.handler.calls == [(0, True), (1, True)]  # type: ignore[attr-defined]


def test_answers_never_written_do_not_stop_the_next_batch() -> None:
    """The wait is capped (``ANSWER_WRITE_WAIT_S``, the interpreter's switch interval): an IO
    thread that never writes holds the next batch that long, not for good."""
    wire = Wire(write_after_s=None)
    srv = _serve_two(wire)
    assert [d for d, _ in wire.sent] == [[b"1"], [b"2"]]
    assert srv.handler.calls == [(0, True), (1, False)]  # type: ignore[attr-defined]
