"""The five built-in models behind the handler convention of ``instance.models``.

Built-in models (``BUILTIN_MODELS``), all randomly initialised — never downloaded — with a
seed derived from the model name, so every process of every node builds identical weights:

=============  ==============================================  ========  =====================
model          architecture (``transformers`` configuration)   params    input (one item)
=============  ==============================================  ========  =====================
resnet50       ResNetForImageClassification, ResNet-50, 1000   25.6 M    FP32 image [3,224,224]
bert-base      BertForSequenceClassification, 12x768, 2 labels 109.5 M   INT64 token ids [seq]
bert-large     BertForSequenceClassification, 24x1024          335.1 M   INT64 token ids [seq]
vit-base       ViTForImageClassification, ViT-B/16, 1000       86.6 M    FP32 image [3,224,224]
mlp            torch MLP 64-256-256-10 (ReLU)                  0.08 M    FP32 vector [64]
=============  ==============================================  ========  =====================

Input decoding of the built-ins (``decode``): one payload is ONE item (shape as above) or a
batch of items (one more leading dimension). Accepted payload forms:

* ``torch.Tensor`` or ``numpy.ndarray``;
* JSON lists, nested (``[[[...]]]`` of shape [3,224,224]) — floats for images and the MLP,
  integers for token ids;
* ``{"data": [...flat or nested...], "shape": [...]}`` (the OIP tensor form);
* raw ``bytes``: images and the MLP read little-endian float32 (``len`` a multiple of one
  item's size: k items when it holds k); text models read UTF-8 text;
* text models also take a ``str`` (or a list of ``str`` as a batch) and tokenise it with a
  deterministic byte-level tokenizer, no vocabulary file: ``[CLS]=101``, each UTF-8 byte
  ``b`` → ``1000 + b``, ``[SEP]=102``, truncated to the model's 512 positions; ``[PAD]=0``.
  Token ids must lie in ``[0, vocab_size)``. Sequences of different lengths are padded and
  masked.

Outputs of the built-ins (all classifiers): ``{"label": int, "score": float}`` for one item
(the arg-max class and its softmax probability), ``{"label": [int...], "score": [float...]}``
for a batch payload — over the Open Inference Protocol (always a batch) the outputs ``label``
(INT64 [n]) and ``score`` (FP32 [n]) of ``output_spec()``. An invalid payload raises
``InputError`` naming its index, the expected shape and what was given (the instance answers
it as a bad request).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Final

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
from gshare.spec import BUILTIN_MODELS

CLS_ID: Final[int] = 101
SEP_ID: Final[int] = 102
PAD_ID: Final[int] = 0
BYTE_ID0: Final[int] = 1000
"""Byte ``b`` of a text is token ``BYTE_ID0 + b`` (the toy tokenizer of the text models)."""


# -- payload decoding ---------------------------------------------------------------------------


def _fmt_shape(shape: tuple[int, ...] | list[int] | torch.Size) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _as_tensor(x: Any, dtype: torch.dtype) -> torch.Tensor:
    """A payload (tensor, ndarray, nested list, ``{"data", "shape"}``) as a CPU tensor."""
    if isinstance(x, torch.Tensor):
        t = x.detach()
    elif isinstance(x, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(x))
    elif isinstance(x, Mapping) and "data" in x:
        t = _as_tensor(x["data"], dtype)
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


def _split_fixed(
    t: torch.Tensor, item_shape: tuple[int, ...], what: str
) -> tuple[torch.Tensor, bool]:
    """``t`` as a batch ``[k, *item_shape]`` and whether it was given as a batch."""
    if tuple(t.shape) == item_shape:
        return t.unsqueeze(0), False
    if t.dim() == len(item_shape) + 1 and tuple(t.shape[1:]) == item_shape and t.shape[0] > 0:
        return t, True
    raise InputError(
        f"expected {what} of shape {_fmt_shape(item_shape)} or [n, {_fmt_shape(item_shape)[1:]}, "
        f"got {_fmt_shape(t.shape)}"
    )


def _from_float_bytes(
    b: bytes | bytearray | memoryview, item_shape: tuple[int, ...]
) -> tuple[torch.Tensor, bool]:
    item = int(np.prod(item_shape)) * 4
    n = len(b)
    if n == 0 or n % item:
        raise InputError(
            f"raw payload of {n} bytes is not a whole number of float32 items of shape "
            f"{_fmt_shape(item_shape)} ({item} bytes each)"
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


class _FixedShapeClassifier(TorchClassifier):
    """Classifiers of fixed-shape float inputs (images, vectors)."""

    input_name = "input"
    what = "input"

    @property
    def item_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    def decode_one(self, payload: Any) -> tuple[list[torch.Tensor], bool]:
        if isinstance(payload, bytes | bytearray | memoryview):
            t, batched = _from_float_bytes(payload, self.item_shape)
        else:
            t, batched = _split_fixed(
                _as_tensor(payload, torch.float32), self.item_shape, self.what
            )
        if not torch.isfinite(t).all():
            raise InputError(f"{self.what} contains NaN or infinite values")
        return list(t.unbind(0)), batched

    def forward(self, items: list[torch.Tensor]) -> torch.Tensor:
        x = torch.stack(items).to(self.device, self._param_dtype())
        return self.logits(x)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        assert self.module is not None
        out = self.module(pixel_values=x)
        return out.logits  # type: ignore[no-any-return]

    def example_input(self) -> torch.Tensor:
        g = torch.Generator().manual_seed(0)
        return torch.rand(self.item_shape, generator=g)

    def input_spec(self) -> list[TensorSpec]:
        return [TensorSpec(self.input_name, (-1, *self.item_shape), "FP32")]


class ResNet50Handler(_FixedShapeClassifier):
    model_name = "resnet50"
    what = "an image"

    def config(self) -> Any:
        from transformers import ResNetConfig

        if self.tiny:
            kw: dict[str, Any] = {
                "embedding_size": 8,
                "hidden_sizes": [16, 32],
                "depths": [1, 1],
                "layer_type": "bottleneck",
                "num_labels": 10,
            }
        else:  # defaults: ResNet-50 (bottleneck 3-4-6-3)
            kw = {"num_labels": 1000}
        return ResNetConfig(**kw)

    @property
    def image_size(self) -> int:
        return 32 if self.tiny else 224

    @property
    def item_shape(self) -> tuple[int, ...]:
        return (3, self.image_size, self.image_size)

    def build(self) -> nn.Module:
        from transformers import ResNetForImageClassification

        return ResNetForImageClassification(self.cfg)


class ViTBaseHandler(_FixedShapeClassifier):
    model_name = "vit-base"
    what = "an image"

    def config(self) -> Any:
        from transformers import ViTConfig

        if self.tiny:
            kw: dict[str, Any] = {
                "hidden_size": 32,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "intermediate_size": 64,
                "image_size": 32,
                "patch_size": 8,
                "num_labels": 10,
            }
        else:  # defaults: ViT-B/16, 224x224
            kw = {"num_labels": 1000}
        return ViTConfig(**kw)

    @property
    def item_shape(self) -> tuple[int, ...]:
        size = int(self.cfg.image_size)
        return (3, size, size)

    def build(self) -> nn.Module:
        from transformers import ViTForImageClassification

        return ViTForImageClassification(self.cfg)


class MLP(nn.Module):
    """The ``mlp`` built-in: in → hidden → hidden → classes, ReLU (a cheap model, ≪ 10 ms)."""

    def __init__(self, n_in: int = 64, hidden: int = 256, n_out: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(n_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))  # type: ignore[no-any-return]


class MLPHandler(_FixedShapeClassifier):
    model_name = "mlp"
    what = "a vector"
    N_IN = 64

    @property
    def item_shape(self) -> tuple[int, ...]:
        return (self.N_IN,)

    def build(self) -> nn.Module:
        return MLP(self.N_IN, 32 if self.tiny else 256, 10)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        assert self.module is not None
        return self.module(x)  # type: ignore[no-any-return]


class BertHandler(TorchClassifier):
    """BERT sequence classifiers (2 labels) over token ids; see the module doc for the toy
    tokenizer used for text payloads."""

    large = False

    def config(self) -> Any:
        from transformers import BertConfig

        kw: dict[str, Any] = {"num_labels": 2}  # defaults: BERT-base 12x768, vocab 30522, 512 pos
        if self.tiny:
            kw.update(
                vocab_size=BYTE_ID0 + 256 + 24,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                max_position_embeddings=64,
            )
        elif self.large:  # BERT-large: 24x1024, 16 heads, 335 M parameters
            kw.update(
                hidden_size=1024,
                num_hidden_layers=24,
                num_attention_heads=16,
                intermediate_size=4096,
            )
        return BertConfig(**kw)

    def build(self) -> nn.Module:
        from transformers import BertForSequenceClassification

        return BertForSequenceClassification(self.cfg)

    @property
    def max_len(self) -> int:
        return int(self.cfg.max_position_embeddings)

    @property
    def vocab_size(self) -> int:
        return int(self.cfg.vocab_size)

    def tokenize(self, text: str) -> torch.Tensor:
        body = [BYTE_ID0 + b for b in text.encode("utf-8")][: self.max_len - 2]
        return torch.tensor([CLS_ID, *body, SEP_ID], dtype=torch.int64)

    def _check_ids(self, t: torch.Tensor) -> torch.Tensor:
        if t.numel() == 0:
            raise InputError("empty token sequence")
        if t.shape[-1] > self.max_len:
            raise InputError(f"sequence of {t.shape[-1]} tokens is longer than {self.max_len}")
        lo, hi = int(t.min()), int(t.max())
        if lo < 0 or hi >= self.vocab_size:
            raise InputError(f"token ids must be in [0, {self.vocab_size}), got [{lo}, {hi}]")
        return t

    def decode_one(self, payload: Any) -> tuple[list[torch.Tensor], bool]:
        if isinstance(payload, bytes | bytearray | memoryview):
            try:
                payload = bytes(payload).decode("utf-8")
            except UnicodeDecodeError:
                raise InputError("raw payload is not UTF-8 text") from None
        if isinstance(payload, str):
            return [self.tokenize(payload)], False
        if isinstance(payload, Mapping) and "text" in payload:
            return self.decode_one(payload["text"])
        if isinstance(payload, Mapping) and "input_ids" in payload:
            payload = payload["input_ids"]
        if (
            isinstance(payload, list | tuple)
            and payload
            and all(isinstance(s, str) for s in payload)
        ):
            return [self.tokenize(s) for s in payload], True
        if (
            isinstance(payload, list | tuple)
            and payload
            and all(isinstance(s, list | tuple) for s in payload)
        ):  # a batch of sequences, possibly ragged
            seqs = [self._check_ids(_as_tensor(s, torch.int64)) for s in payload]
            if any(s.dim() != 1 for s in seqs):
                raise InputError("a batch of token id sequences must be a list of flat lists")
            return seqs, True
        t = _as_tensor(payload, torch.int64)
        if t.dim() == 1:
            return [self._check_ids(t)], False
        if t.dim() == 2 and t.shape[0] > 0:
            self._check_ids(t)
            return list(t.unbind(0)), True
        raise InputError(
            f"expected token ids of shape [seq] or [n, seq], got {_fmt_shape(t.shape)}"
        )

    def forward(self, items: list[torch.Tensor]) -> torch.Tensor:
        assert self.module is not None
        n, longest = len(items), max(int(t.shape[0]) for t in items)
        ids = torch.full((n, longest), PAD_ID, dtype=torch.int64)
        mask = torch.zeros((n, longest), dtype=torch.int64)
        for i, t in enumerate(items):
            ids[i, : t.shape[0]] = t
            mask[i, : t.shape[0]] = 1
        out = self.module(input_ids=ids.to(self.device), attention_mask=mask.to(self.device))
        return out.logits  # type: ignore[no-any-return]

    def example_input(self) -> list[int]:
        return self.tokenize("gshare shares accelerators in space and time").tolist()

    def input_spec(self) -> list[TensorSpec]:
        return [TensorSpec("input_ids", (-1, -1), "INT64")]


class BertBaseHandler(BertHandler):
    model_name = "bert-base"


class BertLargeHandler(BertHandler):
    model_name = "bert-large"
    large = True


BUILTIN_HANDLERS: Final[Mapping[str, type[TorchClassifier]]] = {
    "resnet50": ResNet50Handler,
    "bert-base": BertBaseHandler,
    "bert-large": BertLargeHandler,
    "vit-base": ViTBaseHandler,
    "mlp": MLPHandler,
}
assert tuple(BUILTIN_HANDLERS) == BUILTIN_MODELS


__all__ = [
    "BUILTIN_HANDLERS",
    "BUILTIN_MODELS",
    "BYTE_ID0",
    "CLS_ID",
    "PAD_ID",
    "SEP_ID",
    "TorchClassifier",
]
