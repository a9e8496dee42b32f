"""Live workflows: a DAG of deployed functions behind ``POST /workflow/{name}`` (ESG §3).

Who uses it: the gateway's HTTP app (``app.mount_workflows``) runs a request through
``WorkflowRunner.run``; the control API (``control.api``) deploys, lists and deletes workflows
(``put``, ``remove``) and the server restores them from the state database at start.

How a request runs: every stage is one request to its function through the call a request
from outside takes (``OipService.call``: ``Gateway.submit``, the same routing, admission,
retries and metrics), started as soon as all its predecessors have answered, so independent
branches run at the same time. What a stage receives:

* a first stage (no ``after``): the request body, as it came (JSON or raw bytes);
* a stage after one stage: that stage's output, as it came;
* a join (a stage after several): a JSON object ``{"<stage>": output, ...}`` with one member
  per predecessor — a JSON output as JSON, a raw output as a base64 string.

The answer is the output of the last stage (the one stage nothing runs after; with several
such stages, a JSON object of their outputs by stage name, as for a join).

Errors name the workflow and the stage: a stage whose function is not deployed (deleted after
the workflow was deployed) is a 424 naming the function; a stage that fails passes on its
status and message. The end-to-end latency is measured from arrival to the last answer and
counted against the workflow's ``slo_ms`` (``gshare_workflow_*`` metrics).

Scheduling: with a ``StageScheduler`` (``gateway.stages``; ``gshare serve --workflow-policy``,
ESG by default) a ready stage becomes a job of the stage's AFW queue and the scheduler decides
its batch, time quota and instance; without one (``--workflow-policy direct``) a stage is one
request through its function's own queue and batching (``OipService.call``).
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import orjson
from prometheus_client import Counter, Histogram

from gshare.runtime.gateway.errors import HttpError
from gshare.runtime.gateway.router import Gateway
from gshare.runtime.gateway.stages import LiveRequest, StageScheduler
from gshare.runtime.instance import protocol as P
from gshare.runtime.metrics import LATENCY_BUCKETS_S
from gshare.workflows.spec import WorkflowSpec

Call = Callable[[str, int, bytes], Awaitable[tuple[int, bytes, tuple[float, float, float, int]]]]
"""One request to a function: (function, encoding, payload) -> (encoding, output, measurements),
``HttpError`` as the function answered (``OipService.call``)."""


@dataclass(frozen=True)
class LiveWorkflow:
    spec: WorkflowSpec
    version: int
    order: tuple[str, ...]
    sinks: tuple[str, ...]
    function_of: Mapping[str, str]
    after: Mapping[str, tuple[str, ...]]
    stats: WorkflowStats = field(default_factory=lambda: WorkflowStats())
    """What its requests did (the status page); mutable, unlike the rest."""


RECENT = 1000
"""Latencies kept per workflow for the status page's p50 / p99."""


@dataclass
class WorkflowStats:
    """One workflow's successful requests: counts since it was deployed and the latencies of
    the last ``RECENT`` (``WorkflowRunner.run`` adds, the status page reads)."""

    recent_ms: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))
    requests: int = 0
    hits: int = 0
    """Requests within the workflow's ``slo_ms``."""

    def add(self, latency_ms: float, hit: bool) -> None:
        self.recent_ms.append(latency_ms)
        self.requests += 1
        self.hits += int(hit)

    def view(self) -> dict[str, object]:
        """Requests, SLO hit rate and the recent p50/p99 as the status page shows them."""
        xs = sorted(self.recent_ms)

        def q(f: float) -> float | None:
            return round(xs[min(len(xs) - 1, int(f * len(xs)))], 2) if xs else None

        rate = self.hits / self.requests if self.requests else None
        return {
            "requests": self.requests,
            "slo_hit_rate": None if rate is None else round(rate, 4),
            "p50_ms": q(0.5),
            "p99_ms": q(0.99),
            "latency_samples": len(xs),
        }


@dataclass
class _Metrics:
    latency: Histogram
    requests: Counter
    slo: Counter
    stage_latency: Histogram


