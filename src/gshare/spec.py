"""Function specs: what a user deploys — a model (built-in or their own handler) with its GPU
share, batching, SLO and scaling bounds (docs/DESIGN.md §2, §5, §6).

YAML form (``load_function_spec``)::

    name: resnet50-small            # DNS label: 1..63 of a-z 0-9 '-'
    model: resnet50                 # a built-in (BUILTIN_MODELS) ... or
    # handler: my_pkg.mod:MyModel   # ... your own class ("module:Class" or "file.py:Class")
    weights: null                   # optional .safetensors file (random init otherwise)
    device: auto                    # cpu | cuda | auto
    resources:                      # or the literal string "auto" (policy.autoscale picks)
      sm_pct: 25                    # spatial: % of SMs (MPS) / of CPU cores     (0, 100]
      quota_request: 0.4            # temporal: guaranteed share of each window  (0, 1]
      quota_limit: 0.6              # temporal: at most this share               [quota_request, 1]
      mem_mb: 2048                  # memory limit, MiB (0: none) | auto | {init, step, max}
    batching: {max_batch: 8, max_wait_ms: 5}
    slo_ms: 100
    # slo: {ttft_ms: 500, tpot_ms: 50}  # generative functions: time to first token, per token
    min_instances: 0
    max_instances: 4
    priority: 0                     # 0..9, higher is more important
    keep_alive_s: 300
    predict_timeout_s: 60           # a batch's predict past this: failed (504), instance restarted

``quota_limit`` defaults to ``quota_request`` and ``mem_mb`` to 0 (no limit) when omitted.
``mem_mb`` is a fixed limit (an integer), or resource-centric sizing (BulkX,
``gshare.policy.sizing``): ``auto`` — the controller sizes ``init``/``step`` from the memory
the function's requests really used — or ``{init: 256, step: 128, max: 2048}`` (MiB): an
instance starts with ``init`` and its limit grows by ``step`` when a request needs more, up to
``max`` (docs/DESIGN.md §5).

Errors: every invalid field raises ``SpecError`` whose message is ONE line naming the field by
its dotted path, the allowed values and the offending value, e.g.
``resources.sm_pct: must be a number in (0, 100], got 150``; several problems are joined with
``"; "``. Unknown fields are errors too (a typo must not be silently ignored).

Relative paths: when a spec is loaded from a file, a relative ``weights`` path and a relative
``file.py`` handler are resolved against the directory of that file, so a spec and its handler
module can travel together (see ``examples/``).

Who calls it: the CLI (``gshare deploy FILE``), the controller and agent (which store and ship
``FunctionSpec.model_dump()``), ``gshare.runtime.instance.loading.make_handler``. This module is
data: it reads a file only in ``load_function_spec`` and imports neither torch nor the runtime.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from gshare.documents import DocumentError, load_yaml, one_line_errors
from gshare.resources import GpuShare

BUILTIN_MODELS: Final[tuple[str, ...]] = (
    "resnet50",
    "bert-base",
    "bert-large",
    "vit-base",
    "mlp",
    "swin2sr",
    "segformer",
    "dpt",
)
"""Built-in models (``gshare.runtime.instance.builtin_models`` builds them from ``transformers``
configurations with random weights; nothing is ever downloaded):

==========  =====================================  ==================================
model       task                                   input → output (one item)
==========  =====================================  ==================================
resnet50    image classification (ResNet-50)       image [3, 224, 224] → label, score
bert-base   text classification (BERT-base)        token ids [seq] → label, score
bert-large  text classification (BERT-large)       token ids [seq] → label, score
vit-base    image classification (ViT-B/16)        image [3, 224, 224] → label, score
mlp         vector classification (64-256-256-10)  vector [64] → label, score
swin2sr     super-resolution x2 (Swin2SR)          image [3, 64, 64] → image [3, 128, 128]
segformer   semantic segmentation (SegFormer-b0)   image [3, 128, 128] → classes [128, 128]
dpt         depth estimation (DPT, ViT-S/16)       image [3, 128, 128] → depth [128, 128]
==========  =====================================  ==================================

