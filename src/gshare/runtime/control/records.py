"""The controller's records: its knobs, node agents, devices, live instances, functions.

Who uses them: ``runtime.control.loop.Controller`` owns them (``agents``, ``devices``,
``instances``, ``functions``); ``observe`` updates instances from node status; the control
API (``control.api``), the status page (``control.status``) and the stage host read them.
They are plain mutable dataclasses changed only on the server's asyncio loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gshare.policy import autoscale
from gshare.policy.control import ControlParams, ControlState
from gshare.profiles import ProfileTable
from gshare.resources import GpuShare
from gshare.runtime.control.configs import FunctionConfigs
from gshare.runtime.control.memory import FunctionMemory
from gshare.runtime.messages import (
    AgentHandle,
    ConfigSource,
    FikitUsage,
    LiveState,
    MemoryUsage,
    NodeInfo,
)
from gshare.spec import FunctionSpec

if TYPE_CHECKING:  # the stage scheduler's module is the server's, loaded by wiring
    from gshare.runtime.gateway.stages import PolicyFactory


@dataclass
class ControllerConfig:
    """Knobs of the control loop (defaults as the simulator's ``ClusterConfig``)."""

    period_s: float = 1.0
    control: ControlParams = field(default_factory=ControlParams)
    """Rate prediction, keep-alive and back-off knobs (``policy.control``; the simulator's
    defaults)."""
    autoscaler: str = autoscale.DEFAULT_AUTOSCALER
    placer: str = "mra"
    drain_timeout_s: float = 120.0
    """Longest a removed instance drains its in-flight requests before it is stopped."""
    agent_timeout_s: float = 10.0
    workflow_policy: str = "esg"
    """The live workflow scheduler (``gateway.stages.WORKFLOW_POLICY_NAMES`` or ``direct``)."""
    workflow_policy_factory: PolicyFactory | None = None
    """``gateway.stages.PolicyFactory`` building it (None: ``policy.workflow.make_policy`` by
    name; the CLI passes Aquatope's, whose optimiser lives in ``gshare.experiments``)."""


@dataclass
class AgentRef:
    node_id: str
    handle: AgentHandle
    info: NodeInfo
    alive: bool = True


@dataclass(frozen=True)
class Device:
    index: int
    """The placer's GPU index."""
    node_id: str
    local_index: int
    name: str


@dataclass
class LiveInstance:
    instance_id: str
    function: str
    config: autoscale.ScaleConfig
    share: GpuShare
    device: Device
    created_s: float
    """``clock`` when it was asked to start (or began restarting)."""
    state: LiveState = LiveState.STARTING
    incarnation: int = -1
    """Incarnation the gateway is connected to (-1: none yet)."""
    pid: int | None = None
    restarts: int = 0
    uds_path: str | None = None
    tcp_port: int | None = None
    used_ms: float | None = None
    used_t: float | None = None
    achieved_share: float | None = None
    token_held_ms: float | None = None
    """Time its released tokens were held, grant to release, at its last token report."""
    tokens: int = 0
    """Tokens it had released at its last token report."""
    token_idle_hold_ms: float | None = None
    """Device time a token of its was held beyond its busy time, per token, over the period
    before its last token report (``observe.record_tokens``)."""
    drain_since: float | None = None
    profiling: bool = False
    cores: list[int] | None = None
    rss_mb: float = 0.0
    last_exit: str | None = None
    channel_secret: str = ""
    """What the gateway presents on a TCP connection to it (``protocol.OP_AUTH``)."""
    route: str = ""
    """The gateway route it serves (the function's; a private one for profiling)."""
    memory: MemoryUsage | None = None
    """Its memory limit and measured peaks, from its node's last status."""
    fikit: FikitUsage | None = None
    """Its FIKIT phase and counters, from its node's last status (None: tokens alone)."""

    def __post_init__(self) -> None:
        self.route = self.route or self.function


@dataclass
class FunctionState:
    spec: FunctionSpec
    version: int
    control: ControlState
    """The reconcile step's state (``policy.control``)."""
    inputs: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    """The handler's OIP outputs (``output_spec``), for model metadata; [] when undeclared."""
    predicted_rps: float = 0.0
    observed_rps: float = 0.0
    invocations: int = 0
    start_error: str | None = None
    configs: FunctionConfigs = field(
        default_factory=lambda: FunctionConfigs([], ConfigSource.DEFAULT_SHARE)
    )
    table: ProfileTable | None = None
    table_loaded: bool = False
    last_reason: str = ""
    last_shortfall_s: float = -1e18
    last_scale_event: tuple[str, int, int] | None = None
    """The last "scale:" event logged (reason, +, -), to log a repeated one only now and then."""
    last_scale_event_s: float = -1e18
    memory: FunctionMemory = field(default_factory=FunctionMemory)
    """Resource-centric memory sizing (``runtime.control.memory``)."""
    kernel_runs: int = 0
    """Runs of the FIKIT kernel profile kept for it in the state database (0: none yet)."""
    kernel_fetching: bool = False
    generative: bool = False
    """A generative function (a built-in causal LM, or a step-wise handler): its gateway route
    takes prompts (``gateway.streams``)."""


__all__ = ["AgentRef", "ControllerConfig", "Device", "FunctionState", "LiveInstance"]
