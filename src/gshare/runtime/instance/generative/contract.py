"""The generative handler contract: how a handler generates tokens, step by step or as a stream
(public: users' generative handlers import it). The one-shot contract (``predict``) is
``instance.models``; a generative handler implements that one too (``load``, and ``predict``
answering the whole completion at once), and adds one of the two below.

1. Step-wise (``StepwiseHandler``: what the engine batches, Orca-style, at the iteration level)
================================================================================================
The instance's engine (``generative.engine.GenerationEngine``) owns the sequences and calls::

    spec  = h.generation_spec()                 # once: KV bytes per token, context, EOS
    ids   = h.encode_prompt(inputs)             # per request: payload -> prompt token ids
    toks  = h.prefill([PrefillWork...])         # feed a chunk of each sequence's pending tokens
    toks  = h.decode([SeqView...])              # feed the last token of each; one token each
    h.free(seq_id)                              # the sequence left: drop its KV cache
    b     = h.token_bytes(token_id)             # the bytes a token stands for (text output)

* A ``SeqView`` is the engine's read-only view of one sequence: ``token_ids`` (prompt, then the
  tokens generated so far), ``cached_tokens`` (how many leading ``token_ids`` the handler's KV
  cache holds for it: the engine counts them, the handler must agree) and its ``params``.
* ``prefill(work)``: for each ``PrefillWork(seq, n_tokens)`` run tokens
  ``token_ids[cached_tokens : cached_tokens + n_tokens]`` into the sequence's cache (a chunk of
  a long prompt; a new sequence has no cache yet: create it). When the chunk reaches the end of
  ``token_ids`` return the next token (sampled with ``seq.params``, see ``sampling``), else
  ``None``. A sequence whose cache was dropped (preempted with its KV recomputed) comes back
  with ``cached_tokens`` 0 and its generated tokens in ``token_ids``: prefill recomputes them.
* ``decode(seqs)``: every sequence has ``cached_tokens == len(token_ids) - 1``; run the last
  token of each through the model — batched across sequences of different lengths — and
  return one next token per sequence, in order.
* ``free(seq_id)``: the engine will not use the sequence again (finished, cancelled,
  preempted with its KV dropped); a no-op for an unknown id.
* What must hold: calls come from one thread (the engine's), one at a time, between the
  engine's ``before_step`` / ``after_step`` hooks (one step is one burst of the instance's
  time token); ``prefill`` / ``decode`` raise ``InputError`` only for a bad request, anything
  else fails the sequences of that call, never the instance.

2. Streamed (``StreamingHandler``: for handlers that do not batch)
===================================================================
``generate(inputs, parameters) -> Iterator[str]`` yields the output as text chunks (each
``next`` is one burst). The instance serves such a handler one request at a time; stop strings
and ``max_tokens`` are the handler's to honour (``GenerationParams.parse`` reads them).

Parameters (``GenerationParams``, from a request's ``parameters``): ``max_tokens`` (>= 1),
``temperature`` (0: greedy), ``top_p`` (0 < p <= 1), ``seed`` (sampled decoding is reproducible
per seed), ``stop`` (strings that end the output, not included in it). Bad values raise
``InputError`` (a 4xx).

Output (``Chunk``): per sequence, its new text (UTF-8 complete characters only; text that may
be the start of a stop string is held back until it is known not to be), the token ids behind
it, and in the last chunk ``finish_reason`` (``FinishReason``) and the sequence's timings.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, Protocol, runtime_checkable

from gshare.runtime.instance.models import InputError

MAX_STOP_STRINGS: Final[int] = 8


class FinishReason(StrEnum):
    """Why a sequence ended (the OpenAI API's names where it has one)."""

    STOP = "stop"
    """An end-of-sequence token or a stop string."""
    LENGTH = "length"
    """``max_tokens`` generated, or the model's context is full."""
    CANCELLED = "cancelled"
    """``cancel`` (a client that disconnected)."""
    REFUSED = "refused"
    """The request can never fit (its context or KV memory): the chunk's ``error`` says why."""
    ERROR = "error"
    """The handler raised: the chunk's ``error`` says what."""


@dataclass(frozen=True, slots=True)
class GenerationParams:
    """A request's decoding parameters (module doc)."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    """Generate ``max_tokens`` whatever the model's end-of-sequence token (benchmarks that
    replay a trace's generated token counts; vLLM's parameter of that name)."""

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @classmethod
    def parse(cls, parameters: Mapping[str, Any] | None) -> GenerationParams:
        """From a request's ``parameters`` (unknown keys ignored); ``InputError`` naming the
        first bad value."""
        p = dict(parameters or {})
        d = cls()
        try:
            max_tokens = int(p.get("max_tokens", d.max_tokens))
            temperature = float(p.get("temperature", d.temperature))
            top_p = float(p.get("top_p", d.top_p))
            seed = None if p.get("seed") is None else int(p["seed"])
        except (TypeError, ValueError):
            raise InputError(
                "max_tokens and seed must be integers, temperature and top_p numbers"
            ) from None
        if max_tokens < 1:
            raise InputError(f"max_tokens must be >= 1, got {max_tokens}")
        if not (math.isfinite(temperature) and temperature >= 0.0):
            raise InputError(f"temperature must be a finite number >= 0, got {temperature}")
        if not (0.0 < top_p <= 1.0):
            raise InputError(f"top_p must lie in (0, 1], got {top_p}")
        stop_raw = p.get("stop")
        stop: tuple[str, ...]
        if stop_raw is None:
            stop = ()
        elif isinstance(stop_raw, str):
            stop = (stop_raw,)
        elif isinstance(stop_raw, list | tuple) and all(isinstance(s, str) for s in stop_raw):
            stop = tuple(stop_raw)
        else:
            raise InputError("stop must be a string or a list of strings")
        if len(stop) > MAX_STOP_STRINGS or any(not s for s in stop):
            raise InputError(f"stop takes 1 to {MAX_STOP_STRINGS} non-empty strings")
        ignore_eos = p.get("ignore_eos", False)
        if not isinstance(ignore_eos, bool):
            raise InputError("ignore_eos must be true or false")
        return cls(max_tokens, temperature, top_p, seed, stop, ignore_eos)


@dataclass(frozen=True, slots=True)
class GenerationSpec:
    """What the engine and its policy need to know of a step-wise model."""

    kv_bytes_per_token: int
    """KV-cache bytes one token of one sequence holds (all layers, keys and values)."""
    max_context_tokens: int
    """Prompt plus generated tokens a sequence may reach (the model's positions)."""
    eos_token_id: int | None
    """The token that ends a sequence (``FinishReason.STOP``), None when there is none."""


@dataclass(slots=True)
class SeqView:
    """The engine's view of one sequence, handed to ``prefill`` / ``decode`` (read-only for the
    handler: the engine appends the tokens the handler returns and counts ``cached_tokens``)."""

    seq_id: str
    token_ids: list[int]
    params: GenerationParams
    cached_tokens: int = 0


@dataclass(frozen=True, slots=True)
class PrefillWork:
    """Feed ``n_tokens`` of ``seq``'s pending tokens (from ``seq.cached_tokens``)."""

    seq: SeqView
    n_tokens: int


@dataclass(frozen=True, slots=True)
class SequenceTimings:
    """One sequence's latencies, seconds on the engine's clock (in its last chunk)."""

    ttft_s: float | None
    """Submission to first token (None when no token came)."""
    tpot_s: float | None
    """Mean time per output token after the first (None with fewer than two tokens)."""
    queued_s: float
    """Submission to its first step."""
    preemptions: int = 0


@dataclass(frozen=True, slots=True)
class Chunk:
    """One piece of one sequence's output (module doc)."""

    seq_id: str
    text: str
    token_ids: tuple[int, ...] = ()
    finish_reason: FinishReason | None = None
    """Set on the sequence's last chunk only."""
    error: str = ""
    timings: SequenceTimings | None = field(default=None)
    """Set on the last chunk only."""

    @property
    def last(self) -> bool:
        return self.finish_reason is not None


@runtime_checkable
class StepwiseHandler(Protocol):
    """Contract 1 (module doc): a handler the engine batches at the iteration level."""

    def generation_spec(self) -> GenerationSpec: ...

    def encode_prompt(self, inputs: Any) -> list[int]: ...

    def prefill(self, work: Sequence[PrefillWork]) -> list[int | None]: ...

    def decode(self, seqs: Sequence[SeqView]) -> list[int]: ...

    def free(self, seq_id: str) -> None: ...

    def token_bytes(self, token_id: int) -> bytes: ...


@runtime_checkable
class StreamingHandler(Protocol):
    """Contract 2 (module doc): a handler that streams one request at a time."""

    def generate(self, inputs: Any, parameters: Mapping[str, Any]) -> Iterator[str]: ...


__all__ = [
    "MAX_STOP_STRINGS",
    "Chunk",
    "FinishReason",
    "GenerationParams",
    "GenerationSpec",
    "PrefillWork",
    "SeqView",
    "SequenceTimings",
    "StepwiseHandler",
    "StreamingHandler",
]
