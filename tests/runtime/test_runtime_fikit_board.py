"""FIKIT live, the device side: the board (``runtime.tokens.board``) and the token server's class
plan (``TokenServer(priority_classes=True)``), over real Unix sockets and threads.

What is asserted: the board's layout (slots by client id, the top class); a lower-class client's
ACQUIRE is held while a higher class is active (it gets no token until the higher class gives
its token back as done) and the board shows the top class meanwhile; a lower-class token holder
sees the top class change on the board (its cue to yield); with one class, or without priority
classes, the server behaves as before (no request is held). No timing is asserted: every wait is
on an event, bounded by a generous timeout.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from gshare.policy.tokens import ClientSpec, TokenConfig
from gshare.runtime.tokens import TokenClient, TokenServer
from gshare.runtime.tokens.board import (
    MODE_FIKIT,
    MODE_TOKENS,
    S_FILLS,
    S_PREEMPTIONS,
    S_STATE,
    STATE_BUSY,
    BoardClient,
    BoardWriter,
    board_path,
    ident_of,
    open_board,
)
from gshare.testing import wait_until

CFG = TokenConfig(window_ms=4000.0, max_token_ms=2000.0, idle_token_ms=2000.0)


def test_board_path_and_ident() -> None:
    assert board_path("/run/x/tokens0.sock") == "/run/x/tokens0.board"
    assert ident_of("a") == ident_of("a") != ident_of("b")
    assert ident_of("a") > 0


def test_board_slots_and_top(short_tmp: Path) -> None:
    path = str(short_tmp / "t.board")
    w = BoardWriter(path, MODE_FIKIT)
    sa = w.assign("a", 9)
    sb = w.assign("b", 2)
    assert sa != sb and w.assign("a", 9) == sa  # re-assigning keeps the slot
    c = BoardClient(path, "b")
    assert c.slot == sb and c.priority == 2 and c.mode == MODE_FIKIT
    assert c.top() is None
    w.set_top(9)
    assert c.top() == 9
    c.put(S_STATE, STATE_BUSY)
    c.add(S_PREEMPTIONS, 3)
    c.add(S_FILLS)
    u = w.usage_of("b")
    assert u is not None and u.preemptions == 3 and u.fills == 1
    # the top-class tasks: a is idle (no task), so none runs
    assert c.top_tasks(9) == []
    w.free("b")
    assert not c.still_mine()
    c.close()
    w.remove_file()


def test_open_board_is_off_in_tokens_mode(short_tmp: Path) -> None:
    sock = str(short_tmp / "t.sock")
    w = BoardWriter(board_path(sock), MODE_TOKENS)
    w.assign("a", 5)
    assert open_board(sock, "a") is None  # MODE_TOKENS: instances ignore the board
    assert open_board(str(short_tmp / "none.sock"), "a") is None
    w.remove_file()


def _server(tmp: Path, classes: bool) -> TokenServer:
    sock = str(tmp / "tokens0.sock")
    ts = TokenServer(sock, CFG, board=board_path(sock), priority_classes=classes)
    ts.start()
    for cid, prio in (("high", 9), ("low", 2)):
        ts.add_client(ClientSpec(cid, 100.0, 0.5, 1.0, prio))
    return ts


def _acquire_in_thread(c: TokenClient) -> tuple[threading.Thread, threading.Event]:
    got = threading.Event()

    def run() -> None:
        c.acquire()
        got.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, got


def test_lower_class_is_held_while_a_higher_class_is_active(short_tmp: Path) -> None:
    ts = _server(short_tmp, classes=True)
    try:
        high = TokenClient(ts.socket_path, "high", timeout_s=30)
        low = TokenClient(ts.socket_path, "low", timeout_s=30)
        board = BoardClient(board_path(ts.socket_path), "low")
        low.acquire()  # alone: the low class is the top class and gets a token
        assert board.top() == 2
        t, got = _acquire_in_thread(high)
        # the high class asks: the board's top class changes (low's cue to yield) ...
        wait_until(lambda: board.top() == 9, 20, "the board to show the high class")
        assert not got.is_set()  # ... and high waits for low's token (SM adapter: 100 % each)
        low.release(1.0, completed=False)  # low yields at its next preemption point
        assert got.wait(20)
        t.join(5)
        # low asks again while high holds its token: held back by the class plan
        t2, low_got = _acquire_in_thread(low)
        wait_until(lambda: "low" in _held(ts), 20, "low's request to be held")
        plan = ts.class_plan()
        assert plan is not None and plan.top_priority == 9 and "low" in plan.fill_clients
        assert not low_got.is_set()
        high.release(5.0, completed=True)  # high is done: low's class may run again
        assert low_got.wait(20)
        t2.join(5)
        assert board.top() == 2
        low.release(1.0)
        wait_until(lambda: board.top() is None, 20, "nobody to be active")
        high.close()
        low.close()
        board.close()
    finally:
        ts.stop()


def test_high_class_resuming_keeps_the_lower_class_out(short_tmp: Path) -> None:
    """A release with work left (``completed=False``, the token ran out mid-batch) keeps the
    high class active, so the low class does not slip in before high asks again."""
    ts = _server(short_tmp, classes=True)
    try:
        high = TokenClient(ts.socket_path, "high", timeout_s=30)
        low = TokenClient(ts.socket_path, "low", timeout_s=30)
        high.acquire()
        t, low_got = _acquire_in_thread(low)
        wait_until(lambda: "low" in _held(ts), 20, "low's request to be held")
        high.release(2.0, completed=False)
        high.acquire()  # granted: low stays held
        assert not low_got.is_set()
        high.release(2.0, completed=True)
        assert low_got.wait(20)
        t.join(5)
        high.close()
        low.close()
    finally:
        ts.stop()


@pytest.mark.parametrize("classes", [False, True])
def test_one_class_or_no_classes_is_plain_token_sharing(short_tmp: Path, classes: bool) -> None:
    sock = str(short_tmp / "tokens0.sock")
    ts = TokenServer(sock, CFG, board=board_path(sock), priority_classes=classes)
    ts.start()
    try:
        ts.add_client(ClientSpec("a", 100.0, 0.5, 1.0, 5))
        ts.add_client(ClientSpec("b", 100.0, 0.5, 1.0, 5 if classes else 1))
        a = TokenClient(sock, "a", timeout_s=30)
        b = TokenClient(sock, "b", timeout_s=30)
        a.acquire()
        t, got = _acquire_in_thread(b)
        wait_until(lambda: ts.snapshot()["b"].waiting, 20, "b to wait in the token scheduler")
        assert "b" not in _held(ts)  # not held back by a class plan
        a.release(1.0)
        assert got.wait(20)
        t.join(5)
        b.release(1.0)
        a.close()
        b.close()
    finally:
        ts.stop()


def _held(ts: TokenServer) -> frozenset[str]:
    return ts.held_requests()
