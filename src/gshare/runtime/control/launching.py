"""The message that starts one instance: an ``InstanceLaunch`` from the controller's records.

Who calls it: ``Controller.start_instance``, after the placer bound the instance to a device
and rectangle (or the profiler gave it one). What must hold: the launch carries the share as
placed (SM %, quotas, the starting memory limit), the memory plan's step and maximum, the
device on its node, a fresh channel secret that every gateway connection must prove (Unix
socket or TCP), and a TCP listener only for an instance on another node than the gateway's.
"""

from __future__ import annotations

import secrets

from gshare.policy import autoscale
from gshare.resources import GpuShare
from gshare.runtime.control.memory import MemoryPlan
from gshare.runtime.control.records import Device
from gshare.runtime.instance.launch import InstanceLaunch
from gshare.spec import FunctionSpec


def instance_launch(
    instance_id: str,
    spec: FunctionSpec,
    spec_dump: dict[str, object],
    cfg: autoscale.ScaleConfig,
    share: GpuShare,
    mem: MemoryPlan,
    device: Device,
    sm_offset_pct: float,
    *,
    request_timeout_s: float,
    remote: bool,
    tcp_host: str,
    extra_sys_path: tuple[str, ...],
    kernel_profile: dict[str, object] | None,
) -> InstanceLaunch:
    """The launch of ``instance_id`` of ``spec`` (``spec_dump``: its JSON form) with ``cfg``
    and ``share`` on ``device`` at ``sm_offset_pct`` (clamped to 0..100); ``remote``: the
    device's node is not the gateway's (the instance listens on ``tcp_host``);
    ``request_timeout_s``: the gateway's, the predict timeout when the spec sets none."""
    return InstanceLaunch(
        instance_id=instance_id,
        function=spec.name,
        spec=spec_dump,
        sm_pct=share.sm_pct,
        quota_request=share.quota_request,
        quota_limit=share.quota_limit,
        mem_mb=share.mem_mb,
        mem_step_mb=mem.step_mb,
        mem_max_mb=mem.max_mb,
        predict_timeout_s=float(spec.predict_timeout_s or request_timeout_s),
        priority=spec.priority,
        max_batch=cfg.batch,
        max_wait_ms=spec.batching.max_wait_ms,
        device=device.name,
        device_index=device.local_index,
        sm_offset_pct=min(100.0, max(0.0, sm_offset_pct)),
        listen_tcp=remote,
        tcp_host=tcp_host,
        channel_secret=secrets.token_hex(16),  # every connection proves it, UDS or TCP
        extra_sys_path=extra_sys_path,
        kernel_profile=kernel_profile,
    )


__all__ = ["instance_launch"]
