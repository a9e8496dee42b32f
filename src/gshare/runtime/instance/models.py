"""The handler convention: how an instance process serves a model (public: users' handlers
import it).

The built-in models are in ``instance.builtin_models``; which handler a spec gets, and with
which weights, is ``instance.loading``.

The handler convention (``Handler``)
====================================
An instance process serves a function through an object with two methods::

    class MyModel:
        def load(self, weights: Mapping[str, torch.Tensor] | None, device: str) -> None: ...
        def predict(self, inputs: list[Any]) -> list[Any]: ...        # one output per input
        # optional:
        def example_input(self) -> Any: ...            # one valid payload (profiler, warm-up)
        def input_spec(self) -> list[TensorSpec]: ...  # Open Inference Protocol v2 inputs
        def output_spec(self) -> list[TensorSpec]: ... # ... and outputs (model metadata)
        def initial_weights(self) -> dict[str, torch.Tensor]: ...  # weights without a file

* ``load`` is called once, before any ``predict``, with the function's weights — the tensors of
  the node's model store (read-only, shared by every instance on the node: never write to them
  in place, the page is mapped read-only and the process would get SIGSEGV) or ``None`` — and a
  concrete device (``"cpu"``, ``"cuda"``, ``"cuda:1"``). The weights come from the spec's
  ``weights`` file, else from ``initial_weights()``; a handler with neither gets ``None``.
* ``predict`` gets a batch of decoded request payloads (the instance batches up to
  ``batching.max_batch`` requests) and returns one JSON-serialisable output per payload (a
  ``dict`` becomes one Open Inference Protocol output tensor per key).
* ``predict(self, inputs, parameters)`` — a handler whose ``predict`` has a ``parameters``
  argument also gets, per payload, the request's Open Inference Protocol ``parameters`` (a
  dict; ``{}`` for other requests). ``input_spec`` / ``output_spec`` are what OIP clients see
  in the model metadata; an OIP request is checked against ``input_spec`` (none: any inputs).
* A spec names the class as ``handler: "package.module:Class"`` (importable on ``sys.path``)
  or ``handler: "path/to/file.py:Class"``; the class is instantiated without arguments.
  ``examples/keyword_sentiment.py`` with ``examples/keyword-sentiment.yaml`` is a complete one.
* ``build_on_meta`` and ``load_weights`` are the two helpers a user handler needs to build its
  ``torch.nn.Module`` without allocating and to adopt the shared tensors without copying them.

Generative handlers (language models that stream tokens) implement this convention too —
``predict`` answering the whole completion — and add the generative contract of
``instance.generative.contract``: step-wise ``prefill`` / ``decode`` / ``free`` over sequences
with KV caches (the instance's engine batches them at the iteration level) or a streamed
``generate(inputs, parameters)`` yielding text chunks. The built-in causal LM is
``instance.generative.causal_lm``; the guide is docs/generative.md.

Payloads (what ``predict`` receives, by request encoding — ``instance.protocol``): raw bytes
(``ENC_RAW``), a parsed JSON document (``ENC_JSON``), or for the Open Inference Protocol a
``torch.Tensor`` shaped like ``input_spec()`` with its leading batch dimension (``ENC_OIP``;
a dict name → tensor when the request has several inputs; a BYTES input is a flat list of
``str``, ``bytes`` for elements that are not UTF-8). Its output for an OIP request becomes the
response's output tensors: a dict gives one per key (tensors, arrays, lists, scalars; Python
floats are FP32, strings BYTES), anything else one named ``output0``; the request's requested
outputs are picked from them.

Test-only size override: ``tiny=True`` (or the environment variable ``GSHARE_TINY_MODELS=1``,
so that runtime tests can start real instance processes cheaply) builds every built-in from a
small configuration of the same architecture (images 32x32, 2 layers, hidden 32...). Weights
keys differ (``weights_key``), so tiny and full weights never mix in a model store.
"""

from __future__ import annotations

import contextlib
import os
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable

import torch
from torch import nn

TINY_ENV: Final[str] = "GSHARE_TINY_MODELS"


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


def seed_of(name: str) -> int:
    """The seed of a built-in's random weights: the same in every process of every node."""
    return zlib.crc32(name.encode()) & 0x7FFF_FFFF


__all__ = [
    "TINY_ENV",
    "Handler",
    "InputError",
    "TensorSpec",
    "build_on_meta",
    "load_weights",
    "resolve_device",
    "seed_of",
    "shares_weights",
    "tiny_models",
]
