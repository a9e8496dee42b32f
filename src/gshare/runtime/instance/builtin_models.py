"""The built-in models behind the handler convention of ``instance.models``.

Built-in models (``BUILTIN_MODELS``), all randomly initialised — never downloaded — with a
seed derived from the model name, so every process of every node builds identical weights
(``builtin_base.TorchClassifier``). This module has the classifiers and registers every
built-in (``BUILTIN_HANDLERS``); the image-to-image family is ``image_models``:

=============  ==============================================  ========  =====================
model          architecture (``transformers`` configuration)   params    input (one item)
=============  ==============================================  ========  =====================
resnet50       ResNetForImageClassification, ResNet-50, 1000   25.6 M    FP32 image [3,224,224]
bert-base      BertForSequenceClassification, 12x768, 2 labels 109.5 M   INT64 token ids [seq]
bert-large     BertForSequenceClassification, 24x1024          335.1 M   INT64 token ids [seq]
vit-base       ViTForImageClassification, ViT-B/16, 1000       86.6 M    FP32 image [3,224,224]
mlp            torch MLP 64-256-256-10 (ReLU)                  0.08 M    FP32 vector [64]
swin2sr        Swin2SRForImageSuperResolution, x2 (small)      0.39 M    FP32 image [3,64,64]
segformer      SegformerForSemanticSegmentation, MiT-b0        3.75 M    FP32 image [3,128,128]
dpt            DPTForDepthEstimation, ViT-S/16 backbone        14.9 M    FP32 image [3,128,128]
=============  ==============================================  ========  =====================

Per-item latency at batch 1 on one core of this repository's 2-core CPU VM (``predict``, one
torch thread): resnet50 ≈ 110 ms, vit-base ≈ 400 ms, swin2sr ≈ 200 ms, segformer ≈ 45 ms,
dpt ≈ 50 ms.

Input decoding of the classifiers (``decode``): one payload is ONE item (shape as above) or a
batch of items (one more leading dimension). Accepted payload forms:

* ``torch.Tensor`` or ``numpy.ndarray``;
* JSON lists, nested (``[[[...]]]`` of shape [3,224,224]) — floats for images and the MLP,
  integers for token ids;
* ``{"data": [...flat or nested...], "shape": [...]}`` (the OIP tensor form);
* raw ``bytes``: images and the MLP read little-endian float32 (``len`` a multiple of one
  item's size: k items when it holds k); text models read UTF-8 text;
* images (resnet50, vit-base) are decoded as by the image models (``image_models.
  decode_images``): any height and width is resized to the input size (over the Open
  Inference Protocol their input stays the declared [n, 3, 224, 224]), and the stage form
  ``{"image": ...}`` — an image model's output — is an image, so a workflow stage after
  swin2sr takes its output as it comes;
* text models also take a ``str`` (or a list of ``str`` as a batch) and tokenise it with a
  deterministic byte-level tokenizer, no vocabulary file: ``[CLS]=101``, each UTF-8 byte
  ``b`` → ``1000 + b``, ``[SEP]=102``, truncated to the model's 512 positions; ``[PAD]=0``.
  Token ids must lie in ``[0, vocab_size)``. Sequences of different lengths are padded and
  masked.

Outputs of the classifiers: ``{"label": int, "score": float}`` for one item (the arg-max class
and its softmax probability), ``{"label": [int...], "score": [float...]}`` for a batch payload
— over the Open Inference Protocol (always a batch) the outputs ``label`` (INT64 [n]) and
``score`` (FP32 [n]) of ``output_spec()``. The image models answer images, class maps and depth
maps (``image_models``). An invalid payload raises ``InputError`` naming its index, the
expected shape and what was given (the instance answers it as a bad request).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import torch
from torch import nn

from gshare.runtime.instance.builtin_base import (
    TorchClassifier,
    as_tensor,
    fmt_shape,
    from_float_bytes,
    split_fixed,
)
from gshare.runtime.instance.image_models import IMAGE_HANDLERS, decode_images
from gshare.runtime.instance.models import InputError, TensorSpec
from gshare.spec import BUILTIN_MODELS

CLS_ID: Final[int] = 101
SEP_ID: Final[int] = 102
PAD_ID: Final[int] = 0
BYTE_ID0: Final[int] = 1000
"""Byte ``b`` of a text is token ``BYTE_ID0 + b`` (the toy tokenizer of the text models)."""


# -- built-in handlers --------------------------------------------------------------------------


class _FixedShapeClassifier(TorchClassifier):
    """Classifiers of fixed-shape float inputs (images, vectors)."""

    input_name = "input"
    what = "input"

    @property
    def item_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    def decode_one(self, payload: Any) -> tuple[list[torch.Tensor], bool]:
        if isinstance(payload, bytes | bytearray | memoryview):
            t, batched = from_float_bytes(payload, self.item_shape)
        else:
            t, batched = split_fixed(as_tensor(payload, torch.float32), self.item_shape, self.what)
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


class _ImageClassifier(_FixedShapeClassifier):
    """Image classifiers: the image payloads of ``image_models.decode_images`` — any height
    and width resized to the input size, the stage form of an image model's output included."""

    what = "an image"

    @property
    def image_size(self) -> int:
        raise NotImplementedError

    @property
    def item_shape(self) -> tuple[int, ...]:
        return (3, self.image_size, self.image_size)

    def decode_one(self, payload: Any) -> tuple[list[torch.Tensor], bool]:
        t, batched = decode_images(payload, self.image_size, self.what)
        return list(t.unbind(0)), batched


class ResNet50Handler(_ImageClassifier):
    model_name = "resnet50"

    def config(self) -> Any:
        from transformers import ResNetConfig  # lazy: transformers is heavy

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

    def build(self) -> nn.Module:
        from transformers import ResNetForImageClassification  # lazy: transformers is heavy

        return ResNetForImageClassification(self.cfg)


class ViTBaseHandler(_ImageClassifier):
    model_name = "vit-base"

    def config(self) -> Any:
        from transformers import ViTConfig  # lazy: transformers is heavy

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
    def image_size(self) -> int:
        return int(self.cfg.image_size)

    def build(self) -> nn.Module:
        from transformers import ViTForImageClassification  # lazy: transformers is heavy

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
        from transformers import BertConfig  # lazy: transformers is heavy

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
        from transformers import BertForSequenceClassification  # lazy: transformers is heavy

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
            seqs = [self._check_ids(as_tensor(s, torch.int64)) for s in payload]
            if any(s.dim() != 1 for s in seqs):
                raise InputError("a batch of token id sequences must be a list of flat lists")
            return seqs, True
        t = as_tensor(payload, torch.int64)
        if t.dim() == 1:
            return [self._check_ids(t)], False
        if t.dim() == 2 and t.shape[0] > 0:
            self._check_ids(t)
            return list(t.unbind(0)), True
        raise InputError(f"expected token ids of shape [seq] or [n, seq], got {fmt_shape(t.shape)}")

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
    **IMAGE_HANDLERS,
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
