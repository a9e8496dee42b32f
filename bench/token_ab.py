"""Two source trees' token paths side by side: round trips and the mlp overhead, interleaved.

Usage: ``python bench/token_ab.py --tree A=PATH --tree B=PATH [--rounds N] [--quick] [--json PATH]``

The development VM switches between a fast and a slow state every few seconds (a raw
Unix-socket echo takes ~10 us in one, ~50 us in the other) and other work comes and goes, so
two runs of ``token_rtt.py`` or ``token_overhead.py`` a minute apart compare the machine, not
the code. Here each tree (``PATH`` is a checkout's root; its ``src`` goes first on the worker's
``sys.path``) gets one worker process, started once, which hosts that tree's ``TokenServer`` and
an echo thread and spawns one client process (the instance's role). The driver then alternates
the trees every round (``--rounds``, 10; quick 4), each round a short measurement:

* ``rtt`` -- ``acquire()`` + ``release()`` and a raw 16-byte echo, alternating in blocks of 50,
  back to back and after 2 ms of CPU work (as ``token_rtt.py``);
* ``mlp`` -- the ``token_overhead.py`` mlp (1024-2048-2048-1000, batch 8, one torch thread)
  under both protocols: per-burst (``acquire -> call -> release``; the time inside the two
  token calls is ``protocol_us``) and reuse (blocks of 10 calls with ``start_burst`` /
  ``end_burst``, then ``idle()``, against blocks of 10 plain calls, ABBA).

Per tree, pooled over its rounds: ``rtt_us_p50``, ``echo_us_p50``, ``ratio_p50_vs_echo`` and the
same after work; ``protocol_us_p50`` (per-burst); ``overhead_pct_mlp`` (reuse: median of
``with - without`` per block pair over the median plain block) and ``protocol_pct_mlp`` (time
inside the token calls per block over the median plain block). The token server of each tree
runs ``LIVE_TOKEN_CONFIG`` with one client (100 % SMs, request = limit = 1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from _common import bench_parser, machine_load, percentile, print_table, write_json

WORKER = r"""
import json, multiprocessing as mp, os, selectors, socket, statistics, sys, threading, time
from gshare.policy.tokens import LIVE_TOKEN_CONFIG, ClientSpec
from gshare.runtime.tokens import TokenClient, TokenServer


def echo_serve(path):
    lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lst.bind(path)
    lst.listen(4)
    lst.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(lst, selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            s = key.fileobj
            if s is lst:
                c, _ = lst.accept()
                c.setblocking(False)
                sel.register(c, selectors.EVENT_READ)
                continue
            try:
                d = s.recv(65536)
            except BlockingIOError:
                continue
            if not d:
                sel.unregister(s)
                s.close()
            else:
                s.send(d)


def client(tok, echo, conn):
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048),
        torch.nn.ReLU(), torch.nn.Linear(2048, 1000),
    ).eval()
    x = torch.randn(8, 1024)
    c = TokenClient(tok, "bench", timeout_s=60)
    e = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    e.connect(echo)
    msg, view = b"\x02" + b"\0" * 15, memoryview(bytearray(16))
    perf = time.perf_counter

    def tok_once():
        c.acquire()
        c.release(0.001)

    def echo_once():
        e.sendall(msg)
        got = 0
        while got < 16:
            got += e.recv_into(view[got:], 16 - got)

    def rtt(n, gap_s):
        out = {"token": [], "echo": []}
        for _ in range(0, n, 50):
            for kind, once in (("token", tok_once), ("echo", echo_once)):
                for _ in range(50):
                    if gap_s:
                        d = perf() + gap_s
                        while perf() < d:
                            pass
                    t = perf()
                    once()
                    out[kind].append((perf() - t) * 1e6)
        return out

    def mlp_round(pairs, blocks):
        call = lambda: mlp(x)
        proto = []
        for i in range(pairs):  # per-burst: the time inside acquire and release
            call()
            t0 = perf(); c.acquire(); t1 = perf()
            call()
            t2 = perf(); c.release((t2 - t1) * 1e3); t3 = perf()
            proto.append(((t1 - t0) + (t3 - t2)) * 1e6)
        w, wo, wp = [], [], []
        for i in range(blocks):  # reuse: blocks of 10, ABBA with plain blocks
            def with_tokens():
                p = 0.0
                t0 = perf()
                for _ in range(10):
                    a = perf(); c.start_burst(); b = perf()
                    call()
                    d = perf(); c.end_burst(); p += (b - a) + (perf() - d)
                a = perf(); c.idle(); t1 = perf()
                return t1 - t0, p + (t1 - a)
            def without():
                t0 = perf()
                for _ in range(10):
                    call()
                return perf() - t0
            if i % 2 == 0:
                a, p = with_tokens(); b = without()
            else:
                b = without(); a, p = with_tokens()
            w.append(a); wo.append(b); wp.append(p)
        return {"proto_us": proto, "with_s": w, "without_s": wo, "proto_s": wp}

    with torch.inference_mode():
        mlp_round(20, 4)  # warm-up
        rtt(200, 0.0)
        conn.send("ready")
        while True:
            cmd = conn.recv()
            if cmd is None:
                break
            kind, a, b = cmd
            if kind == "rtt":
                conn.send(rtt(a, b))
            else:
                conn.send(mlp_round(a, b))
    c.close()