Image models accept any height and width (resized to their input size)."""

GENERATIVE_MODELS: Final[tuple[str, ...]] = ("causal-lm-tiny", "causal-lm-gpt2-small")
"""Built-in generative models (``gshare.runtime.instance.generative.causal_lm``: a GPT-2
architecture with random weights and a byte tokenizer; docs/generative.md): a prompt in, text
out token by token, served by the instance's engine (continuous batching) and reachable over
the OpenAI-compatible and OIP generate routes. ``causal-lm-gpt2-small`` is the tiny one under
the test-size override."""

MAX_SLO_MS: Final[float] = 3_600_000.0
"""Largest accepted SLO: one hour."""
MAX_INSTANCES: Final[int] = 1024
"""Largest accepted ``max_instances`` (a guard against typos, not a platform limit)."""
MAX_KEEP_ALIVE_S: Final[float] = 86_400.0
MAX_PREDICT_TIMEOUT_S: Final[float] = 86_400.0
"""Largest accepted keep-alive: one day."""
MAX_MEM_MB: Final[int] = 1 << 20
"""Largest accepted memory size (1 TiB): a guard against typos."""
MAX_BATCH: Final[int] = 256
MAX_WAIT_MS: Final[float] = 10_000.0

_NAME_RE: Final = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_IDENT: Final = r"[A-Za-z_][A-Za-z0-9_]*"
_HANDLER_RE: Final = re.compile(rf"^(?:{_IDENT}(?:\.{_IDENT})*|[^:]+\.py):{_IDENT}(?:\.{_IDENT})*$")

# The allowed values of every field, by dotted path: the single source of the wording of
# errors, whichever check (pydantic type/range constraint or our own) fails.
FIELD_RULES: Final[Mapping[str, str]] = {
    "name": "a DNS label: 1..63 characters of a-z, 0-9 and '-', starting and ending with a "
    "letter or digit",
    "model": f"one of {', '.join(BUILTIN_MODELS + GENERATIVE_MODELS)}",
    "handler": "'module:Class' (a dotted module path or a .py file, ':', a class name)",
    "weights": "a path to a .safetensors file",
    "device": "one of cpu, cuda, auto",
    "resources": "'auto' or a mapping with sm_pct, quota_request, quota_limit, mem_mb",
    "resources.sm_pct": "a number in (0, 100]",
    "resources.quota_request": "a number in (0, 1]",
    "resources.quota_limit": "a number in [quota_request, 1]",
    "resources.mem_mb": f"an integer in [0, {MAX_MEM_MB}], 'auto', or a mapping with init, step, "
    "max (MiB)",
    "resources.mem_mb.init": f"an integer in [0, {MAX_MEM_MB}] (MiB)",
    "resources.mem_mb.step": f"an integer in [1, {MAX_MEM_MB}] (MiB)",
    "resources.mem_mb.max": f"an integer in [init, {MAX_MEM_MB}] (MiB)",
    "batching": "a mapping with max_batch, max_wait_ms",
    "batching.max_batch": f"an integer in [1, {MAX_BATCH}]",
    "batching.max_wait_ms": f"a number in [0, {MAX_WAIT_MS:.0f}]",
    "slo_ms": f"a number in (0, {MAX_SLO_MS:.0f}] or null",
    "slo": "a mapping with ttft_ms, tpot_ms (generative functions only)",
    "slo.ttft_ms": f"a number in (0, {MAX_SLO_MS:.0f}] or null",
    "slo.tpot_ms": f"a number in (0, {MAX_SLO_MS:.0f}] or null",
    "min_instances": "an integer in [0, max_instances]",
    "max_instances": f"an integer in [1, {MAX_INSTANCES}]",
    "priority": "an integer in [0, 9]",
    "keep_alive_s": f"a number in [0, {MAX_KEEP_ALIVE_S:.0f}]",
    "predict_timeout_s": f"a number in (0, {MAX_PREDICT_TIMEOUT_S:.0f}] or null",
}


class SpecError(ValueError):
    """A function spec that cannot be read or is invalid. The message is one line naming each
    offending field (dotted path), its allowed values and the value given."""


def _no_bool(v: Any) -> Any:
    # YAML `yes`/`true` must not pass as 1 for a number.
    if isinstance(v, bool):
        raise ValueError("a boolean is not a number")
    return v


Num = Annotated[float, BeforeValidator(_no_bool)]
Int = Annotated[int, BeforeValidator(_no_bool)]


class MemSteps(BaseModel):
    """Resource-centric memory sizing, set by hand (BulkX §3): an instance starts with a limit
    of ``init`` MiB and grows it by ``step`` MiB when a request needs more, up to ``max``."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    init: Int = Field(ge=0, le=MAX_MEM_MB)
    step: Int = Field(ge=1, le=MAX_MEM_MB)
    max: Int = Field(ge=1, le=MAX_MEM_MB)

    @model_validator(mode="after")
    def _max_ok(self) -> MemSteps:
        if self.max < self.init:
            raise ValueError(f"@max: must be an integer >= init={self.init} (MiB), got {self.max}")
        return self


