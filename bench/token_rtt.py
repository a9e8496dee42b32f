"""Token request + release round trip over the Unix socket, against a raw socket echo.

Usage: ``python bench/token_rtt.py [--quick] [--json PATH] [--repeat N] [--gap-ms MS] [--block N]``

Set-up, as on a node: the ``TokenServer`` runs in this process (the node agent's role) and the
client runs in a separate process (an instance, started with multiprocessing *spawn*). One
client is registered alone on the device with 100 % of the SMs and request = limit = 1, so
every request is granted at once and the figure is the mechanism's cost, not queueing.

* ``token acquire+release`` -- one sample is ``TokenClient.acquire()`` (ACQUIRE frame out,
  GRANT frame back: one round trip through the server's scheduler) followed by
  ``release(busy_ms)`` (one frame out, no reply), timed with ``time.perf_counter`` in the
  client, with nothing run in between. Because the release is not answered, ``mean_us`` (total
  time / samples, back to back) is also shown: it includes the server's processing of every
  release, which the next acquire waits behind (the best run's mean is shown).
* ``raw uds echo`` -- the baseline: the same client process sends a 16-byte frame to a
  selector-loop thread in this process that sends it back (the floor for any Python protocol
  over this socket type on this machine).

* ``..., after N ms of work`` -- the same two round trips, each after ``--gap-ms`` (2) of CPU
  spinning in the client, as an instance asks for a token after preparing a batch and releases
  it after running it. The far end has gone idle in between, so this adds the machine's
  wake-up latency of an idle thread (in a VM: of an idle vCPU), whatever the protocol: the
  echo row shows the platform's share of it.

Token and echo round trips alternate in blocks of ``--block`` (50) inside one client process
(one for the back-to-back pair, one for the after-work pair, in every one of ``--repeat``
runs), so both see the same machine: the development VM switches between a fast state (echo
~10 us) and a slow one (echo ~50 us) every few seconds, and a ratio of two runs a few seconds
apart measured that switch, not the protocol (docs/journal/tokens.md). The percentiles pool
every run's samples.

Summary: ``rtt_us_p50`` and ``rtt_us_p99`` (token acquire+release; target p50 <= 100 us),
``rtt_us_mean``, ``echo_us_p50``, ``ratio_p50_vs_echo`` (token / echo, same run),
``rtt_after_work_us_p50`` and ``echo_after_work_us_p50`` (the round trips after work).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import selectors
import socket
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from _common import bench_parser, machine_load, percentile, print_table, write_json
from gshare.policy.tokens import ClientSpec
from gshare.runtime.tokens import TokenClient, TokenServer


def _client_main(
    tok_path: str, echo_path: str, n: int, warmup: int, gap_ms: float, block: int, out: Connection
) -> None:  # pragma: no cover - runs in the child
    """Child process: ``n`` timed token round trips and ``n`` echo round trips (after
    ``warmup`` of each), alternating in blocks of ``block``, each after ``gap_ms`` of CPU
    spinning (0: back to back); sends back both sample lists (us) and mean cycles (us)."""
    perf = time.perf_counter
    gap_s = gap_ms / 1000.0
    c = TokenClient(tok_path, "bench", timeout_s=30)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(echo_path)
    msg = b"\x02" + b"\0" * 15
    view = memoryview(bytearray(16))

    def token_once() -> None:
        c.acquire()
        c.release(0.001)

    def echo_once() -> None:
        s.sendall(msg)
        got = 0
        while got < 16:
            got += s.recv_into(view[got:], 16 - got)

    result: dict[str, tuple[list[float], float]] = {}
    samples = {"token": [0.0] * n, "echo": [0.0] * n}
    busy = {"token": 0.0, "echo": 0.0}
    spent = {"token": 0.0, "echo": 0.0}
    for _ in range(warmup):
        token_once()
        echo_once()
    for start in range(0, n, block):
        for kind, once in (("token", token_once), ("echo", echo_once)):
            xs = samples[kind]
            t_all = perf()
            for i in range(start, min(n, start + block)):
                if gap_s:
                    d = perf() + gap_s
                    while perf() < d:
                        pass
                    busy[kind] += gap_s
                t = perf()
                once()
                xs[i] = (perf() - t) * 1e6
            spent[kind] += perf() - t_all
    for kind in samples:
        result[kind] = (samples[kind], (spent[kind] - busy[kind]) / n * 1e6)
    c.close()
    s.close()
    out.send(result)
    out.close()


class _EchoServer:
    """A selector loop in a thread echoing every byte it reads (the baseline's far end)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(8)
        self.listener.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ)
        self.stop_r, self.stop_w = socket.socketpair()
        self.sel.register(self.stop_r, selectors.EVENT_READ)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            for key, _ in self.sel.select():
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self.stop_r:
                    return
                if sock is self.listener:
                    conn, _ = self.listener.accept()
                    conn.setblocking(False)
                    self.sel.register(conn, selectors.EVENT_READ)
                    continue
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    continue
                if not data:
                    self.sel.unregister(sock)
                    sock.close()
                else:
                    sock.send(data)

    def close(self) -> None:
        self.stop_w.send(b"x")
        self.thread.join(5)
        self.listener.close()
        os.unlink(self.path)


