"""The launch description of a function instance: everything it needs to start, as plain data.

Who calls it: the controller builds an ``InstanceLaunch`` (``control.loop``), the node agent
completes it (socket paths, token credential, model key) and hands it to the instance process
(``node.launcher``'s forked template, or the Ray actor ``instance.server.InstanceActor``) as a
dict (``launch_to_dict``); ``instance.server.InstanceServer`` reads it during its cold start.

What must hold: the dataclass stays plain, picklable data (no handles, no callables), since it
crosses process boundaries as ``asdict`` output and is rebuilt there with ``InstanceLaunch(**d)``;
this module imports nothing heavy, so the controller and the agent can use it without the
instance runtime.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict


@dataclass(frozen=True)
class InstanceLaunch:
    """Everything an instance needs to start; built by the controller, completed by the agent
    (socket paths, model key), pickled to the actor. Plain data."""

    instance_id: str
    function: str
    spec: dict[str, object]
    """The function spec (``FunctionSpec.model_dump(mode="json")``)."""
    sm_pct: float
    quota_request: float
    quota_limit: float
    mem_mb: float
    """The memory limit the instance starts with, MiB (0: none): a fixed limit, or the
    ``init`` of resource-centric sizing when ``mem_step_mb`` > 0."""
    priority: int
    max_batch: int
    max_wait_ms: float
    device: str = "cpu"
    """``cpu`` or ``cuda:N``."""
    device_index: int = 0
    sm_offset_pct: float = 0.0
    """Start of the instance's SM band (the placement rectangle's y)."""
    token_socket: str = ""
    token_secret: str = ""
    """This instance's credential on the token socket (the agent draws it; never in the
    environment, so other processes of the user cannot read it from ``/proc``)."""
    uds_path: str = ""
    listen_tcp: bool = False
    tcp_host: str = "0.0.0.0"
    """The address the TCP listener binds (the node's own address, from the controller)."""
    channel_secret: str = ""
    """What a TCP connection must present first (``OP_AUTH``); set whenever ``listen_tcp``."""
    """Also listen on TCP (the gateway runs on another node)."""
    model_key: str | None = None
    """Key of the shared weights in the node's ``ModelStore`` (None: the handler has none)."""
    store_root: str | None = None
    incarnation: int = 0
    """0 for the first start, +1 for every restart by the agent."""
    predict_timeout_s: float = 0.0
    """Longest one ``predict`` may run before the instance fails its requests and exits (the
    agent restarts it); 0: no limit. The spec's ``predict_timeout_s``, else the server's
    request time-out (the controller fills it in)."""
    mem_step_mb: float = 0.0
    """Resource-centric sizing (``instance.memory``): grow the limit by this much when a
    request needs more (0: the limit is fixed)."""
    mem_max_mb: float = 0.0
    """... up to this much (0: as much as the device's memory ledger grants)."""
    extra_sys_path: tuple[str, ...] = ()
    """Folders to put on ``sys.path`` before importing a ``handler: module:Class``."""
    env: dict[str, str] = field(default_factory=dict)
    kernel_profile: dict[str, object] | None = None
    """The function's FIKIT kernel profile from the state database (``KernelProfile.to_records``;
    None: the instance measures its first batches, ``instance.fikit``)."""


class InstanceInfo(TypedDict, total=False):
    """What an instance reports once it is ready (``InstanceServer.info``; JSON in its
    ``.ready`` file); the agent's copy is empty until then."""

    pid: int
    uds_path: str
    tcp_port: int | None
    cores: list[int]
    inputs: list[dict[str, Any]]
    """``oip.header.input_spec_dicts`` of the handler's ``input_spec()`` (OIP metadata)."""
    incarnation: int


def launch_to_dict(launch: InstanceLaunch) -> dict[str, Any]:
    """The launch as ``InstanceLaunch(**d)`` takes it back (its values are its fields' types)."""
    return asdict(launch)


__all__ = ["InstanceInfo", "InstanceLaunch", "launch_to_dict"]
