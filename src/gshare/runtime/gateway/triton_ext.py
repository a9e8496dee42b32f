"""Triton's protocol extensions where they map to gshare: model configuration (from the
function spec), inference statistics (from the gateway's per-request measurements) and the
model repository index (the deployed functions and their state).

Who uses it: ``oip_service.OipService`` answers the HTTP routes (``/v2/models/{name}/config``,
``/v2/models[/{name}]/stats``, ``POST /v2/repository/index``) and the gRPC RPCs
(``ModelConfig``, ``ModelStatistics``, ``RepositoryIndex``) with these dicts, in the JSON form
of Triton's messages (proto field names), so ``tritonclient`` reads them over both transports.
``InferenceStats.observe`` is fed every answered request of a function, whatever its API
(``/function``, OIP HTTP, gRPC), on the gateway's event loop (plain additions, no lock).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, TypedDict

from gshare.runtime.oip.header import TensorMeta

_TYPES: Final[dict[str, str]] = {
    "BOOL": "TYPE_BOOL", "UINT8": "TYPE_UINT8", "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32", "UINT64": "TYPE_UINT64", "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16", "INT32": "TYPE_INT32", "INT64": "TYPE_INT64", "FP16": "TYPE_FP16",
    "FP32": "TYPE_FP32", "FP64": "TYPE_FP64", "BYTES": "TYPE_STRING",
}  # fmt: skip
"""OIP datatype → Triton's model-config ``DataType``."""


class FunctionStatus(TypedDict):
    """The control API's status of a function (``ControlPlane.function_status``): the keys
    the OIP service reads (it has more)."""

    name: str
    version: int
    spec: dict[str, Any]
    """The function spec's JSON form (``gshare.spec.FunctionSpec``), read key by key."""
    inputs: list[TensorMeta]
    outputs: list[TensorMeta]
    available_replicas: int
    start_error: str | None
    instances: list[dict[str, object]]
    """One view per instance (``device``: where it runs)."""


# -- model configuration ----------------------------------------------------------------------


def _tensor_configs(tensors: list[TensorMeta]) -> list[dict[str, object]]:
    return [
        {
            "name": t["name"],
            "data_type": _TYPES.get(t["datatype"], "TYPE_INVALID"),
            "dims": [int(d) for d in t["shape"]],
        }
        for t in tensors
    ]


def instance_kind(spec_device: str, instances: list[dict[str, object]] | None) -> str:
    """Triton's instance kind: where the function's instances run (``cuda:N`` -> GPU, else
    CPU); before any runs, the spec's device — ``auto`` is ``KIND_AUTO`` (a GPU if the node
    has one), as Triton's own."""
    devices = {str(i.get("device", "")) for i in instances or []}
    if devices:
        return "KIND_GPU" if any(d.startswith("cuda") for d in devices) else "KIND_CPU"
    return {"cpu": "KIND_CPU", "cuda": "KIND_GPU"}.get(spec_device, "KIND_AUTO")


def model_config(status: FunctionStatus) -> dict[str, object]:
    """Triton's ``ModelConfig`` of a function, from its spec and its handler's tensors
    (``status``: the control API's function status).

    How gshare maps onto it: inputs and outputs carry the handler's full shapes (their first
    dimension, -1, is the request's own batch), so ``max_batch_size`` is 0 — gshare batches
    whole requests, which ``dynamic_batching`` describes (``preferred_batch_size`` = the spec's
    ``max_batch``, ``max_queue_delay_microseconds`` = its ``max_wait_ms``); ``instance_group``
    is up to ``max_instances`` instances of the kind they run on (``instance_kind``); the
    share, SLO, scaling and priority of the spec are ``parameters`` (string values, as
    Triton's are)."""
    spec = status["spec"]
    batching = spec.get("batching") or {}
    device = str(spec.get("device", "cpu"))
    params: dict[str, object] = {}
    res = spec.get("resources")
    if isinstance(res, dict):
        for k in ("sm_pct", "quota_request", "quota_limit", "mem_mb"):
            if res.get(k) is not None:
                params[k] = res[k]
    elif res is not None:
        params["resources"] = res
    for k in ("slo_ms", "min_instances", "max_instances", "priority", "keep_alive_s", "device"):
        if spec.get(k) is not None:
            params[k] = spec[k]
    params["model" if spec.get("model") else "handler"] = spec.get("model") or spec.get("handler")
    return {
        "name": status["name"],
        "platform": "gshare",
        "backend": "gshare",
        "version_policy": {"specific": {"versions": [str(status.get("version", 1))]}},
        "max_batch_size": 0,
        "input": _tensor_configs(status.get("inputs") or []),
        "output": _tensor_configs(status.get("outputs") or []),
        "dynamic_batching": {
            "preferred_batch_size": [int(batching.get("max_batch", 1))],
            "max_queue_delay_microseconds": int(float(batching.get("max_wait_ms", 0)) * 1000),
        },
        "instance_group": [
            {
                "name": status["name"],
                "kind": instance_kind(device, status.get("instances")),
                "count": int(spec.get("max_instances", 1)),
            }
        ],
        "parameters": {k: {"string_value": str(v)} for k, v in params.items()},
    }


# -- inference statistics ----------------------------------------------------------------------


