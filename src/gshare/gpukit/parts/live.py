"""Part g: ``gshare serve`` on the GPU, as a user runs it.

Starts ``gshare serve`` (``gshare.testing.ServeProcess``: its default mode, a temporary state
folder), then:

1. **cold start**: deploys resnet50 (``device: cuda``, quota 0.6) and times deploy -> first
   answer;
2. **shares**: deploys bert-base at quota 0.3 and drives both with closed-loop clients for up
   to 30 s: each function's p50/p99 and its achieved share (the controller's per-instance
   ``achieved_share``, sampled every second) against the requested one;
3. **model store**: resnet50 at 4 instances (forked, CUDA IPC weights) vs 1: the GPU memory of
   the server's processes (``nvidia-smi --query-compute-apps``);
4. **priorities (FIKIT)**: a priority-9 resnet50's p99 alone, then beside a saturating
   priority-0 resnet50 (FIKIT), then beside it at equal priority.

Each step runs while the part's budget allows. In a dry run the same steps run on the CPU with
the tiny ``mlp`` model (what needs a GPU is skipped), so the part cannot rot.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from gshare.gpukit.parts.common import Deadline, KitContext, part_main, percentile, skipped
from gshare.gpukit.results import Figure, PartResult, judge

IMAGE_BYTES = 3 * 224 * 224 * 4


def _spec(
    name: str, model: str, device: str, quota: float, sm_pct: float = 50, **kw: Any
) -> dict[str, Any]:
    """A function spec; SM shares that fit side by side on one device (the placer's rule)."""
    spec = {
        "name": name,
        "model": model,
        "device": device,
        "resources": {
            "sm_pct": sm_pct,
            "quota_request": quota,
            "quota_limit": quota,
            "mem_mb": 4096 if device == "cuda" else 512,
        },
        "batching": {"max_batch": 8, "max_wait_ms": 5},
        "min_instances": 1,
        "max_instances": 1,
        "keep_alive_s": 600,
    }
    spec.update(kw)
    return spec


def _payload(model: str) -> bytes:
    if model == "bert-base":
        return b"a shared GPU serves this sentence " * 3
    if model == "mlp":
        return bytes(64 * 4)
    return bytes(IMAGE_BYTES)


class _Load:
    """Closed-loop clients of one function (threads, httpx), recording latencies."""

    def __init__(self, url: str, name: str, model: str, clients: int) -> None:
        self.url, self.name, self.body = url, name, _payload(model)
        self.lat_ms: list[float] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self) -> None:
        import httpx

        with httpx.Client(base_url=self.url, timeout=60) as c:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                r = c.post(
                    f"/function/{self.name}",
                    content=self.body,
                    headers={"Content-Type": "application/octet-stream"},
                )
                if r.status_code == 200:
                    self.lat_ms.append((time.perf_counter() - t0) * 1000.0)
                elif len(self.errors) < 5:
                    self.errors.append(f"{r.status_code} {r.text[:120]}")

    def __enter__(self) -> _Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=70)


def _wait_answer(client: Any, name: str, model: str, timeout_s: float) -> float:
    """Seconds until ``name`` answers (a 2xx) — the cold start when called right after deploy."""
    t0 = time.monotonic()
    last = ""
    while time.monotonic() - t0 < timeout_s:
        try:
            r = client.invoke_raw(name, _payload(model))
            if 200 <= r.status_code < 300:
                return time.monotonic() - t0
            last = f"{r.status_code} {r.text[:200]}"
        except Exception as e:  # noqa: BLE001 -- keep asking until the time-out
            last = f"{type(e).__name__}: {e}"
        time.sleep(0.2)
    raise RuntimeError(f"{name} did not answer in {timeout_s:.0f} s: {last}")


