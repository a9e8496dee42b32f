"""The controller's side of the live workflow scheduler (``gateway.stages.StageHost``).

Who calls it: ``StageScheduler`` (built by ``control.api.ControlApi``), on the event loop, for
the devices (its invokers), the ready instances of the stage functions, each function's share
model, and to change an instance's token quota for a task. What holds: only ready, connected,
non-profiling instances are offered; a function's SM partition is that of its instances (the
first one's, when an update left several; before any, the spec's or the default share's).
Its latencies come from, in this order:

1. its live profile (``gshare profile``) when one covers that partition: the scheduler then
   searches batches x quotas;
2. on a CUDA device, the shipped V100 table when the spec's built-in model is in it (as
   ``configs.configs_for`` does; never run on a GPU);
3. the busy time its instances measured (``gateway.stages.measured_table``;
   ``configs.DEFAULT_BUSY_MS_PER_REQUEST`` before any), and then only batches at the
   instance's own quota: how a quota below it would slow a burst that overruns the token
   window is what a profile measures, and a guess there made ESG starve a fixed pool (the
   demo's swin2sr at 25 %: 2.4 s measured against 0.8 s estimated).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gshare.profiles import ProfileError, ProfileTable
from gshare.runtime.control.configs import DEFAULT_BUSY_MS_PER_REQUEST, DEFAULT_SHARE
from gshare.runtime.gateway.router import Gateway
from gshare.runtime.gateway.stages import StageFunction, StageInstance, measured_table
from gshare.runtime.messages import LiveState
from gshare.workflows.shares import QUOTA_STEP_PCT, ShareFunction, quotas_of

if TYPE_CHECKING:
    from gshare.runtime.control.loop import Controller
    from gshare.runtime.control.records import LiveInstance

BATCHES = (1, 2, 4, 8, 16, 32)
"""Batches offered to the scheduler, up to the function's ``batching.max_batch``."""
TABLE_TTL_S = 5.0
"""How long a function's live profile is read from the state database once."""


class ControllerStageHost:
    """``StageHost`` over one ``Controller`` (module doc)."""

    def __init__(self, controller: Controller, gateway: Gateway) -> None:
        self.c = controller
        self.gateway = gateway
        self._tables: dict[str, tuple[float, ProfileTable | None]] = {}

    def device_count(self) -> int:
        return len(self.c.devices)

    def _ready(self, function: str | None = None) -> list[LiveInstance]:
        gw = self.gateway
        return [
            i
            for i in self.c.instances.values()
            if i.state is LiveState.READY
            and not i.profiling
            and (function is None or i.function == function)
            and gw.is_connected(i.function, i.instance_id)
        ]

    def instance_exists(self, instance_id: str) -> bool:
        return instance_id in self.c.instances

    def stage_instances(self, function: str) -> Sequence[StageInstance]:
        return [
            StageInstance(
                i.instance_id,
                i.function,
                i.device.index,
                i.share.sm_pct,
                i.share.quota_request * 100.0,
            )
            for i in self._ready(function)
        ]

    def _table(self, function: str) -> ProfileTable | None:
        now = self.gateway.clock()
        hit = self._tables.get(function)
        if hit is None or now - hit[0] > TABLE_TTL_S:
            hit = self._tables[function] = (now, self.c.state.profile_table(function))
        return hit[1]

    def stage_function(self, function: str) -> StageFunction | None:
        fs = self.c.functions.get(function)
        if fs is None:
            return None
        ready = self._ready(function)
        if ready:
            sm, quota = ready[0].share.sm_pct, ready[0].share.quota_request
        elif fs.spec.resources != "auto":
            sm, quota = fs.spec.resources.sm_pct, fs.spec.resources.quota_request
        else:
            sm, quota = DEFAULT_SHARE.sm_pct, DEFAULT_SHARE.quota_request
        max_batch = fs.spec.batching.max_batch
        batches = tuple(b for b in BATCHES if b <= max_batch) or (1,)
        table = self._table(function)
        if table is not None:
            with contextlib.suppress(ProfileError):
                table.latency_ms(function, sm, 100.0, 1)
                share = ShareFunction(function, function, sm, batches, quotas_of(table, function))
                return StageFunction(share, table, "live profile")
        model = fs.spec.model
        if (
            model
            and fs.spec.device != "cpu"
            and any(d.name.startswith("cuda") for d in self.c.devices)
        ):
            v100 = ProfileTable.shipped_v100()  # as configs.configs_for: only for a GPU
            if v100.has_model(model):
                with contextlib.suppress(ProfileError):
                    v100.latency_ms(model, sm, 100.0, 1)
                    share = ShareFunction(function, model, sm, batches, quotas_of(v100, model))
                    return StageFunction(share, v100, "shipped V100 table")
        route = self.gateway.routes.get(function)
        per_item = (
            route.exec_ms_per_item if route is not None else None
        ) or DEFAULT_BUSY_MS_PER_REQUEST
        per_item = float(f"{per_item:.2g}")  # a new model only when the estimate really moved
        q_pct = round(quota * 100.0 / QUOTA_STEP_PCT) * QUOTA_STEP_PCT
        q_pct = min(100.0, max(QUOTA_STEP_PCT, q_pct))
        share = ShareFunction(function, function, sm, batches, (q_pct,))
        return StageFunction(
            share,
            measured_table(function, share, per_item),
            f"measured busy time {per_item:g} ms/item at quota {q_pct:g} %",
        )

    async def set_quota(self, instance_id: str, quota_pct: float) -> None:
        """The task's quota becomes the instance's guaranteed share (``quota_request``, what
        the task is billed for); its limit stays the larger of that and the instance's own
        ``quota_limit``, so it may still use idle time as its spec allows (setting the limit
        to the quota too capped every task: measured, the tight mlp chain met 22 % of its SLOs
        under ESG against 83 % under FaST-GShare, which never changed a quota)."""
        inst = self.c.instances.get(instance_id)
        if inst is None:
            raise RuntimeError(f"instance {instance_id} is gone")
        agent = self.c.agents[inst.device.node_id]
        q = quota_pct / 100.0
        await agent.handle.set_share(instance_id, q, max(q, inst.share.quota_limit))
