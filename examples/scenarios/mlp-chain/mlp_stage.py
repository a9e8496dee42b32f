"""A workflow stage that is the ``mlp`` built-in's network (64 -> 256 -> 256 -> 10, ReLU) and
also accepts what an ``mlp`` answers, so ``mlp`` functions can be chained in a workflow.

A built-in ``mlp`` answers ``{"label": int, "score": float}``; a workflow stage receives its
predecessor's answer as it came, and the built-in does not decode that (it wants a vector).
This handler decodes it: the vector is ``score`` at index ``label`` (mod 64), zeros elsewhere.
It also takes what the built-in takes for one item or a batch: raw little-endian float32
bytes of k x 64 values, a JSON list ``[64]`` or ``[k, 64]``, ``{"data": [...], "shape": [...]}``.

Weights: seeded random (``initial_weights``), put once in the node's model store.
Used by ``examples/scenarios/mlp-chain.yaml`` (stages 2 and 3).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from gshare.runtime.instance.models import InputError, TensorSpec, build_on_meta, load_weights

N_IN, HIDDEN, N_OUT = 64, 256, 10


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(N_IN, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, HIDDEN)
        self.fc3 = nn.Linear(HIDDEN, N_OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))  # type: ignore[no-any-return]


def _items(payload: Any) -> tuple[np.ndarray, bool]:
    """One payload as ``[k, 64]`` float32 and whether it was a batch."""
    if isinstance(payload, Mapping) and "label" in payload and "score" in payload:
        labels, scores = payload["label"], payload["score"]
        batched = isinstance(labels, list)
        ls = labels if batched else [labels]
        ss = scores if isinstance(scores, list) else [scores]
        if len(ls) != len(ss) or not ls:
            raise InputError("'label' and 'score' must have the same length")
        x = np.zeros((len(ls), N_IN), np.float32)
        for i, (lab, sc) in enumerate(zip(ls, ss, strict=True)):
            x[i, int(lab) % N_IN] = float(sc)
        return x, batched
    if isinstance(payload, bytes | bytearray | memoryview):
        b = bytes(payload)
        if not b or len(b) % (4 * N_IN):
            raise InputError(f"raw payload of {len(b)} bytes is not k x {N_IN} float32 values")
        x = np.frombuffer(b, "<f4").reshape(-1, N_IN)
        return x.copy(), x.shape[0] > 1
    if isinstance(payload, Mapping) and "data" in payload:
        x = np.asarray(payload["data"], np.float32).reshape(payload.get("shape", (-1, N_IN)))
    else:
        try:
            x = np.asarray(payload, np.float32)
        except (TypeError, ValueError):
            raise InputError(f"expected a vector [{N_IN}], got {type(payload).__name__}") from None
    if x.shape == (N_IN,):
        return x.reshape(1, N_IN), False
    if x.ndim == 2 and x.shape[1] == N_IN and x.shape[0] > 0:
        return x, True
    raise InputError(f"expected a vector [{N_IN}] or a batch [n, {N_IN}], got shape {x.shape}")


class MlpStage:
    """The handler class the spec names; gshare instantiates it without arguments."""

    def __init__(self) -> None:
        self.model: Mlp | None = None
        self.device = "cpu"

    def initial_weights(self) -> dict[str, torch.Tensor]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(64)
            return {k: v.detach() for k, v in Mlp().state_dict().items()}

    def load(self, weights: Mapping[str, torch.Tensor] | None, device: str) -> None:
        if weights is None:
            weights = self.initial_weights()
        model = build_on_meta(Mlp)
        load_weights(model, weights)
        self.model = model.eval().to(device)
        self.device = device

    def predict(self, inputs: list[Any]) -> list[Any]:
        assert self.model is not None, "predict before load"
        parts: list[tuple[np.ndarray, bool]] = []
        for i, p in enumerate(inputs):
            try:
                parts.append(_items(p))
            except InputError as e:
                raise InputError(f"input {i}: {e}") from None
        if not parts:
            return []
        x = torch.from_numpy(np.concatenate([a for a, _ in parts])).to(self.device)
        with torch.no_grad():
            score, label = torch.softmax(self.model(x), dim=-1).max(dim=-1)
        labels, scores = label.cpu().tolist(), score.cpu().tolist()
        out: list[Any] = []
        pos = 0
        for a, batched in parts:
            n = a.shape[0]
            if batched:
                out.append({"label": labels[pos : pos + n], "score": scores[pos : pos + n]})
            else:
                out.append({"label": labels[pos], "score": scores[pos]})
            pos += n
        return out

    def example_input(self) -> dict[str, Any]:
        return {"label": 3, "score": 0.5}

    def input_spec(self) -> list[TensorSpec]:
        return [TensorSpec("input", (-1, N_IN), "FP32")]

    def output_spec(self) -> list[TensorSpec]:
        return [TensorSpec("label", (-1,), "INT64"), TensorSpec("score", (-1,), "FP32")]