def _run_child(
    tok_path: str, echo_path: str, n: int, warmup: int, gap_ms: float, block: int
) -> dict[str, tuple[list[float], float]]:
    ctx = mp.get_context("spawn")
    recv_end, send_end = ctx.Pipe(duplex=False)
    p = ctx.Process(
        target=_client_main, args=(tok_path, echo_path, n, warmup, gap_ms, block, send_end)
    )
    p.start()
    send_end.close()
    result: dict[str, tuple[list[float], float]] = recv_end.recv()
    p.join(30)
    if p.exitcode != 0:
        sys.exit(f"client failed (exit code {p.exitcode})")
    return result


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--repeat", type=int, default=None, help="runs per case (3; quick 2)")
    parser.add_argument(
        "--gap-ms", type=float, default=2.0, help="CPU work before each 'after work' round trip"
    )
    parser.add_argument(
        "--block", type=int, default=50, help="round trips per token / echo block (50)"
    )
    args = parser.parse_args()
    load = machine_load()  # before our own load
    n = 3000 if args.quick else 20000
    warmup = 300 if args.quick else 2000
    repeat = args.repeat or (2 if args.quick else 3)

    gap_n = n // 10  # round trips after a gap of work are slower to collect
    block = args.block
    cases = [  # (row name, kind, gap before each round trip ms, samples per run)
        ("token acquire+release", "token", 0.0, n),
        ("raw uds echo (16 B)", "echo", 0.0, n),
        (f"token, after {args.gap_ms:g} ms of work", "token", args.gap_ms, gap_n),
        (f"raw echo, after {args.gap_ms:g} ms of work", "echo", args.gap_ms, gap_n),
    ]
    tmp = tempfile.mkdtemp(prefix="gs-rtt-", dir="/tmp")
    tok_path, echo_path = os.path.join(tmp, "tok.sock"), os.path.join(tmp, "echo.sock")
    server = TokenServer(tok_path)
    server.add_client(ClientSpec("bench", 100.0, 1.0, 1.0))
    server.start()
    echo = _EchoServer(echo_path)
    samples: dict[str, list[float]] = {c[0]: [] for c in cases}
    means: dict[str, list[float]] = {c[0]: [] for c in cases}
    try:
        for _ in range(repeat):
            for gap_ms, count in ((0.0, n), (args.gap_ms, gap_n)):
                got = _run_child(tok_path, echo_path, count, warmup, gap_ms, block)
                for name, kind, case_gap, _count in cases:
                    if case_gap == gap_ms:
                        xs, m = got[kind]
                        samples[name] += xs
                        means[name].append(m)
    finally:
        echo.close()
        stats = server.stats()
        server.stop()
        os.rmdir(tmp)
    expected = repeat * (n + gap_n + 2 * warmup)
    if stats["grants"] != expected or stats["errors"] or stats["malformed"]:
        sys.exit(f"token server counters are off: {stats}")

    rows: list[dict[str, Any]] = []
    for name, *_ in cases:
        xs = samples[name]
        rows.append(
            {
                "case": name,
                "samples": len(xs),
                "p50_us": percentile(xs, 50),
                "p90_us": percentile(xs, 90),
                "p99_us": percentile(xs, 99),
                "mean_us": min(means[name]),
            }
        )
    summary = {
        "rtt_us_p50": rows[0]["p50_us"],
        "rtt_us_p99": rows[0]["p99_us"],
        "rtt_us_mean": rows[0]["mean_us"],
        "echo_us_p50": rows[1]["p50_us"],
        "ratio_p50_vs_echo": rows[0]["p50_us"] / rows[1]["p50_us"],
        "rtt_after_work_us_p50": rows[2]["p50_us"],
        "echo_after_work_us_p50": rows[3]["p50_us"],
        "samples": len(samples[cases[0][0]]),
    }
    print_table(
        "token round trip (server in this process, client in another)",
        ["case", "samples", "p50 us", "p90 us", "p99 us", "mean us"],
        [list(r.values()) for r in rows],
    )
    print(
        f"rtt_us_p50 = {summary['rtt_us_p50']:.1f} (target <= 100), "
        f"rtt_us_p99 = {summary['rtt_us_p99']:.1f}, "
        f"token / echo (p50) = {summary['ratio_p50_vs_echo']:.2f}; after {args.gap_ms:g} ms "
        f"of work: token {summary['rtt_after_work_us_p50']:.1f}, "
        f"echo {summary['echo_after_work_us_p50']:.1f}"
    )
    summary.update(load)
    print(f"machine load at start: {load}")
    write_json(args.json, summary, rows=rows)


if __name__ == "__main__":
    main()