def _mem_tag(v: Any) -> str:
    if isinstance(v, str):
        return "auto"
    return "steps" if isinstance(v, Mapping | MemSteps) else "fixed"


MemField = Annotated[
    Annotated[Annotated[Int, Field(ge=0, le=MAX_MEM_MB)], Tag("fixed")]
    | Annotated[Literal["auto"], Tag("auto")]
    | Annotated[MemSteps, Tag("steps")],
    Discriminator(_mem_tag),
]


class Resources(BaseModel):
    """A spatio-temporal GPU share (FaST-GShare §3.3; ``gshare.resources.GpuShare``).

    Invariants: ``0 < sm_pct <= 100``, ``0 < quota_request <= quota_limit <= 1``,
    ``mem_mb >= 0``. ``quota_limit`` defaults to ``quota_request``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    sm_pct: Num = Field(gt=0, le=100)
    """Spatial share: % of the GPU's SMs (MPS thread percentage); on CPU, % of the cores."""
    quota_request: Num = Field(gt=0, le=1)
    """Guaranteed fraction of each time window."""
    quota_limit: Num = Field(default=-1.0, le=1)
    """Largest fraction of each time window (elastic use of idle time up to it)."""
    mem_mb: MemField = 0
    """Memory limit of each instance: a fixed size in MiB (0: no limit), ``"auto"`` (sized by
    the controller from measured requests) or ``MemSteps`` (init, step, max by hand)."""

    @model_validator(mode="before")
    @classmethod
    def _default_limit(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and data.get("quota_limit") is None:
            data = dict(data)
            data.pop("quota_limit", None)
            if "quota_request" in data:
                data["quota_limit"] = data["quota_request"]
        return data

    @model_validator(mode="after")
    def _limit_ok(self) -> Resources:
        if not (self.quota_request <= self.quota_limit <= 1.0):
            raise ValueError(
                f"@quota_limit: must be a number in [quota_request={self.quota_request:g}, 1], "
                f"got {self.quota_limit:g}"
            )
        return self

    @property
    def mem_init_mb(self) -> float:
        """The memory an instance reserves when it starts: the fixed limit, ``init`` of
        ``MemSteps``, or 0 for ``auto`` (the controller's sizing decides)."""
        m = self.mem_mb
        if isinstance(m, MemSteps):
            return float(m.init)
        return 0.0 if isinstance(m, str) else float(m)

    def share(self) -> GpuShare:
        """This share as the placement/sim data type (``mem_mb`` = the starting reservation)."""
        return GpuShare(self.sm_pct, self.quota_request, self.quota_limit, self.mem_init_mb)


class Batching(BaseModel):
    """Dynamic batching of an instance: wait at most ``max_wait_ms`` after the first queued
    request for up to ``max_batch`` requests, then run them as one batch."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    max_batch: Int = Field(default=1, ge=1, le=MAX_BATCH)
    max_wait_ms: Num = Field(default=5.0, ge=0, le=MAX_WAIT_MS)


class TokenSlo(BaseModel):
    """A generative function's objectives per token: time to first token (arrival at the
    gateway to the first streamed chunk, ms; requests that would miss it are shed at once with
    429) and mean time per output token after the first (ms; measured and reported)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    ttft_ms: Num | None = Field(default=None, gt=0, le=MAX_SLO_MS)
    tpot_ms: Num | None = Field(default=None, gt=0, le=MAX_SLO_MS)


def _resources_tag(v: Any) -> str:
    return "auto" if isinstance(v, str) else "share"


