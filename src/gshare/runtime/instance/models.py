"""Models behind one handler convention: the built-ins and users' own classes.

The handler convention (``Handler``)
====================================
An instance process serves a function through an object with two methods::

    class MyModel:
        def load(self, weights: Mapping[str, torch.Tensor] | None, device: str) -> None: ...
        def predict(self, inputs: list[Any]) -> list[Any]: ...        # one output per input
        # optional:
        def example_input(self) -> Any: ...            # one valid payload (profiler, warm-up)
        def input_spec(self) -> list[TensorSpec]: ...  # Open Inference Protocol v2 inputs
        def initial_weights(self) -> dict[str, torch.Tensor]: ...  # weights without a file

* ``load`` is called once, before any ``predict``, with the function's weights — the tensors of
  the node's model store (read-only, shared by every instance on the node: never write to them
  in place, the page is mapped read-only and the process would get SIGSEGV) or ``None`` — and a
  concrete device (``"cpu"``, ``"cuda"``, ``"cuda:1"``). The weights come from the spec's
  ``weights`` file, else from ``initial_weights()``; a handler with neither gets ``None``.
* ``predict`` gets a batch of decoded request payloads (the instance batches up to
  ``batching.max_batch`` requests) and returns one JSON-serialisable output per payload (a
  ``dict`` becomes one Open Inference Protocol output tensor per key).
* A spec names the class as ``handler: "package.module:Class"`` (importable on ``sys.path``)
  or ``handler: "path/to/file.py:Class"``; the class is instantiated without arguments.
  ``examples/keyword_sentiment.py`` with ``examples/keyword-sentiment.yaml`` is a complete one.
* ``build_on_meta`` and ``load_weights`` are the two helpers a user handler needs to build its
  ``torch.nn.Module`` without allocating and to adopt the shared tensors without copying them.

Payloads (what ``predict`` receives, by request encoding — ``instance.protocol``): raw bytes
(``ENC_RAW``), a parsed JSON document (``ENC_JSON``), or for the Open Inference Protocol a
``torch.Tensor`` shaped like ``input_spec()`` with its leading batch dimension (``ENC_OIP``).

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
for a batch payload. An invalid payload raises ``InputError`` naming its index, the expected
shape and what was given (the instance answers it as a bad request).

Test-only size override: ``tiny=True`` (or the environment variable ``GSHARE_TINY_MODELS=1``,
so that runtime tests can start real instance processes cheaply) builds every built-in from a
small configuration of the same architecture (images 32x32, 2 layers, hidden 32...). Weights
keys differ (``weights_key``), so tiny and full weights never mix in a model store.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import os
import sys
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from gshare.spec import BUILTIN_MODELS, FunctionSpec

__all__ = [
    "BUILTIN_MODELS",
    "Handler",
    "InputError",
    "TensorSpec",
    "build_on_meta",
    "handler_class",
    "load_handler",
    "load_weights",
    "make_handler",
    "resolve_device",
    "shares_weights",
    "state_dict_for",
    "tiny_models",
    "weights_key",
]

TINY_ENV: Final[str] = "GSHARE_TINY_MODELS"
CLS_ID: Final[int] = 101
SEP_ID: Final[int] = 102
PAD_ID: Final[int] = 0
BYTE_ID0: Final[int] = 1000
"""Byte ``b`` of a text is token ``BYTE_ID0 + b`` (the toy tokenizer of the text models)."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input of a model in Open Inference Protocol v2 terms."""

    name: str
    shape: tuple[int, ...]
    """-1 marks a dimension of any size (the batch, a sequence length)."""
    datatype: str
    """An OIP datatype name: "FP32", "INT64", ..."""


class InputError(ValueError):
    """A request payload the handler cannot decode; a client error (4xx), not a server one."""


@runtime_checkable
class Handler(Protocol):
    """The convention every served model follows (see the module doc)."""

    def load(self, weights: Mapping[str, torch.Tensor] | None, device: str) -> None: ...

    def predict(self, inputs: list[Any]) -> list[Any]: ...


# -- building modules without allocating, adopting shared tensors without copying ---------------


