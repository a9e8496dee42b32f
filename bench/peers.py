"""gshare's gateway against what users would pick instead: KServe's Python model server
(``kserve.ModelServer``, the same Open Inference Protocol, the model in process) and Ray Serve.

Same machine, same run, same client, same work (``bench/gateway.py``'s load generator and
requests, built by ``tritonclient``; 16 connections in a closed loop, rounds alternated, each
system's best round kept):

* ``echo`` — a 64-byte JSON body answered unchanged: gshare ``POST /function/echo``, Ray Serve
  the same route, KServe its v1 route ``POST /v1/models/echo:predict`` (its model returns the
  JSON it got);
* ``json``, ``binary``, ``grpc`` — one FP32 tensor of 1 MiB echoed over the Open Inference
  Protocol as JSON tensors, HTTP binary tensor data and gRPC ``ModelInfer`` (raw contents);
  ``binary_4mb`` and ``grpc_4mb`` — the same with 4 MiB;
* ``shm_4mb`` (gshare; KServe's Python server does not serve the extension): the 4 MiB tensor
  in and out through Triton's system shared memory (``bench/shm.py``'s requests: a region pair
  per connection), on the same server right after its other cases; ``shm_over_binary_4mb`` =
  its rps ÷ gshare's ``binary_4mb`` rps;

The systems: gshare (``gshare serve --grpc-port 0``, ``demo_handlers:Echo``, one instance of a
whole device share, no batching); Ray Serve (one replica, as in ``bench/gateway.py``); KServe
0.21 (``ModelServer`` with one ``Model`` whose ``predict`` echoes: an ``InferRequest``'s first
input back as ``output0``, binary when the request asks for binary outputs, as KServe's own
custom-model examples do; one uvicorn worker, its default). KServe is installed by this bench
into its own virtual environment (``~/.cache/gshare-bench/kserve-<version>``, created once; its
pins apart from ours); ``--no-kserve`` leaves it out.

Summary: ``throughput_ratio_vs_kserve_<case>`` and ``p99_ratio_vs_kserve_<case>`` (gshare ÷
KServe; throughput >= 1 and p99 <= 1 is gshare ahead) for ``echo``, ``json``, ``binary``,
``grpc``, ``binary_4mb``, ``grpc_4mb``; the same ``_vs_rayserve_``; ``shm_over_binary_4mb``;
each system's rps / p50 / p99 / errors per case; the machine's load.

Options: ``--quick`` (one round of 3 s per case, 1 MiB cases only), ``--json PATH``,
``--rounds N``, ``--duration-s S``, ``--concurrency N``, ``--no-kserve``, ``--no-rayserve``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

import gateway as gw
import shm as shm_bench
from _common import bench_parser, machine_load, print_table, write_json

KSERVE_VERSION = "0.21.0"
KSERVE_ENV = Path.home() / ".cache" / "gshare-bench" / f"kserve-{KSERVE_VERSION}"
KSERVE_ECHO_PATH = "/v1/models/echo:predict"
MB4_SHAPE = (1, 1_048_576)
"""The 4 MiB FP32 tensor."""

KSERVE_APP = textwrap.dedent(
    """
    import sys
    from kserve import Model, ModelServer
    from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse

    class Echo(Model):
        def __init__(self):
            super().__init__("echo")
            self.ready = True

        async def predict(self, payload, headers=None, response_headers=None):
            if not isinstance(payload, InferRequest):
                return payload  # v1: the JSON body back
            x = payload.inputs[0].as_numpy()
            binary = payload.use_binary_outputs
            for o in payload.request_outputs or ():
                if o.binary_data is not None:
                    binary = o.binary_data
            out = InferOutput(name="output0", shape=list(x.shape), datatype="FP32")
            out.set_data_from_numpy(x, binary_data=binary)
            return InferResponse(
                model_name=self.name, infer_outputs=[out], response_id=payload.id or "",
                use_binary_outputs=binary,
            )

    if __name__ == "__main__":
        http_port, grpc_port = int(sys.argv[1]), int(sys.argv[2])
        ModelServer(http_port=http_port, grpc_port=grpc_port, enable_docs_url=False).start(
            [Echo()]
        )
    """
)

SUFFIX = {
    "echo": "echo",
    "oip-json": "json",
    "oip-binary": "binary",
    "grpc": "grpc",
    "oip-binary-4mb": "binary_4mb",
    "grpc-4mb": "grpc_4mb",
    "shm-4mb": "shm_4mb",
}
"""Case name -> its summary-key suffix."""


def kserve_python() -> Path:
    """The KServe environment's interpreter, created and installed on first use."""
    py = KSERVE_ENV / "bin" / "python"
    if py.exists():
        return py
    print(f"installing kserve=={KSERVE_VERSION} into {KSERVE_ENV} (once)", file=sys.stderr)
    KSERVE_ENV.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(KSERVE_ENV)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", f"kserve=={KSERVE_VERSION}"], check=True)
    return py


def _same_json(body: bytes, headers: dict[str, str]) -> None:
    """KServe's v1 route answers the JSON it got re-serialized (no spaces): the same document."""
    if json.loads(body) != json.loads(gw.PAYLOAD):
        raise SystemExit(f"the KServe echo answer differs: {body[:80]!r}")


