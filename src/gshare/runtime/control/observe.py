"""Observation: what the node agents report, read into typed observations.

Who calls it: ``Controller.observe`` (every reconcile period, and every ``starting_poll_s``
while an instance starts: how often is decided here too). ``poll_agents`` asks each live agent
for its ``NodeStatus``; ``read_node_status`` turns one report, against the controller's records
of that node's instances, into a list of ``Observation`` in the order they must be applied; the
controller applies them (``Controller.apply``): instance states (a ready instance is connected
to the gateway; a crash and restart is counted and logged; a failed start releases the instance,
backs the function off and, with no other instance, fails its queued requests with the start
error), the token servers' ``total_used_ms`` (each instance's achieved share over the period),
the memory reports (``control.memory``) and FIKIT's counters and kernel profile.

What must hold: ``read_node_status`` reads the records and changes nothing (its tests feed it
records and a report); ``record_*`` change one record (and count into the metrics they are
handed) and nothing else. Nothing here knows the controller or the gateway.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gshare.runtime.control.records import AgentRef, FunctionState, LiveInstance
from gshare.runtime.messages import (
    FikitUsage,
    InstanceState,
    LiveState,
    MemoryUsage,
    NodeStatus,
)
from gshare.runtime.metrics import Metrics

# -- when to poll ------------------------------------------------------------------------------

STARTING_POLL_S = 0.25
"""Longest agent poll interval while an instance is starting (between reconcile periods)."""
STARTING_POLL_MIN_S = 0.02
"""Shortest one: an instance asked to start ``age`` seconds ago is polled for every
``age / 8`` within these bounds (``starting_poll_s``), so a fork ready in 150 ms is seen
within ~20 ms, and a model that loads for a minute costs four polls a second."""


def starting_poll_s(age_s: float) -> float:
    """The agent poll interval while the youngest starting instance is ``age_s`` old."""
    return min(STARTING_POLL_S, max(STARTING_POLL_MIN_S, age_s / 8.0))


# -- the observations --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reported:
    """The instance is in its node's report: its process, cores, memory and addresses."""

    instance_id: str
    pid: int | None
    rss_mb: float
    cores: list[int] | None
    uds_path: str | None
    tcp_port: int | None


@dataclass(frozen=True, slots=True)
class MemoryReported:
    """Its memory limit and measured peaks changed hands (an instance with a memory plan)."""

    instance_id: str
    usage: MemoryUsage


@dataclass(frozen=True, slots=True)
class FikitReported:
    """Its FIKIT phase and counters (an instance that shares its device by FIKIT)."""

    instance_id: str
    usage: FikitUsage


@dataclass(frozen=True, slots=True)
class Restarted:
    """Its node agent restarted it in place: ``restarts`` in all since it was started (more than
    the records say); ``last_exit`` says how the last process ended."""

    instance_id: str
    restarts: int
    last_exit: str | None


@dataclass(frozen=True, slots=True)
class ReportedReady:
    """It serves: connect the gateway to ``incarnation`` (over its Unix socket when
    ``local``, else over TCP at ``node_ip``); ``inputs``: the handler's OIP inputs."""

    instance_id: str
    incarnation: int
    node_ip: str
    local: bool
    inputs: list[dict[str, Any]] | None


@dataclass(frozen=True, slots=True)
class ReportedRestarting:
    """It was ready and its agent is starting it again (a crash, restarted in place)."""

    instance_id: str


@dataclass(frozen=True, slots=True)
class ReportedFailed:
    """It failed to start (or to restart) with ``error``."""

    instance_id: str
    error: str


@dataclass(frozen=True, slots=True)
class TokensUsed:
    """Its token client's busy time so far, per the agent's clock ``now_s``."""

    instance_id: str
    total_used_ms: float
    now_s: float
    total_held_ms: float = 0.0
    """Time its released tokens were held, grant to release (``messages.TokenUsage``)."""
    tokens: int = 0
    """Tokens it released."""


@dataclass(frozen=True, slots=True)
class Vanished:
    """Its agent has not reported it for longer than ``agent_timeout_s`` since it was asked to
    start."""

    instance_id: str


Observation = (
    Reported
    | MemoryReported
    | FikitReported
    | Restarted
    | ReportedReady
    | ReportedRestarting
    | ReportedFailed
    | TokensUsed
    | Vanished
)


# -- reading -----------------------------------------------------------------------------------


async def poll_agents(
    agents: Sequence[AgentRef],
) -> list[tuple[AgentRef, NodeStatus | BaseException]]:
    """Each agent's status, or what it raised (``AgentGone``: its process is gone), in order."""
    results = await asyncio.gather(*(a.handle.status() for a in agents), return_exceptions=True)
    return list(zip(agents, results, strict=True))


