"""Config sources: the candidate configurations of a live function and the share of each.

Who calls it: the controller (``runtime.control.loop``), when a function is deployed or
updated, after ``gshare profile`` wrote a profile, and every period (an unprofiled function's
throughput estimate follows what its instances measure). The result is what the autoscaler
chooses from (``policy.control.control_step``).

Sources, in order of preference (``ConfigSource``):

* ``resources: auto`` and the function was profiled (``gshare profile``): FaST-GShare's
  ``candidate_configs`` over the live profile table (every measured sm × quota × batch up to
  ``max_batch``, filtered by ``slo_ms``; all of them when none meets it);
* ``resources: auto`` on a CUDA node, built-in model present in the shipped V100 table:
  ``candidate_configs`` over that table;
* ``resources: auto`` otherwise: ``DEFAULT_SHARE``, one config;
* explicit ``resources``: that one config.

A config's throughput comes from the profile table when the function was profiled at that
point; otherwise from what the instances measure (the gateway's EWMA of busy time per request):
``quota_request × 1000 / busy_ms_per_request``, and before any measurement from
``DEFAULT_BUSY_MS_PER_REQUEST``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from gshare.policy import autoscale
from gshare.policy.autoscale.measured import config_from_busy
from gshare.profiles import ProfileError, ProfileTable
from gshare.resources import GpuShare
from gshare.runtime.messages import ConfigSource
from gshare.spec import FunctionSpec

DEFAULT_SHARE = GpuShare(sm_pct=50.0, quota_request=0.5, quota_limit=1.0)
"""The share of a ``resources: auto`` function that has no profile (CPU nodes, or a model not
in the shipped table): half the cores (SMs), half of every window guaranteed, and idle time up
to the whole window (elastic). ``gshare profile NAME`` replaces it with measured configs."""
DEFAULT_BUSY_MS_PER_REQUEST = 20.0
"""Busy time per request assumed before an unprofiled function has run (then measured)."""
NO_SLO_MS = 3_600_000.0
"""SLO used to filter candidate configs of a function without ``slo_ms`` (any config)."""


@dataclass(frozen=True)
class FunctionConfigs:
    """A function's candidate configs and where they come from."""

    configs: list[autoscale.ScaleConfig]
    source: ConfigSource
    note: str = ""
    """Detail shown after the source (``12 configs meet the SLO``, the SLO error)."""

    def describe(self) -> str:
        return f"{self.source.value} ({self.note})" if self.note else self.source.value


def configs_for(
    spec: FunctionSpec,
    table: ProfileTable | None,
    *,
    has_cuda: bool,
    busy_ms_per_request: float | None,
) -> FunctionConfigs:
    """The candidate configs of ``spec`` (module doc). ``table`` is its live profile (None when
    not profiled); ``busy_ms_per_request`` what its instances measured (None before any)."""
    max_batch = spec.batching.max_batch
    slo = spec.slo_ms or NO_SLO_MS
    wait = spec.batching.max_wait_ms
    name = spec.name
    if spec.resources == "auto":
        if table is not None:
            bs = [b for b in table.batches(name) if b <= max_batch] or [min(table.batches(name))]
            sms = sorted({p.sm_pct for p in table.measured(name)})
            qs = sorted({p.quota_pct for p in table.measured(name)})
            try:
                configs = autoscale.candidate_configs(
                    table, name, slo, sm_values=sms, quota_values=qs, batches=bs, max_wait_ms=wait
                )
                return FunctionConfigs(
                    configs, ConfigSource.LIVE_PROFILE, f"{len(configs)} configs meet the SLO"
                )
            except autoscale.AutoscaleError as e:
                configs = autoscale.candidate_configs(
                    table,
                    name,
                    NO_SLO_MS,
                    sm_values=sms,
                    quota_values=qs,
                    batches=bs,
                    max_wait_ms=wait,
                )
                return FunctionConfigs(configs, ConfigSource.LIVE_PROFILE_SLO_UNMET, str(e))
        if spec.model and has_cuda and spec.device != "cpu":
            v100 = ProfileTable.shipped_v100()
            if v100.has_model(spec.model):
                with contextlib.suppress(autoscale.AutoscaleError, ProfileError):
                    configs = autoscale.candidate_configs(v100, spec.model, slo, max_wait_ms=wait)
                    return FunctionConfigs(configs, ConfigSource.SHIPPED_V100)
        share, source, note = DEFAULT_SHARE, ConfigSource.DEFAULT_SHARE, "not profiled"
    else:
        share, source, note = spec.resources.share(), ConfigSource.SPEC, ""
    cfg = config_at(name, share, max_batch, table, busy_ms_per_request)
    return FunctionConfigs([cfg], source, note)


def config_at(
    name: str,
    share: GpuShare,
    batch: int,
    table: ProfileTable | None,
    busy_ms_per_request: float | None,
) -> autoscale.ScaleConfig:
    """The config of ``share`` at ``batch``, its throughput from the profile or the measured
    busy time (module doc)."""
    q_pct = share.quota_request * 100.0
    if table is not None:
        with contextlib.suppress(ProfileError):
            lat = table.latency_ms(name, share.sm_pct, q_pct, batch)
            return autoscale.ScaleConfig(share.sm_pct, q_pct, batch, batch * 1000.0 / lat, lat)
    per_item = busy_ms_per_request or DEFAULT_BUSY_MS_PER_REQUEST
    return config_from_busy(share.sm_pct, q_pct, batch, per_item)


def share_for(spec: FunctionSpec, cfg: autoscale.ScaleConfig, source: ConfigSource) -> GpuShare:
    """The share an instance of ``spec`` started with ``cfg`` gets: the config's SM % and quota
    request; the limit is the spec's (explicit resources), the default share's (elastic) or the
    request (a profiled config, as FaST-GShare profiles it)."""
    q = cfg.quota_pct / 100.0
    if spec.resources == "auto":
        limit = DEFAULT_SHARE.quota_limit if source is ConfigSource.DEFAULT_SHARE else q
        return GpuShare(cfg.sm_pct, q, max(q, limit), 0.0)
    res = spec.resources
    return GpuShare(cfg.sm_pct, q, max(q, res.quota_limit), res.mem_init_mb)


__all__ = [
    "DEFAULT_BUSY_MS_PER_REQUEST",
    "DEFAULT_SHARE",
    "NO_SLO_MS",
    "FunctionConfigs",
    "config_at",
    "configs_for",
    "share_for",
]
