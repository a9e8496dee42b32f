"""What a ready instance's report does at the gateway: connect to it, and keep what its handler
declares.

Who calls it: ``Controller.apply`` on a ``ReportedReady`` observation (``control.observe``),
every time a node agent reports the instance ready, so ``connect_ready`` must do nothing for an
instance already connected in the same incarnation; after a restart in place (a new
incarnation) it connects again. Nothing here knows the controller.
"""

from __future__ import annotations

from typing import Any

from gshare.runtime.control.observe import ReportedReady
from gshare.runtime.control.records import FunctionState, LiveInstance
from gshare.runtime.control.state import StateStore
from gshare.runtime.gateway.router import Gateway
from gshare.runtime.messages import LiveState


async def connect_ready(gateway: Gateway, inst: LiveInstance, ready: ReportedReady) -> None:
    """Connect the gateway to a ready instance (again, after a restart in place); an instance
    draining meanwhile is drained at the gateway too."""
    iid = inst.instance_id
    if inst.incarnation == ready.incarnation and gateway.is_connected(inst.route, iid):
        return
    tcp = (ready.node_ip, inst.tcp_port) if inst.tcp_port and not ready.local else None
    await gateway.instance_ready(
        inst.route,
        iid,
        uds_path=inst.uds_path if ready.local else None,
        tcp=tcp,
        max_batch=inst.config.batch,
        secret=inst.channel_secret,
    )
    if gateway.is_connected(inst.route, iid):
        inst.incarnation = ready.incarnation
        if inst.state is LiveState.DRAINING:
            gateway.drain(inst.route, iid)


def learn_inputs(
    state: StateStore, gateway: Gateway, fs: FunctionState, inputs: list[dict[str, Any]]
) -> None:
    """The handler's OIP inputs, first reported by a ready instance: kept on the function, in
    the state database and on the gateway's route."""
    fs.inputs = inputs
    io = {"inputs": inputs, "outputs": fs.outputs, "generative": fs.generative}
    state.set_function_io(fs.spec.name, io)
    r = gateway.routes.get(fs.spec.name)
    if r is not None:
        r.inputs = inputs


__all__ = ["connect_ready", "learn_inputs"]