def read_node_status(
    status: NodeStatus,
    instances: Iterable[LiveInstance],
    *,
    now_s: float,
    agent_timeout_s: float,
    local: bool,
) -> list[Observation]:
    """The observations of one node's report ``status`` about ``instances`` (the controller's
    records of the instances on that node), in the order they are to be applied; ``local``: the
    node is the gateway's. Pure: it reads the records and changes nothing."""
    by_id = {s.instance_id: s for s in status.instances}
    out: list[Observation] = []
    for inst in instances:
        iid = inst.instance_id
        st = by_id.get(iid)
        if st is None:
            if now_s - inst.created_s > agent_timeout_s:
                out.append(Vanished(iid))
            continue
        out.append(Reported(iid, st.pid, st.rss_mb, st.cores, st.uds_path, st.tcp_port))
        if st.memory is not None and not inst.profiling:
            out.append(MemoryReported(iid, st.memory))
        if st.fikit is not None and not inst.profiling:
            out.append(FikitReported(iid, st.fikit))
        if st.restarts > inst.restarts:
            out.append(Restarted(iid, st.restarts, st.last_exit))
        if st.state is InstanceState.READY:
            out.append(ReportedReady(iid, st.incarnation, status.node_ip, local, st.inputs))
        elif st.state is InstanceState.STARTING and inst.state is LiveState.READY:
            out.append(ReportedRestarting(iid))
        elif st.state is InstanceState.FAILED:
            out.append(ReportedFailed(iid, st.error or "unknown error"))
            continue
        tok = status.tokens.get(iid)
        if tok is not None:
            out.append(
                TokensUsed(iid, tok.total_used_ms, status.now_s, tok.total_held_ms, tok.tokens)
            )
    return out


# -- recording into one record -----------------------------------------------------------------


def record_tokens(inst: LiveInstance, used: TokensUsed) -> None:
    """The achieved share over the time since its last token report (busy ms / elapsed ms),
    and the device time its tokens released since then were held idle, per token (held beyond
    the busy time charged; the protocol's hand-overs)."""
    if inst.used_ms is not None and inst.used_t is not None and used.now_s > inst.used_t:
        elapsed_ms = (used.now_s - inst.used_t) * 1000.0
        inst.achieved_share = max(0.0, (used.total_used_ms - inst.used_ms) / elapsed_ms)
    if inst.token_held_ms is not None and inst.used_ms is not None:
        n = used.tokens - inst.tokens
        if n > 0:
            idle_ms = (used.total_held_ms - inst.token_held_ms) - (
                used.total_used_ms - inst.used_ms
            )
            inst.token_idle_hold_ms = max(0.0, idle_ms / n)
    inst.used_ms, inst.used_t = used.total_used_ms, used.now_s
    inst.token_held_ms, inst.tokens = used.total_held_ms, used.tokens


def record_memory(
    fs: FunctionState, inst: LiveInstance, usage: MemoryUsage, metrics: Metrics
) -> None:
    """An instance's memory report: its reservation as it changes, and the counters."""
    grows, steps, refusals = fs.memory.observe(inst.instance_id, usage)
    inst.share = replace(inst.share, mem_mb=usage.limit_mb)
    inst.memory = usage
    if grows:
        metrics.memory_kills_avoided.labels(inst.function).inc(grows)
    if steps:
        metrics.memory_steps.labels(inst.function).inc(steps)
    if refusals:
        metrics.memory_refusals.labels(inst.function).inc(refusals)


def record_fikit(inst: LiveInstance, usage: FikitUsage, metrics: Metrics) -> None:
    """An instance's FIKIT report: the counters' growth into the metrics."""
    prev = inst.fikit
    inst.fikit = usage
    for counter, new, old in (
        (metrics.fikit_preemptions, usage.preemptions, prev.preemptions if prev else 0),
        (metrics.fikit_fills, usage.fills, prev.fills if prev else 0),
        (metrics.fikit_measure, usage.measure_s, prev.measure_s if prev else 0.0),
    ):
        delta = new - old if new >= old else new  # below: the slot was re-registered
        if delta > 0:
            counter.labels(inst.function).inc(delta)


def kernel_profile_wanted(fs: FunctionState, inst: LiveInstance, usage: FikitUsage) -> bool:
    """Whether to fetch the instance's kernel profile now: the function's first instance in
    FIKIT's sharing phase, with no profile kept and no fetch under way."""
    return (
        usage.phase == "sharing"
        and fs.kernel_runs == 0
        and not fs.kernel_fetching
        and inst.state is LiveState.READY
    )


__all__ = [
    "FikitReported",
    "MemoryReported",
    "Observation",
    "Reported",
    "ReportedFailed",
    "ReportedReady",
    "ReportedRestarting",
    "Restarted",
    "TokensUsed",
    "Vanished",
    "kernel_profile_wanted",
    "poll_agents",
    "read_node_status",
    "record_fikit",
    "record_memory",
    "record_tokens",
    "starting_poll_s",
]