def run_kserve(args: Any, tmp: Path, cases: list[gw.Case]) -> dict[str, Any]:
    port, grpc_port = gw.free_port(), gw.free_port()
    app = tmp / "kserve_echo.py"
    app.write_text(KSERVE_APP)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # its own pins
    with open(tmp / f"kserve-{port}.log", "wb") as log:
        proc = subprocess.Popen(
            [str(kserve_python()), str(app), str(port), str(grpc_port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            cwd=tmp,
        )
    try:
        gw.wait_http(port, KSERVE_ECHO_PATH, 180, proc)
        kcases = [
            gw.Case(c.name, c.body, KSERVE_ECHO_PATH, c.headers, check=_same_json)
            if c.name == "echo"
            else c
            for c in cases
        ]
        return gw.measure(args, port, grpc_port, kcases)
    finally:
        gw.stop_process(proc)


def run_gshare(args: Any, tmp: Path, cases: list[gw.Case]) -> dict[str, Any]:
    """gshare's cases, then (full run) the 4 MiB tensor through shared memory on the same
    server."""

    def shm_case(port: int) -> dict[str, dict[str, Any]]:
        if args.quick:
            return {}
        x = np.random.default_rng(0).random(shm_bench.SHAPE, dtype=np.float32)
        with shm_bench.shm_conns(port, x, args.concurrency) as conns:
            return {
                "shm-4mb": asyncio.run(shm_bench.load(port, conns, args.warmup_s, args.duration_s))
            }

    return gw.run_gshare(args, tmp, cases, more=shm_case)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = bench_parser(__doc__)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--duration-s", type=float, default=None)
    parser.add_argument("--warmup-s", type=float, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--no-kserve", action="store_true", help="leave KServe out")
    parser.add_argument("--no-rayserve", action="store_true", help="leave Ray Serve out")
    args = parser.parse_args(argv)
    args.duration_s = args.duration_s or (3.0 if args.quick else 8.0)
    args.warmup_s = args.warmup_s if args.warmup_s is not None else (1.0 if args.quick else 2.0)
    args.rounds = args.rounds or (1 if args.quick else 2)
    cases = gw.make_cases()
    if not args.quick:
        cases += [c for c in gw.make_cases(MB4_SHAPE, "-4mb", echo=False) if "json" not in c.name]
    systems: list[tuple[str, gw.System]] = [("gshare", run_gshare)]
    if not args.no_kserve:
        systems.append(("kserve", run_kserve))
    if not args.no_rayserve:
        systems.append(("ray-serve", gw.run_rayserve))

    best, rounds, failed = gw.alternate_rounds(args, systems, cases, "gshare-peers-")
    ratio = gw.ratio

    summary: dict[str, Any] = {}
    for peer, key in (("kserve", "kserve"), ("ray-serve", "rayserve")):
        for case, sfx in SUFFIX.items():
            g, p = best.get(("gshare", case)), best.get((peer, case))
            if g is None or p is None:
                continue
            summary[f"throughput_ratio_vs_{key}_{sfx}"] = ratio(g["rps"], p["rps"])
            summary[f"p99_ratio_vs_{key}_{sfx}"] = ratio(g["p99_ms"], p["p99_ms"])
    if ("gshare", "shm-4mb") in best and ("gshare", "oip-binary-4mb") in best:
        summary["shm_over_binary_4mb"] = ratio(
            best[("gshare", "shm-4mb")]["rps"], best[("gshare", "oip-binary-4mb")]["rps"]
        )
    for (system, case), b in best.items():
        prefix = system.replace("-", "")
        sfx = SUFFIX[case]
        summary[f"{prefix}_rps_{sfx}"] = b["rps"]
        summary[f"{prefix}_p50_ms_{sfx}"] = b["p50_ms"]
        summary[f"{prefix}_p99_ms_{sfx}"] = b["p99_ms"]
        summary[f"{prefix}_errors_{sfx}"] = sum(
            x["errors"] for x in rounds if x["system"] == system and x["case"] == case
        )
    summary.update(machine_load())
    summary["failed"] = failed
    names = [s for s, _ in systems]
    print_table(
        f"{args.concurrency} connections, {args.duration_s:g} s per round, best of {args.rounds}",
        ["case", "system", "requests/s", "p50 ms", "p99 ms", "errors", "gshare ÷ KServe rps"],
        [
            [
                case,
                system,
                b["rps"],
                b["p50_ms"],
                b["p99_ms"],
                b["errors"],
                summary.get(f"throughput_ratio_vs_kserve_{SUFFIX[case]}", "")
                if system == "gshare"
                else "",
            ]
            for (system, case), b in sorted(
                best.items(), key=lambda kv: (list(SUFFIX).index(kv[0][1]), names.index(kv[0][0]))
            )
        ],
    )
    print_table("summary", ["key", "value"], [[k, v] for k, v in summary.items()])
    write_json(
        args.json,
        summary,
        benchmark="peers",
        params={
            "concurrency": args.concurrency,
            "duration_s": args.duration_s,
            "warmup_s": args.warmup_s,
            "rounds": args.rounds,
            "systems": names,
            "kserve_version": KSERVE_VERSION,
            "request_bytes": {c.name: len(c.body) for c in cases},
        },
        rows=rounds,
    )
    gw.print_errors(best)
    return summary


if __name__ == "__main__":
    main()