ResourcesField = Annotated[
    Annotated[Resources, Tag("share")] | Annotated[Literal["auto"], Tag("auto")],
    Discriminator(_resources_tag),
]


class FunctionSpec(BaseModel):
    """A deployable function. Exactly one of ``model`` (a built-in) and ``handler`` (a user
    class) is set. See the module doc for the YAML form and the allowed values."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    """DNS-label-like: it appears in URLs (``/function/{name}``) and process names."""
    model: str | None = None
    """A built-in model (``BUILTIN_MODELS``)."""
    handler: str | None = None
    """``"package.module:Class"`` or ``"path/file.py:Class"``; the class follows the
    ``gshare.runtime.instance.models.Handler`` protocol."""
    weights: str | None = None
    """A ``.safetensors`` file with the weights; built-ins are random-initialised without."""
    device: Literal["cpu", "cuda", "auto"] = "auto"
    """Where instances run; ``auto`` is cuda when the node has a GPU, else cpu."""
    resources: ResourcesField = "auto"
    """The GPU share of each instance, or ``"auto"``: ``policy.autoscale`` picks it from the
    profile table."""
    batching: Batching = Field(default_factory=Batching)
    slo_ms: Num | None = Field(default=None, gt=0, le=MAX_SLO_MS)
    """Latency objective of one request (arrival to response), ms; None: best effort."""
    slo: TokenSlo | None = None
    """A generative function's per-token objectives (``TokenSlo``); a built-in that is not
    generative refuses it here, a handler that is not at deployment."""
    min_instances: Int = Field(default=0, ge=0)
    max_instances: Int = Field(default=4, ge=1, le=MAX_INSTANCES)
    priority: Int = Field(default=0, ge=0, le=9)
    """Token priority: higher is served first (``policy.tokens``)."""
    keep_alive_s: Num = Field(default=300.0, ge=0, le=MAX_KEEP_ALIVE_S)
    """How long the function stays warm once idle — no request queued or running, counted from
    the later of its last arrival and its last answer — before its instances above
    ``min_instances`` are reclaimed."""
    predict_timeout_s: Num | None = Field(default=None, gt=0, le=MAX_PREDICT_TIMEOUT_S)
    """Longest one ``predict`` call may run: past it, the batch's requests (and those queued
    behind it) fail with 504 naming the limit, and the instance is restarted — a handler that
    hangs cannot hold its instance, or a device token, for ever. None: the server's
    ``--request-timeout-s`` (no request would wait longer for its answer anyway)."""

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError("bad name")
        return v

    @field_validator("model")
    @classmethod
    def _model_ok(cls, v: str | None) -> str | None:
        if v is not None and v not in BUILTIN_MODELS + GENERATIVE_MODELS:
            raise ValueError("unknown model")
        return v

    @field_validator("handler")
    @classmethod
    def _handler_ok(cls, v: str | None) -> str | None:
        if v is not None and not _HANDLER_RE.match(v):
            raise ValueError("bad handler")
        return v

    @field_validator("weights")
    @classmethod
    def _weights_ok(cls, v: str | None) -> str | None:
        if v is not None and not v.endswith(".safetensors"):
            raise ValueError("bad weights")
        return v

    @model_validator(mode="after")
    def _cross_ok(self) -> FunctionSpec:
        if (self.model is None) == (self.handler is None):
            got = "both" if self.model is not None else "neither"
            raise ValueError(f"@model: exactly one of model or handler must be set, got {got}")
        if self.slo is not None and self.model is not None and not self.is_generative_builtin:
            raise ValueError(
                f"@slo: ttft_ms and tpot_ms apply to generative functions only (model one of "
                f"{', '.join(GENERATIVE_MODELS)}, or a handler with the step-wise contract), "
                f"not to model {self.model}"
            )
        if self.min_instances > self.max_instances:
            raise ValueError(
                f"@min_instances: must be an integer in [0, max_instances={self.max_instances}], "
                f"got {self.min_instances}"
            )
        return self

    # -- queries ------------------------------------------------------------------------------

    @property
    def is_builtin(self) -> bool:
        return self.model is not None

    @property
    def is_generative_builtin(self) -> bool:
        return self.model in GENERATIVE_MODELS

    def share(self) -> GpuShare | None:
        """The fixed GPU share, or None when ``resources`` is ``auto``."""
        return None if isinstance(self.resources, str) else self.resources.share()

    def to_yaml(self) -> str:
        """YAML text that ``load_function_spec`` reads back to an equal spec."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


