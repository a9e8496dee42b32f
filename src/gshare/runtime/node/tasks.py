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
from typing import Any


def put_weights(store_root: str | None, spec: dict[str, Any]) -> str | None:
    """Build the function's weights and put them in the node's store once; return their key
    (``instance.loading.weights_key``: functions of the same built-in, or of the same weights file,
    share one copy per node), or None when there are none to share."""
    from gshare.runtime.instance.loading import state_dict_for, weights_key
    from gshare.runtime.node.model_store import ModelStore
    from gshare.spec import load_function_spec

    fspec = load_function_spec(spec)
    key = weights_key(fspec)
    store = ModelStore(store_root) if store_root else ModelStore()
    if store.has(key):
        return key
    state = state_dict_for(fspec)
    if not state:
        return None
    store.put(key, state)
    return key


def describe_handler(spec: dict[str, Any], extra_sys_path: list[str]) -> dict[str, Any]:
    """Import the handler and report its OIP inputs and outputs (``input_spec()``,
    ``output_spec()``), or the import error (a bad ``handler`` fails the deployment, not the
    first call)."""
    for p in extra_sys_path:
        if p not in sys.path:
            sys.path.insert(0, p)
    try:
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
        return {"ok": True, **io, "example": hasattr(handler, "example_input")}
    except Exception as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}".splitlines()[0]}


__all__ = ["describe_handler", "put_weights"]
