"""Tenants apart: a deployed handler (``demo_handlers.TenantProbe``, any tenant's code) tries
what one tenant must not do to another or to the platform, and fails, while a victim function
keeps answering correctly. Each attack here succeeded before the walls
(``runtime.instance.walls``): the handler ran as the server's user, root.

Needs root and an installation other users can read (the uid, mount and cgroup walls):
skipped otherwise, with the reason.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gshare.runtime.instance.walls import degraded, uid_for
from gshare.testing import ServeProcess, wait_until

pytestmark = pytest.mark.skipif(bool(degraded()), reason=f"no tenant walls here: {degraded()}")

ATTACKER = "tenant-probe"
VICTIM = "victim-mlp"


@pytest.fixture(scope="module")
def srv() -> Iterator[ServeProcess]:
    with ServeProcess(tiny_models=True) as s:
        c = s.client()
        c.deploy({"name": VICTIM, "model": "mlp", "device": "cpu", "min_instances": 1})
        c.deploy(
            {
                "name": ATTACKER,
                "handler": "gshare.runtime.demo_handlers:TenantProbe",
                "device": "cpu",
                "min_instances": 1,
            }
        )
        for name in (VICTIM, ATTACKER):
            wait_until(lambda n=name: c.get(n)["availableReplicas"] >= 1, 120, f"{name} ready")
        yield s


def _attack(srv: ServeProcess, **kw: object) -> object:
    return srv.client().invoke(ATTACKER, kw)


def _pid(srv: ServeProcess, name: str) -> int:
    inst = [i for i in srv.client().get(name)["instances"] if i.get("pid")]
    assert inst, f"{name} has no instance with a pid"
    return int(inst[0]["pid"])


def _victim_answer(srv: ServeProcess) -> object:
    return srv.client().invoke(VICTIM, [[0.5] * 64])


def test_a_tenant_runs_as_its_functions_uid_with_a_scrubbed_environment(
    srv: ServeProcess,
) -> None:
    who = _attack(srv, attack="whoami")
    assert isinstance(who, dict)
    assert who["uid"] == uid_for(ATTACKER) and who["uid"] != 0, who
    assert who["uid"] != uid_for(VICTIM)
    assert who["env"] == [], f"secret-bearing variables reached the tenant: {who['env']}"


def test_deploy_time_code_runs_inside_the_walls(srv: ServeProcess) -> None:
    """The handler is imported at deploy (``describe``, and its ``initial_weights`` for the
    model store) in children of the node's template: they already have the tenant's uid and
    cannot read the control token."""
    inputs = srv.client().get(ATTACKER).get("inputs") or []
    names = [i["name"] for i in inputs]
    assert names == [f"uid{uid_for(ATTACKER)}-denied"], names
    # its initial_weights() ran as the tenant too, and its weights reached its instance
    assert _attack(srv, attack="weights") == [float(uid_for(ATTACKER)), 0.0]


def test_a_tenant_cannot_signal_trace_or_see_another(srv: ServeProcess) -> None:
    victim = _pid(srv, VICTIM)
    before = _victim_answer(srv)
    assert str(_attack(srv, attack="signal", pid=victim, sig=int(signal.SIGKILL))).startswith(
        "error PermissionError"
    )
    assert str(_attack(srv, attack="ptrace", pid=victim)).startswith("error")
    seen = _attack(srv, attack="proc")
    assert isinstance(seen, list) and victim not in seen and os.getpid() not in seen, seen
    assert str(_attack(srv, attack="read", path=f"/proc/{victim}/environ")).startswith("error")
    assert str(_attack(srv, attack="unshare")).startswith("error")
    assert _victim_answer(srv) == before  # alive and unchanged


def test_the_control_token_and_the_model_store_are_out_of_reach(srv: ServeProcess) -> None:
    token = next(p for p in srv.state_dir.iterdir() if "token" in p.name)
    assert str(_attack(srv, attack="read", path=str(token))).startswith("error")
    before = _victim_answer(srv)
    stored = glob.glob("/dev/shm/gshare-*/*.safetensors")
    assert stored, "the victim's weights are not in the model store"
    for path in stored:
        got = str(_attack(srv, attack="write", path=path, offset=4096))
        assert got.startswith("error"), (path, got)
    assert _victim_answer(srv) == before


def test_shared_memory_is_private_and_counted(srv: ServeProcess) -> None:
    name = f"tenant-probe-{uuid.uuid4().hex[:8]}"
    assert _attack(srv, attack="shm", name=name, mb=8) == "ok"
    leaked = Path(f"/dev/shm/{name}")
    try:
        assert not leaked.exists(), "the tenant wrote the host's /dev/shm"
    finally:
        leaked.unlink(missing_ok=True)
    # past its private /dev/shm (256 MiB): refused, not spilled into the node's memory
    big = f"tenant-probe-big-{uuid.uuid4().hex[:8]}"
    try:
        assert str(_attack(srv, attack="shm", name=big, mb=300)).startswith("error")
    finally:
        Path(f"/dev/shm/{big}").unlink(missing_ok=True)


def test_what_a_tenant_starts_dies_with_it(srv: ServeProcess) -> None:
    c = srv.client()
    c.deploy({"name": "spawner", "handler": "gshare.runtime.demo_handlers:TenantProbe",
              "device": "cpu", "min_instances": 1})  # fmt: skip
    wait_until(lambda: c.get("spawner")["availableReplicas"] >= 1, 120, "spawner ready")
    child = c.invoke("spawner", {"attack": "spawn"})
    assert isinstance(child, int)
    assert _running(child)
    c.delete("spawner")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _running(child):
        time.sleep(0.2)
    assert not _running(child), f"process {child} started by the deleted function is running"
    assert json.dumps(_victim_answer(srv))


def _memory_of(pid: int) -> bytes:
    """The writable private memory of process ``pid`` (root reads it through /proc)."""
    out = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            addr, perms, *_rest = line.split()
            if not perms.startswith("rw") or "[vvar" in line or "[vsyscall" in line:
                continue
            lo, hi = (int(x, 16) for x in addr.split("-"))
            if hi - lo > 256 << 20:
                continue
            try:
                mem.seek(lo)
                out.append(mem.read(hi - lo))
            except OSError:
                continue
    return b"".join(out)


def test_the_fork_template_never_holds_an_instances_secrets(srv: ServeProcess) -> None:
    """Every instance is forked from the node's template, so whatever the template's heap holds,
    every tenant inherits. Instances' secrets reach them in a root-only file, read after the
    fork: the template's memory has none of the launch secrets."""
    import psutil

    template = psutil.Process(_pid(srv, VICTIM)).ppid()
    heap = _memory_of(template)
    assert len(heap) > 1 << 20
    for field in (b'"token_secret"', b'"channel_secret"'):
        assert field not in heap, f"the template's memory holds {field.decode()}"


