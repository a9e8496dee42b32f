"""One-off jobs the node agent runs on its node, in a throw-away process.

Who calls them: ``NodeAgent`` (``agent.py``), through its ``Launcher`` (a child forked from
the node's pre-imported template: ``launcher.call("gshare.runtime.node.tasks:NAME", args)``)
or, with ``launcher="ray"``, as a Ray task pinned to the node. Either way the agent's own
process stays free of CPU-bound work and of torch: it hosts the token servers, whose answers
need the GIL. Arguments and results are plain JSON data. This module imports nothing heavy
at load time (no ray, no torch), so a forked child starts at once.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict


class HandlerDescription(TypedDict):
    """``describe_handler``'s answer (JSON): ``ok`` and the handler's OIP inputs and outputs,
    or ``error``."""

    ok: bool
    error: NotRequired[str]
    inputs: NotRequired[list[dict[str, Any]]]
    """``oip.header.spec_dicts`` of ``input_spec()`` (open: OIP metadata)."""
    outputs: NotRequired[list[dict[str, Any]]]
    example: NotRequired[bool]
    generative: NotRequired[bool]
    """The handler follows the step-wise generative contract (``generative.contract``)."""


def put_weights(
    store_root: str | None, spec: Mapping[str, object], verified: list[str] | None = None
) -> str | None:
    """Build the function's weights and put them in the node's store once; return their key
    (``instance.loading.weights_key``: functions of the same built-in, or of the same weights file,
    share one copy per node), or None when there are none to share."""
    # lazy: both import torch, which this module's forked children import only when needed
    from gshare.runtime.instance.loading import state_dict_for, weights_key
    from gshare.runtime.node.model_store import ModelStore
    from gshare.spec import load_function_spec  # lazy: pydantic; the agent imports this module

    fspec = load_function_spec(spec)
    key = weights_key(fspec)
    store = ModelStore(store_root) if store_root else ModelStore()
    if store.has(key):
        if key in (verified or ()) or store.verify(key):
            return key
        store.drop(key)  # changed since it was written (or written without a checksum)
    state = state_dict_for(fspec)
    if not state:
        return None
    store.put(key, state)
    return key


def build_weights(spec: Mapping[str, object], out_path: str) -> bool:
    """(Inside the tenant's walls: ``instance.walls``) a user handler's ``initial_weights()``,
    written to ``out_path`` as a .safetensors file; False when it has none. Its code runs as
    the tenant; ``store_weights`` then reads the file — a format that holds data, never code —
    and puts it in the store, which the tenant may not write."""
    # lazy: torch (safetensors.torch, loading) is heavy; see the module doc
    from safetensors.torch import save_file

    from gshare.runtime.instance.loading import state_dict_for
    from gshare.spec import load_function_spec  # lazy: pydantic; the agent imports this module

    state = state_dict_for(load_function_spec(spec))
    if not state:
        return False
    save_file({k: v.contiguous() for k, v in state.items()}, out_path)
    return True


def store_weights(store_root: str | None, spec: Mapping[str, object], path: str) -> str:
    """Put the weights ``build_weights`` wrote at ``path`` in the node's store (as root);
    return their key. The file is removed."""
    # lazy: torch (safetensors.torch, loading, the store) is heavy; see the module doc
    from safetensors.torch import load_file

    from gshare.runtime.instance.loading import weights_key
    from gshare.runtime.node.model_store import ModelStore
    from gshare.spec import load_function_spec  # lazy: pydantic; the agent imports this module

    key = weights_key(load_function_spec(spec))
    store = ModelStore(store_root) if store_root else ModelStore()
    try:
        if store.has(key) and not store.verify(key):
            store.drop(key)
        if not store.has(key):
            store.put(key, load_file(path))
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return key


def describe_handler(spec: Mapping[str, object], extra_sys_path: list[str]) -> HandlerDescription:
    """Import the handler and report its OIP inputs and outputs (``input_spec()``,
    ``output_spec()``), or the import error (a bad ``handler`` fails the deployment, not the
    first call)."""
    for p in extra_sys_path:
        if p not in sys.path:
            sys.path.insert(0, p)
    try:
        # lazy: inside the try (a failed import is the answer), and loading imports torch
        from gshare.runtime.instance.generative.contract import StepwiseHandler
        from gshare.runtime.instance.loading import make_handler
        from gshare.runtime.oip.header import spec_dicts
        from gshare.spec import load_function_spec

        fs = load_function_spec(spec)
        if fs.weights is not None:  # read where the instances will read it: on this node
            w = fs.weights
            if not os.path.isfile(w) or not os.access(w, os.R_OK):
                return {"ok": False, "error": f"the weights file {w!r} is missing or unreadable"}
        handler = make_handler(fs)
        io: dict[str, list[dict[str, Any]]] = {"inputs": [], "outputs": []}
        for key, method in (("inputs", "input_spec"), ("outputs", "output_spec")):
            if hasattr(handler, method):
                with contextlib.suppress(Exception):
                    io[key] = spec_dicts(getattr(handler, method)())
        return {
            "ok": True,
            "inputs": io["inputs"],
            "outputs": io["outputs"],
            "example": hasattr(handler, "example_input"),
            "generative": isinstance(handler, StepwiseHandler),
        }
    except Exception as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}".splitlines()[0]}


__all__ = [
    "HandlerDescription",
    "build_weights",
    "describe_handler",
    "put_weights",
    "store_weights",
]
