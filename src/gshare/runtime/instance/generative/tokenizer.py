"""The built-in causal LM's byte-level tokenizer and the text side of a stream: token bytes to
complete UTF-8 characters, with stop strings held back (``TextStream``).

Who calls it: ``causal_lm.CausalLM`` (``ByteTokenizer``: prompts to ids, ids to bytes) and the
engine (``TextStream``, one per sequence, fed each new token's bytes by ``token_bytes``).

The tokenizer is written by hand, no vocabulary file, nothing downloaded: byte ``b`` is token
``b`` (0..255), then ``BOS`` 256, ``EOS`` 257, ``PAD`` 258; ``VOCAB_SIZE`` 260. A prompt is
``[BOS] + its UTF-8 bytes``. Every text round-trips: ``decode(encode(t)) == t``.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence
from typing import Final

BOS_ID: Final[int] = 256
EOS_ID: Final[int] = 257
PAD_ID: Final[int] = 258
VOCAB_SIZE: Final[int] = 260
"""256 bytes + BOS, EOS, PAD, rounded up to a multiple of 4 (one id unused)."""


class ByteTokenizer:
    """Bytes <-> ids (module doc). Stateless."""

    def encode(self, text: str | bytes) -> list[int]:
        data = text.encode() if isinstance(text, str) else bytes(text)
        return [BOS_ID, *data]

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of one token: its byte, or b"" for the special ids."""
        return bytes((token_id,)) if 0 <= token_id < 256 else b""

    def decode(self, ids: Iterable[int]) -> str:
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", errors="replace")


class TextStream:
    """One sequence's output text, released as it becomes final.

    ``push(b)`` takes one token's bytes and returns ``(text, stopped)``: the text that can be
    released now (complete UTF-8 characters, minus any tail that may be the start of a stop
    string) and whether a stop string appeared (the text up to it is released, the stop string
    and everything after it never are). ``flush()`` releases what was held back at the end.
    What must hold: the concatenation of everything released equals the decoded output cut
    before the first stop string.
    """

    def __init__(self, stop: Sequence[str] = ()) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(s for s in stop if s)
        self._held = ""
        self.stopped = False

    def push(self, data: bytes) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        self._held += self._dec.decode(data)
        return self._release()

    def flush(self) -> str:
        if self.stopped:
            return ""
        self._held += self._dec.decode(b"", final=True)
        text, _ = self._release()
        out = text + self._held
        self._held = ""
        return out

    def _release(self) -> tuple[str, bool]:
        held = self._held
        if not self._stop:
            self._held = ""
            return held, False
        cut = min((i for i in (held.find(s) for s in self._stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return held[:cut], True
        keep = 0  # the longest tail of held that is a proper prefix of a stop string
        for s in self._stop:
            for k in range(min(len(s) - 1, len(held)), keep, -1):
                if held.endswith(s[:k]):
                    keep = k
                    break
        self._held = held[len(held) - keep :]
        return held[: len(held) - keep], False


__all__ = ["BOS_ID", "EOS_ID", "PAD_ID", "VOCAB_SIZE", "ByteTokenizer", "TextStream"]