def _make_metrics(gw: Gateway) -> _Metrics:
    r = gw.metrics.registry
    return _Metrics(
        Histogram(
            "gshare_workflow_latency_seconds",
            "Workflow arrival to the last stage's answer, successful requests",
            ["workflow"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        ),
        Counter(
            "gshare_workflow_requests",
            "Workflow requests answered, by HTTP code",
            ["workflow", "code"],
            registry=r,
        ),
        Counter(
            "gshare_workflow_slo",
            "Successful workflow requests within (hit) or over (miss) the workflow's slo_ms",
            ["workflow", "outcome"],
            registry=r,
        ),
        Histogram(
            "gshare_workflow_stage_latency_seconds",
            "A stage's request, submit to answer (queueing and execution)",
            ["workflow", "stage"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        ),
    )


@dataclass
class WorkflowRunner:
    """The deployed workflows of one gateway and their execution (module doc)."""

    gw: Gateway
    scheduler: StageScheduler | None = None
    """The live ESG controller loop (None: ``direct``, module doc)."""
    workflows: dict[str, LiveWorkflow] = field(default_factory=dict)
    _m: _Metrics | None = None

    @property
    def metrics(self) -> _Metrics:
        if self._m is None:
            self._m = _make_metrics(self.gw)
        return self._m

    def put(self, spec: WorkflowSpec, version: int) -> None:
        after = {s.name: tuple(s.after) for s in spec.stages}
        used = {p for ps in after.values() for p in ps}
        self.workflows[spec.name] = LiveWorkflow(
            spec,
            version,
            tuple(spec.topological_order()),
            tuple(s.name for s in spec.stages if s.name not in used),
            {s.name: s.function for s in spec.stages},
            after,
        )
        if self.scheduler is not None:
            self.scheduler.put(spec)

    def remove(self, name: str) -> bool:
        if self.scheduler is not None:
            self.scheduler.remove(name)
        return self.workflows.pop(name, None) is not None

    def missing_functions(self, wf: LiveWorkflow) -> list[str]:
        return sorted({f for f in wf.function_of.values() if not self.gw.is_public(f)})

    async def run(self, name: str, body: bytes, enc: int, call: Call) -> tuple[int, bytes]:
        """Run one request through workflow ``name``, each stage through ``call``: the last
        stage's ``(encoding, output)``, or ``HttpError`` naming the stage that failed."""
        wf = self.workflows.get(name)
        if wf is None:
            raise HttpError(404, f"workflow {name!r} is not deployed")
        t0 = time.perf_counter()
        m = self.metrics
        try:
            out = await self._run(wf, body, enc, call)
        except HttpError as e:
            m.requests.labels(name, str(e.status)).inc()
            raise
        latency_s = time.perf_counter() - t0
        m.requests.labels(name, "200").inc()
        m.latency.labels(name).observe(latency_s)
        hit = latency_s * 1000.0 <= wf.spec.slo_ms
        m.slo.labels(name, "hit" if hit else "miss").inc()
        wf.stats.add(latency_s * 1000.0, hit)
        return out

    async def _run(self, wf: LiveWorkflow, body: bytes, enc: int, call: Call) -> tuple[int, bytes]:
        missing = self.missing_functions(wf)
        if missing:
            raise HttpError(
                424,
                f"workflow {wf.spec.name!r} cannot run: its stages use functions that are not "
                f"deployed: {', '.join(missing)}",
            )
        done: dict[str, asyncio.Future[tuple[int, bytes]]] = {
            s: asyncio.get_running_loop().create_future() for s in wf.order
        }
        req = self.scheduler.new_request(wf.spec) if self.scheduler is not None else None

        async def stage(s: str) -> None:
            preds = wf.after[s]
            try:
                inputs = [await done[p] for p in preds]
                if not preds:
                    s_enc, payload = enc, body
                elif len(preds) == 1:
                    s_enc, payload = inputs[0]
                else:
                    s_enc, payload = P.ENC_JSON, _join(dict(zip(preds, inputs, strict=True)))
                done[s].set_result(await self._stage(wf, s, s_enc, payload, call, req))
            except BaseException as e:  # propagate to the successors, then to run()
                if not done[s].done():
                    done[s].set_exception(e)

        tasks = [asyncio.create_task(stage(s)) for s in wf.order]
        try:
            if len(wf.sinks) == 1:
                return await done[wf.sinks[0]]
            outs = [await done[s] for s in wf.sinks]
            return P.ENC_JSON, _join(dict(zip(wf.sinks, outs, strict=True)))
        finally:
            for t in tasks:
                if not t.done():
                    t.cancel()
            for f in done.values():  # failed stages nobody awaited: no "never retrieved"
                if f.done() and not f.cancelled():
                    f.exception()

    async def _stage(
        self,
        wf: LiveWorkflow,
        s: str,
        enc: int,
        payload: bytes,
        call: Call,
        req: LiveRequest | None,
    ) -> tuple[int, bytes]:
        function = wf.function_of[s]
        t0 = time.perf_counter()
        try:
            if self.scheduler is None or req is None:
                renc, data, _m = await call(function, enc, payload)
            elif not self.gw.is_public(function):
                raise HttpError(404, f"function {function!r} is not deployed")
            else:
                renc, data = await self.scheduler.run_stage(req, s, function, enc, payload)
        except HttpError as e:  # say which workflow and stage; a function gone is a 424
            raise HttpError(
                424 if e.status == 404 else e.status,
                f"workflow {wf.spec.name!r}, stage {s!r} ({function}): {e.message}",
                e.headers,
            ) from None
        self.metrics.stage_latency.labels(wf.spec.name, s).observe(time.perf_counter() - t0)
        return renc, data

    def status(self) -> list[dict[str, object]]:
        """The status page's workflows: ``view()`` plus each one's recent figures."""
        recent = {n: wf.stats.view() for n, wf in self.workflows.items()}
        return [{**v, **recent[str(v["name"])]} for v in self.view()]

    def view(self) -> list[dict[str, object]]:
        """What ``GET /system/workflows`` and ``gshare list`` show."""
        return [
            {
                "name": wf.spec.name,
                "version": wf.version,
                "slo_ms": wf.spec.slo_ms,
                "stages": [
                    {"name": s.name, "function": s.function, "after": list(s.after)}
                    for s in wf.spec.stages
                ],
                "missing_functions": self.missing_functions(wf),
            }
            for wf in sorted(self.workflows.values(), key=lambda w: w.spec.name)
        ]


def _join(outputs: Mapping[str, tuple[int, bytes]]) -> bytes:
    """The input of a join (module doc): one JSON object, a member per predecessor."""
    doc: dict[str, object] = {}
    for name, (enc, data) in outputs.items():
        if enc == P.ENC_JSON:
            doc[name] = orjson.loads(data)
        else:
            doc[name] = base64.b64encode(data).decode("ascii")
    return orjson.dumps(doc)
