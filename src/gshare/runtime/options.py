"""What ``gshare serve`` is asked to run: the server's options.

Who uses them: the CLI (``gshare serve``) fills a ``ServeOptions``; ``runtime.server`` runs a
server with it, ``runtime.wiring`` builds the server's objects from it and the cluster backends
(``runtime.backends``) start the node agents it asks for. Plain data, no behaviour: a module of
its own so that none of them needs another to name it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gshare.runtime.instance.lanes import DEFAULT_REQUEST_LANE_MB

if TYPE_CHECKING:
    from gshare.runtime.gateway.stages import PolicyFactory

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


@dataclass
class ServeOptions:
    address: str | None = None
    """Join this Ray cluster (``RayBackend``); None: one machine."""
    cluster: str | None = None
    """``local`` (embedded, no Ray), ``ray`` (a local Ray instance, on purpose), or None:
    ``ray`` when ``address`` or ``launcher="ray"`` asks for it, else ``local``
    (``cluster_backend``)."""
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    state: str | None = None
    max_body_mb: float = 16.0
    request_timeout_s: float = 120.0
    placer: str = "mra"
    autoscaler: str = "gshare-burst"  # policy.autoscale.DEFAULT_AUTOSCALER
    period_s: float = 1.0
    num_cpus: int | None = None
    object_store_mb: int = 256
    log_level: str = "info"
    launcher: str = "fork"
    """How instance processes start (``launcher.LAUNCHERS``): forked from a pre-imported
    template per node, or one Ray actor each."""
    device_mem_mb: float | None = None
    """Memory of each node's CPU device for instances' memory limits (None: 90 % of RAM)."""
    priority_sharing: str = "fikit"
    """How a device combines functions of different priority (``node.agent.PRIORITY_SHARING``):
    ``fikit`` (FIKIT across priority classes, tokens within one) or ``tokens``."""
    read_timeout_s: float = 30.0
    """Longest a request's headers and body may take to arrive (``gateway.http_protocol``)."""
    max_connections: int = 4096
    """Most HTTP connections open at once; more are closed at once (``gateway.http_protocol``)."""
    max_connections_per_client: int | None = None
    """Most of them from one client address (None: a quarter of ``max_connections``)."""
    write_timeout_s: float = 30.0
    """Longest a response may wait for its client to read it (then the connection is cut)."""
    max_wait_slo_factor: float = 0.75
    """A request of a function with an SLO is shed with 429 when its predicted latency exceeds
    this many SLOs (``policy.admission``; 0: never shed before the queue cap)."""
    workflow_policy: str = "esg"
    """The live workflow scheduler (``gateway.stages``): esg, fast-gshare, infless, orion,
    aquatope, or direct (no scheduler)."""
    workflow_policy_factory: PolicyFactory | None = None
    """Its factory when the name alone cannot build it (Aquatope's optimiser, from the CLI)."""
    shared_memory: bool = True
    """Serve the OIP system shared-memory extension (``gateway.shm``); False: registering a
    region is a 400 saying it is turned off."""
    lane_mb: int = DEFAULT_REQUEST_LANE_MB
    """Each local instance connection's shared-memory request lane, MiB (its response lane:
    half; ``instance.lanes``); 0: every payload through the socket."""
    grpc_port: int | None = None
    """Also serve the KServe v2 / Triton gRPC API (``gateway.grpc_server``) on this port of
    ``host`` (0: any free port, written to ``server.json`` as ``grpc``); None: no gRPC."""


__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "ServeOptions"]