def _cgroup_of(pid: int, controller: str) -> Path | None:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        hid, ctrls, path = line.split(":", 2)
        if controller in ctrls.split(","):
            return Path("/sys/fs/cgroup") / controller / path.lstrip("/")
        if hid == "0" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            return Path("/sys/fs/cgroup") / path.lstrip("/")
    return None


def test_a_function_without_mem_mb_is_capped_and_counted(srv: ServeProcess) -> None:
    """The attacker's spec sets no ``mem_mb``: its instance still has a memory cap (the default,
    4 GiB + 128 MiB of slack) and a process cap, in a cgroup of its own."""
    from gshare.runtime.instance.oscap import SLACK_MB
    from gshare.runtime.instance.walls import DEFAULT_MEM_MB, DEFAULT_PIDS_MAX

    pid = _pid(srv, ATTACKER)
    mem = _cgroup_of(pid, "memory")
    pids = _cgroup_of(pid, "pids")
    if mem is None or pids is None:
        pytest.skip("no memory or pids cgroup on this host")
    limit = next(
        (mem / f).read_text().strip()
        for f in ("memory.max", "memory.limit_in_bytes")
        if (mem / f).exists()
    )
    assert int(limit) == int((DEFAULT_MEM_MB + SLACK_MB) * (1 << 20)), (mem, limit)
    assert mem.name == str(pid) and pids.name == str(pid)
    assert int((pids / "pids.max").read_text()) == DEFAULT_PIDS_MAX


def test_a_clean_stop_leaves_no_tenant_process_and_no_cgroup(tmp_path: Path) -> None:
    with ServeProcess(tiny_models=True) as s:
        c = s.client()
        c.deploy({"name": "spawner", "handler": "gshare.runtime.demo_handlers:TenantProbe",
                  "device": "cpu", "min_instances": 1})  # fmt: skip
        wait_until(lambda: c.get("spawner")["availableReplicas"] >= 1, 120, "spawner ready")
        child = c.invoke("spawner", {"attack": "spawn"})
        pid = _pid(s, "spawner")
        groups = [g for g in (_cgroup_of(pid, "memory"), _cgroup_of(pid, "pids")) if g]
        assert isinstance(child, int) and Path(f"/proc/{child}").exists()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _running(child):
        time.sleep(0.2)
    assert not _running(child), f"process {child} outlived the server's clean stop"
    left = [str(g.parent) for g in groups if g.parent.exists()]
    assert not left, f"cgroups left after the stop: {left}"


def _running(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return not stat.read_text().split(") ")[-1].startswith("Z")
    except OSError:
        return False


@pytest.fixture(scope="module")
def ray_srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    pytest.importorskip("ray", reason="Ray is not installed (the cluster extra)")
    with ServeProcess(
        "--cluster", "ray", state_dir=tmp_path_factory.mktemp("tenants-ray") / "state",
        tiny_models=True,
    ) as s:  # fmt: skip
        yield s


def test_under_ray_a_tenant_can_neither_find_nor_join_the_cluster(ray_srv: ServeProcess) -> None:
    """With ``--cluster ray`` the node's instances are still forked behind the walls: the Ray
    session token is not in a tenant's environment, and Ray's processes (whose command lines
    hold the cluster's address) are invisible to it."""
    import psutil

    c = ray_srv.client()
    c.deploy({"name": "ray-probe", "handler": "gshare.runtime.demo_handlers:TenantProbe",
              "device": "cpu", "min_instances": 1})  # fmt: skip
    wait_until(lambda: c.get("ray-probe")["availableReplicas"] >= 1, 180, "ray-probe ready")
    who = c.invoke("ray-probe", {"attack": "whoami"})
    assert who["uid"] == uid_for("ray-probe") and who["env"] == [], who
    ray_pids = [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if any("raylet" in a or "gcs_server" in a for a in (p.info["cmdline"] or []))
    ]
    assert ray_pids, "no Ray process found"
    seen = c.invoke("ray-probe", {"attack": "proc"})
    assert isinstance(seen, list) and not set(ray_pids) & set(seen), seen
    for pid in ray_pids:
        got = str(c.invoke("ray-probe", {"attack": "read", "path": f"/proc/{pid}/cmdline"}))
        assert got.startswith("error"), (pid, got)
    c.delete("ray-probe")
