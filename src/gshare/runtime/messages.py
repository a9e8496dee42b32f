"""The typed contract between the runtime's processes: what a node agent reports, what the
controller asks of it.

Who uses it: the node agent (``runtime.node.agent``) builds a ``NodeStatus`` in ``status()``;
the controller (``runtime.control.loop``) consumes it through an ``AgentHandle``
(``runtime.control.agents``: the agent child process of the embedded default, a Ray actor on a
Ray cluster, a small fake in the controller's unit tests). Values cross process boundaries by
pickling (the agent's socket pair, or Ray), so every field is plain data; enums are ``str``
enums, so that the JSON views of the control API show their value.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gshare.runtime.instance.launch import InstanceLaunch


class InstanceState(enum.StrEnum):
    """An instance process as its node agent sees it."""

    STARTING = "starting"
    """Process started (or restarted after a crash), model not loaded yet."""
    READY = "ready"
    """Serving on its socket."""
    FAILED = "failed"
    """Gave up: the start failed, or it crashed too often; ``error`` says why."""
    STOPPED = "stopped"
    """Stopped on the controller's request."""


class LiveState(enum.StrEnum):
    """An instance as the controller manages it."""

    STARTING = "starting"
    """Asked to start; not connected to the gateway yet."""
    READY = "ready"
    """Connected to the gateway and taking requests."""
    RESTARTING = "restarting"
    """Was ready; its agent restarts it after a crash (the gateway holds its requests)."""
    DRAINING = "draining"
    """Removed: takes no new requests, stops when its in-flight requests are answered."""


class ConfigSource(enum.StrEnum):
    """Where a function's candidate configurations come from (``runtime.control.configs``)."""

    LIVE_PROFILE = "live profile"
    """``gshare profile NAME`` measured it on this cluster."""
    LIVE_PROFILE_SLO_UNMET = "live profile, SLO unmet"
    """Profiled, but no configuration meets the SLO: every profiled one is a candidate."""
    SHIPPED_V100 = "shipped V100 profile"
    """A built-in model on a CUDA node: the shipped V100 table."""
    DEFAULT_SHARE = "default share"
    """``resources: auto`` without a profile: the default share."""
    SPEC = "spec resources"
    """The spec's explicit ``resources``."""


@dataclass(frozen=True, slots=True)
class MemoryUsage:
    """An instance's memory limit as its device's ledger holds it (``policy.memory``), and the
    peak memory of its recent requests (resource-centric sizing, ``policy.sizing``)."""

    limit_mb: float
    """The reservation now (starts at ``init``, grows by steps, back to ``init`` when idle)."""
    grows: int = 0
    """Granted increases since the instance was registered (each a kill avoided)."""
    steps: int = 0
    """Steps those increases added up to."""
    refusals: int = 0
    """Requests that needed more than the instance could get (failed with a 503)."""
    samples_total: int = 0
    """Requests (batches) measured since the instance started."""
    samples: tuple[tuple[float, float], ...] = ()
    """The most recent measurements, oldest first: (peak memory MiB above the runtime's
    baseline, execution time s) per batch; ``samples_total`` numbers the last one."""


@dataclass(frozen=True, slots=True)
class FikitUsage:
    """An instance's FIKIT state from its device's board (``runtime.tokens.board``; counters
    since the instance was registered)."""

    phase: str
    """``measuring`` / ``sharing`` (``policy.priority.TaskPhase``), or ``off``."""
    runs: int = 0
    """Runs in its kernel profile (T)."""
    preemptions: int = 0
    """Ops it held because a higher priority class was active (task switching)."""
    fills: int = 0
    """Ops it ran inside a higher class's predicted idle gaps."""
    measure_s: float = 0.0
    """Wall time of its measured batches (the measurement phase)."""
    gaps: int = 0
    """Idle gaps it published (top class, sharing phase)."""
    wait_s: float = 0.0
    """Time its held ops waited for a higher class."""


