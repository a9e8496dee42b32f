"""Streamed generations at the gateway: one request of a generative function from admission to
its last chunk, whichever API it came by.

Who uses it: the OpenAI-compatible routes (``gateway.openai_api``), the OIP generate routes
(``gateway.generate_http``) and gRPC ``ModelStreamInfer`` (``gateway.grpc_server``) call
``start_generation`` with the prompt and the checked parameters (``check_parameters``), then
iterate ``Generation.events()``: ``Piece`` per chunk (``ST_CHUNK`` frames of
``instance.protocol``) and a last ``Done`` — or an ``HttpError`` (a 4xx/5xx of the instance, a
lost instance, a timeout, the client gone).

What it does: checks the function is generative (``FunctionRoute.gen``; else 400), admits on
TTFT (``gateway.generation``'s module doc; 429 at once), sends ``OP_GENERATE`` through the
router's queue and dispatch (``Gateway.submit``), and gives the request a chunk queue
(``Pending.chunks``). A client that goes away — an HTTP disconnect seen by ``watch`` (the ASGI
``receive``), a cancelled gRPC call, an iterator closed early — cancels it: ``Gateway.cancel``
sends ``OP_CANCEL`` and the instance's engine stops the sequence at its next step and frees
its KV. Metrics per generation: ``gshare_generate_ttft_seconds`` (arrival at the gateway to the
first chunk with a token), ``gshare_generate_tpot_seconds`` (first to last token over the tokens
between), ``gshare_generate_tokens_total{kind}``, and the request counters of every function.

What must hold: ``close`` runs exactly once per generation (the iterator's ``finally``) and
leaves nothing behind — the request answered or cancelled, the watcher stopped, the TTFT
backlog (``GenerativeRoute.awaiting_first``) counted down exactly once.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson
from starlette.types import Receive

from gshare.policy.admission import Admit, admit
from gshare.runtime.gateway.channel import Pending
from gshare.runtime.gateway.errors import HttpError, overloaded, status_of
from gshare.runtime.gateway.generation import GenerativeRoute
from gshare.runtime.gateway.router import Gateway
from gshare.runtime.instance import protocol as P

MAX_STOP: Final[int] = 8
MAX_TOKENS_LIMIT: Final[int] = 1 << 20
"""Largest ``max_tokens`` the gateway forwards (the model's context bounds it further: the
instance refuses what cannot fit with a 400 naming both)."""


class BadParameter(HttpError):
    """A 400 naming the request field (``param``) it is about (OpenAI's error shape has it)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(400, message)
        self.param = param


@dataclass(frozen=True, slots=True)
class Piece:
    """New text of a generation (may be empty while a token's bytes are held back)."""

    text: str
    tokens: int
    batch: int = 0
    """Sequences in the decode step that produced it (continuous batching at work)."""


@dataclass(frozen=True, slots=True)
class Done:
    """A generation's end: its last piece of text, why it ended and its token counts."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


def _number(doc: Mapping[str, Any], key: str, *, integer: bool = False) -> float | int | None:
    v = doc.get(key)
    if v is None:
        return None
    ok = isinstance(v, int) if integer else isinstance(v, int | float)
    if isinstance(v, bool) or not ok or not math.isfinite(v):
        kind = "an integer" if integer else "a number"
        raise BadParameter(key, f"{key} must be {kind}, got {orjson.dumps(v).decode()[:80]}")
    return int(v) if integer else float(v)


def check_parameters(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The decoding parameters of a request (``max_tokens``, ``temperature``, ``top_p``,
    ``seed``, ``stop``, ``ignore_eos``), type- and range-checked; ``BadParameter`` naming the
    first bad one."""
    out: dict[str, Any] = {}
    mt = _number(doc, "max_tokens", integer=True)
    if mt is not None:
        if not 1 <= mt <= MAX_TOKENS_LIMIT:
            raise BadParameter(
                "max_tokens", f"max_tokens must be an integer in [1, {MAX_TOKENS_LIMIT}], got {mt}"
            )
        out["max_tokens"] = int(mt)
    t = _number(doc, "temperature")
    if t is not None:
        if not 0 <= t <= 2:
            raise BadParameter("temperature", f"temperature must be in [0, 2], got {t}")
        out["temperature"] = float(t)
    tp = _number(doc, "top_p")
    if tp is not None:
        if not 0 < tp <= 1:
            raise BadParameter("top_p", f"top_p must be in (0, 1], got {tp}")
        out["top_p"] = float(tp)
    seed = _number(doc, "seed", integer=True)
    if seed is not None:
        out["seed"] = int(seed)
    stop = doc.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if (
            not isinstance(stop, list)
            or not 1 <= len(stop) <= MAX_STOP
            or not all(isinstance(s, str) and s for s in stop)
        ):
            raise BadParameter(
                "stop", f"stop must be a non-empty string or a list of 1 to {MAX_STOP} of them"
            )
        out["stop"] = stop
    ie = doc.get("ignore_eos")
    if ie is not None:
        if not isinstance(ie, bool):
            raise BadParameter("ignore_eos", "ignore_eos must be true or false")
        out["ignore_eos"] = ie
    return out


def generative_route(gw: Gateway, name: str) -> GenerativeRoute:
    """The generative state of public function ``name``: 404 when it is not deployed, 400 when
    it is not generative."""
    r = gw.routes.get(name)
    if r is None or r.internal:
        raise HttpError(404, f"function {name!r} is not deployed")
    if r.gen is None:
        raise BadParameter(
            "model",
            f"function {name!r} is not generative: it answers one-shot requests (POST "
            f"/function/{name} or /v2/models/{name}/infer), not prompts",
        )
    return r.gen


def start_generation(
    gw: Gateway,
    name: str,
    prompt: str | list[int],
    parameters: Mapping[str, Any],
    receive: Receive | None = None,
) -> Generation:
    """Admit and send one generation (module doc); ``HttpError`` 404 / 400 / 429 / 503."""
    g = generative_route(gw, name)
    if g.ttft_ms:
        d = admit(g.awaiting_first, g.first_token, g.ttft_ms, gw.max_latency_slo_factor)
        if d.verdict is Admit.SHED:
            r = gw.routes[name]
            r.arrivals += 1  # demand, shed or not: the autoscaler sizes for it
            gw.metrics.shed.labels(name, "ttft").inc()
            wait_ms = d.predicted_ms or 0.0
            raise overloaded(
                f"function {name!r} is overloaded: a request now would get its first token in "
                f"about {wait_ms:.0f} ms, over its TTFT SLO of {g.ttft_ms:g} ms; try again later",
                wait_ms,
            )
    body = orjson.dumps({"prompt": prompt, "parameters": dict(parameters)})
    p = gw.submit(name, P.OP_GENERATE, P.ENC_JSON, body)
    return Generation(gw, name, g, p, receive)


class Generation:
    """One admitted generation (module doc)."""

    def __init__(
        self, gw: Gateway, name: str, g: GenerativeRoute, p: Pending, receive: Receive | None
    ) -> None:
        self.gw, self.name, self.g, self.p = gw, name, g, p
        q: asyncio.Queue[tuple[bytes, int] | None] = asyncio.Queue()
        p.chunks = q
        p.future.add_done_callback(lambda _f: q.put_nowait(None))
        g.awaiting_first += 1
        self._awaiting = True
        self._first_s: float | None = None
        self._closed = False
        self._watcher = (
            asyncio.get_running_loop().create_task(self._watch(receive))
            if receive is not None
            else None
        )

    async def _watch(self, receive: Receive) -> None:
        while not self.p.future.done():
            msg = await receive()
            if msg.get("type") == "http.disconnect":
                self.gw.cancel(self.p)
                return

    def _got_first(self) -> None:
        if self._awaiting:
            self._awaiting = False
            g = self.g
            g.awaiting_first -= 1
            g.first_token.observe(self.gw.clock(), g.awaiting_first > 0)

    async def events(self) -> AsyncIterator[Piece | Done]:
        """The generation's pieces, then ``Done``; ``HttpError`` when it fails (module doc).
        Closing the iterator early cancels the generation."""
        p, gw = self.p, self.gw
        q = p.chunks
        assert q is not None  # set in __init__
        try:
            while True:
                try:
                    item = await asyncio.wait_for(q.get(), gw.request_timeout_s)
                except TimeoutError:
                    gw.cancel(p)
                    raise HttpError(
                        504,
                        f"function {self.name!r}: no token for {gw.request_timeout_s:g} s",
                    ) from None
                if item is None:
                    break
                doc = orjson.loads(item[0])
                piece = Piece(str(doc.get("text", "")), int(doc.get("tokens", 0)), item[1])
                if piece.tokens and self._first_s is None:
                    self._first_s = time.perf_counter()
                    self._got_first()
                yield piece
            try:
                status, _enc, data, m = p.future.result()
            except HttpError as e:
                gw.record(self.name, e.status, p, None)
                raise
            code = status_of(status)
            gw.record(self.name, code, p, m)
            if code != 200:
                raise HttpError(code, data.decode("utf-8", "replace"))
            doc = orjson.loads(data)
            done = Done(
                str(doc.get("text", "")),
                str(doc.get("finish_reason", "")),
                int(doc.get("prompt_tokens", 0)),
                int(doc.get("completion_tokens", 0)),
            )
            self._got_first()
            self._observe(done)
            yield done
        finally:
            self.close()

    def _observe(self, done: Done) -> None:
        mt = self.gw.metrics
        now = time.perf_counter()
        first = self._first_s if self._first_s is not None else now
        if done.completion_tokens:
            mt.generate_ttft.labels(self.name).observe(first - self.p.arrived)
        if done.completion_tokens > 1:  # the last token came with the final frame, now
            mt.generate_tpot.labels(self.name).observe((now - first) / (done.completion_tokens - 1))
        mt.generate_tokens.labels(self.name, "prompt").inc(done.prompt_tokens)
        mt.generate_tokens.labels(self.name, "completion").inc(done.completion_tokens)

    def close(self) -> None:
        """Cancel the generation if it is still running; stop watching (once)."""
        if self._closed:
            return
        self._closed = True
        if not self.p.future.done():
            self.gw.cancel(self.p)
        if self._awaiting:
            self._awaiting = False
            self.g.awaiting_first -= 1
        w = self._watcher
        if w is not None and not w.done():
            w.cancel()
        f = self.p.future
        if f.done() and not f.cancelled():
            f.exception()  # retrieved: no "exception was never retrieved" warning


async def collect(gen: Generation) -> tuple[str, Done]:
    """A generation's whole text and its ``Done`` (the non-streamed answers)."""
    parts: list[str] = []
    async for ev in gen.events():
        parts.append(ev.text)
        if isinstance(ev, Done):
            return "".join(parts), ev
    raise HttpError(502, "the generation ended without its last frame")


__all__ = [
    "BadParameter",
    "Done",
    "Generation",
    "Piece",
    "check_parameters",
    "collect",
    "generative_route",
    "start_generation",
]
