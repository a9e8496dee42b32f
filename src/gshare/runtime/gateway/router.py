"""The gateway's router: per-function queues, instance connections and dispatch (HTTP in
through ``gateway.app``, binary frames out to the instances).

Who uses it: ``server`` builds one ``Gateway`` and its app (``app.build_app``) next to the
controller (same asyncio loop), which tells it which instances are ready (``instance_ready``),
draining (``drain``) or gone (``instance_gone``) and reads its arrivals (``take_arrivals``).

Data path (``POST /function/{name}``, ``POST /v2/models/{name}/infer``):

1. the body is read under the size limit (413 beyond it) and checked (400 for malformed JSON
   or OIP tensors); an unknown function is a 404;
2. the request joins its function's queue; the dispatcher sends it at once to the instance
   ``policy.routing.choose_instance`` picks (the simulator's gateway uses the same rule): the
   ready instance with the fewest requests in flight, ties spread round-robin, unless every
   instance already holds ``inflight_cap`` (4 × its batch, at least 8): then it waits in the
   queue — also while the function has no ready instance (cold start: the controller is
   nudged to start one);
3. the frame goes over the instance's persistent connection (Unix socket on the same node,
   TCP across nodes; ``instance.protocol``) and the response comes back on it, matched by id;
4. the answer carries the function's output; instance errors map to 4xx (a rejected input)
   or 5xx (the function raised, the instance crashed or hit its memory limit). A generative
   function streams its answer chunk by chunk (``gateway.streams``).

Nothing accepted is lost silently: a request waits at most ``request_timeout_s`` (then 504
naming what it waited for); when an instance's connection drops, every request it held is put
back at the head of the queue once (retried on another instance, or on the same one once the
agent restarted it) and failed with a 502 naming the crash the second time; requests an
instance reports as over its memory limit are failed with a 503 naming the limit; deleting a
function fails its queued requests with a 410.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from gshare.policy.admission import (
    DEFAULT_MAX_LATENCY_SLO_FACTOR,
    Admit,
    admit,
)
from gshare.policy.autoscale.measured import next_busy_ms_per_request
from gshare.policy.routing import Candidate, choose_instance
from gshare.runtime.gateway.channel import InstanceChannel, Pending, connect_unix
from gshare.runtime.gateway.errors import HttpError, overloaded
from gshare.runtime.gateway.generation import GenerativeRoute
from gshare.runtime.gateway.route import FunctionRoute
from gshare.runtime.instance import protocol as P
from gshare.runtime.instance.lanes import DEFAULT_REQUEST_LANE_MB
from gshare.runtime.metrics import Metrics

if TYPE_CHECKING:
    from prometheus_client import Counter, Histogram
    from starlette.types import Receive

log = logging.getLogger("gshare.gateway")

DEFAULT_MAX_BODY_BYTES = 16 << 20
"""Largest request body accepted (413 beyond it); ``gshare serve --max-body-mb``."""
DEFAULT_REQUEST_TIMEOUT_S = 120.0
"""Longest a request may wait for its answer, cold start included (then 504)."""
MAX_QUEUE = 10_000
"""Requests queued per function beyond which new ones get 429 (any function; one with an SLO
is shed far earlier by ``policy.admission``)."""
DISCONNECT_WATCH_S = 0.05
"""A request not answered after this long starts watching its client's connection: one that
went away is cancelled (dropped from the queue, or at its instance)."""
CLIENT_GONE = 499
"""The status recorded for a request whose client disconnected before its answer (nginx's)."""


class Gateway:
    """Routing, queues and instance connections (see the module doc)."""

    def __init__(
        self,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        node_id: str = "",
        clock: Callable[[], float] = time.monotonic,
        max_latency_slo_factor: float = DEFAULT_MAX_LATENCY_SLO_FACTOR,
        metrics: Metrics | None = None,
        lane_mb: int = DEFAULT_REQUEST_LANE_MB,
    ) -> None:
        self.lane_mb = lane_mb
        """Each instance connection's request lane, MiB (its response lane: half); 0: every
        payload through the socket (``instance.lanes``)."""
        self._lane_warned = False
        self.clock = clock
        """Seconds; the clock of ``idle_since_s`` (the controller's keep-alive clock)."""
        self.max_latency_slo_factor = max_latency_slo_factor
        """``policy.admission``: shed a request predicted to take more than this many SLOs."""
        self.max_body_bytes = max_body_bytes
        self.request_timeout_s = request_timeout_s
        self.node_id = node_id
        self.routes: dict[str, FunctionRoute] = {}
        self.metrics = metrics if metrics is not None else Metrics()
        """Where it records requests (the server hands the same object to the controller)."""
        self._ids = itertools.count(1)
        self._children: dict[
            tuple[str, int], tuple[Counter, Histogram, Histogram, Histogram, Histogram, Counter]
        ] = {}
        """Per (function, code): the labelled metrics ``record`` updates."""
        self.on_cold: Callable[[str], None] | None = None
        """Called (by the controller) when a function has queued requests and no instance."""
        self.closing = False

    def next_id(self) -> int:
        return next(self._ids)

    # -- controller side -----------------------------------------------------------------------

    def add_function(
        self,
        name: str,
        slo_ms: float | None,
        max_batch: int,
        inputs: list[dict[str, object]] | None = None,
        *,
        internal: bool = False,
        gen: GenerativeRoute | None = None,
    ) -> None:
        r = self.routes.get(name)
        if r is None:
            r = self.routes[name] = FunctionRoute(
                name, slo_ms, max_batch, inputs=list(inputs or []), internal=internal
            )
        else:
            r.slo_ms, r.max_batch = slo_ms, max_batch
            if inputs is not None:
                r.inputs = list(inputs)
            r.start_error = None
        r.gen = gen

    def remove_function(self, name: str) -> None:
        r = self.routes.pop(name, None)
        if r is None:
            return
        for key in [k for k in self._children if k[0] == name]:
            del self._children[key]
        self.metrics.forget_function(name)
        self._fail_queue(r, 410, f"function {name!r} was deleted while the request waited")
        for ch in list(r.channels.values()):
            self._close_channel(ch)

    async def instance_ready(
        self,
        function: str,
        instance_id: str,
        *,
        uds_path: str | None,
        tcp: tuple[str, int] | None,
        max_batch: int,
        secret: str = "",
    ) -> None:
        """Connect to a ready instance (Unix socket when given, else TCP; the first frame is
        ``OP_AUTH`` with the instance's channel ``secret`` when it has one) and start
        sending."""
        r = self.routes.get(function)
        if r is None:
            return
        old = r.channels.pop(instance_id, None)
        if old is not None:
            self._retire_channel(old)
        cap = max(8, 4 * max_batch)
        loop = asyncio.get_running_loop()
        ch = InstanceChannel(self, function, instance_id, cap)
        auth = P.encode_request(0, P.OP_AUTH, P.ENC_RAW, secret.encode()) if secret else b""
        try:
            if uds_path:
                sock, why = await connect_unix(ch, uds_path, auth, self.lane_mb)
                if why and not self._lane_warned:
                    log.warning("no shared-memory lanes to instances: %s", why)
                    self._lane_warned = True
                await loop.create_unix_connection(lambda: ch, sock=sock)
            elif tcp:
                await loop.create_connection(lambda: ch, tcp[0], tcp[1])
                if auth:
                    assert ch.transport is not None
                    ch.transport.write(auth)
            else:
                raise OSError("no address")
        except OSError as e:
            log.warning("cannot connect to instance %s: %s", instance_id, e)
            if ch.lanes is not None:
                ch.lanes.close()
            return
        r.channels[instance_id] = ch
        r.start_error = None
        r.waiting_reason = None
        self.dispatch(function)

    def is_connected(self, function: str, instance_id: str) -> bool:
        r = self.routes.get(function)
        ch = r.channels.get(instance_id) if r else None
        return ch is not None and not ch.closed

    def drain(self, function: str, instance_id: str) -> None:
        """Stop sending to an instance; its in-flight requests still complete."""
        r = self.routes.get(function)
        if r and instance_id in r.channels:
            r.channels[instance_id].draining = True

    def close_function(self, name: str) -> None:
        """The function is being deleted: new requests get 410, queued ones are failed with 410
        now, the ones already at its instances run on (the controller waits for them, then
        ``remove_function``)."""
        r = self.routes.get(name)
        if r is None:
            return
        r.closed = True
        self._fail_queue(r, 410, f"function {name!r} was deleted while the request waited")

    def inflight_total(self, function: str) -> int:
        """Requests of ``function`` sent to its instances and not answered yet."""
        r = self.routes.get(function)
        return sum(len(ch.inflight) for ch in r.channels.values()) if r else 0

    def inflight(self, function: str, instance_id: str) -> int:
        r = self.routes.get(function)
        ch = r.channels.get(instance_id) if r else None
        return len(ch.inflight) if ch else 0

    def instance_restarting(self, function: str, instance_id: str) -> None:
        """The agent reports the instance restarting: stop sending to its connection, which
        is retired (``_retire_channel``), not closed -- it may already reach the new
        incarnation, and the requests on it then finish there."""
        r = self.routes.get(function)
        ch = r.channels.pop(instance_id, None) if r else None
        if ch is not None:
            self._retire_channel(ch)

    def instance_gone(self, function: str, instance_id: str) -> None:
        """The instance was stopped: close its connection (anything it held is retried)."""
        r = self.routes.get(function)
        ch = r.channels.pop(instance_id, None) if r else None
        if ch is not None:
            self._close_channel(ch)

    def take_arrivals(self, function: str) -> int:
        r = self.routes.get(function)
        if r is None:
            return 0
        n, r.arrivals = r.arrivals, 0
        return n

    def queued(self, function: str) -> int:
        r = self.routes.get(function)
        return len(r.queue) + r.staged if r else 0

    def service_interval_s(self, function: str) -> float | None:
        """The admission's measured service interval of ``function`` (``policy.admission``);
        None before it is measured or for a function not deployed."""
        r = self.routes.get(function)
        return r.service.interval_s if r else None

    def outstanding(self, function: str) -> int:
        """Requests of ``function`` queued here or in flight at its instances."""
        r = self.routes.get(function)
        if r is None:
            return 0
        return len(r.queue) + r.staged + sum(len(c.inflight) for c in r.channels.values())

    def idle_since_s(self, function: str) -> float | None:
        """``clock`` time since which ``function`` has had no request (the later of its last arrival
        and its last answer); None when it has had none since the server started."""
        r = self.routes.get(function)
        if r is None:
            return None
        times = [t for t in (r.last_arrival_s, r.last_done_s) if t is not None]
        return max(times) if times else None

    def set_waiting_reason(self, function: str, message: str | None) -> None:
        """The controller could not place an instance of ``function`` (``message``; None: it
        can again). Queued requests keep waiting — room may free up — and one that times out
        says why."""
        r = self.routes.get(function)
        if r is not None:
            r.waiting_reason = message

    def waiting_reason(self, function: str) -> str | None:
        """Why instances of ``function`` cannot be placed now (``set_waiting_reason``)."""
        r = self.routes.get(function)
        return None if r is None else r.waiting_reason

    def set_start_error(self, function: str, message: str) -> None:
        """No instance of the function could start: fail what waits for one (503)."""
        r = self.routes.get(function)
        if r is None:
            return
        r.start_error = message
        if not any(ch.usable for ch in r.channels.values()):
            self._fail_queue(r, 503, message)

    def fail_all(self, status: int, message: str) -> None:
        """Server shutdown: answer everything queued or in flight."""
        self.closing = True
        for r in self.routes.values():
            self._fail_queue(r, status, message)
            for ch in list(r.channels.values()):
                for p in list(ch.inflight.values()):
                    self._finish_error(p, status, message)
                ch.inflight.clear()
                self._close_channel(ch)

    def _close_channel(self, ch: InstanceChannel) -> None:
        ch.draining = True
        if ch.transport is not None:
            ch.transport.close()

    def _retire_channel(self, ch: InstanceChannel) -> None:
        """A connection replaced by a new one to the same instance id (the controller saw a new
        incarnation): no new requests on it, and it is closed once its in-flight requests are
        answered. Closing it at once would count them as crashed: with fast restarts the old
        connection may already reach the new incarnation (the controller connected between
        the crash and the status that reported the restart). If its peer is dead, the
        connection drops by itself and its requests are retried as usual."""
        ch.draining = True
        ch.retired = True
        ch.close_if_retired_and_idle()

    def _fail_queue(self, r: FunctionRoute, status: int, message: str) -> None:
        while r.queue:
            self._finish_error(r.queue.popleft(), status, message)

    # -- data path -----------------------------------------------------------------------------

    def is_public(self, function: str) -> bool:
        """True when ``function`` is a deployed function that callers may reach."""
        r = self.routes.get(function)
        return r is not None and not r.internal

    def submit(
        self, function: str, op: int, enc: int, payload: P.Payload, *, internal: bool = False
    ) -> Pending:
        """Accept a request (raises ``HttpError`` 404 / 429 / 503) and dispatch it; only the
        controller (``internal``) reaches an internal route."""
        r = self.routes.get(function)
        if r is None or (r.internal and not internal):
            raise HttpError(404, f"function {function!r} is not deployed")
        if self.closing:
            raise HttpError(503, "the server is shutting down")
        if r.closed:
            raise HttpError(410, f"function {function!r} is being deleted")
        r.arrivals += 1  # demand, shed or not: the autoscaler sizes for it
        r.last_arrival_s = self.clock()
        if len(r.queue) >= MAX_QUEUE:
            self.metrics.shed.labels(function, "queue_cap").inc()
            raise HttpError(
                429, f"function {function!r} has {len(r.queue)} requests queued; try again later"
            )
        if r.slo_ms:
            d = admit(
                len(r.queue) + self.inflight_total(function),
                r.service,
                r.slo_ms,
                self.max_latency_slo_factor,
            )
            if d.verdict is Admit.SHED:
                self.metrics.shed.labels(function, "slo").inc()
                wait_ms = d.predicted_ms or 0.0
                raise overloaded(
                    f"function {function!r} is overloaded: a request now would take about "
                    f"{wait_ms:.0f} ms, over its SLO of {r.slo_ms:g} ms; try again later",
                    wait_ms,
                )
        loop = asyncio.get_running_loop()
        p = Pending(function, op, enc, payload, time.perf_counter(), loop.create_future())
        ch = self._pick(r) if not r.queue else None
        if ch is not None:
            ch.send(p)
        else:
            r.queue.append(p)
            if any(c.usable for c in r.channels.values()):
                self.dispatch(function)  # FIFO: the queue goes first
            elif self.on_cold is not None:
                self.on_cold(function)
        return p

    def submit_to(
        self, function: str, instance_id: str, items: list[tuple[int, bytes]]
    ) -> list[Pending]:
        """Send ``items`` (encoding, payload) to one instance in one write, past the function's
        queue: a task of the live workflow scheduler (``gateway.stages``), which formed the
        batch and chose the instance. ``HttpError`` 503 when the instance is not connected.
        (The scheduler counted them as the function's arrivals when they were queued.)"""
        r = self.routes.get(function)
        ch = r.channels.get(instance_id) if r is not None else None
        if r is None or ch is None or not ch.usable:
            raise HttpError(503, f"instance {instance_id!r} of {function!r} is not connected")
        loop = asyncio.get_running_loop()
        now = time.perf_counter()
        ps = [
            Pending(function, P.OP_INVOKE, enc, data, now, loop.create_future())
            for enc, data in items
        ]
        ch.send_many(ps)
        return ps

    async def control(
        self, function: str, instance_id: str, command: Mapping[str, object]
    ) -> bytes:
        """Send an ``OP_CONTROL`` command to one connected instance and return its JSON answer;
        ``HttpError`` 404 when it is not connected, 4xx/5xx as the instance answered."""
        r = self.routes.get(function)
        ch = r.channels.get(instance_id) if r is not None else None
        if ch is None or not ch.usable:
            raise HttpError(404, f"instance {instance_id!r} of {function!r} is not connected")
        loop = asyncio.get_running_loop()
        payload = json.dumps(command).encode()
        p = Pending(
            function, P.OP_CONTROL, P.ENC_JSON, payload, time.perf_counter(), loop.create_future()
        )
        ch.send(p)
        status, _enc, data, _m = await self.wait(p)
        if status != P.ST_OK:
            raise HttpError(400, data.decode("utf-8", "replace"))
        return data

    def _pick(self, r: FunctionRoute) -> InstanceChannel | None:
        """``policy.routing.choose_instance`` over the function's connections, ties spread
        round-robin (a rotating start)."""
        chans = list(r.channels.values())
        n = len(chans)
        if n > 1:
            r.rr = (r.rr + 1) % n
        pick = choose_instance(
            [Candidate(len(c.inflight), c.usable, c.cap) for c in chans], r.rr if n > 1 else 0
        )
        return None if pick is None else chans[pick]

    def dispatch(self, function: str) -> None:
        r = self.routes.get(function)
        if r is None:
            return
        while r.queue:
            ch = self._pick(r)
            if ch is None:
                return
            ch.send(r.queue.popleft())

    async def wait(
        self, p: Pending, receive: Receive | None = None
    ) -> tuple[int, int, bytes, tuple[float, float, float, int]]:
        """The instance's answer to ``p``; ``HttpError`` 504 after ``request_timeout_s`` (a
        timer, not ``wait_for``: no extra task per request on the hot path). With the ASGI
        ``receive`` of the request (its body already read), a request still waiting after
        ``DISCONNECT_WATCH_S`` watches its client, and is cancelled if the client goes away
        (``HttpError`` 499, recorded as such; nothing is sent)."""
        fut = p.future
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.request_timeout_s, self._expire, p)
        watch = (
            loop.call_later(DISCONNECT_WATCH_S, self._start_watch, p, receive)
            if receive is not None
            else None
        )
        try:
            return await fut
        except asyncio.CancelledError:  # the caller's task was cancelled (a gRPC client left)
            self.cancel(p)
            raise
        finally:
            timer.cancel()
            if watch is not None:
                watch.cancel()
            if p.watcher is not None and not p.watcher.done():
                p.watcher.cancel()

    def _start_watch(self, p: Pending, receive: Receive) -> None:
        if not p.future.done():
            p.watcher = asyncio.get_running_loop().create_task(self._watch(p, receive))

    async def _watch(self, p: Pending, receive: Receive) -> None:
        while not p.future.done():
            msg = await receive()
            if msg.get("type") == "http.disconnect":
                self.cancel(p)
                return

    def cancel(self, p: Pending) -> None:
        """The client of ``p`` went away: drop it from the queue, or ask its instance to drop
        it if it has not started (``OP_CANCEL``; a started one runs to the end and its answer
        is dropped). Its future fails with ``CLIENT_GONE``."""
        if p.future.done():  # answered, expired or cancelled already
            return
        ch = p.channel
        if ch is not None:
            if ch.transport is not None and not ch.closed:
                ch.transport.write(P.encode_request(p.req_id, P.OP_CANCEL, P.ENC_RAW, b""))
        else:
            r = self.routes.get(p.function)
            if r is not None:
                with contextlib.suppress(ValueError):
                    r.queue.remove(p)
        self.metrics.cancelled.labels(p.function).inc()
        p.future.set_exception(HttpError(CLIENT_GONE, "the client closed the connection"))

    def _expire(self, p: Pending) -> None:
        if p.future.done():
            return
        r = self.routes.get(p.function)
        where = "waiting for an instance to become ready"
        if p.channel is not None:
            ch = p.channel
            ch.inflight.pop(p.req_id, None)
            where = f"waiting for instance {ch.instance_id} to answer"
            ch.close_if_retired_and_idle()
        elif r is not None:
            with contextlib.suppress(ValueError):
                r.queue.remove(p)
            if r.waiting_reason:
                where += f"; {r.waiting_reason}"
        p.future.set_exception(
            HttpError(
                504,
                f"function {p.function!r}: no answer after {self.request_timeout_s:g} s ({where})",
            )
        )

    def on_response(
        self,
        ch: InstanceChannel,
        p: Pending,
        status: int,
        enc: int,
        payload: bytes,
        m: tuple[float, float, float, int],
    ) -> None:
        if status == P.ST_DRAINING:  # not accepted: send elsewhere (no attempt counted)
            r = self.routes.get(p.function)
            ch.draining = True
            if r is not None:
                r.queue.appendleft(p)
            return
        r = self.routes.get(p.function)
        if r is not None:
            r.last_done_s = now = self.clock()
            gap = r.service.observe(now, bool(r.queue) or self.inflight_total(p.function) > 0)
            if gap is not None:
                self.metrics.admission_gap.labels(p.function).observe(gap)
        if status == P.ST_CANCELLED:
            return  # the client went away (``cancel``): its future has failed already
        if status == P.ST_OK:
            q_ms, tw_ms, ex_ms, batch = m
            if r is not None and batch > 0:
                r.exec_ms_per_item = next_busy_ms_per_request(
                    r.exec_ms_per_item, max(0.0, ex_ms), batch
                )
        if not p.future.done():
            p.future.set_result((status, enc, payload, m))

    def on_channel_lost(self, ch: InstanceChannel, lost: list[Pending]) -> None:
        r = self.routes.get(ch.function)
        if r is not None and r.channels.get(ch.instance_id) is ch:
            del r.channels[ch.instance_id]
        if self.closing:
            for p in lost:
                self._finish_error(p, 503, "the server is shutting down")
            return
        if r is None or r.closed:  # deleted: say so, not "crashed"
            for p in lost:
                self._finish_error(
                    p, 410, f"function {p.function!r} was deleted while the request ran"
                )
            return
        retry: list[Pending] = []
        for p in lost:
            p.channel = None
            p.crashed_on.append(ch.instance_id)
            p.attempts += 1
            if p.attempts >= 2 or r is None:
                first = (
                    f"function {p.function!r}: instance {ch.instance_id} crashed while running "
                    "the request (connection lost)"
                )
                again = (
                    f"; it was a retry after instance {p.crashed_on[0]} had crashed too"
                    if len(p.crashed_on) > 1
                    else ""
                )
                self._finish_error(p, 502, first + again)
            else:
                retry.append(p)
        if r is not None and retry:
            self.metrics.retries.labels(ch.function).inc(len(retry))
            r.queue.extendleft(reversed(retry))
            self.dispatch(ch.function)
            if (
                r.queue
                and not any(c.usable for c in r.channels.values())
                and self.on_cold is not None
            ):
                self.on_cold(ch.function)

    def _finish_error(self, p: Pending, status: int, message: str) -> None:
        if not p.future.done():
            p.future.set_exception(HttpError(status, message))

    # -- results -> HTTP ---------------------------------------------------------------------------

    def record(
        self, function: str, code: int, p: Pending, m: tuple[float, float, float, int] | None
    ) -> None:
        """Per-request metrics (the labelled children are cached per function and code)."""
        key = (function, code)
        c = self._children.get(key)
        if c is None:
            mt = self.metrics
            c = self._children[key] = (
                mt.requests.labels(function, str(code)),
                mt.latency.labels(function),
                mt.token_wait.labels(function),
                mt.queue_wait.labels(function),
                mt.batch_size.labels(function),
                mt.slo_violations.labels(function),
            )
        c[0].inc()
        if m is None or code >= 400:
            return
        latency_s = time.perf_counter() - p.arrived
        c[1].observe(latency_s)
        _q_ms, tw_ms, ex_ms, batch = m
        c[2].observe(tw_ms / 1000.0)
        c[3].observe(max(0.0, latency_s - (tw_ms + ex_ms) / 1000.0))
        c[4].observe(batch)
        r = self.routes.get(function)
        if r is not None:
            r.recent_latency_ms.append(latency_s * 1000.0)
            if r.slo_ms is not None and latency_s * 1000.0 > r.slo_ms:
                c[5].inc()

    def latency_quantiles(self, function: str) -> tuple[float | None, float | None, int]:
        """(p50 ms, p99 ms, n) over the function's ``RECENT_LATENCIES`` last successful
        requests; (None, None, 0) without any."""
        r = self.routes.get(function)
        if r is None or not r.recent_latency_ms:
            return None, None, 0
        xs = sorted(r.recent_latency_ms)
        n = len(xs)
        return xs[(n - 1) // 2], xs[min(n - 1, math.ceil(0.99 * n) - 1)], n


__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "MAX_QUEUE",
    "FunctionRoute",
    "Gateway",
    "InstanceChannel",
    "Pending",
]