@dataclass(frozen=True, slots=True)
class InstanceStatus:
    """One instance in a node agent's report."""

    instance_id: str
    function: str
    state: InstanceState
    incarnation: int
    """Restarts in place increment it; the gateway reconnects to a new incarnation."""
    device_index: int = 0
    pid: int | None = None
    uds_path: str | None = None
    tcp_port: int | None = None
    inputs: list[dict[str, object]] | None = None
    """The handler's OIP input description, once loaded."""
    cores: list[int] | None = None
    error: str | None = None
    """Why it failed (``FAILED``)."""
    last_exit: str | None = None
    """How its last process ended (a crash it was restarted after)."""
    restarts: int = 0
    """Restarts since it was started."""
    rss_mb: float = 0.0
    """Private resident memory."""
    memory: MemoryUsage | None = None
    """Its memory limit and measured peaks (None: the instance has no memory limit)."""
    fikit: FikitUsage | None = None
    """Its FIKIT state (None: its device shares by tokens alone)."""


@dataclass(frozen=True, slots=True)
class TokenUsage:
    """One token client in a device's token table."""

    total_used_ms: float
    """Busy time charged to the client since it was registered (the achieved share is its
    growth over a period)."""
    quota_request: float
    quota_limit: float
    sm_pct: float
    total_held_ms: float = 0.0
    """Time its released tokens were held, grant to release, as the token server saw them."""
    tokens: int = 0
    """Tokens it released. ``(total_held_ms - busy) / tokens``: the device time a token is
    held idle, the protocol's hand-over (grant, wake-up, release)."""


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """A node agent's report (``NodeAgent.status``)."""

    node_id: str
    node_ip: str
    now_s: float
    """The agent's monotonic clock when the report was taken (token usage is per this clock)."""
    instances: tuple[InstanceStatus, ...] = ()
    tokens: Mapping[str, TokenUsage] = field(default_factory=dict)
    """Token usage by instance id."""
    device_memory: tuple[tuple[float, float], ...] = ()
    """Per device (local index order): (capacity MiB, reserved MiB) of its memory ledger."""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What a node agent tells about itself when it joins (``NodeAgent.info``)."""

    node_id: str
    devices: tuple[str, ...] = ("cpu",)
    """Device names in local index order: ``cpu`` or ``cuda:N``."""
    cpu_count: int = 1
    """Cores the node's instances may use."""
    device_memory_mb: tuple[float, ...] = ()
    """Memory of each device that instances' limits are reserved from (CPU: the node's RAM
    share, ``gshare serve --device-mem-mb``; CUDA: the device's memory)."""
    extra: Mapping[str, object] = field(default_factory=dict)
    """Anything else it reports (ip, pid, MPS, run directory, launcher: ``/system/info``)."""


class AgentGone(RuntimeError):
    """The node agent died (its node left the cluster); its instances are gone with it."""


class AgentHandle(Protocol):
    """The controller's view of one node agent. Every call may raise ``AgentGone`` (the agent
    died) or ``TimeoutError`` (it did not answer in time); any other exception is the agent's
    answer to that call (a start it refused, say)."""

    node_id: str

    async def status(self) -> NodeStatus: ...

    async def start_instance(self, launch: InstanceLaunch) -> None: ...

    async def stop_instance(self, instance_id: str) -> None: ...

    async def describe(
        self, spec: dict[str, object], extra_sys_path: list[str]
    ) -> dict[str, object]: ...

    async def set_share(
        self, instance_id: str, quota_request: float, quota_limit: float
    ) -> None: ...


__all__ = [
    "AgentGone",
    "AgentHandle",
    "ConfigSource",
    "FikitUsage",
    "InstanceState",
    "InstanceStatus",
    "LiveState",
    "MemoryUsage",
    "NodeInfo",
    "NodeStatus",
    "TokenUsage",
]
