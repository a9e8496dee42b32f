"""An example user handler: a tiny byte-level text classifier (``handler: file.py:Class``).

It shows the whole ``gshare.runtime.instance.models.Handler`` convention on a model small enough to
read in one screen:

* ``initial_weights()`` — the weights gshare puts ONCE in the node's model store when the spec
  has no ``weights`` file (here: seeded random weights; a real handler would ship a
  ``.safetensors`` file and name it in the spec instead);
* ``load(weights, device)`` — builds the ``nn.Module`` skeleton on the meta device and adopts
  the store's read-only tensors without copying them (``build_on_meta`` + ``load_weights``),
  so N instances of the function cost one copy of the weights on the node;
* ``predict(inputs)`` — one output per payload; payloads are ``str``, UTF-8 ``bytes``,
  ``{"text": str}``, or a list of ``str`` (a batch: then the output holds lists);
* ``example_input()`` and ``input_spec()`` (Open Inference Protocol: one BYTES input).

Deploy with ``gshare deploy examples/text-classifier.yaml``. The weights are random: the
labels mean nothing, the mechanics are the point.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from gshare.runtime.instance.models import InputError, TensorSpec, build_on_meta, load_weights

LABELS = ("negative", "positive")
DIM = 32
MAX_BYTES = 4096


class ByteBag(nn.Module):
    """Mean of learned byte embeddings → linear layer → 2 logits."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(256, DIM, mode="mean")
        self.head = nn.Linear(DIM, len(LABELS))

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids, offsets))  # type: ignore[no-any-return]


class ByteBagClassifier:
    """The handler class the spec names; gshare instantiates it without arguments."""

    def __init__(self) -> None:
        self.model: ByteBag | None = None
        self.device = "cpu"

    def initial_weights(self) -> dict[str, torch.Tensor]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1234)
            return {k: v.detach() for k, v in ByteBag().state_dict().items()}

    def load(self, weights: Mapping[str, torch.Tensor] | None, device: str) -> None:
        if weights is None:  # run outside gshare: own copy
            weights = self.initial_weights()
        model = build_on_meta(ByteBag)  # no allocation, no init
        load_weights(model, weights)  # zero-copy; raises if anything were copied
        self.model = model.eval().to(device)
        self.device = device

    @staticmethod
    def _texts(payload: Any) -> tuple[list[str], bool]:
        if isinstance(payload, bytes | bytearray | memoryview):
            try:
                payload = bytes(payload).decode("utf-8")
            except UnicodeDecodeError:
                raise InputError("raw payload is not UTF-8 text") from None
        if isinstance(payload, Mapping) and isinstance(payload.get("text"), str):
            payload = payload["text"]
        if isinstance(payload, str):
            return [payload], False
        if isinstance(payload, list) and payload and all(isinstance(s, str) for s in payload):
            return list(payload), True
        raise InputError("expected text: a string, UTF-8 bytes, {'text': ...} or a list of strings")

    def predict(self, inputs: list[Any]) -> list[Any]:
        assert self.model is not None, "load() first"
        parsed = []
        for i, x in enumerate(inputs):
            try:
                parsed.append(self._texts(x))
            except InputError as e:
                raise InputError(f"input {i}: {e}") from None
        texts = [t for ts, _ in parsed for t in ts]
        encoded = [list(t.encode("utf-8")[:MAX_BYTES]) or [0] for t in texts]
        offsets = torch.tensor([0] + [len(e) for e in encoded[:-1]]).cumsum(0)
        ids = torch.tensor([b for e in encoded for b in e], dtype=torch.int64)
        with torch.no_grad():
            probs = torch.softmax(self.model(ids.to(self.device), offsets.to(self.device)), -1)
        score, label = probs.max(-1)
        out: list[Any] = []
        pos = 0
        for ts, batched in parsed:
            labs = [LABELS[i] for i in label[pos : pos + len(ts)].tolist()]
            scs = score[pos : pos + len(ts)].tolist()
            out.append({"label": labs, "score": scs} if batched else {"label": labs[0], "score": scs[0]})
            pos += len(ts)
        return out

    def example_input(self) -> str:
        return "serverless inference on shared accelerators"

    def input_spec(self) -> list[TensorSpec]:
        return [TensorSpec("text", (-1,), "BYTES")]