@dataclass
class _Duration:
    count: int = 0
    ns: int = 0

    def add(self, seconds: float, n: int = 1) -> None:
        self.count += n
        self.ns += round(seconds * 1e9)

    def view(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class _BatchStats:
    executions: float = 0.0
    """Model executions at this batch size: each request of a batch of b adds 1/b."""
    infer_ns: float = 0.0


@dataclass
class _FunctionStats:
    success: _Duration = field(default_factory=_Duration)
    fail: _Duration = field(default_factory=_Duration)
    queue: _Duration = field(default_factory=_Duration)
    compute_infer: _Duration = field(default_factory=_Duration)
    executions: float = 0.0
    last_ms: int = 0
    batches: dict[int, _BatchStats] = field(default_factory=dict)


class InferenceStats:
    """Per-function counters of the answered requests, in Triton's statistics terms.

    A request's ``success`` time is its latency at the gateway (arrival to answer); ``queue``
    the time it waited before its batch ran (gateway queue, batching wait and token wait: the
    time not spent computing); ``compute_infer`` its batch's busy time; ``execution_count`` the
    model executions (a batch of b requests is one). Failed requests count in ``fail`` with
    their latency. ``compute_input`` / ``compute_output`` are reported as 0: the instance does
    not time tensor decoding and encoding apart, so they count in ``queue``; there is no
    response cache."""

    def __init__(self, wall_clock: Callable[[], float] = time.time) -> None:
        self._wall = wall_clock
        self._by: dict[str, _FunctionStats] = {}

    def observe(
        self,
        function: str,
        code: int,
        latency_s: float,
        m: tuple[float, float, float, int] | None,
    ) -> None:
        """One answered request: HTTP-like ``code``, its latency at the gateway, and the
        instance's measurements ``(queue_ms, token_wait_ms, exec_ms, batch)`` (None when no
        instance answered)."""
        s = self._by.get(function)
        if s is None:
            s = self._by[function] = _FunctionStats()
        s.last_ms = int(self._wall() * 1000)
        if code >= 400 or m is None:
            s.fail.add(latency_s)
            return
        _q_ms, _tw_ms, ex_ms, batch = m
        b = max(1, int(batch))
        s.success.add(latency_s)
        s.queue.add(max(0.0, latency_s - ex_ms / 1000.0))
        s.compute_infer.add(ex_ms / 1000.0)
        s.executions += 1.0 / b
        bs = s.batches.get(b)
        if bs is None:
            bs = s.batches[b] = _BatchStats()
        bs.executions += 1.0 / b
        bs.infer_ns += ex_ms * 1e6 / b

    def forget(self, function: str) -> None:
        """A deleted function's counters go (a redeployed one starts from zero)."""
        self._by.pop(function, None)

    def model_stats(self, name: str, version: int) -> dict[str, object]:
        """Triton's ``ModelStatistics`` of one function (zeros before its first request)."""
        s = self._by.get(name) or _FunctionStats()
        zero = {"count": 0, "ns": 0}
        return {
            "name": name,
            "version": str(version),
            "last_inference": s.last_ms,
            "inference_count": s.success.count,
            "execution_count": round(s.executions),
            "inference_stats": {
                "success": s.success.view(),
                "fail": s.fail.view(),
                "queue": s.queue.view(),
                "compute_input": dict(zero),
                "compute_infer": s.compute_infer.view(),
                "compute_output": dict(zero),
                "cache_hit": dict(zero),
                "cache_miss": dict(zero),
            },
            "batch_stats": [
                {
                    "batch_size": b,
                    "compute_input": dict(zero),
                    "compute_infer": {"count": round(bs.executions), "ns": int(bs.infer_ns)},
                    "compute_output": dict(zero),
                }
                for b, bs in sorted(s.batches.items())
            ],
        }


# -- model repository index ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Readiness:
    """Whether a function is ready for inferencing (OIP "model ready"), and why not."""

    ready: bool
    state: str
    """Triton's model state: ``READY``, ``LOADING`` (its first instance is starting) or
    ``UNAVAILABLE`` (its instances fail to start)."""
    reason: str = ""


def readiness(status: FunctionStatus) -> Readiness:
    """A function is ready when no start failed and it has a ready instance — or needs none:
    with ``min_instances`` 0 it may scale to zero and a request starts one (serverless)."""
    if status.get("start_error"):
        return Readiness(False, "UNAVAILABLE", str(status["start_error"]))
    if int(status.get("available_replicas", 0)) > 0:
        return Readiness(True, "READY")
    if int(status["spec"].get("min_instances", 1)) == 0:
        return Readiness(True, "READY")
    return Readiness(False, "LOADING", "no instance is ready yet")


def repository_index(statuses: list[FunctionStatus], ready_only: bool) -> list[dict[str, object]]:
    """Triton's repository index: every deployed function, its version and state."""
    out: list[dict[str, object]] = []
    for st in statuses:
        r = readiness(st)
        if ready_only and not r.ready:
            continue
        out.append(
            {
                "name": st["name"],
                "version": str(st["version"]),
                "state": r.state,
                "reason": r.reason,
            }
        )
    return out


__all__ = [
    "FunctionStatus",
    "InferenceStats",
    "Readiness",
    "model_config",
    "readiness",
    "repository_index",
]
