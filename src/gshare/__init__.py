"""gshare: serverless deep-learning inference on shared accelerators.

The package is layered (see DESIGN.md): ``gshare.resources`` and ``gshare.profiles`` hold data,
``gshare.policy`` decides (pure), ``gshare.sim`` runs the policies in virtual time, and
``gshare.cli`` is the command line.
"""

from gshare.profiles import ProfileTable
from gshare.resources import GpuShare, Rect

__all__ = ["GpuShare", "ProfileTable", "Rect"]
__version__ = "0.1.0"
