"""``runtime.wiring``: the server process's objects, built in one place for both cluster
backends — the control API runs workflows on the stage scheduler built for the same
controller, the OIP service is the control API's, and an unknown workflow policy is an error
naming the known ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from gshare.runtime.control.state import StateStore
from gshare.runtime.server import ServeOptions
from gshare.runtime.wiring import build_server_objects, stage_scheduler


def test_the_objects_share_one_controller_and_one_scheduler(tmp_path: Path) -> None:
    store = StateStore.open(tmp_path / "state")
    try:
        objs = build_server_objects(
            ServeOptions(workflow_policy="esg"), store, gateway_node_id="local-node"
        )
        assert objs.controller.gateway is objs.gateway
        assert objs.controller.gateway_node_id == "local-node"
        assert objs.control_api.c is objs.controller
        assert objs.control_api.profiler is objs.profiler
        assert objs.profiler.controller is objs.controller
        assert objs.controller.metrics is objs.gateway.metrics  # one registry for /metrics
        assert objs.control_api.gateway is objs.gateway and objs.profiler.gateway is objs.gateway
        assert objs.stage_scheduler is not None
        assert objs.control_api.workflows.scheduler is objs.stage_scheduler
        assert objs.oip.gw is objs.gateway and objs.oip.control is objs.control_api
        direct = build_server_objects(
            ServeOptions(workflow_policy="direct"), store, gateway_node_id="n"
        )
        assert direct.stage_scheduler is None and direct.control_api.workflows.scheduler is None
        with pytest.raises(ValueError, match=r"unknown workflow policy 'nope' \(known: esg"):
            stage_scheduler(objs.controller, objs.gateway, "nope")
    finally:
        store.close()