@contextlib.contextmanager
def _params_on_meta() -> Iterator[None]:
    # Parameters go to the meta device as they are registered, buffers stay real: models
    # compute non-persistent buffers (e.g. BERT's position_ids) in __init__ and those are not
    # in a state dict. (accelerate's init_empty_weights(include_buffers=False) idiom.)
    # The parameter's CPU tensor is created by torch.empty and dropped at once: its pages are
    # never touched, so it costs no resident memory. Not thread-safe: build one model at a time.
    orig = nn.Module.register_parameter

    def register(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        orig(self, name, param)

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = orig  # type: ignore[method-assign]


def build_on_meta(factory: Callable[[], nn.Module]) -> nn.Module:
    """``factory()`` with every parameter on the meta device (no memory, no init cost) and
    buffers real; follow with ``load_weights`` to give it the (shared) weights."""
    with _params_on_meta():
        return factory()


def load_weights(module: nn.Module, weights: Mapping[str, torch.Tensor]) -> None:
    """Make ``weights`` the module's parameters and buffers WITHOUT copying them.

    ``load_state_dict(assign=True)`` keeps the given tensors (their storage, dtype and device)
    instead of copying into the module's; entries that are not in the module's state dict are
    taken as non-persistent buffers. Afterwards every tensor named in ``weights`` is checked to
    be the same memory (a silent copy — a dtype or device conversion — would defeat the model
    store and raises ``RuntimeError``), and no parameter may remain on the meta device.
    """
    own = module.state_dict(keep_vars=True)
    missing = sorted(k for k in own if k not in weights)
    if missing:
        raise KeyError(f"weights lack {len(missing)} tensors of the model, e.g. {missing[:3]}")
    persistent = {k: v for k, v in weights.items() if k in own}
    buffers = dict(module.named_buffers())
    extra = sorted(k for k in weights if k not in own and k not in buffers)
    if extra:
        raise KeyError(f"weights have {len(extra)} tensors the model lacks, e.g. {extra[:3]}")
    module.load_state_dict(persistent, strict=True, assign=True)
    for k in weights:
        if k not in own:  # a non-persistent buffer: set it in place of the module's own
            owner_name, _, leaf = k.rpartition(".")
            owner = module.get_submodule(owner_name)
            owner._buffers[leaf] = weights[k]
    module.requires_grad_(False)
    if not shares_weights(module, weights):
        raise RuntimeError(
            "load_state_dict copied the weights: the model store's zero-copy "
            "guarantee is broken (dtype/device mismatch?)"
        )
    left = [n for n, t in [*module.named_parameters(), *module.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"tensors left on the meta device after loading: {left[:3]}")


def shares_weights(module: nn.Module, weights: Mapping[str, torch.Tensor]) -> bool:
    """True when every tensor of ``weights`` IS the module's tensor of that name (same data
    pointer), i.e. the module maps the weights rather than owning a copy."""
    mine = {
        **dict(module.named_parameters(remove_duplicate=False)),
        **dict(module.named_buffers(remove_duplicate=False)),
    }
    for k, w in weights.items():
        t = mine.get(k)
        if t is None or t.data_ptr() != w.data_ptr() or t.dtype != w.dtype:
            return False
    return True


def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` when this process sees a GPU, else ``cpu``; others unchanged."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def tiny_models(tiny: bool | None = None) -> bool:
    """The test-only size override: ``tiny`` when given, else ``$GSHARE_TINY_MODELS``."""
    if tiny is not None:
        return tiny
    return os.environ.get(TINY_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _seed_of(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFF_FFFF


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
        return _seed_of(self.model_name)

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


# -- user handlers ------------------------------------------------------------------------------


def handler_class(ref: str) -> type:
    """The class named by ``"package.module:Class"`` or ``"path/file.py:Class"``.
    ``ImportError`` / ``AttributeError`` / ``TypeError`` with a one-line message otherwise."""
    mod_name, _, attr = ref.rpartition(":")
    if not mod_name or not attr:
        raise ImportError(f"handler {ref!r}: expected 'module:Class'")
    if mod_name.endswith(".py"):
        path = Path(mod_name).resolve()
        if not path.is_file():
            raise ImportError(f"handler {ref!r}: no file {str(path)!r}")
        unique = "gshare_user_" + path.stem + "_" + hashlib.sha1(str(path).encode()).hexdigest()[:8]
        module = sys.modules.get(unique)
        if module is None:
            spec = importlib.util.spec_from_file_location(unique, path)
            if spec is None or spec.loader is None:
                raise ImportError(f"handler {ref!r}: cannot import {str(path)!r}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[unique] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[unique]
                raise
    else:
        module = importlib.import_module(mod_name)
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AttributeError(f"handler {ref!r}: {mod_name} has no {attr!r}") from None
    if not isinstance(obj, type):
        raise TypeError(f"handler {ref!r}: {attr} is not a class")
    missing = [m for m in ("load", "predict") if not callable(getattr(obj, m, None))]
    if missing:
        raise TypeError(f"handler {ref!r}: {attr} lacks {' and '.join(missing)}() (see Handler)")
    return obj


# -- factories ----------------------------------------------------------------------------------


def make_handler(spec: FunctionSpec, *, tiny: bool | None = None) -> Handler:
    """A new, not yet loaded handler for ``spec``: a built-in, or the user's class
    instantiated without arguments. ``tiny`` is the test-only size override of the built-ins."""
    if spec.model is not None:
        return BUILTIN_HANDLERS[spec.model](tiny)
    assert spec.handler is not None
    h = handler_class(spec.handler)()
    return h  # type: ignore[no-any-return]


def _load_safetensors(path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if not Path(path).is_file():
        raise FileNotFoundError(f"weights file {path!r} does not exist")
    return load_file(path, device="cpu")


def state_dict_for(spec: FunctionSpec, *, tiny: bool | None = None) -> dict[str, torch.Tensor]:
    """The weights instances of ``spec`` share (what the agent ``put``s in the model store):
    the ``weights`` .safetensors file when given; else a built-in's seeded random weights;
    else the user handler's ``initial_weights()``; else ``{}`` (the handler gets ``None``)."""
    if spec.weights is not None:
        return _load_safetensors(spec.weights)
    h = make_handler(spec, tiny=tiny)
    if isinstance(h, TorchClassifier):
        return h.random_state()
    init = getattr(h, "initial_weights", None)
    if callable(init):
        return dict(init())
    return {}


def weights_key(spec: FunctionSpec, *, tiny: bool | None = None) -> str:
    """The model-store key of ``state_dict_for(spec)``: equal keys mean equal weights, so all
    functions of one built-in share one copy per node. Built-ins: ``<model>[-tiny]-random-
    <seed>``; weights files: their name, size and mtime hashed; user handlers without a file:
    the handler reference."""
    if spec.weights is not None:
        p = Path(spec.weights).resolve()
        st = p.stat() if p.exists() else None
        ident = f"{p}|{st.st_size if st else -1}|{st.st_mtime_ns if st else -1}"
        return f"file-{p.stem[:40]}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}"
    if spec.model is not None:
        size = "-tiny" if tiny_models(tiny) else ""
        return f"{spec.model}{size}-random-{_seed_of(spec.model):08x}"
    assert spec.handler is not None
    return f"handler-{spec.name}-{hashlib.sha256(spec.handler.encode()).hexdigest()[:16]}"


def load_handler(
    spec: FunctionSpec,
    *,
    store: Any = None,
    device: str | None = None,
    tiny: bool | None = None,
) -> Handler:
    """A loaded handler for ``spec`` — what an instance process does at start.

    With a ``gshare.runtime.node.model_store.ModelStore`` the weights are taken from the store
    (written once per node by the first caller: ``get_or_put``) and mapped, so N instances
    cost one copy; without one, built-ins initialise their own random weights (a private
    copy per process). ``device`` defaults to ``spec.device`` (``auto`` resolved).
    """
    dev = resolve_device(device or spec.device)
    handler = make_handler(spec, tiny=tiny)
    weights: Mapping[str, torch.Tensor] | None
    if store is not None:
        key = weights_key(spec, tiny=tiny)
        if dev.startswith("cuda") and store.has_cuda(key, dev):
            weights = store.get(key, device=dev) or None  # one copy per GPU (CUDA IPC)
        else:
            weights = store.get_or_put(key, lambda: state_dict_for(spec, tiny=tiny)) or None
    elif spec.weights is not None or not isinstance(handler, TorchClassifier):
        weights = state_dict_for(spec, tiny=tiny) or None
    else:
        weights = None
    handler.load(weights, dev)
    return handler
