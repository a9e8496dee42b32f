"""gshare: serverless deep-learning inference on shared accelerators.

The package is layered (docs/DESIGN.md §1): ``gshare.resources`` and ``gshare.profiles`` hold data,
``gshare.policy`` decides (pure), ``gshare.sim`` runs the policies in virtual time, and
``gshare.cli`` is the command line.
"""

from typing import TYPE_CHECKING, Any

from gshare.profiles import ProfileTable
from gshare.resources import GpuShare, Rect

if TYPE_CHECKING:
    from gshare.runtime.client import Client
    from gshare.spec import FunctionSpec

__all__ = ["Client", "FunctionSpec", "GpuShare", "ProfileTable", "Rect"]
__version__ = "0.1.0"

_LAZY = {"Client": "gshare.runtime.client", "FunctionSpec": "gshare.spec"}


def __getattr__(name: str) -> Any:
    # Lazy: ``import gshare`` (and so every policy module) must not pull in httpx, sqlite3 or
    # pydantic; the Python API objects are imported on first use.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gshare' has no attribute {name!r}")
