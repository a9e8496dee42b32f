"""Small handlers (``handler: gshare.runtime.demo_handlers:Class``) used by the gateway
benchmark, the demo and the runtime tests. They follow the ``models.Handler`` convention and
import nothing heavy, so an instance of them starts fast.

* ``Echo`` — returns each payload unchanged (bytes stay bytes, JSON stays JSON): the
  "trivial function" of ``bench/gateway.py``.
* ``Sleep`` — ``{"sleep_ms": N}`` sleeps N ms (default 20) and answers its pid: slow requests
  for the crash and retry tests.
* ``Spin`` — ``{"spin_ms": N}`` keeps the CPU busy N ms per request (default 10): a workload
  whose busy time is known, for share measurements (it also answers the interpreter's switch
  interval it ran under).
* ``MemoryHog`` — ``{"hold_mb": N}`` allocates and keeps N MiB more (default 64), to trip the
  instance's memory limit.
* ``Activations`` — ``{"mb": N, "hold_ms": T}`` builds N MiB of tensors (default 16) in 4 MiB
  layers, each the output of a torch module call — the instance's preemption points, as a
  network's activations are — holds them T ms (default 300) and frees them: a request whose
  memory need depends on its input, for resource-centric sizing.
* ``AddSub`` — the Open Inference Protocol's "simple" model (as in Triton's examples): FP32
  inputs ``INPUT0`` and ``INPUT1`` of shape [n, 16] → ``OUTPUT0`` = sum and ``OUTPUT1`` =
  difference, both times the request parameter ``scale`` (default 1): declared tensors for the
  model metadata, request parameters, requested outputs (the OIP conformance tests).
* ``Kernels`` — ``{"kernels": N, "kernel_ms": K, "gap_ms": G}`` runs N torch module calls
  (default 10), each keeping the CPU busy K ms (default 2), with G ms of idle host time (a sleep)
  between them (default 0): a model whose ops — the instance's preemption points, FIKIT's
  kernels — and inter-op gaps are known, for the priority tests and benches (a host that
  synchronises between kernels leaves gaps a lower priority class can fill).
* ``DiesAtStart`` — its ``load`` writes a line to stderr and ends the process with code 3
  (no exception, no reason file): an instance that dies while it starts, for the start-failure
  message.
* ``Gate`` — ``{"dir": PATH, "id": ID}`` creates ``PATH/started-ID-PID`` when the request
  starts running, then holds it until the file ``PATH/open`` exists (at most ``timeout_s``,
  default 120) and answers ``{"id": ID, "pid": PID}``: a test sees which request runs where,
  and decides when it ends (no sleeps to guess with).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from gshare.runtime.instance.models import TensorSpec


class Echo:
    def load(self, weights: Mapping[str, torch.Tensor] | None, device: str) -> None:
        pass

    def predict(self, inputs: list[object]) -> list[object]:
        return inputs

    def example_input(self) -> object:
        return {"hello": "gshare"}


def _field(payload: object, key: str, default: float) -> float:
    if isinstance(payload, Mapping) and key in payload:
        v = payload[key]
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
            raise ValueError(f"{key} must be a number >= 0, got {v!r}")
        return float(v)
    return default


class Sleep:
    def load(self, weights: Mapping[str, torch.Tensor] | None, device: str) -> None:
        pass

    def predict(self, inputs: list[object]) -> list[object]:
        longest = max(_field(x, "sleep_ms", 20.0) for x in inputs)
        time.sleep(longest / 1000.0)
        return [{"slept_ms": longest, "pid": os.getpid()} for _ in inputs]

    def example_input(self) -> object:
        return {"sleep_ms": 5}


class Wrap:
    """Answers ``{"in": input}`` (tests of workflows: each stage adds one level)."""

    def load(self, weights: Mapping[str, torch.Tensor] | None, device: str) -> None:
        pass

    def predict(self, inputs: list[object]) -> list[object]:
        return [{"in": x} for x in inputs]


class Counted:
    """Sleeps ``sleep_ms`` per batch and answers how many requests it has run so far (tests of
    cancellation: a request dropped before it started is not counted)."""

    def __init__(self) -> None:
        self.runs = 0

    def load(self, weights: Mapping[str, torch.Tensor] | None, device: str) -> None:
        pass

    def predict(self, inputs: list[object]) -> list[object]:
        time.sleep(max(_field(x, "sleep_ms", 20.0) for x in inputs) / 1000.0)
        self.runs += len(inputs)
        return [{"runs": self.runs} for _ in inputs]


class Failing:
    """Raises a ``RuntimeError`` deep in its own code for every request."""

    def load(self, weights: Mapping[str, torch.Tensor] | None, device: str) -> None:
        pass

    def predict(self, inputs: list[object]) -> list[object]:
        raise RuntimeError("the model is broken")


class FileProbe:
    """Tries to read ``path`` and to write a temporary file; answers what happened (tests of
    the instance sandbox)."""

    def load(self, weights: Mapping[str, torch.Tensor] | None, device: str) -> None:
        pass

    def predict(self, inputs: list[object]) -> list[object]:
        out: list[object] = []
        for x in inputs:
            path = str(x.get("path", "")) if isinstance(x, Mapping) else ""
            try:
                with open(path, "rb") as f:
                    read: int | str = len(f.read())
            except OSError as e:
                read = f"{type(e).__name__}: {e.strerror}"
            with tempfile.NamedTemporaryFile() as t:
                t.write(b"x")
                t.flush()
                tmp_ok = os.path.getsize(t.name) == 1
            out.append({"read": read, "tmp_ok": tmp_ok})
        return out


class Spin:
    def load(self, weights: Mapping[str, torch.Tensor] | None, device: str) -> None:
        pass

    def predict(self, inputs: list[object]) -> list[object]:
        out: list[object] = []
        for x in inputs:
            ms = _field(x, "spin_ms", 10.0)
            end = time.perf_counter() + ms / 1000.0
            n = 0
            while time.perf_counter() < end:
                n += 1
            out.append({"spun_ms": ms, "loops": n, "switch_interval_s": sys.getswitchinterval()})
        return out

    def example_input(self) -> object:
        return {"spin_ms": 5}


class MemoryHog:
    def __init__(self) -> None:
        self.held: list[bytearray] = []

    def load(self, weights: Mapping[str, torch.Tensor] | None, device: str) -> None:
        pass

    def predict(self, inputs: list[object]) -> list[object]:
        out: list[object] = []
        for x in inputs:
            mb = int(_field(x, "hold_mb", 64.0))
            block = bytearray(mb << 20)
            for i in range(0, len(block), 4096):  # touch every page: resident, not just reserved
                block[i] = 1
            self.held.append(block)
            time.sleep(0.3)  # give the watchdog time to see it
            out.append({"held_mb": sum(len(b) for b in self.held) >> 20})
        return out


class Activations:
    LAYER_MB = 4

    def load(self, weights: Mapping[str, torch.Tensor] | None, device: str) -> None:
        import torch  # lazy: torch is heavy and only instances that run a model need it

        self.torch = torch
        self.layer = torch.nn.Identity()

    def example_input(self) -> object:
        return {"mb": 16, "hold_ms": 50}

    def predict(self, inputs: list[object]) -> list[object]:
        torch = self.torch
        out: list[object] = []
        for x in inputs:
            mb = int(_field(x, "mb", 16.0))
            hold_s = _field(x, "hold_ms", 300.0) / 1000.0
            layers = []
            for _ in range(-(-mb // self.LAYER_MB)):  # ceil: every layer is resident (ones)
                layers.append(self.layer(torch.ones((self.LAYER_MB << 20) // 4)))
            deadline = time.monotonic() + hold_s
            while time.monotonic() < deadline:  # hold, passing preemption points
                self.layer(layers[-1] if layers else None)
                time.sleep(0.01)
            out.append({"mb": len(layers) * self.LAYER_MB})
            del layers
        return out


class AddSub:
    WIDTH = 16

    def load(self, weights: Mapping[str, torch.Tensor] | None, device: str) -> None:
        pass

    def input_spec(self) -> list[TensorSpec]:
        from gshare.runtime.instance.models import TensorSpec  # lazy: it imports torch

        return [TensorSpec(n, (-1, self.WIDTH), "FP32") for n in ("INPUT0", "INPUT1")]

    def output_spec(self) -> list[TensorSpec]:
        from gshare.runtime.instance.models import TensorSpec  # lazy: it imports torch

        return [TensorSpec(n, (-1, self.WIDTH), "FP32") for n in ("OUTPUT0", "OUTPUT1")]

    def predict(
        self,
        inputs: list[Mapping[str, torch.Tensor]],
        parameters: list[dict[str, object]] | None = None,
    ) -> list[object]:
        out: list[object] = []
        for x, p in zip(inputs, parameters or [{}] * len(inputs), strict=True):
            scale = p.get("scale", 1)
            if isinstance(scale, bool) or not isinstance(scale, int | float):
                raise ValueError(f"parameter scale must be a number, got {scale!r}")
            a, b = x["INPUT0"], x["INPUT1"]
            out.append({"OUTPUT0": (a + b) * scale, "OUTPUT1": (a - b) * scale})
        return out

    def example_input(self) -> object:
        import torch  # lazy: torch is heavy and only instances that run a model need it

        return {"INPUT0": torch.ones(1, self.WIDTH), "INPUT1": torch.ones(1, self.WIDTH)}


class Kernels:
    def load(self, weights: Mapping[str, torch.Tensor] | None, device: str) -> None:
        import torch  # lazy: torch is heavy and only instances that run a model need it

        class Busy(torch.nn.Module):
            def forward(self, x: torch.Tensor, ms: float) -> torch.Tensor:
                end = time.perf_counter() + ms / 1000.0
                while time.perf_counter() < end:
                    pass
                return x

        self.torch = torch
        self.op = Busy()
        self.x = torch.zeros(1)

    def example_input(self) -> object:
        return {"kernels": 4, "kernel_ms": 1}

    def predict(self, inputs: list[object]) -> list[object]:
        out: list[object] = []
        for x in inputs:
            n = int(_field(x, "kernels", 10.0))
            kernel_ms = _field(x, "kernel_ms", 2.0)
            gap_s = _field(x, "gap_ms", 0.0) / 1000.0
            with self.torch.no_grad():
                for i in range(n):
                    if i and gap_s:
                        time.sleep(gap_s)
                    self.op(self.x, kernel_ms)
            out.append({"kernels": n, "pid": os.getpid()})
        return out


class DiesAtStart:
    def load(self, weights: Mapping[str, torch.Tensor] | None, device: str) -> None:
        print("DiesAtStart: leaving on purpose", file=sys.stderr, flush=True)
        os._exit(3)

    def predict(self, inputs: list[object]) -> list[object]:
        return inputs


class Gate:
    def load(self, weights: Mapping[str, torch.Tensor] | None, device: str) -> None:
        pass

    def predict(self, inputs: list[object]) -> list[object]:
        held: list[tuple[Path, str]] = []
        timeout_s = 120.0
        for x in inputs:
            if (
                not isinstance(x, Mapping)
                or not isinstance(x.get("dir"), str)
                or not isinstance(x.get("id"), str)
            ):
                raise ValueError(f'expected {{"dir": PATH, "id": ID}} (strings), got {x!r}')
            gate = Path(x["dir"])
            if not gate.is_dir():
                raise ValueError(f"dir {x['dir']!r} is not a directory")
            timeout_s = min(timeout_s, _field(x, "timeout_s", 120.0))
            held.append((gate, x["id"]))
        pid = os.getpid()
        for gate, rid in held:
            (gate / f"started-{rid}-{pid}").touch()
        deadline = time.monotonic() + timeout_s
        for gate, _ in held:
            while not (gate / "open").exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{gate / 'open'} did not appear within {timeout_s:g} s")
                time.sleep(0.01)
        return [{"id": rid, "pid": pid} for _, rid in held]


__all__ = [
    "Activations",
    "AddSub",
    "DiesAtStart",
    "Echo",
    "Gate",
    "Kernels",
    "MemoryHog",
    "Sleep",
    "Spin",
]


class TenantProbe:
    """A hostile tenant for the isolation suite (``tests/runtime/test_tenants.py``): each input
    ``{"attack": NAME, ...}`` tries one thing another tenant's handler must not be able to do,
    and answers what happened (``"ok"`` or the error). Its ``input_spec`` reports the uid and
    whether the control token could be read at deploy time (``describe``)."""

    weights: dict[str, torch.Tensor] = {}

    def load(self, weights: Mapping[str, torch.Tensor] | None, device: str) -> None:
        self.weights = dict(weights or {})

    @staticmethod
    def _token_read() -> bool:
        for d in os.environ.get("GSHARE_HIDE_PATHS", "").split(os.pathsep):  # the state dir
            try:
                with open(os.path.join(d, "token"), "rb"):
                    return True
            except OSError:
                pass
        return False

    def input_spec(self) -> list[dict[str, object]]:
        read = "read" if self._token_read() else "denied"
        return [{"name": f"uid{os.getuid()}-{read}", "datatype": "BYTES", "shape": [-1]}]

    def initial_weights(self) -> dict[str, torch.Tensor]:
        """Built at deploy, before any instance: records who built them."""
        import torch  # lazy: torch is heavy and only instances that run a model need it

        probe = [float(os.getuid()), 1.0 if self._token_read() else 0.0]
        return {"probe": torch.tensor(probe, dtype=torch.float64)}

    def predict(self, inputs: list[object]) -> list[object]:
        return [self._one(x) for x in inputs]

    def _one(self, payload: object) -> object:  # noqa: PLR0911 -- one branch per attack
        x: Mapping[str, str | int] = payload if isinstance(payload, Mapping) else {}
        a = x.get("attack")
        try:
            if a == "weights":
                return [float(v) for v in self.weights["probe"].tolist()]
            if a == "whoami":
                env = sorted(k for k in os.environ if "TOKEN" in k or "SECRET" in k or "RAY" in k)
                return {"uid": os.getuid(), "gid": os.getgid(), "env": env}
            if a == "read":
                with open(str(x["path"]), "rb") as f:
                    return f"ok {len(f.read())}"
            if a == "write":
                with open(str(x["path"]), "r+b") as f:
                    f.seek(int(x.get("offset", 0)))
                    f.write(b"\xff" * 64)
                return "ok"
            if a == "signal":
                os.kill(int(x["pid"]), int(x.get("sig", 0)))
                return "ok"
            if a == "ptrace":
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.ptrace(16, int(x["pid"]), 0, 0) != 0:  # PTRACE_ATTACH
                    return f"error {os.strerror(ctypes.get_errno())}"
                return "ok"
            if a == "proc":
                return sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
            if a == "shm":
                path = f"/dev/shm/{x.get('name', 'tenant-probe')}"
                with open(path, "wb") as f:
                    f.write(b"\x01" * (int(x.get("mb", 1)) << 20))
                return "ok"
            if a == "spawn":
                p = subprocess.Popen(["sleep", "600"], start_new_session=True)
                return p.pid
            if a == "unshare":
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
                    return f"error {os.strerror(ctypes.get_errno())}"
                return "ok"
        except Exception as e:  # noqa: BLE001 -- the answer is what happened
            return f"error {type(e).__name__}: {getattr(e, 'strerror', None) or e}"
        return f"error unknown attack {a!r}"
