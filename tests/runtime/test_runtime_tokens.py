"""runtime.tokens: the token server and client over real Unix sockets, real threads and
real processes (no mocks of gshare components).

Shares are measured from the server's token records (the busy time each client reported,
placed at its grant), over a short run, with generous tolerances; nothing asserts how fast
anything is: a length is bounded only in CPU time (``time.thread_time``, which a preempted
thread does not accumulate) or against other values measured in the same test, and a test that
needs several bursts to fit on one token gets long tokens (``LONG_TOKENS``) rather than
trusting the machine to run them within 30 ms. Window W = 40 ms (``TokenConfig`` default)
elsewhere.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from gshare.policy.tokens import ClientSpec, TokenConfig, TokenError
from gshare.runtime.tokens import (
    MemoryChannel,
    TokenClient,
    TokenRecord,
    TokenRuntimeError,
    TokenServer,
    UnknownClientError,
)
from gshare.testing import wait_until

pytestmark = pytest.mark.serial  # measures shares or timings: `make test` runs it alone

LONG_TOKENS = TokenConfig(window_ms=4000.0, max_token_ms=2000.0, idle_token_ms=2000.0)
"""Uncontended tokens of 2 s (a client with request = limit = 1 of a 4-s window: nothing clips
them): back-to-back bursts of a few ms fit on one token unless the machine stalls for seconds."""

FRAME = struct.Struct("<BBHId")
HELLO, ACQUIRE, RELEASE, WELCOME, GRANT, ERROR = 0x01, 0x02, 0x03, 0x81, 0x82, 0xEE

# A busy instance: a closed loop of bursts of KERNELS x KERNEL_MS on a modelled device, each
# burst under tokens. The kernels that fit in the token are "launched" together and the process
# sleeps until they are done (as a host waits on a GPU stream: light on this shared machine);
# the rest of the burst waits for the next token (Gemini revocation, completed=False).
# Prints "ready", waits for a line on stdin, runs SECONDS.
WORKER = r"""
import sys, time
from gshare.runtime.tokens import TokenClient
path, cid, seconds, kernel_ms, kernels = sys.argv[1:6]
seconds, kernel_ms, kernels = float(seconds), float(kernel_ms), int(kernels)
c = TokenClient(path, cid, timeout_s=20)
print("ready", flush=True)
sys.stdin.readline()
end = time.monotonic() + seconds
while time.monotonic() < end:
    left = kernels
    while left:
        c.acquire()
        t0 = time.perf_counter()
        fit = min(left, int(c.token_left_ms() // kernel_ms))
        done = t0 + fit * kernel_ms / 1000.0
        while (r := done - time.perf_counter()) > 0:
            time.sleep(r)
        left -= fit
        c.release((time.perf_counter() - t0) * 1000.0, completed=left == 0)
c.close()
print("done", flush=True)
"""

# Acquires one token, says so, and sleeps holding it until killed.
HOLDER = r"""
import sys, time
from gshare.runtime.tokens import TokenClient
c = TokenClient(sys.argv[1], sys.argv[2], timeout_s=20)
c.acquire()
print("held", flush=True)
time.sleep(60)
"""


@pytest.fixture
def sock_path(short_tmp: Path) -> str:
    return str(short_tmp / "dev0.sock")  # conftest: AF_UNIX paths are at most 107 bytes


@pytest.fixture
def server(sock_path: str) -> Iterator[TokenServer]:
    srv = TokenServer(sock_path, TokenConfig(), record_tokens=100_000)
    srv.start()
    yield srv
    srv.stop()


def spec(cid: str, sm: float = 100.0, req: float = 0.5, lim: float | None = None) -> ClientSpec:
    return ClientSpec(cid, sm, req, req if lim is None else lim)


def spawn(code: str, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def run_workers(path: str, plans: Sequence[tuple[str, float, int]], seconds: float) -> float:
    """Run one WORKER process per (client id, kernel_ms, kernels); return the start time."""
    procs = [spawn(WORKER, path, cid, seconds, k_ms, k) for cid, k_ms, k in plans]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        t_go = time.monotonic()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "done"
            assert p.wait(timeout=30) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return t_go


def busy_s(records: Sequence[TokenRecord], cid: str, t0: float, t1: float) -> float:
    """Busy time of ``cid`` inside [t0, t1]: each record's [start, start + busy] clipped."""
    total = 0.0
    for r in records:
        if r.client_id == cid:
            a, b = r.start_s, r.start_s + r.busy_ms / 1000.0
            total += max(0.0, min(b, t1) - max(a, t0))
    return total


def overlaps(records: Sequence[TokenRecord], a: str, b: str) -> int:
    """Pairs of tokens of clients ``a`` and ``b`` held at the same time (grant to release)."""
    ra = [r for r in records if r.client_id == a]
    rb = [r for r in records if r.client_id == b]
    return sum(1 for x in ra for y in rb if x.start_s < y.end_s and y.start_s < x.end_s)


def raw_connect(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    return s


def raw_hello(s: socket.socket, cid: str) -> None:
    raw = cid.encode()
    s.sendall(FRAME.pack(HELLO, 1, len(raw), 0, 0.0) + raw)
    op, *_ = read_frame(s)
    assert op == WELCOME


def read_frame(s: socket.socket) -> tuple[int, int, int, int, float, bytes]:
    buf = b""
    while len(buf) < FRAME.size:
        chunk = s.recv(FRAME.size - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    op, flags, length, seq, value = FRAME.unpack(buf)
    text = b""
    while len(text) < length:
        text += s.recv(length - len(text))
    return op, flags, length, seq, value, text


# -- shares and the SM adapter (real processes) ------------------------------------------------


def test_two_busy_processes_get_their_shares(server: TokenServer, sock_path: str) -> None:
    # Both on 100 % of the SMs, so they time-share. A: 0.2 x 40 = 8 ms of every window, B: 20 ms;
    # together 70 % of the device, so each reaches its cap and the other 30 % stays idle.
    server.add_client(spec("A", req=0.2))
    server.add_client(spec("B", req=0.5))
    t_go = run_workers(sock_path, [("A", 0.25, 12), ("B", 0.25, 20)], seconds=1.6)
    wait_until(
        lambda: server.stats()["closed"] == 2, 10, "both connections to close"
    )  # both gone: every release processed
    recs = server.token_records()
    t0, t1 = t_go + 0.3, t_go + 1.5  # skip the start; stop before the workers do
    share_a = busy_s(recs, "A", t0, t1) / (t1 - t0) * 100
    share_b = busy_s(recs, "B", t0, t1) / (t1 - t0) * 100
    assert share_a == pytest.approx(20, abs=8), share_a
    assert share_b == pytest.approx(50, abs=10), share_b
    assert overlaps(recs, "A", "B") == 0  # 100 + 100 > 100: never together
    snap = server.snapshot()
    assert not snap["A"].running and not snap["B"].running


def test_sm_adapter_keeps_60pct_clients_apart_and_lets_a_40pct_one_run_beside(
    server: TokenServer, sock_path: str
) -> None:
    # X and Y (60 % SMs each) cannot hold tokens together (120 % > 100 %); Z (40 %) fits beside
    # either of them, so the server hands out two tokens at once (FaST-GShare's multi-token).
    server.add_client(spec("X", sm=60, req=0.4))
    server.add_client(spec("Y", sm=60, req=0.4))
    server.add_client(spec("Z", sm=40, req=0.5))
    both_seen: list[bool] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            s = server.snapshot()
            both_seen.append(s["X"].running and s["Y"].running)
            time.sleep(0.0005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        run_workers(sock_path, [("X", 0.25, 12), ("Y", 0.25, 16), ("Z", 0.25, 8)], seconds=1.0)
        wait_until(lambda: server.stats()["closed"] == 3, 10, "the three connections to close")
    finally:
        stop.set()
        sampler.join()
    recs = server.token_records()
    assert {r.client_id for r in recs} == {"X", "Y", "Z"}
    assert overlaps(recs, "X", "Y") == 0
    assert overlaps(recs, "X", "Z") + overlaps(recs, "Y", "Z") > 0
    assert both_seen and not any(both_seen)


# -- failures: disconnects, malformed messages, unknown clients --------------------------------


def test_disconnect_while_holding_frees_the_token(server: TokenServer, sock_path: str) -> None:
    server.add_client(spec("A", req=0.5))
    server.add_client(spec("B", req=0.5))
    holder = spawn(HOLDER, sock_path, "A")
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        got: list[float] = []
        b = TokenClient(sock_path, "B", timeout_s=20)
        waiter = threading.Thread(target=lambda: got.append(b.acquire()))
        waiter.start()
        wait_until(
            lambda: server.snapshot()["B"].waiting, 10, "B to wait for a token"
        )  # blocked: A holds the device
        assert server.snapshot()["A"].running and not got
        holder.send_signal(signal.SIGKILL)
        waiter.join(timeout=20)
        assert got and got[0] > 0  # B was granted once A's connection dropped
        b.release(0.1)
        b.close()
    finally:
        holder.kill()
        holder.wait()
    (rec,) = [r for r in server.token_records() if r.client_id == "A"]
    assert rec.dropped and not rec.completed
    assert rec.busy_ms == pytest.approx((rec.end_s - rec.start_s) * 1000.0)  # charged its run
    assert "A" in server.snapshot()  # still registered: only the agent removes clients
    assert server.stats()["dropped_tokens"] == 1
    again = TokenClient(sock_path, "A", timeout_s=10)  # and it may reconnect
    assert again.acquire() > 0
    again.release(0.1)
    again.close()


def test_malformed_messages_close_only_that_connection(server: TokenServer, sock_path: str) -> None:
    server.add_client(spec("A", req=0.5))
    server.add_client(spec("B", req=0.5))
    good = TokenClient(sock_path, "B", timeout_s=10)
    # 1. an unknown op from an anonymous connection
    s1 = raw_connect(sock_path)
    s1.sendall(FRAME.pack(0x7F, 0, 0, 1, 0.0))
    assert s1.recv(64) == b""  # closed by the server
    # 2. garbage from an identified connection holding a token: the token is released too
    s2 = raw_connect(sock_path)
    raw_hello(s2, "A")
    s2.sendall(FRAME.pack(ACQUIRE, 0, 0, 7, 0.0))
    op, _, _, seq, token_ms, _ = read_frame(s2)
    assert (op, seq) == (GRANT, 7) and token_ms > 0
    s2.sendall(b"\xff" * 16)
    assert s2.recv(64) == b""
    # 3. a HELLO with a bad version, and one whose id is not UTF-8
    for frame in (
        FRAME.pack(HELLO, 99, 1, 0, 0.0) + b"A",
        FRAME.pack(HELLO, 1, 2, 0, 0.0) + b"\xc3\x28",
    ):
        s3 = raw_connect(sock_path)
        s3.sendall(frame)
        assert s3.recv(64) == b""
        s3.close()
    s1.close()
    s2.close()
    assert server.stats()["malformed"] == 4
    wait_until(lambda: not server.snapshot()["A"].running, 10, "A's token to be released")
    (rec,) = [r for r in server.token_records() if r.client_id == "A"]
    assert rec.dropped
    for _ in range(3):  # the server still serves everyone else
        assert good.acquire() > 0
        good.release(0.05)
    good.close()


def test_frames_split_across_writes_are_reassembled(server: TokenServer, sock_path: str) -> None:
    server.add_client(spec("A", req=0.5))
    s = raw_connect(sock_path)
    msg = FRAME.pack(HELLO, 1, 1, 0, 0.0) + b"A" + FRAME.pack(ACQUIRE, 0, 0, 1, 0.0)
    for i in range(len(msg)):  # one byte per write
        s.sendall(msg[i : i + 1])
        time.sleep(0.0005)
    assert read_frame(s)[0] == WELCOME
    op, _, _, seq, _, _ = read_frame(s)
    assert (op, seq) == (GRANT, 1)
    # RELEASE and the next ACQUIRE in one write
    s.sendall(FRAME.pack(RELEASE, 1, 0, 2, 0.2) + FRAME.pack(ACQUIRE, 0, 0, 3, 0.0))
    op, _, _, seq, _, _ = read_frame(s)
    assert (op, seq) == (GRANT, 3)
    s.close()


def test_unknown_client_and_protocol_errors_get_error_replies(
    server: TokenServer, sock_path: str
) -> None:
    server.add_client(spec("A", req=0.5))
    with pytest.raises(UnknownClientError, match="unknown client 'ghost'"):
        TokenClient(sock_path, "ghost", timeout_s=10)
    s = raw_connect(sock_path)
    s.sendall(FRAME.pack(ACQUIRE, 0, 0, 5, 0.0))  # before HELLO
    op, code, _, seq, _, text = read_frame(s)
    assert (op, code, seq) == (ERROR, 2, 5) and b"HELLO" in text
    raw_hello(s, "A")  # the connection stayed open
    s.sendall(FRAME.pack(RELEASE, 1, 0, 6, 1.0))  # releases no token
    op, code, _, seq, _, _ = read_frame(s)
    assert (op, code, seq) == (ERROR, 3, 6)
    s.sendall(FRAME.pack(ACQUIRE, 0, 0, 7, 0.0))
    assert read_frame(s)[0] == GRANT
    s.sendall(FRAME.pack(ACQUIRE, 0, 0, 8, 0.0))  # while holding
    op, code, _, seq, _, _ = read_frame(s)
    assert (op, code, seq) == (ERROR, 3, 8)
    s.sendall(FRAME.pack(RELEASE, 1, 0, 9, float("nan")))  # bad value
    op, code, _, seq, _, _ = read_frame(s)
    assert (op, code, seq) == (ERROR, 4, 9)
    with pytest.raises(TokenRuntimeError, match="already connected"):  # one connection each
        TokenClient(sock_path, "A", timeout_s=10)
    s.close()
    assert server.stats()["malformed"] == 0


def test_client_misuse_is_refused_locally(server: TokenServer, sock_path: str) -> None:
    server.add_client(spec("A", req=0.5))
    with TokenClient(sock_path, "A", timeout_s=10) as c:
        assert c.window_ms == 40.0
        with pytest.raises(TokenRuntimeError, match="holds no token"):
            c.release(1.0)
        c.acquire()
        with pytest.raises(TokenRuntimeError, match="already holds"):
            c.acquire()
        with pytest.raises(ValueError, match="busy_ms"):
            c.release(-1.0)
        first_left = c.token_left_ms()
        assert first_left <= c.token_ms  # type: ignore[operator]
        assert c.token_left_ms() <= first_left  # it only runs down (how fast: the wall clock's)
        assert c.should_yield(1e9)
        c.release(0.5)
        with c.burst() as token_ms:
            assert token_ms > 0
    wait_until(
        lambda: not server.snapshot()["A"].running, 10, "A's token to be released"
    )  # a release has no reply
    assert server.stats()["errors"] == 0
    assert server.snapshot()["A"].total_used_ms > 0.5


def test_remove_client_fails_a_waiting_acquire(server: TokenServer, sock_path: str) -> None:
    server.add_client(spec("A", req=0.5))
    server.add_client(spec("B", req=0.5))
    a = TokenClient(sock_path, "A", timeout_s=10)
    b = TokenClient(sock_path, "B", timeout_s=10)
    a.acquire()  # A holds the whole device
    errors: list[BaseException] = []

    def wait_b() -> None:
        try:
            b.acquire()
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=wait_b)
    t.start()
    wait_until(lambda: server.snapshot()["B"].waiting, 10, "B to wait for a token")
    server.remove_client("B")
    t.join(timeout=10)
    assert len(errors) == 1 and isinstance(errors[0], UnknownClientError)
    with pytest.raises(UnknownClientError, match="removed"):
        b.acquire()
    with pytest.raises(TokenError):
        server.remove_client("B")
    a.release(0.1)
    a.close()
    b.close()


def test_an_acquire_that_waits_past_its_timeout_raises_and_frees_the_request(
    server: TokenServer, sock_path: str
) -> None:
    # The client's timeout is enforced by the kernel (SO_RCVTIMEO) once the handshake is done,
    # not by polling before each call: a wait past it still fails the call and closes the
    # client; the grant that comes for it later finds no connection and is given back.
    server.add_client(spec("A", req=0.5))
    server.add_client(spec("B", req=0.5))
    a = TokenClient(sock_path, "A", timeout_s=10)
    a.acquire()  # A holds the whole device
    b = TokenClient(sock_path, "B", timeout_s=0.2)
    with pytest.raises(TimeoutError, match="did not answer in time"):
        b.acquire()
    with pytest.raises(TokenRuntimeError, match="closed"):
        b.acquire()
    wait_until(lambda: server.stats()["closed"] == 1, 10, "B's connection to close")
    a.release(0.1)
    wait_until(lambda: server.stats()["undelivered_grants"] == 1, 10, "B's grant to be given back")
    assert a.acquire() > 0  # the device is free again
    a.release(0.1)
    a.close()
    assert server.stats()["errors"] == 0


def test_a_grant_split_across_reads_is_reassembled(short_tmp: Path) -> None:
    # A fake server that sends its WELCOME and GRANT in pieces: the client completes a frame
    # whose first read came back short.
    path = str(short_tmp / "split.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def fake() -> None:
        conn, _ = listener.accept()
        with conn:
            read_frame(conn)  # HELLO
            welcome = FRAME.pack(WELCOME, 1, 0, 0, 40.0)
            conn.sendall(welcome[:5])
            time.sleep(0.05)
            conn.sendall(welcome[5:])
            _, _, _, seq, _, _ = read_frame(conn)  # ACQUIRE
            grant = FRAME.pack(GRANT, 1, 0, seq, 7.5)
            conn.sendall(grant[:3])
            time.sleep(0.05)
            conn.sendall(grant[3:])
            read_frame(conn)  # RELEASE

    t = threading.Thread(target=fake, daemon=True)
    t.start()
    try:
        with TokenClient(path, "A", timeout_s=10) as c:
            assert c.window_ms == 40.0
            assert c.acquire() == 7.5 and c.elastic
            c.release(1.0)
        t.join(10)
        assert not t.is_alive()
    finally:
        listener.close()


def test_a_grant_nobody_can_take_is_given_back(server: TokenServer, sock_path: str) -> None:
    # B asks, then disconnects while waiting; when A releases, the scheduler grants B, the
    # server finds no connection to deliver to and returns the token at once.
    server.add_client(spec("A", req=0.5))
    server.add_client(spec("B", req=0.5))
    a = TokenClient(sock_path, "A", timeout_s=10)
    a.acquire()
    s = raw_connect(sock_path)
    raw_hello(s, "B")
    s.sendall(FRAME.pack(ACQUIRE, 0, 0, 1, 0.0))
    wait_until(lambda: server.snapshot()["B"].waiting, 10, "B to wait for a token")
    s.close()
    wait_until(
        lambda: server.stats()["closed"] == 1, 10, "B's connection to close"
    )  # the server saw B go
    a.release(0.2)
    wait_until(
        lambda: server.stats()["undelivered_grants"] == 1,
        10,
        "the undelivered grant to be returned",
    )
    snap = server.snapshot()
    assert not snap["B"].running and not snap["B"].waiting
    assert a.acquire() > 0  # the device is free again
    a.release(0.1)
    a.close()


def test_a_client_at_its_limit_waits_for_the_next_window(
    server: TokenServer, sock_path: str
) -> None:
    # Limit 0.25 x 40 = 10 ms a window. Reporting 10 ms of use fills the window, so the next
    # token can only come from the tick at the window's end (on the server's clock).
    server.add_client(spec("A", req=0.25))
    with TokenClient(sock_path, "A", timeout_s=10) as c:
        c.acquire()
        c.release(10.0)
        c.acquire()
        c.release(0.1)
    wait_until(lambda: len(server.token_records()) == 2, 10, "two token records")
    first, second = server.token_records()
    w_s = 0.040
    window = int((first.end_s - server.epoch_s) // w_s)
    assert second.start_s >= server.epoch_s + (window + 1) * w_s - 1e-9


def test_stop_removes_the_socket_and_disconnects_clients(sock_path: str) -> None:
    srv = TokenServer(sock_path)
    srv.add_client(spec("A", req=0.5))  # clients may be registered before start
    srv.start()
    c = TokenClient(sock_path, "A", timeout_s=10)
    c.acquire()
    assert os.path.exists(sock_path)
    srv.stop()
    srv.stop()  # idempotent
    assert not os.path.exists(sock_path)
    with pytest.raises(ConnectionError):
        c.release(1.0)
    with pytest.raises(ConnectionError):
        TokenClient(sock_path, "A", timeout_s=10)
    assert not srv.snapshot()["A"].running  # the held token went back on stop
    srv.start()  # and the server can serve again, with its clients still registered
    with TokenClient(sock_path, "A", timeout_s=10) as c1:
        assert c1.acquire() > 0
    srv.stop()
    # a stale socket file left by a crashed server is replaced on start
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(sock_path)
    stale.close()
    with TokenServer(sock_path) as again:
        again.add_client(spec("A", req=0.5))
        with TokenClient(sock_path, "A", timeout_s=10) as c2:
            assert c2.acquire() > 0
        with pytest.raises(RuntimeError, match="already listens"):
            TokenServer(sock_path).start()


def test_token_reuse_runs_back_to_back_bursts_on_one_token(sock_path: str) -> None:
    # Bursts of 2 ms of CPU time (busy_clock=time.thread_time, as a CPU frontend measures them)
    # reuse the first token while its rest fits the EWMA of the bursts, and the release charges
    # the busy time of all of them. Lengths are checked in CPU time or against the bursts
    # measured here, so a slow or preempted run cannot fail them.
    with TokenServer(sock_path, LONG_TOKENS, record_tokens=1000) as srv:
        srv.add_client(spec("A", req=1.0))
        with TokenClient(sock_path, "A", timeout_s=10, busy_clock=time.thread_time) as c:
            bursts: list[float] = []
            for _ in range(5):
                assert c.start_burst() > 0
                t = time.thread_time() + 0.002
                while time.thread_time() < t:
                    pass
                bursts.append(c.end_burst())
            assert c.token_ms == pytest.approx(LONG_TOKENS.idle_token_ms)
            assert c.reused == 4  # one acquire, four bursts on the same token
            assert min(bursts) >= 2.0  # each spun 2 ms of CPU time ...
            assert max(bursts) < 10.0  # ... and little more: CPU time leaves out preemption
            assert min(bursts) <= c.predicted_burst_ms <= max(bursts)  # an EWMA of them
            with pytest.raises(TokenRuntimeError, match="not in a burst"):
                c.end_burst()
            assert c.idle()
            assert not c.idle()  # nothing held any more
            wait_until(lambda: not srv.snapshot()["A"].running, 10, "A's token to be released")
            recs = srv.token_records()
            assert len(recs) == 1 and recs[0].completed
            assert recs[0].busy_ms == pytest.approx(sum(bursts))  # all five, charged on one token
            # A token whose rest cannot fit the predicted burst is given back (completed=False,
            # work is still queued) and a new one acquired.
            c.start_burst()
            c.predicted_burst_ms = 1e6
            c.end_burst()
            c.predicted_burst_ms = 1e6
            c.start_burst()
            assert c.in_burst and c.reused == 4
            c.end_burst()
            c.idle()
            wait_until(lambda: len(srv.token_records()) == 3, 10, "three token records")
            assert [r.completed for r in srv.token_records()] == [True, False, True]
        assert srv.stats()["errors"] == 0


def test_renew_gives_the_token_back_before_asking_again(
    server: TokenServer, sock_path: str
) -> None:
    # renew() sends RELEASE (completed=False, with the busy time on the token) and ACQUIRE in one
    # message: the server handles the release first, so a neighbour waiting meanwhile gets the
    # device before the renewing client's next token.
    server.add_client(spec("A", req=0.5))
    server.add_client(spec("B", req=0.5))
    with (
        TokenClient(sock_path, "A", timeout_s=10) as a,
        TokenClient(sock_path, "B", timeout_s=10) as b,
    ):
        a.acquire()  # A holds the whole device
        got: list[float] = []
        t = threading.Thread(target=lambda: got.append(b.acquire()))
        t.start()
        wait_until(lambda: server.snapshot()["B"].waiting, 10, "B to wait for a token")
        renewed: list[float] = []
        ta = threading.Thread(target=lambda: renewed.append(a.renew()))
        ta.start()
        t.join(10)
        assert got and got[0] > 0  # B was granted on A's release ...
        wait_until(lambda: server.snapshot()["A"].waiting, 10, "A to wait behind B")
        assert not renewed  # ... while A's ACQUIRE waits behind B's token
        b.release(0.5)
        ta.join(10)
        assert renewed and renewed[0] > 0 and a.token_ms is not None
        a.release(0.1)
        assert a.renew() > 0  # without a held token: a plain acquire
        a.release(0.1)
    wait_until(lambda: server.stats()["released"] == 4, 10, "four releases")
    recs = server.token_records()
    assert [(r.client_id, r.completed) for r in recs] == [
        ("A", False),
        ("B", True),
        ("A", True),
        ("A", True),
    ]
    assert server.stats()["errors"] == 0


def test_split_bursts_reuse_a_token_whatever_the_predicted_burst(sock_path: str) -> None:
    # A frontend that yields before every kernel (split_bursts=True) keeps running on the held
    # token while any time is left on it, even when its rest cannot fit the predicted burst
    # (the NOTE on split bursts in TokenClient.reusable): no early release, one token.
    with TokenServer(sock_path, LONG_TOKENS, record_tokens=1000) as srv:
        srv.add_client(spec("A", req=1.0))
        with TokenClient(sock_path, "A", timeout_s=10, split_bursts=True) as c:
            c.start_burst()
            c.end_burst()
            c.predicted_burst_ms = 1e6  # could never fit: the default client would give it back
            assert c.reusable()
            c.start_burst()
            assert c.reused == 1
            c.end_burst()
            c.idle()
            assert not c.reusable()  # nothing held
            wait_until(lambda: len(srv.token_records()) == 1, 10, "one token record")
            assert [r.completed for r in srv.token_records()] == [True]
        assert srv.stats()["errors"] == 0


def test_busy_clock_measures_the_time_reported_on_a_token(sock_path: str) -> None:
    # busy_clock measures the busy time a token's record holds (a CPU frontend passes
    # time.thread_time); the token's length stays wall time. A clock that advances 7 ms per
    # burst: two bursts on one token report 14 ms, whatever the wall clock did.
    ticks = iter(range(0, 1000, 7))

    def fake_clock() -> float:
        return next(ticks) / 1000.0

    with TokenServer(sock_path, LONG_TOKENS, record_tokens=1000) as srv:
        srv.add_client(spec("A", req=1.0))
        with TokenClient(
            sock_path, "A", timeout_s=10, split_bursts=True, busy_clock=fake_clock
        ) as c:
            for _ in range(2):
                c.start_burst()
                c.end_burst()
            c.idle()
            wait_until(lambda: len(srv.token_records()) == 1, 10, "one token record")
            (rec,) = srv.token_records()
            assert rec.busy_ms == pytest.approx(14.0)
            assert c.predicted_burst_ms == pytest.approx(7.0)
        assert srv.stats()["errors"] == 0


# -- the memory channel (resource-centric sizing) -------------------------------------------------


def test_memory_channel_grows_within_the_device_and_counts(short_tmp: Path) -> None:
    """The device's ledger behind the token server: grows that fit are granted, one that does
    not is refused with the reason and leaves the limit, shrinking frees memory, an instance has
    one memory channel, and MEMORY on a token connection is an error (the connection stays)."""
    srv = TokenServer(str(short_tmp / "m.sock"), TokenConfig(), memory_mb=1000)
    srv.start()
    try:
        srv.add_client(spec("a", 50))
        srv.add_client(spec("b", 50))
        assert srv.reserve_memory("a", 100).granted and srv.reserve_memory("b", 800).granted
        assert not srv.reserve_memory("c", 500).granted  # 100 MiB free
        m = MemoryChannel(srv.socket_path, "a")
        r = m.resize(200, 1)  # +100: exactly what is free
        assert r.granted and r.limit_mb == 200 and r.free_mb == 0
        r = m.resize(264, 1)
        assert not r.granted and r.refusal == "device memory full" and r.limit_mb == 200
        assert m.over_max().granted  # only counted
        r = m.resize(100)
        assert r.granted and r.free_mb == 100
        with pytest.raises(TokenRuntimeError, match="memory channel"):
            MemoryChannel(srv.socket_path, "a")
        with pytest.raises(UnknownClientError):
            MemoryChannel(srv.socket_path, "nobody")
        t = TokenClient(srv.socket_path, "a")  # the token connection is separate
        t.acquire()
        t.release(1.0)
        s = raw_connect(srv.socket_path)
        raw_hello(s, "b")
        s.sendall(FRAME.pack(0x04, 0, 0, 7, 500.0))
        op, code, *_ = read_frame(s)
        assert op == 0xEE and code == 2  # not identified as a memory channel
        cap, held = srv.memory_snapshot()
        assert cap == 1000
        assert (held["a"].limit_mb, held["a"].grows, held["a"].refusals) == (100, 1, 2)
        srv.release_memory("a")
        assert "a" not in srv.memory_snapshot()[1]
        m.close()
        t.close()
        s.close()
    finally:
        srv.stop()


def test_a_client_registered_with_a_secret_cannot_be_taken_over(short_tmp: Path) -> None:
    """Issue 15, item 2: ids are predictable; a process of the same user that knows one must
    not get that instance's tokens (nor block it with "already connected")."""
    srv = TokenServer(str(short_tmp / "s.sock"), TokenConfig(), memory_mb=100)
    srv.start()
    try:
        srv.add_client(spec("victim", 50), secret="s3cret")
        for creds in (None, "wrong"):
            with pytest.raises(TokenRuntimeError, match="bad credentials") as ei:
                TokenClient(srv.socket_path, "victim", secret=creds)
            assert ei.value.code == 5
            with pytest.raises(TokenRuntimeError, match="bad credentials"):
                MemoryChannel(srv.socket_path, "victim", secret=creds)
        real = TokenClient(srv.socket_path, "victim", secret="s3cret")  # not blocked
        assert real.acquire() > 0
        real.release(1.0)
        mem = MemoryChannel(srv.socket_path, "victim", secret="s3cret")
        mem.close()
        real.close()
        srv.add_client(spec("open", 50))  # registered without a secret: the id suffices
        TokenClient(srv.socket_path, "open").close()
    finally:
        srv.stop()


def test_a_restarted_instance_replaces_its_old_connection(short_tmp: Path) -> None:
    """Issue 15, item 13: a restart could race the token server — the new incarnation's HELLO
    arrived before the old connection's close was read, got "already connected", and burnt a
    restart. With the instance's secret the newcomer takes over (the old connection is closed
    and its token released); without a secret a live holder still keeps its id."""
    srv = TokenServer(str(short_tmp / "s.sock"), TokenConfig(), memory_mb=100)
    srv.start()
    try:
        srv.add_client(spec("inst", 50), secret="k")
        old = TokenClient(srv.socket_path, "inst", secret="k")
        assert old.acquire() > 0  # the old incarnation holds a token when the new one comes
        new = TokenClient(srv.socket_path, "inst", secret="k")
        assert new.acquire() > 0  # the old token was released as on a drop
        new.release(1.0)
        with pytest.raises((ConnectionError, TokenRuntimeError, OSError)):
            old.release(1.0)
            old.acquire()
        new.close()
        srv.add_client(spec("open", 50))  # no secret: the id alone proves nothing
        holder = TokenClient(srv.socket_path, "open")
        with pytest.raises(TokenRuntimeError, match="already connected"):
            TokenClient(srv.socket_path, "open")
        holder.close()
    finally:
        srv.stop()
