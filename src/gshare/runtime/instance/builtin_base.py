"""The base of the built-in handlers (``builtin_models``, ``image_models``): payload decoding
helpers and ``TorchClassifier``, the life cycle every built-in shares — a ``transformers``
configuration or a torch module built under a seed derived from the model name (random
weights, never downloaded), on the meta device when the weights come from the model store,
``load`` / ``predict`` behind the handler convention of ``instance.models``.

Kept apart from ``builtin_models`` so that the image family (``image_models``) can build on it
while ``builtin_models`` registers every built-in (``BUILTIN_HANDLERS``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from gshare.runtime.instance.models import (
    InputError,
    TensorSpec,
    build_on_meta,
    load_weights,
    resolve_device,
    seed_of,
    tiny_models,
)

# -- payload decoding ---------------------------------------------------------------------------


def fmt_shape(shape: tuple[int, ...] | list[int] | torch.Size) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def as_tensor(x: Any, dtype: torch.dtype) -> torch.Tensor:
    """A payload (tensor, ndarray, nested list, ``{"data", "shape"}``) as a CPU tensor."""
    if isinstance(x, torch.Tensor):
        t = x.detach()
    elif isinstance(x, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(x))
    elif isinstance(x, Mapping) and "data" in x:
        t = as_tensor(x["data"], dtype)
        if "shape" in x:
            try:
                t = t.reshape([int(d) for d in x["shape"]])
            except (RuntimeError, TypeError, ValueError):
                raise InputError(
                    f"'data' has {t.numel()} values, which do not fit 'shape' {x['shape']!r}"
                ) from None
        return t
    elif isinstance(x, list | tuple):
        try:
            t = torch.tensor(x)  # dtype inferred: fractional values must not truncate to ints
        except (TypeError, ValueError, RuntimeError, OverflowError):
            raise InputError("a nested list of numbers with a regular shape was expected") from None
    else:
        raise InputError(f"unsupported payload type {type(x).__name__}")
    if t.is_floating_point() and not dtype.is_floating_point and not torch.equal(t, t.round()):
        raise InputError("integer values were expected, got fractional numbers")
    if t.dtype == torch.bool or t.is_complex():
        raise InputError(f"numbers were expected, got a {t.dtype} tensor")
    return t.to("cpu", dtype)


def split_fixed(
    t: torch.Tensor, item_shape: tuple[int, ...], what: str
) -> tuple[torch.Tensor, bool]:
    """``t`` as a batch ``[k, *item_shape]`` and whether it was given as a batch."""
    if tuple(t.shape) == item_shape:
        return t.unsqueeze(0), False
    if t.dim() == len(item_shape) + 1 and tuple(t.shape[1:]) == item_shape and t.shape[0] > 0:
        return t, True
    raise InputError(
        f"expected {what} of shape {fmt_shape(item_shape)} or [n, {fmt_shape(item_shape)[1:]}, "
        f"got {fmt_shape(t.shape)}"
    )


def from_float_bytes(
    b: bytes | bytearray | memoryview, item_shape: tuple[int, ...]
) -> tuple[torch.Tensor, bool]:
    item = int(np.prod(item_shape)) * 4
    n = len(b)
    if n == 0 or n % item:
        hint = ""
        if bytes(b[:64]).lstrip()[:1] in (b"[", b"{", b'"'):
            # it looks like JSON sent without its content type (curl -d sends a form type)
            hint = "; a JSON body needs the header 'Content-Type: application/json'"
        raise InputError(
            f"raw payload of {n} bytes is not a whole number of float32 items of shape "
            f"{fmt_shape(item_shape)} ({item} bytes each){hint}"
        )
    t = torch.frombuffer(bytearray(b), dtype=torch.float32).reshape(n // item, *item_shape)
    return t, n // item > 1


# -- built-in handlers --------------------------------------------------------------------------


class TorchClassifier:
    """Base of the built-ins: a ``torch.nn.Module`` classifier behind the handler convention.

    Subclasses give ``build()`` (the architecture, random-initialised by torch/transformers
    under the caller's RNG state), ``decode_one(payload)`` (→ per-item tensors, batched?) and
    ``forward(items)`` (→ logits ``[n, classes]``). Who calls it: the instance process —
    ``load`` once, then ``predict`` per batch; ``state_dict_for`` calls ``random_state``.
    """

    model_name: str = ""

    def __init__(self, tiny: bool | None = None) -> None:
        self.tiny = tiny_models(tiny)
        self.module: nn.Module | None = None
        self.device = "cpu"

    # -- construction -------------------------------------------------------------------------

    def build(self) -> nn.Module:
        raise NotImplementedError

    def config(self) -> Any:
        """The ``transformers`` configuration of the architecture (None for plain torch)."""
        return None

    @functools.cached_property
    def cfg(self) -> Any:
        """``config()``, built once (it is read on every request by the decoders)."""
        return self.config()

    @property
    def seed(self) -> int:
        return seed_of(self.model_name)

    def random_module(self) -> nn.Module:
        """The architecture with its deterministic random weights (seeded by the model name;
        the global RNG state is left untouched)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return self.build()

    def random_state(self) -> dict[str, torch.Tensor]:
        """The weights to share: ``state_dict()`` of ``random_module()`` (detached)."""
        return {k: v.detach() for k, v in self.random_module().state_dict().items()}

    def load(self, weights: Mapping[str, torch.Tensor] | None, device: str) -> None:
        """Build the model: from ``weights`` without copying them (meta-device skeleton +
        ``load_weights``), or with the seeded random weights when ``weights`` is None; eval
        mode, no gradients, moved to ``device`` (a copy only when the weights are elsewhere)."""
        device = resolve_device(device)
        if weights is None:
            module = self.random_module()
            module.requires_grad_(False)
        else:
            module = build_on_meta(self.build)
            load_weights(module, weights)
        module.eval()
        if torch.device(device).type != "cpu" or any(
            t.device.type != "cpu" for t in module.parameters()
        ):
            module.to(device)  # no copy for tensors already on the device (CUDA IPC tier)
        self.module, self.device = module, device

    # -- inference ----------------------------------------------------------------------------

    def decode_one(self, payload: Any) -> tuple[list[torch.Tensor], bool]:
        raise NotImplementedError

    def forward(self, items: list[torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def decode(self, payload: Any) -> tuple[list[torch.Tensor], bool]:
        """One payload → its items (CPU tensors) and whether it was a batch; ``InputError``."""
        return self.decode_one(payload)

    def predict(self, inputs: list[Any]) -> list[Any]:
        """One ``{"label", "score"}`` per payload (lists of them for batch payloads)."""
        if self.module is None:
            raise RuntimeError(f"{type(self).__name__}.predict before load")
        decoded: list[tuple[list[torch.Tensor], bool]] = []
        for i, x in enumerate(inputs):
            try:
                decoded.append(self.decode_one(x))
            except InputError as e:
                raise InputError(f"input {i}: {e}") from None
        items = [t for ts, _ in decoded for t in ts]
        if not items:
            return []
        with torch.no_grad():
            logits = self.forward(items).float()
            probs = torch.softmax(logits, dim=-1)
            score, label = probs.max(dim=-1)
        labels, scores = label.cpu().tolist(), score.cpu().tolist()
        out: list[Any] = []
        pos = 0
        for ts, batched in decoded:
            n = len(ts)
            if batched:
                out.append({"label": labels[pos : pos + n], "score": scores[pos : pos + n]})
            else:
                out.append({"label": labels[pos], "score": scores[pos]})
            pos += n
        return out

    def output_spec(self) -> list[TensorSpec]:
        """The OIP outputs: a request of n items gets n labels and n scores."""
        return [TensorSpec("label", (-1,), "INT64"), TensorSpec("score", (-1,), "FP32")]

    def _param_dtype(self) -> torch.dtype:
        assert self.module is not None
        return next(self.module.parameters()).dtype


__all__ = ["TorchClassifier", "as_tensor", "fmt_shape", "from_float_bytes", "split_fixed"]
