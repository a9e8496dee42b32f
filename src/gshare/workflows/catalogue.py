"""ESG's six DNN functions and four applications, as built-in data (§4.1, Table 3).

Functions (Table 3; execution time measured in the minimum configuration: batch 1, 1 vCPU,
1 vGPU of an A100):

=====================  ==============  ========  ============  =============
function               model           exec ms   cold start ms  input MB
=====================  ==============  ========  ============  =============
super_resolution       SRGAN                 86          3503           2.7
segmentation           deeplabv3_resnet50   293         16510           2.5
deblur                 DeblurGAN            319         22343           1.1
classification         ResNet50             147         18299           0.147
background_removal     U2Net               1047          3729           2.5
depth_recognition      MiDaS                828         16479           0.648
=====================  ==============  ========  ============  =============

Applications (§4.1; every one is a linear pipeline):

* ``image-classification``: super_resolution -> segmentation -> classification
* ``depth-recognition``: deblur -> super_resolution -> depth_recognition
* ``background-elimination``: super_resolution -> deblur -> background_removal
* ``expanded-image-classification``: deblur -> super_resolution -> background_removal ->
  segmentation -> classification

Stage names are the function names (each application uses a function at most once).

SLOs (§4.1): with ``L`` the application's latency when it runs alone in the minimum
configuration (the sum of its Table 3 times — every application is a chain), the strict,
moderate and relaxed SLOs are 0.8 L, 1.0 L and 1.2 L. ``application(name, slo="strict")``
builds the spec; ``min_config_latency_ms(name)`` is ``L``. (Whether the paper's ``L`` includes
cold starts or data transfer is not stated; here it does not — the times are Table 3's.)

Workloads (§4.1): one of the four applications is picked at random for every arrival; the
inter-arrival interval is uniform in ``ARRIVAL_INTERVAL_MS[load]`` (heavy, normal, light); the
evaluated pairs are strict-light, moderate-normal and relaxed-heavy (``SETTINGS``).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final, Literal

from gshare.workflows.functions import FUNCTIONS as FUNCTIONS
from gshare.workflows.functions import FunctionInfo as FunctionInfo
from gshare.workflows.spec import StageSpec, WorkflowSpec

APPLICATION_CHAINS: Final = MappingProxyType(
    {
        "image-classification": ("super_resolution", "segmentation", "classification"),
        "depth-recognition": ("deblur", "super_resolution", "depth_recognition"),
        "background-elimination": ("super_resolution", "deblur", "background_removal"),
        "expanded-image-classification": (
            "deblur",
            "super_resolution",
            "background_removal",
            "segmentation",
            "classification",
        ),
    }
)
"""ESG's four applications (§4.1): the functions of each pipeline in execution order."""

SloLevel = Literal["strict", "moderate", "relaxed"]
SLO_FACTORS: Final = MappingProxyType({"strict": 0.8, "moderate": 1.0, "relaxed": 1.2})
"""SLO = factor x L (§4.1)."""

Load = Literal["heavy", "normal", "light"]
ARRIVAL_INTERVAL_MS: Final = MappingProxyType(
    {"heavy": (10.0, 16.8), "normal": (20.0, 33.6), "light": (40.0, 67.2)}
)
"""Uniform inter-arrival interval range per load level (§4.1), ms."""

SETTINGS: Final = MappingProxyType(
    {
        "strict-light": ("strict", "light"),
        "moderate-normal": ("moderate", "normal"),
        "relaxed-heavy": ("relaxed", "heavy"),
    }
)
"""The three evaluated (SLO level, load) pairs (§4.1)."""

KEEP_ALIVE_MS: Final[float] = 600_000.0
"""OpenWhisk's fixed keep-alive, which ESG keeps after pre-warming (§2, §4): 10 minutes."""


def _chain_spec(name: str, functions: tuple[str, ...], slo_ms: float) -> WorkflowSpec:
    stages = tuple(
        StageSpec(name=f, function=f, after=(functions[i - 1],) if i else ())
        for i, f in enumerate(functions)
    )
    return WorkflowSpec(name=name, slo_ms=slo_ms, stages=stages)


def min_config_latency_ms(app: str) -> float:
    """ESG's ``L`` of an application: its end-to-end time alone in the minimum configuration,
    i.e. the sum of its functions' Table 3 times (§4.1)."""
    chain = _chain(app)
    return sum(FUNCTIONS[f].exec_ms_at_min for f in chain)


def application(
    app: str, slo: SloLevel | None = "moderate", *, slo_ms: float | None = None
) -> WorkflowSpec:
    """The spec of one of ESG's applications with SLO ``SLO_FACTORS[slo] * L`` (or the
    explicit ``slo_ms``, which wins). ``KeyError`` naming the known applications otherwise."""
    chain = _chain(app)
    if slo_ms is None:
        if slo is None or slo not in SLO_FACTORS:
            raise KeyError(f"unknown SLO level {slo!r} (known: {', '.join(SLO_FACTORS)})")
        slo_ms = SLO_FACTORS[slo] * min_config_latency_ms(app)
    return _chain_spec(app, chain, slo_ms)


def applications(slo: SloLevel = "moderate") -> dict[str, WorkflowSpec]:
    """All four applications with the given SLO level, in §4.1 order."""
    return {a: application(a, slo) for a in APPLICATION_CHAINS}


def _chain(app: str) -> tuple[str, ...]:
    try:
        return APPLICATION_CHAINS[app]
    except KeyError:
        raise KeyError(
            f"unknown application {app!r} (known: {', '.join(APPLICATION_CHAINS)})"
        ) from None