if __name__ == "__main__":
    tmp = sys.argv[1]
    tok, echo = os.path.join(tmp, "tok.sock"), os.path.join(tmp, "echo.sock")
    server = TokenServer(tok, LIVE_TOKEN_CONFIG)
    server.add_client(ClientSpec("bench", 100.0, 1.0, 1.0))
    server.start()
    threading.Thread(target=echo_serve, args=(echo,), daemon=True).start()
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    p = ctx.Process(target=client, args=(tok, echo, there), daemon=True)
    p.start()
    assert here.recv() == "ready"
    print("ready", flush=True)
    for line in sys.stdin:
        here.send(json.loads(line))
        print(json.dumps(here.recv()), flush=True)
    here.send(None)
    p.join(10)
    stats = server.stats()
    server.stop()
    print(json.dumps(stats), flush=True)
"""


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--tree", action="append", required=True, help="NAME=PATH (twice)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per tree (10; quick 4)")
    args = parser.parse_args()
    rounds = args.rounds or (4 if args.quick else 10)
    trees = dict(t.split("=", 1) for t in args.tree)
    load = machine_load()
    workers: dict[str, subprocess.Popen[str]] = {}
    tmps: list[str] = []
    for name, path in trees.items():
        tmp = tempfile.mkdtemp(prefix="gs-ab-", dir="/tmp")
        tmps.append(tmp)
        env = dict(os.environ, PYTHONPATH=os.path.join(os.path.abspath(path), "src"))
        script = os.path.join(tmp, "worker.py")  # a file: spawn re-imports the main module
        with open(script, "w") as f:
            f.write(WORKER)
        workers[name] = subprocess.Popen(
            [sys.executable, script, tmp],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
    for w in workers.values():
        assert w.stdout is not None and w.stdout.readline().strip() == "ready"

    def ask(name: str, cmd: list[Any]) -> Any:
        w = workers[name]
        assert w.stdin is not None and w.stdout is not None
        w.stdin.write(json.dumps(cmd) + "\n")
        w.stdin.flush()
        return json.loads(w.stdout.readline())

    pooled: dict[str, dict[str, list[float]]] = {
        n: {k: [] for k in ("tok", "echo", "tok_w", "echo_w", "proto", "ovh", "ppct")}
        for n in trees
    }
    n_rtt, pairs, blocks = (1000, 60, 8) if args.quick else (2000, 150, 16)
    for r in range(rounds):
        order = list(trees) if r % 2 == 0 else list(reversed(list(trees)))
        for name in order:
            p = pooled[name]
            got = ask(name, ["rtt", n_rtt, 0.0])
            p["tok"] += got["token"]
            p["echo"] += got["echo"]
            got = ask(name, ["rtt", n_rtt // 10, 0.002])
            p["tok_w"] += got["token"]
            p["echo_w"] += got["echo"]
            got = ask(name, ["mlp", pairs, blocks])
            p["proto"] += got["proto_us"]
            base = sorted(got["without_s"])[len(got["without_s"]) // 2]
            p["ovh"] += [
                (a - b) / base * 100 for a, b in zip(got["with_s"], got["without_s"], strict=True)
            ]
            p["ppct"] += [x / base * 100 for x in got["proto_s"]]
    stats = {}
    for name, w in workers.items():
        assert w.stdin is not None and w.stdout is not None
        w.stdin.close()
        stats[name] = json.loads(w.stdout.readline())
        w.wait(30)
    for tmp in tmps:
        for f in os.listdir(tmp):
            os.unlink(os.path.join(tmp, f))
        os.rmdir(tmp)
    rows = []
    summary: dict[str, Any] = {}
    for name, p in pooled.items():
        row = {
            "tree": name,
            "rtt_us_p50": percentile(p["tok"], 50),
            "echo_us_p50": percentile(p["echo"], 50),
            "rtt_after_work_us_p50": percentile(p["tok_w"], 50),
            "echo_after_work_us_p50": percentile(p["echo_w"], 50),
            "protocol_us_p50": percentile(p["proto"], 50),
            "overhead_pct_mlp": percentile(p["ovh"], 50),
            "protocol_pct_mlp": percentile(p["ppct"], 50),
        }
        row["ratio_p50_vs_echo"] = row["rtt_us_p50"] / row["echo_us_p50"]
        row["ratio_after_work"] = row["rtt_after_work_us_p50"] / row["echo_after_work_us_p50"]
        rows.append(row)
        summary.update({f"{k}_{name}": v for k, v in row.items() if k != "tree"})
        if stats[name]["errors"] or stats[name]["malformed"]:
            sys.exit(f"{name}: token server counters are off: {stats[name]}")
    figures = [k for k in rows[0] if k != "tree"]
    print_table(
        f"token path, trees interleaved ({rounds} rounds)",
        ["figure", *(r["tree"] for r in rows)],
        [[k, *(r[k] for r in rows)] for k in figures],
    )
    load_end = machine_load()
    summary.update(load)
    summary.update({f"{k}_end": v for k, v in load_end.items() if k != "cpus"})
    print(f"machine load at start: {load}; at the end: {load_end}")
    write_json(args.json, summary, rows=rows)


if __name__ == "__main__":
    main()
