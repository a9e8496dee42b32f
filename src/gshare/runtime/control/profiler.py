"""The FaST-Profiler on the live runtime (FaST-GShare §3.2): measure a function's latency at
every (spatial share, time quota, batch) point and write the rows to the live profile table
the autoscaler reads.

Who runs it: ``POST /system/profile/{name}`` (``gshare profile NAME``) starts one job per
function in the server; ``GET /system/profile/{name}`` reports its progress (the CLI draws a
progress bar from it). A job runs, for each SM share (the Experiment phase samples configs,
the Trial phase loads them):

1. a dedicated profiling instance of the function at that share (outside the function's fleet
   and of the placer's bookkeeping: it is a trial pod, like the paper's), reached through a
   private gateway route so no user request goes to it;
2. for each batch size, the instance's batching is set to exactly that batch
   (``set_batching``), and for each quota the token server's entry is changed in place to
   ``quota_request = quota_limit = quota`` (as FaST-GShare profiles: both equal, §3.3.2);
3. a closed loop with one outstanding batch: ``batch`` requests on the handler's own example
   input (``OP_EXAMPLE``) are sent together, the next batch when all answered, for
   ``trial_s`` seconds after a short warm-up. The row's ``latency_ms`` is the mean batch time,
   so ``throughput = batch × 1000 / latency_ms`` as in every ``ProfileTable``.

The rows replace earlier ones at the same points (``StateStore.put_profile_rows``) and the
controller recomputes the function's candidate configs at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gshare.policy import autoscale
from gshare.profiles import ProfilePoint
from gshare.resources import GpuShare
from gshare.runtime.gateway.errors import HttpError
from gshare.runtime.gateway.router import Gateway
from gshare.runtime.instance import protocol as P
from gshare.runtime.messages import LiveState

if TYPE_CHECKING:
    from gshare.runtime.control.loop import Controller

DEFAULT_QUOTAS_PCT = (25.0, 50.0, 100.0)
DEFAULT_BATCHES = (1, 2, 4, 8)
DEFAULT_TRIAL_S = 1.0
WARMUP_BATCHES = 2
READY_TIMEOUT_S = 300.0


def profile_route(name: str) -> str:
    """The gateway route of a function's profiling instance (not reachable over HTTP: the
    character ``~`` is not allowed in function names)."""
    return f"{name}~profile"


@dataclass
class ProfileJob:
    function: str
    sm_values: list[float]
    quota_values: list[float]
    batches: list[int]
    trial_s: float
    state: str = "running"
    """running | done | failed | cancelled"""
    done: int = 0
    rows: list[dict[str, object]] = field(default_factory=list)
    error: str | None = None
    current: str = "starting"
    started_s: float = field(default_factory=time.time)
    finished_s: float | None = None
    task: asyncio.Task[None] | None = None

    @property
    def total(self) -> int:
        return len(self.sm_values) * len(self.quota_values) * len(self.batches)

    def view(self) -> dict[str, object]:
        return {
            "function": self.function,
            "state": self.state,
            "done": self.done,
            "total": self.total,
            "current": self.current,
            "rows": self.rows,
            "error": self.error,
            "grid": {
                "sm_pct": self.sm_values,
                "quota_pct": self.quota_values,
                "batch": self.batches,
                "trial_s": self.trial_s,
            },
            "elapsed_s": round((self.finished_s or time.time()) - self.started_s, 2),
        }


def _floats(v: object, what: str, lo: float, hi: float) -> list[float]:
    if (
        not isinstance(v, list)
        or not v
        or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in v)
    ):
        raise HttpError(
            400, f"{what}: must be a non-empty list of numbers in ({lo:g}, {hi:g}], got {v!r}"
        )
    out = sorted({float(x) for x in v})
    if not all(lo < x <= hi for x in out):
        raise HttpError(400, f"{what}: every value must be in ({lo:g}, {hi:g}], got {v!r}")
    return out


class LiveProfiler:
    """Profiling jobs of one server (see the module doc)."""

    def __init__(self, controller: Controller, gateway: Gateway) -> None:
        self.controller = controller
        self.gateway = gateway
        self.jobs: dict[str, ProfileJob] = {}

    async def start(self, name: str, params: dict[str, object]) -> dict[str, object]:
        c = self.controller
        fs = c.functions[name]
        job0 = self.jobs.get(name)
        if job0 is not None and job0.state == "running":
            raise HttpError(
                409,
                f"function {name!r} is already being profiled "
                f"({job0.done}/{job0.total} trials done)",
            )
        cores = max((a.info.cpu_count for a in c.agents.values() if a.alive), default=1)
        has_cuda = any(d.name.startswith("cuda") for d in c.devices)
        if "sm_pct" in params:
            sms = _floats(params["sm_pct"], "sm_pct", 0, 100)
        elif has_cuda:
            sms = list(autoscale.FAST_SM_POINTS_PCT)
        else:  # one point per core count: 2 cores → 50, 100
            sms = sorted({round(100.0 * k / cores, 3) for k in range(1, cores + 1)})[-4:]
        qs = (
            _floats(params["quota_pct"], "quota_pct", 0, 100)
            if "quota_pct" in params
            else list(DEFAULT_QUOTAS_PCT)
        )
        max_batch = fs.spec.batching.max_batch
        if "batch" in params:
            b = params["batch"]
            if (
                not isinstance(b, list)
                or not b
                or not all(
                    isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 256 for x in b
                )
            ):
                raise HttpError(
                    400, f"batch: must be a non-empty list of integers in [1, 256], got {b!r}"
                )
            batches = sorted(set(b))
        else:
            batches = [x for x in DEFAULT_BATCHES if x <= max_batch] or [1]
        trial = params.get("trial_s", DEFAULT_TRIAL_S)
        if not isinstance(trial, int | float) or isinstance(trial, bool) or not 0 < trial <= 60:
            raise HttpError(400, f"trial_s: must be a number in (0, 60], got {trial!r}")
        job = ProfileJob(name, sms, qs, batches, float(trial))
        self.jobs[name] = job
        job.task = asyncio.create_task(self._run(job), name=f"gshare-profile-{name}")
        c.state.add_event(
            name,
            f"profiling {job.total} points: sm {sms}, quota {qs}, batch {batches}, "
            f"{trial:g} s each",
        )
        return job.view()

    def status(self, name: str) -> dict[str, object]:
        job = self.jobs.get(name)
        if job is None:
            raise HttpError(404, f"function {name!r} has no profiling job")
        return job.view()

    def cancel(self, name: str) -> None:
        job = self.jobs.get(name)
        if job is not None and job.task is not None and not job.task.done():
            job.task.cancel()

    async def _run(self, job: ProfileJob) -> None:
        c = self.controller
        route = profile_route(job.function)
        inst_id: str | None = None
        rows: list[ProfilePoint] = []
        try:
            fs = c.functions[job.function]
            self.gateway.add_function(route, None, max(job.batches), internal=True)
            device = (
                next(
                    d
                    for d in c.devices
                    if d.node_id == c.gateway_node_id and c.agents[d.node_id].alive
                )
                if any(d.node_id == c.gateway_node_id for d in c.devices)
                else next(d for d in c.devices if c.agents[d.node_id].alive)
            )
            for sm in job.sm_values:
                job.current = f"starting a profiling instance at sm {sm:g}%"
                cfg = autoscale.ScaleConfig(sm, 100.0, max(job.batches), 1.0, 1.0)
                share = GpuShare(
                    sm,
                    1.0,
                    1.0,
                    fs.spec.resources.mem_init_mb if fs.spec.resources != "auto" else 0.0,
                )
                inst = await c.start_instance(fs, cfg, profiling=True, share=share, device=device)
                if inst is None:
                    raise RuntimeError("cannot start the profiling instance")
                inst_id = inst.instance_id
                inst.route = route
                await self._wait_ready(inst_id)
                agent = c.agents[device.node_id].handle
                for b in job.batches:
                    await self._call(
                        route,
                        P.OP_CONTROL,
                        P.ENC_JSON,
                        json.dumps(
                            {"cmd": "set_batching", "max_batch": b, "max_wait_ms": 1000}
                        ).encode(),
                    )
                    for q in job.quota_values:
                        job.current = f"sm {sm:g}%, quota {q:g}%, batch {b}"
                        await agent.set_share(inst_id, q / 100.0, q / 100.0)
                        lat_ms = await self._trial(route, b, job.trial_s)
                        rows.append(ProfilePoint(job.function, sm, q, b, lat_ms))
                        job.rows.append(
                            {
                                "sm_pct": sm,
                                "quota_pct": q,
                                "batch": b,
                                "latency_ms": round(lat_ms, 3),
                                "throughput_rps": round(b * 1000.0 / lat_ms, 2),
                            }
                        )
                        job.done += 1
                await c.stop_instance(inst_id, log_event=False)
                inst_id = None
            n = c.state.put_profile_rows(job.function, rows)
            c.profile_changed(job.function)
            job.state = "done"
            job.current = f"wrote {n} rows"
            c.state.add_event(job.function, f"profiled: wrote {n} rows to the live profile table")
        except asyncio.CancelledError:
            job.state, job.error = (
                "cancelled",
                "cancelled (the function was deleted or the server stopped)",
            )
        except Exception as e:
            job.state, job.error = (
                "failed",
                f"{type(e).__name__}: {e}" if not isinstance(e, HttpError) else e.message,
            )
            c.state.add_event(job.function, f"profiling failed: {job.error}", level="error")
        finally:
            job.finished_s = time.time()
            if inst_id is not None:
                with contextlib.suppress(Exception):
                    await c.stop_instance(inst_id, log_event=False)
            self.gateway.remove_function(route)

    async def _wait_ready(self, iid: str) -> None:
        c = self.controller
        t0 = time.monotonic()
        while True:
            inst = c.instances.get(iid)
            if inst is None:
                raise RuntimeError("the profiling instance failed to start (see gshare logs)")
            if inst.state is LiveState.READY:
                return
            if time.monotonic() - t0 > READY_TIMEOUT_S:
                raise RuntimeError(
                    f"the profiling instance was not ready after {READY_TIMEOUT_S:.0f} s"
                )
            c.nudge()
            await asyncio.sleep(0.2)

    async def _call(self, route: str, op: int, enc: int, payload: bytes) -> bytes:
        gw = self.gateway
        p = gw.submit(route, op, enc, payload, internal=True)
        status, _enc, data, _m = await gw.wait(p)
        if status != P.ST_OK:
            raise RuntimeError(
                f"the profiling instance answered {P.STATUS_NAMES.get(status, status)}: "
                f"{data.decode(errors='replace')}"
            )
        return data

    async def _trial(self, route: str, batch: int, trial_s: float) -> float:
        async def one_batch() -> float:
            t0 = time.perf_counter()
            await asyncio.gather(
                *(self._call(route, P.OP_EXAMPLE, P.ENC_RAW, b"") for _ in range(batch))
            )
            return time.perf_counter() - t0

        for _ in range(WARMUP_BATCHES):
            await one_batch()
        times: list[float] = []
        end = time.perf_counter() + trial_s
        while time.perf_counter() < end or len(times) < 3:
            times.append(await one_batch())
        return statistics.fmean(times) * 1000.0


__all__ = ["LiveProfiler", "ProfileJob", "profile_route"]
