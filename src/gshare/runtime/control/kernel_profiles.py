"""FIKIT's kernel profiles in the live runtime: fetched from an instance once it shares its
device, kept in the state database for the function's next instances.

Who calls it: ``Controller.apply``, when a FIKIT report shows the function's first instance in
the sharing phase with no profile kept (``observe.kernel_profile_wanted``); the controller
sets ``fs.kernel_fetching`` first. What must hold: the profile is kept under the code it was
measured on (``state.kernel_code_key``: model, handler, weights, device), only when it has
runs; ``kernel_fetching`` is cleared whatever happens; a failed fetch is logged, never raised.
"""

from __future__ import annotations

import json
import logging

from gshare.runtime.control.records import FunctionState, LiveInstance
from gshare.runtime.control.state import StateStore, kernel_code_key
from gshare.runtime.gateway.router import Gateway

log = logging.getLogger("gshare.controller")


async def store_kernel_profile(
    gateway: Gateway, state: StateStore, fs: FunctionState, inst: LiveInstance
) -> str | None:
    """Fetch ``inst``'s kernel profile (its ``kernel_profile`` command, through ``gateway``)
    into ``state``. Returns the event to log when one was kept, else None."""
    name = fs.spec.name
    try:
        raw = await gateway.control(
            inst.route, inst.instance_id, {"cmd": "kernel_profile", "profile": True}
        )
        doc = json.loads(raw)
        profile = doc.get("profile")
        if isinstance(profile, dict) and int(profile.get("runs", 0)) > 0:
            code = kernel_code_key(fs.spec.model_dump(mode="json"))
            state.put_kernel_profile(name, code, profile, int(profile["runs"]))
            fs.kernel_runs = int(profile["runs"])
            return (
                f"FIKIT: kernel profile measured ({fs.kernel_runs} runs, "
                f"{doc.get('kernels', 0)} op ids, {doc.get('fillable', 0)} followed by a "
                f"gap >= 0.1 ms); sharing phase"
            )
    except Exception as e:
        log.warning("%s: cannot fetch the kernel profile of %s: %s", name, inst.instance_id, e)
    finally:
        fs.kernel_fetching = False
    return None


__all__ = ["store_kernel_profile"]
