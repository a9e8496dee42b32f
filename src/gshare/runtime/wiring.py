"""The one place that builds the objects of the server process and wires them together.

Who calls it: ``runtime.server`` (``run_server``), once per ``gshare serve``, whatever the
cluster backend (embedded or Ray): the backend only decides how node agents start and what
the gateway's node is called. Nothing else constructs these objects in production; tests that
need one of them alone build it directly.

What it builds, in order (each needs the ones before)::

    Metrics            the Prometheus series of /metrics           (runtime.metrics)
    Gateway            routes, queues, connections to instances   (gateway.router)
    Controller         the control loop over the node agents      (control.loop)
    LiveProfiler       gshare profile's jobs, on the controller   (control.profiler)
    StageScheduler     the live workflow scheduler, or None       (gateway.stages)
    ControlApi         /system/... on the controller              (control.api)
    OipService         KServe v2 / Triton, shared by HTTP & gRPC  (gateway.oip_service)

and ``http_app`` puts the HTTP app around them (``gateway.app.build_app``) with the server's
lifespan. Agents are added to the controller later, by the backend (``Controller.add_agent``).

What must hold: the gateway, the controller and the stage scheduler record into one
``Metrics``; the gateway, the control API and the gRPC server share one ``OipService`` (one
set of inference statistics); the stage scheduler acts on the same controller the control API
does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gshare.policy.workflow.esg import make_share_policy
from gshare.runtime.control.api import ControlApi
from gshare.runtime.control.loop import Controller
from gshare.runtime.control.profiler import LiveProfiler
from gshare.runtime.control.records import ControllerConfig
from gshare.runtime.control.stage_host import ControllerStageHost
from gshare.runtime.gateway.app import build_app
from gshare.runtime.gateway.oip_service import OipService
from gshare.runtime.gateway.router import Gateway
from gshare.runtime.gateway.shm import SharedMemoryRegistry
from gshare.runtime.gateway.stages import WORKFLOW_POLICY_NAMES, PolicyFactory, StageScheduler
from gshare.runtime.metrics import Metrics

if TYPE_CHECKING:
    from gshare.policy.workflow.schedulers import WorkflowPolicy
    from gshare.runtime.control.state import StateStore
    from gshare.runtime.options import ServeOptions
    from gshare.workflows.shares import SharePerf


@dataclass
class ServerObjects:
    """The server process's objects (module doc), wired."""

    gateway: Gateway
    controller: Controller
    profiler: LiveProfiler
    stage_scheduler: StageScheduler | None
    control_api: ControlApi
    oip: OipService


def stage_scheduler(
    controller: Controller, gateway: Gateway, name: str, factory: PolicyFactory | None = None
) -> StageScheduler | None:
    """The live workflow scheduler ``name`` (``--workflow-policy``) on ``controller`` and its
    ``gateway``; None for
    ``direct``. ``factory`` builds its policy from a ``SharePerf`` when the name alone cannot
    (Aquatope's optimiser, from the CLI). An unknown name is a ``ValueError`` naming the known
    ones."""
    if name == "direct":
        return None
    if name not in WORKFLOW_POLICY_NAMES:
        raise ValueError(
            f"unknown workflow policy {name!r} (known: {', '.join(WORKFLOW_POLICY_NAMES)}, direct)"
        )
    if factory is None:

        def factory(perf: SharePerf) -> WorkflowPolicy:
            return make_share_policy(name, perf=perf, seed=0)

    return StageScheduler(gateway, ControllerStageHost(controller, gateway), name, factory)


def build_server_objects(
    opts: ServeOptions,
    store: StateStore,
    *,
    gateway_node_id: str,
    extra_sys_path: tuple[str, ...] = (),
) -> ServerObjects:
    """Build and wire the server's objects for ``opts`` (module doc). ``gateway_node_id``: the
    node the gateway runs on (its instances are reached over Unix sockets, the others' over
    TCP); ``extra_sys_path``: folders for user handler modules (the server's working
    directory)."""
    metrics = Metrics()
    gateway = Gateway(
        metrics=metrics,
        max_body_bytes=int(opts.max_body_mb * (1 << 20)),
        max_latency_slo_factor=opts.max_wait_slo_factor,
        request_timeout_s=opts.request_timeout_s,
        node_id=gateway_node_id,
        lane_mb=opts.lane_mb,
    )
    controller = Controller(
        store,
        gateway,
        ControllerConfig(
            period_s=opts.period_s,
            autoscaler=opts.autoscaler,
            placer=opts.placer,
            drain_timeout_s=opts.request_timeout_s,  # never cut an accepted request short
            workflow_policy=opts.workflow_policy,
            workflow_policy_factory=opts.workflow_policy_factory,
        ),
        metrics=metrics,
        gateway_node_id=gateway_node_id,
        extra_sys_path=extra_sys_path,
    )
    profiler = LiveProfiler(controller, gateway)
    scheduler = stage_scheduler(
        controller, gateway, opts.workflow_policy, opts.workflow_policy_factory
    )
    control_api = ControlApi(controller, gateway, scheduler, profiler)
    oip = OipService(gateway, control_api, shm=SharedMemoryRegistry(enabled=opts.shared_memory))
    return ServerObjects(gateway, controller, profiler, scheduler, control_api, oip)


def http_app(objs: ServerObjects, token: str, lifespan: Any) -> Any:
    """The server's ASGI app over ``objs`` (``gateway.app.build_app``), with ``lifespan``."""
    return build_app(objs.gateway, objs.control_api, token, lifespan=lifespan, oip=objs.oip)


__all__ = ["ServerObjects", "build_server_objects", "http_app", "stage_scheduler"]
