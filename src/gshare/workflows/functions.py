"""ESG's six DNN functions (§4.1, Table 3): the function table that both the workflow
specs (``spec``: the default set of known functions, ESG's ``L``) and the application catalogue
(``catalogue``) read. Kept apart so that ``spec`` does not import ``catalogue`` (which builds
specs); the catalogue's docstring has the table in full.

Plain data: imports nothing from gshare.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Final


@dataclass(frozen=True, slots=True)
class FunctionInfo:
    """One serverless DNN function of ESG's Table 3."""

    name: str
    """Function name used in workflow specs."""
    model: str
    """The DNN the paper deploys."""
    exec_ms_at_min: float
    """Execution time in the minimum configuration (batch 1, 1 vCPU, 1 vGPU), ms."""
    cold_start_ms: float
    """Cold-start time (container + model load), ms."""
    input_mb: float
    """Size of one input image, MB (drives data-transfer time in the simulator)."""


FUNCTIONS: Final = MappingProxyType(
    {
        f.name: f
        for f in (
            FunctionInfo("super_resolution", "SRGAN", 86.0, 3503.0, 2.7),
            FunctionInfo("segmentation", "deeplabv3_resnet50", 293.0, 16510.0, 2.5),
            FunctionInfo("deblur", "DeblurGAN", 319.0, 22343.0, 1.1),
            FunctionInfo("classification", "ResNet50", 147.0, 18299.0, 0.147),
            FunctionInfo("background_removal", "U2Net", 1047.0, 3729.0, 2.5),
            FunctionInfo("depth_recognition", "MiDaS", 828.0, 16479.0, 0.648),
        )
    }
)
"""ESG's six functions (Table 3), in the table's order."""