# -- loading ------------------------------------------------------------------------------------


def _path_of(loc: list[Any]) -> list[Any]:
    """A location without the union member names pydantic adds."""
    loc = [str(x) for x in loc]
    if loc[:1] == ["resources"] and loc[1:2] and loc[1] in ("share", "auto"):
        del loc[1]
    if loc[:2] == ["resources", "mem_mb"] and loc[2:3] and loc[2] in ("fixed", "auto", "steps"):
        del loc[2]
    return loc


def _format_errors(e: ValidationError) -> str:
    """One line: ``path: must be <rule>, got <value>`` per error, joined by ``"; "``."""
    return one_line_errors(
        e.errors(),
        path_of=_path_of,
        rule_of=lambda loc: FIELD_RULES.get(".".join(loc)),
        allowed_of=lambda parent: _allowed_keys(".".join(parent)),
    )


def _allowed_keys(parent: str) -> list[str]:
    models: dict[str, type[BaseModel]] = {
        "slo": TokenSlo,
        "resources": Resources,
        "batching": Batching,
        "resources.mem_mb": MemSteps,
    }
    return list(models.get(parent, FunctionSpec).model_fields)


def parse_function_spec(data: Mapping[str, Any], *, base_dir: Path | None = None) -> FunctionSpec:
    """Validate a mapping (e.g. parsed YAML) into a ``FunctionSpec``; ``SpecError`` (one line)
    otherwise. With ``base_dir``, relative ``weights`` and ``file.py`` handler paths are
    resolved against it."""
    if not isinstance(data, Mapping):
        raise SpecError(
            f"a function spec must be a mapping with at least name and model or handler, "
            f"got {type(data).__name__}"
        )
    data = dict(data)
    if base_dir is not None:
        w = data.get("weights")
        if isinstance(w, str) and w and not Path(w).is_absolute():
            data["weights"] = str((base_dir / w).resolve())
        h = data.get("handler")
        if isinstance(h, str) and ":" in h:
            mod, _, cls = h.rpartition(":")
            if mod.endswith(".py") and not Path(mod).is_absolute():
                data["handler"] = f"{(base_dir / mod).resolve()}:{cls}"
    try:
        return FunctionSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(_format_errors(e)) from None


def load_function_spec(
    source: FunctionSpec | Mapping[str, Any] | str | Path,
) -> FunctionSpec:
    """A ``FunctionSpec`` from a spec (returned as is), a mapping, a YAML file or YAML text.

    A ``Path``, or a one-line string ending in ``.yaml``/``.yml``, is read as a file (a missing
    file is an error); any other string is parsed as YAML text. Raises ``SpecError`` (one line)
    on unreadable files, bad YAML and invalid specs; errors from a file start with its path.
    """
    if isinstance(source, FunctionSpec):
        return source
    if isinstance(source, Mapping):
        return parse_function_spec(source)
    if isinstance(source, Path) or (
        "\n" not in source and source.strip().endswith((".yaml", ".yml"))
    ):
        p = Path(source)
        try:
            text: str | bytes = p.read_bytes()
        except OSError as e:
            raise SpecError(f"cannot read function spec {str(p)!r}: {e.strerror}") from None
        where, base = str(p), p.resolve().parent
    else:
        text, where, base = source, "", None
    try:
        data = load_yaml(text)
    except DocumentError as e:
        raise SpecError(f"{where + ': ' if where else ''}the function spec {e}") from None
    try:
        return parse_function_spec(data, base_dir=base)
    except SpecError as e:
        raise SpecError(f"{where}: {e}" if where else str(e)) from None


def rule_of(path: str) -> str:
    """The allowed values of the field at dotted ``path`` (as in error messages)."""
    return FIELD_RULES[path]


__all__ = [
    "BUILTIN_MODELS",
    "FIELD_RULES",
    "GENERATIVE_MODELS",
    "Batching",
    "FunctionSpec",
    "MemSteps",
    "Resources",
    "SpecError",
    "TokenSlo",
    "load_function_spec",
    "parse_function_spec",
    "rule_of",
]
