"""An instance's cold start up to a loaded model: steps 1–2 of ``instance.server``'s module doc.

Who calls it: ``instance.server.InstanceServer.__init__``, once, first thing in the instance
process (``cold_start``); it then builds its token gate (``instance.gate``, step 3) and data path
(``instance.wire``, step 4) on what this returns (``ColdStart``).

What it does, in this order: the launch's environment and ``sys.path``; the spatial partition
(CPU core affinity and intra-op threads, before torch creates its thread pools); on CUDA the
driver-API interposer's configuration (``runtime.native``); the memory baseline and the kernel's
hard cap under the governor's soft limit (``instance.oscap``); the sandbox that hides the
server's state from the handler (``instance.sandbox``); then the handler, with the node's shared
weights (``ModelStore``).

What must hold: the order above — the partition before torch makes threads, the baseline before
the model loads, the sandbox before the handler's code is imported; nothing here starts a
thread or opens a socket of the instance's own.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gshare.policy.memory import MemoryPlan
from gshare.runtime.instance.launch import InstanceLaunch
from gshare.runtime.instance.oscap import apply_memory_cap
from gshare.runtime.instance.sandbox import HIDE_ENV, SandboxState, hide_paths, tmp_dir
from gshare.runtime.native import configure_interposer
from gshare.runtime.node.partition import apply_cpu_partition, set_cuda_memory_fraction

if TYPE_CHECKING:
    import psutil

    from gshare.runtime.instance.models import Handler, TensorSpec
    from gshare.runtime.instance.oscap import MemoryCap
    from gshare.runtime.instance.sandbox import Sandbox
    from gshare.spec import FunctionSpec

log = logging.getLogger("gshare.runtime.instance.server")
"""The instance server's logger (its parts log under the server's name)."""


@dataclass
class ColdStart:
    """What the cold start made (``InstanceServer`` keeps each as an attribute)."""

    cores: list[int]
    """The CPU cores of the partition (empty on CUDA)."""
    native_tokens: bool
    """The interposer gates this instance's kernel launches on its tokens (CUDA)."""
    governed: bool
    """The memory limit is the instance's own (``instance.memory``): CPU with a limit."""
    baseline_mb: float
    os_cap: MemoryCap | None
    sandbox: Sandbox
    spec: FunctionSpec
    handler: Handler
    input_spec: list[TensorSpec]
    output_spec: list[TensorSpec]
    takes_parameters: bool
    """``handler.predict`` takes the requests' OIP ``parameters`` (``takes_parameters``)."""


def cold_start(launch: InstanceLaunch) -> ColdStart:
    """Steps 1–2 of the cold start (module doc)."""
    for k, v in launch.env.items():
        os.environ[k] = v
    for p in launch.extra_sys_path:
        if p not in sys.path:
            sys.path.insert(0, p)

    # 1. spatial partition, before torch creates its thread pools.
    cores: list[int] = []
    if launch.device == "cpu":
        cores = list(apply_cpu_partition(launch.sm_pct, sm_offset_pct=launch.sm_offset_pct))
    # 1b. the GPU frontend: the driver-API interposer, when the agent preloaded it, gates
    # every kernel launch on this instance's tokens and caps its memory (runtime.native).
    native_tokens = False
    if launch.device.startswith("cuda"):
        cap_mb = launch.mem_mb if launch.mem_step_mb <= 0 else launch.mem_max_mb
        native_tokens = configure_interposer(
            launch.token_socket, launch.instance_id, launch.token_secret, cap_mb
        )
    # 2. model.
    # lazy: loading imports torch, which must come after the partition (step 1)
    from gshare.runtime.instance.loading import make_handler
    from gshare.spec import load_function_spec  # lazy: pydantic, after the partition too

    baseline_mb = 0.0
    governed = (launch.mem_mb > 0 or launch.mem_step_mb > 0) and launch.device == "cpu"
    if governed:
        import psutil  # lazy: only a governed instance measures its baseline

        baseline_mb = _private_rss_mb(psutil.Process())  # torch is imported now
    # the kernel's hard cap under the governor's soft limit (instance.oscap)
    os_cap: MemoryCap | None = None
    plan = MemoryPlan(launch.mem_mb, launch.mem_step_mb, launch.mem_max_mb)
    if governed and math.isfinite(plan.cap_mb):
        os_cap = apply_memory_cap(plan.cap_mb)
        if os_cap.detail:
            log.warning("memory cap: %s", os_cap.detail)
    # the handler may not read the server's state (its control token): instance.sandbox
    hide = [p for p in os.environ.get(HIDE_ENV, "").split(os.pathsep) if p]
    sandbox = hide_paths(hide, tmp_dir(os.path.dirname(launch.uds_path) or "."))
    if sandbox.state is SandboxState.UNAVAILABLE:
        log.warning("the state directory is not hidden: %s", sandbox.detail)

    spec = load_function_spec(launch.spec)
    handler = make_handler(spec)
    weights = None
    if launch.model_key:
        from gshare.runtime.node.model_store import ModelStore  # lazy: imports torch

        store = ModelStore(launch.store_root) if launch.store_root else ModelStore()
        weights = store.get(launch.model_key, device=launch.device)
    if launch.device.startswith("cuda") and launch.mem_mb > 0:
        import torch  # lazy: after the partition (step 1); loading imported it by now

        total_mb = torch.cuda.get_device_properties(launch.device).total_memory / (1 << 20)
        set_cuda_memory_fraction(min(1.0, launch.mem_mb / total_mb))
    handler.load(weights, launch.device)
    input_spec: list[TensorSpec] = []
    if hasattr(handler, "input_spec"):
        with contextlib.suppress(Exception):
            input_spec = list(handler.input_spec() or [])
    output_spec: list[TensorSpec] = []
    if hasattr(handler, "output_spec"):
        with contextlib.suppress(Exception):
            output_spec = list(handler.output_spec() or [])
    return ColdStart(
        cores=cores,
        native_tokens=native_tokens,
        governed=governed,
        baseline_mb=baseline_mb,
        os_cap=os_cap,
        sandbox=sandbox,
        spec=spec,
        handler=handler,
        input_spec=input_spec,
        output_spec=output_spec,
        takes_parameters=takes_parameters(handler),
    )


def _private_rss_mb(proc: psutil.Process) -> float:
    mi = proc.memory_info()
    shared = int(getattr(mi, "shared", 0))
    return float(max(0, int(mi.rss) - shared)) / (1 << 20)


def takes_parameters(handler: Handler) -> bool:
    """Whether ``handler.predict`` has a ``parameters`` argument (it then gets the requests'
    OIP parameters)."""
    try:
        p = inspect.signature(handler.predict).parameters.get("parameters")
    except (TypeError, ValueError):
        return False
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)


__all__ = ["ColdStart", "cold_start", "takes_parameters"]
