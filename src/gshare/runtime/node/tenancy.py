"""What the node agent decides about a tenant's processes: their walls and their secrets.

Who calls it: ``NodeAgent`` (``agent.py``), for each process that runs a tenant's code — an
instance (``instance_walls``, ``write_launch_secrets``) and the deploy-time tasks that import
it (``tenant_walls``: ``describe_handler``, ``build_weights``). The fork template puts the walls
up (``instance.walls.enter``); this module only says what they are. Light: no torch.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, cast

from gshare.policy.memory import MemoryPlan
from gshare.runtime.instance.launch import InstanceLaunch
from gshare.runtime.instance.oscap import SESSION_ENV
from gshare.runtime.instance.walls import DEFAULT_MEM_MB, Walls, uid_for
from gshare.runtime.tokens.board import board_path


class RunTask(Protocol):
    """The agent's ``_node_task``: ``node.tasks.NAME(*args)`` in a throw-away process."""

    def __call__(
        self,
        name: str,
        args: list[object],
        timeout_s: float,
        walls: dict[str, object] | None = None,
    ) -> object: ...


SECRET_FIELDS = ("token_secret", "channel_secret")
"""The launch fields that never pass through the fork template (``write_launch_secrets``)."""


def tenant_files(spec: Mapping[str, object]) -> tuple[str, ...]:
    """The files of a spec that its tenant's code reads: a ``file.py`` handler, weights."""
    out = []
    path = str(spec.get("handler") or "").rpartition(":")[0]
    if path.endswith(".py"):
        out.append(path)
    if spec.get("weights"):
        out.append(str(spec["weights"]))
    return tuple(p for p in out if os.path.isabs(p))


def tenant_walls(
    function: str,
    spec: Mapping[str, object],
    extra_sys_path: tuple[str, ...] | list[str],
    **kw: Any,
) -> Walls:
    """The walls of a process that runs ``function``'s code: its uid, this session's cgroups,
    its code reachable; ``kw`` the rest (``Walls``' fields)."""
    uid = uid_for(function)
    return Walls(
        uid=uid,
        gid=uid,
        session=os.environ.get(SESSION_ENV, ""),
        reach=(*extra_sys_path, *tenant_files(spec)),
        **kw,
    )


def instance_walls(launch: InstanceLaunch, store_root: str) -> Walls:
    """The walls of one instance: its directory, the store read-only, its token socket and the
    device's board writable, its memory cap (its plan's, or the default host cap)."""
    plan = MemoryPlan(launch.mem_mb, launch.mem_step_mb, launch.mem_max_mb)
    if launch.device == "cpu" and math.isfinite(plan.cap_mb) and plan.cap_mb > 0:
        mem = plan.cap_mb
    else:  # no cap asked (or a GPU's memory): the default host cap
        mem = DEFAULT_MEM_MB * (2 if launch.device.startswith("cuda") else 1)
    return tenant_walls(
        launch.function,
        launch.spec,
        launch.extra_sys_path,
        own_dir=os.path.dirname(launch.uds_path),
        store_root=store_root,
        mem_mb=mem,
        reach_rw=(launch.token_socket, str(board_path(launch.token_socket))),
    )


def write_launch_secrets(data: dict[str, object], own_dir: str) -> str:
    """Move the secrets out of a launch's ``data`` into a file only root reads in the
    instance's directory (made here); its path. The child reads and removes it before its walls
    go up, so the template, whose memory every instance inherits, never holds them."""
    os.makedirs(own_dir, mode=0o700, exist_ok=True)
    path = os.path.join(own_dir, ".launch-secrets")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({k: data.pop(k) for k in SECRET_FIELDS}, f)
    return path


def build_weights_walled(
    run_task: RunTask, launch: InstanceLaunch, build: Path, timeout_s: float
) -> str | None:
    """A user handler's ``initial_weights()`` (tenant code) into the node's store: built inside
    the tenant's walls (``node.tasks.build_weights``, a .safetensors file in ``build``), then
    stored by a root task (``store_weights``: a format that holds data, never code); the key,
    or None when it has none. ``run_task(name, args, timeout_s, walls=...)`` is the agent's."""
    out = str(build / "weights.safetensors")
    walls = tenant_walls(launch.function, launch.spec, launch.extra_sys_path, own_dir=str(build))
    try:
        if not run_task("build_weights", [launch.spec, out], timeout_s, walls=walls.to_dict()):
            return None
        key = run_task("store_weights", [launch.store_root, launch.spec, out], timeout_s)
        return cast(str, key)
    finally:
        shutil.rmtree(build, ignore_errors=True)
