"""Fences: the placer reservations that keep a lost node's devices unused.

Who uses it: ``Controller`` fences a node's devices when its agent is lost
(``Controller.agent_lost``) and lifts the fence when the node gets a new agent
(``Controller.add_agent``). What must hold: a fenced device holds one whole-device reservation
(a ``FENCE`` id, never an instance's: ``~`` is not allowed in function names), so the placer
puts nothing there; the status page leaves these reservations out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gshare.policy.placement import NoCapacity
from gshare.policy.placement.base import Placer

FENCE = "~fence-"
"""Prefix of the placer reservations that fence a lost node's devices."""


class Fences:
    """The fence reservations of one placer; ``next_number`` numbers their ids."""

    def __init__(self, placer: Placer, next_number: Callable[[], int]) -> None:
        self.placer = placer
        self.next_number = next_number
        self._by_device: dict[int, str] = {}
        """Device index -> the reservation that keeps it unused."""

    def fence(self, devices: set[int]) -> None:
        """Reserve each of ``devices`` whole. The placer API places anywhere, and a
        whole-device rectangle fits only an empty device, so reservations are placed until
        every device of the set holds one; those that landed on another empty device are given
        back. A device an instance still holds is left unfenced."""
        elsewhere: list[str] = []
        while devices - set(self._by_device):
            fid = f"{FENCE}{self.next_number()}"
            try:
                b = self.placer.place(fid, 100.0, 100.0)
            except NoCapacity:  # an instance still holds one of them: not fenced
                break
            if b.gpu in devices and b.gpu not in self._by_device:
                self._by_device[b.gpu] = fid
            else:
                elsewhere.append(fid)
        for fid in elsewhere:
            self.placer.release(fid)

    def unfence(self, devices: Iterable[int]) -> None:
        """Give back the reservations on ``devices`` (their node has a new agent)."""
        for index in devices:
            fid = self._by_device.pop(index, None)
            if fid is not None:
                self.placer.release(fid)


__all__ = ["FENCE", "Fences"]