def _gpu_mem_mb(pids: set[int]) -> float | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    out = subprocess.run(
        [smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    ).stdout
    total = 0.0
    for line in out.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and int(parts[0]) in pids:
            total += float(parts[1])
    return total


def _tree_pids(root: int) -> set[int]:
    import psutil

    try:
        p = psutil.Process(root)
        return {root, *(c.pid for c in p.children(recursive=True))}
    except psutil.NoSuchProcess:
        return set()


def _shares(client: Any, names: list[str], samples: dict[str, list[float]]) -> None:
    for n in names:
        for inst in client.get(n).get("instances", []):
            if inst.get("achieved_share") is not None and inst.get("state") == "ready":
                samples[n].append(float(inst["achieved_share"]))


def run(ctx: KitContext, budget_s: float) -> PartResult:
    from gshare.testing import ServeProcess

    dl = Deadline(budget_s)
    figs: list[Figure] = []
    gpu = ctx.gpu
    on = "gpu" if gpu else "cpu"
    device = "cuda" if gpu else "cpu"
    big, small = ("resnet50", "bert-base") if gpu else ("mlp", "mlp")
    log = Path(ctx.work) / "g-serve.log"
    with ServeProcess(log_path=log, tiny_models=not gpu, start_timeout_s=90) as srv:
        c = srv.client()
        figs.append(
            Figure(
                "serve_ready",
                True,
                "yes",
                True,
                "",
                on,
                srv.args and " ".join(srv.args) or "the default mode",
            )
        )
        try:
            _steps(ctx, srv, c, figs, dl, big, small, device, on)
        except Exception as e:  # noqa: BLE001 -- keep what was measured, name what broke
            figs.append(
                Figure(
                    "live_steps_completed",
                    False,
                    "yes",
                    False,
                    "",
                    on,
                    f"{type(e).__name__}: {e}"[:600] + f" (server log: {log.name})",
                )
            )
    return judge(figs, gpu, ctx.no_gpu_reason())


def _steps(
    ctx: KitContext,
    srv: Any,
    c: Any,
    figs: list[Figure],
    dl: Deadline,
    big: str,
    small: str,
    device: str,
    on: str,
) -> None:
    """Cold start, shares, model store, priorities, in order; appends to ``figs`` as it goes."""
    gpu = ctx.gpu
    c.deploy(_spec("big", big, device, 0.6))
    cold = _wait_answer(c, "big", big, min(120.0, dl.left() - 10))
    figs.append(
        Figure(f"cold_start_s_{big}", round(cold, 2), None, None, "s", on, "deploy -> first answer")
    )
    pid_root = srv.proc.pid if srv.proc else 0
    mem_one = _gpu_mem_mb(_tree_pids(pid_root)) if gpu else None
    c.deploy(_spec("small", small, device, 0.3))
    _wait_answer(c, "small", small, min(120.0, dl.left() - 10))
    load_s = max(3.0, min(30.0, dl.left() - 45)) if gpu else 3.0
    samples: dict[str, list[float]] = {"big": [], "small": []}
    with _Load(srv.url, "big", big, 4) as lb, _Load(srv.url, "small", small, 4) as ls:
        t_end = time.monotonic() + load_s
        time.sleep(min(3.0, load_s / 3))
        while time.monotonic() < t_end:
            _shares(c, ["big", "small"], samples)
            time.sleep(1.0)
    for name, load, quota, model in (("big", lb, 0.6, big), ("small", ls, 0.3, small)):
        lat = load.lat_ms
        figs.append(
            Figure(
                f"p50_ms_{model}_q{quota}",
                round(percentile(lat, 50), 2),
                None,
                None,
                "ms",
                on,
                f"{len(lat)} answers in {load_s:.0f} s; errors {load.errors[:2]}",
            )
        )
        figs.append(
            Figure(
                f"p99_ms_{model}_q{quota}",
                round(percentile(lat, 99), 2),
                None,
                None,
                "ms",
                on,
                "",
            )
        )
        s = samples[name]
        achieved = sum(s) / len(s) if s else None
        figs.append(
            Figure(
                f"achieved_share_{model}_q{quota}",
                None if achieved is None else round(achieved, 3),
                f"requested {quota}",
                None,
                "",
                on,
                f"mean of {len(s)} one-second samples",
            )
        )
    if gpu and dl.enough(40):
        c.delete("small")
        c.deploy(_spec("big", big, device, 0.2, sm_pct=25, min_instances=4, max_instances=4))
        t0 = time.monotonic()
        while time.monotonic() - t0 < min(90.0, dl.left() - 10):
            ready = [i for i in c.get("big")["instances"] if i["state"] == "ready"]
            if len(ready) >= 4:
                break
            time.sleep(0.5)
        mem_four = _gpu_mem_mb(_tree_pids(pid_root))
        if mem_one and mem_four:
            figs.append(
                Figure(
                    "gpu_mem_ratio_4_instances_vs_1",
                    round(mem_four / mem_one, 2),
                    "well under 4 (one weight copy per GPU)",
                    None,
                    "x",
                    "gpu",
                    f"{mem_four:.0f} MiB vs {mem_one:.0f} MiB",
                )
            )
    else:
        figs.append(
            skipped(
                "gpu_mem_ratio_4_instances_vs_1", "no time left" if gpu else ctx.no_gpu_reason()
            )
        )
    if gpu and dl.enough(40):
        figs += _priorities(c, srv.url, big, dl)
    else:
        figs.append(
            skipped("high_priority_p99_ms_fikit", "no time left" if gpu else ctx.no_gpu_reason())
        )


def _priorities(c: Any, url: str, model: str, dl: Deadline) -> list[Figure]:
    """A priority-9 function's p99: alone, beside a saturating priority-0 one, then beside it at
    equal priority (FIKIT's headline, live)."""
    for n in [f["name"] for f in c.list()]:
        c.delete(n)
    c.deploy(_spec("hi", model, "cuda", 0.5, priority=9))
    c.deploy(_spec("lo", model, "cuda", 0.5, priority=0))
    _wait_answer(c, "hi", model, 60)
    _wait_answer(c, "lo", model, 60)
    secs = max(3.0, min(8.0, (dl.left() - 20) / 3))
    out: list[Figure] = []
    p99: dict[str, float] = {}
    for scene in ("alone", "fikit", "equal"):
        if scene == "equal":
            c.deploy(_spec("lo", model, "cuda", 0.5, priority=9))
            _wait_answer(c, "lo", model, 60)
        with _Load(url, "hi", model, 1) as hi:
            if scene == "alone":
                time.sleep(secs)
            else:
                with _Load(url, "lo", model, 4):
                    time.sleep(secs)
        p99[scene] = percentile(hi.lat_ms, 99)
        out.append(
            Figure(
                f"high_priority_p99_ms_{scene}",
                round(p99[scene], 2),
                None,
                None,
                "ms",
                "gpu",
                f"{len(hi.lat_ms)} answers in {secs:.0f} s",
            )
        )
    return out


if __name__ == "__main__":
    part_main(run)
