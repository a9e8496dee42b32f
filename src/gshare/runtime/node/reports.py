"""What a node agent reports: its ``NodeStatus`` built from the instances it keeps, its token
servers' usage and memory ledgers, and each device's FIKIT board.

Who calls it: ``NodeAgent.status`` (``node.agent``), with its lock held over the instances, for
every poll of the controller (``control.observe.poll_agents``). Pure assembly: it reads the
records and the token servers' snapshots and changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from gshare.policy.memory import Reservation
from gshare.runtime.messages import (
    FikitUsage,
    InstanceStatus,
    MemoryUsage,
    NodeStatus,
    TokenUsage,
)
from gshare.runtime.node.supervision import Managed
from gshare.runtime.tokens import TokenServer

Ledger = tuple[float, dict[str, Reservation]]
"""A device's memory ledger: (capacity MiB, reservation per instance)."""


def node_status(
    node_id: str,
    node_ip: str,
    instances: Mapping[str, Managed],
    token_servers: Sequence[TokenServer],
    ledgers: Sequence[Ledger],
    *,
    fikit: bool,
) -> NodeStatus:
    """The node's status: every instance's record, the token usage of every client and each
    device's (capacity, reserved) memory. ``ledgers``: ``memory_snapshot()`` of each token
    server, taken before the caller locked ``instances``; ``fikit``: report the boards'
    counters (``--priority-sharing fikit``)."""
    reports = tuple(
        InstanceStatus(
            instance_id=iid,
            function=m.launch.function,
            state=m.state,
            incarnation=m.launch.incarnation,
            device_index=m.launch.device_index,
            pid=m.info.get("pid"),
            uds_path=m.launch.uds_path,
            tcp_port=m.info.get("tcp_port"),
            inputs=m.info.get("inputs"),
            cores=m.info.get("cores"),
            error=m.error,
            last_exit=m.last_exit,
            restarts=m.total_restarts,
            rss_mb=round(m.rss_mb, 1),
            memory=memory_usage(iid, m, ledgers),
            fikit=fikit_usage(iid, m, token_servers) if fikit else None,
        )
        for iid, m in instances.items()
    )
    tokens: dict[str, TokenUsage] = {}
    for ts in token_servers:
        for cid, v in ts.snapshot().items():
            tokens[cid] = TokenUsage(
                v.total_used_ms,
                v.quota_request,
                v.quota_limit,
                v.sm_pct,
                total_held_ms=v.total_held_ms,
                tokens=v.tokens,
            )
    device_memory = tuple((cap, sum(r.limit_mb for r in held.values())) for cap, held in ledgers)
    return NodeStatus(node_id, node_ip, time.monotonic(), reports, tokens, device_memory)


def fikit_usage(iid: str, m: Managed, token_servers: Sequence[TokenServer]) -> FikitUsage | None:
    """The instance's FIKIT counters from its device's board (None: none there)."""
    idx = m.launch.device_index
    u = token_servers[idx].board_usage(iid) if idx < len(token_servers) else None
    if u is None:
        return None
    return FikitUsage(
        u.phase, u.runs, u.preemptions, u.fills, u.measure_s, u.gaps, round(u.wait_s, 6)
    )


def memory_usage(iid: str, m: Managed, ledgers: Sequence[Ledger]) -> MemoryUsage | None:
    """The instance's memory limit, its growth and its measured samples (None: no
    reservation on its device)."""
    idx = m.launch.device_index
    held = ledgers[idx][1].get(iid) if idx < len(ledgers) else None
    if held is None:
        return None
    return MemoryUsage(
        limit_mb=held.limit_mb,
        grows=held.grows,
        steps=held.steps,
        refusals=held.refusals,
        samples_total=m.mem_total,
        samples=tuple(m.mem_samples),
    )


__all__ = ["Ledger", "fikit_usage", "memory_usage", "node_status"]
