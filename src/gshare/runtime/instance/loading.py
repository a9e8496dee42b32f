"""Which handler a function spec gets, and with which weights: the built-in of ``model`` or the
user's ``handler`` class (``handler_class``), its weights (``state_dict_for``) under a
model-store key (``weights_key``), and a loaded handler (``load_handler``: what an instance
process does at start). The handler convention itself is ``instance.models``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from gshare.runtime.instance.builtin_models import BUILTIN_HANDLERS, TorchClassifier
from gshare.runtime.instance.models import Handler, resolve_device, seed_of, tiny_models
from gshare.spec import GENERATIVE_MODELS, FunctionSpec

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
    if spec.model in GENERATIVE_MODELS:
        from gshare.runtime.instance.generative.causal_lm import CausalLM  # lazy: transformers

        small = spec.model == "causal-lm-gpt2-small" and not tiny_models(tiny)
        return CausalLM("gpt2-small" if small else "tiny")  # type: ignore[return-value]
    if spec.model is not None:
        return BUILTIN_HANDLERS[spec.model](tiny)
    assert spec.handler is not None
    h = handler_class(spec.handler)()
    return h  # type: ignore[no-any-return]


def _load_safetensors(path: str) -> dict[str, torch.Tensor]:
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
        return f"{spec.model}{size}-random-{seed_of(spec.model):08x}"
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


__all__ = ["handler_class", "load_handler", "make_handler", "state_dict_for", "weights_key"]
