"""Kernel identity: which kernel a launch is, so that measured statistics can be reused (FIKIT).

Who uses it: the FIKIT profile (``policy.priority.profile``) keys its per-kernel statistics by
``KernelId``; the scheduler (``policy.priority.scheduler``) looks the statistics of every
intercepted launch up by it; the mechanisms build one per launch — the simulator from the shipped
V100 kernel profiles, the live runtime from what its preemption point sees.

NOTE — kernel ID (FIKIT §3.2, "Identifying each kernel", Fig. 4): on a GPU a kernel is its
function name plus its launch configuration (grid and block dimensions); kernels with the same
ID are the same computation at the same parallelism, so one measured mean duration (SK) and one
mean idle gap after it (SG) serve every launch of that ID, in any run and at any position. The
ID does not see a kernel's inputs, so two launches of one ID may differ in length (the paper's
Fig. 5); the statistics are means and the scheduler corrects its predictions at run time. On a
CPU, where gshare's preemption point is a torch module call, the identity is the op (module)
name plus its input shapes — the analogue of the launch configuration, and free to read there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any


class DeviceKind(Enum):
    """Where a kernel runs, which decides what identifies it."""

    GPU = "gpu"
    """A CUDA kernel: function name + grid + block."""
    CPU = "cpu"
    """A torch op (module call) on CPU cores: op name + input shapes."""


Dim3 = tuple[int, int, int]
Shape = tuple[int, ...]


class KernelIdError(ValueError):
    """A malformed kernel identity (empty name, bad dimensions, a field of the other kind)."""


@dataclass(frozen=True, slots=True)
class KernelId:
    """The identity of a kernel launch; hashable, so it keys the profile's statistics.

    Build it with ``KernelId.gpu(name, grid, block)`` or ``KernelId.cpu(op, input_shapes)``;
    the fields of the other kind stay empty (``__post_init__`` checks it).
    """

    device: DeviceKind
    name: str
    """Kernel function name (GPU) or op / module name (CPU)."""
    grid: Dim3 | None = None
    """GPU only: grid dimensions (blocks) of the launch."""
    block: Dim3 | None = None
    """GPU only: block dimensions (threads) of the launch."""
    input_shapes: tuple[Shape, ...] | None = None
    """CPU only: the shapes of the op's tensor inputs, in argument order."""

    def __post_init__(self) -> None:
        if not self.name:
            raise KernelIdError("a kernel id needs a non-empty name")
        if self.device is DeviceKind.GPU:
            if self.grid is None or self.block is None or self.input_shapes is not None:
                raise KernelIdError(f"GPU kernel {self.name!r} needs grid and block, no shapes")
            for what, dims in (("grid", self.grid), ("block", self.block)):
                if len(dims) != 3 or any(d < 1 for d in dims):
                    raise KernelIdError(
                        f"GPU kernel {self.name!r}: {what} must be 3 dimensions >= 1, got {dims}"
                    )
        else:
            if self.input_shapes is None or self.grid is not None or self.block is not None:
                raise KernelIdError(f"CPU op {self.name!r} needs input shapes, no grid or block")
            for shape in self.input_shapes:
                if any(d < 0 for d in shape):
                    raise KernelIdError(f"CPU op {self.name!r}: negative dimension in {shape}")

    @classmethod
    def gpu(cls, name: str, grid: Sequence[int], block: Sequence[int]) -> KernelId:
        """A CUDA kernel: its function name and launch configuration."""
        return cls(DeviceKind.GPU, name, grid=_dim3(grid), block=_dim3(block))

    @classmethod
    def cpu(cls, op: str, input_shapes: Sequence[Sequence[int]]) -> KernelId:
        """A torch op on CPU: its name and the shapes of its tensor inputs."""
        return cls(DeviceKind.CPU, op, input_shapes=tuple(tuple(s) for s in input_shapes))

    def to_record(self) -> dict[str, Any]:
        """Plain JSON-able data (for the live runtime's state database)."""
        rec: dict[str, Any] = {"device": self.device.value, "name": self.name}
        if self.device is DeviceKind.GPU:
            rec["grid"] = list(self.grid or ())
            rec["block"] = list(self.block or ())
        else:
            rec["input_shapes"] = [list(s) for s in self.input_shapes or ()]
        return rec

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> KernelId:
        """The inverse of ``to_record``; a malformed record raises ``KernelIdError``."""
        try:
            device = DeviceKind(rec["device"])
            name = str(rec["name"])
            if device is DeviceKind.GPU:
                return cls.gpu(name, rec["grid"], rec["block"])
            return cls.cpu(name, rec["input_shapes"])
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, KernelIdError):
                raise
            raise KernelIdError(f"bad kernel id record {dict(rec)!r}: {e}") from None

    def __str__(self) -> str:
        if self.device is DeviceKind.GPU:
            return f"{self.name}<<<{self.grid}, {self.block}>>>"
        return f"{self.name}{list(self.input_shapes or ())}"


def _dim3(dims: Sequence[int]) -> Dim3:
    if len(dims) != 3:
        raise KernelIdError(f"need 3 dimensions, got {tuple(dims)}")
    return (int(dims[0]), int(dims[1]), int(dims[2]))
