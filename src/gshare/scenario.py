"""Scenarios: one file that describes a load on gshare, run in either world — the simulator
(``gshare simulate``, ``gshare.experiments.scenario_sim``) or a live server (``gshare load``,
``gshare.experiments.scenario_load``) — with the same functions, workflows and arrival times.

YAML form (``load_scenario``; paths are relative to the scenario file)::

    name: mlp-chain                    # letters, digits, '_', '.', '-'
    description: three mlp stages and one plain function
    seed: 1                            # the arrival times (and the simulator's noise)
    duration_s: 60                     # arrivals in [0, duration_s)
    quick_duration_s: 10               # --quick: this instead of duration_s
    warmup_s: 0                        # arrivals before this are served, not measured
    functions: [mlp-chain/mlp-1.yaml, ...]     # function specs (``gshare deploy`` files)
    workflows: [mlp-chain/workflow.yaml]       # workflow specs over those functions
    profiles: mlp-profile.csv          # optional: ProfileTable CSV(s) for the simulator
    cluster:
      nodes: 1
      devices_per_node: 1
      local_latency_ms: 1.0            # a stage input on the same device (simulator)
      remote_latency_ms: 2.0           # ... from another device
      dispatch_ms: 0.0                 # per stage task: the live hop beyond the profile
      frontend_ms: 0.0                 # per workflow request: the client's HTTP exchange
    policies:
      workflow: esg                    # the workflow scheduler (policy.workflow.esg)
      autoscaler: gshare-burst         # for function workloads (policy.autoscale)
    workloads:                         # one per workflow or function; ONE arrival process
      - workflow: mlp-chain
        poisson: {rate_rps: 10}
      - function: mlp-solo
        uniform: {interval_ms: 50}     # or {lo_ms: 40, hi_ms: 60}
        # trace: {format: azure2019, path: ..., rate_rps: 20, start_minute: 600, minutes: 1,
        #         rank: 0, repeat: true}        (formats: azure2019 | azure2021 | llm)
        # input: request.bin           # raw bytes sent by ``gshare load`` (or input_json: ...)
      - function: gen                  # a generative function (model: causal-lm-*)
        trace: {format: llm, rate_rps: 4}
        tokens: {prompt_scale: 64, max_prompt_tokens: 200, max_tokens: 128}
        # each request's prompt and generated token counts: the LLM trace's rows in order
        # (ContextTokens / prompt_scale, at least min_prompt_tokens, at most max_prompt_tokens;
        # GeneratedTokens / generated_scale, at least 1, at most max_tokens); path: another
        # trace of that format. A generative function's workload without tokens: the defaults.

Errors: every problem raises ``ScenarioError`` with ONE line naming the field by its dotted
path (list items by index: ``workloads.1.poisson.rate_rps``), what is allowed and what was
given; several problems are joined with ``"; "``. Unknown fields are errors. A referenced
function or workflow spec that does not load is reported with its field and the spec's own
error (``functions.0: examples/x.yaml: resources.sm_pct: must be ...``).

The policy names are checked by the front ends (``scenario_sim.check_policies``): this module
is data (layer 0, docs/DESIGN.md §1) and does not import ``gshare.policy``. It reads files
only in ``load_scenario``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gshare.documents import DocumentError, load_yaml, one_line_errors
from gshare.profiles import ProfileError, ProfilePoint, ProfileTable
from gshare.spec import GENERATIVE_MODELS, FunctionSpec, Int, Num, SpecError, load_function_spec
from gshare.workflows.spec import WorkflowSpec, WorkflowSpecError, load_workflow

MAX_DURATION_S: Final[float] = 7 * 86_400.0
"""Longest accepted run: a week (a guard against typos)."""
MAX_RATE_RPS: Final[float] = 1_000_000.0
MIN_INTERVAL_MS: Final[float] = 1000.0 / MAX_RATE_RPS
"""The shortest uniform interval: MAX_RATE_RPS as an interval (0.001 ms)."""
MAX_ARRIVALS: Final[int] = 5_000_000
"""Most arrivals one scenario may ask for (every workload's rate x duration_s, summed): the
arrival times and the simulator's per-request records must fit a machine's memory (about
1 KiB a request in the simulator: 5 GiB at this bound)."""
MAX_NODES: Final[int] = 100_000
MAX_DEVICES_PER_NODE: Final[int] = 64
TRACE_FORMATS: Final[tuple[str, ...]] = ("azure2019", "azure2021", "llm")

_NAME_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$")

FIELD_RULES: Final[Mapping[str, str]] = {
    "name": "1..100 letters, digits, '_', '.', '-' (starting with a letter or digit)",
    "description": "a string",
    "seed": "an integer >= 0",
    "duration_s": f"a number in (0, {MAX_DURATION_S:.0f}] (seconds)",
    "quick_duration_s": f"a number in (0, {MAX_DURATION_S:.0f}] (seconds)",
    "warmup_s": "a number in [0, duration_s) (seconds)",
    "functions": "a non-empty list of function spec files",
    "workflows": "a list of workflow spec files",
    "profiles": "a profile CSV file (model,sm_pct,quota_pct,batch,latency_ms) or a list of them",
    "cluster": (
        "a mapping with nodes, devices_per_node, local_latency_ms, remote_latency_ms, "
        "dispatch_ms, frontend_ms"
    ),
    "cluster.nodes": f"an integer in [1, {MAX_NODES}]",
    "cluster.devices_per_node": f"an integer in [1, {MAX_DEVICES_PER_NODE}]",
    "cluster.local_latency_ms": "a number >= 0 (ms)",
    "cluster.remote_latency_ms": "a number >= 0 (ms)",
    "cluster.dispatch_ms": "a number >= 0 (ms)",
    "cluster.frontend_ms": "a number >= 0 (ms)",
    "policies": "a mapping with workflow, autoscaler",
    "policies.workflow": "a workflow scheduler name (esg, fast-gshare, infless, orion, aquatope)",
    "policies.autoscaler": "an autoscaler name (gshare-burst, fast-heuristic, target-util)",
    "workloads": "a non-empty list of workloads",
    "workloads.workflow": "the name of a workflow of the scenario",
    "workloads.function": "the name of a function of the scenario",
    "workloads.poisson": "a mapping with rate_rps",
    "workloads.poisson.rate_rps": f"a number in (0, {MAX_RATE_RPS:.0f}] (requests per second)",
    "workloads.uniform": "a mapping with interval_ms, or with lo_ms and hi_ms",
    "workloads.uniform.interval_ms": f"a number >= {MIN_INTERVAL_MS:g} (ms)",
    "workloads.uniform.lo_ms": f"a number >= {MIN_INTERVAL_MS:g} (ms)",
    "workloads.uniform.hi_ms": "a number >= lo_ms (ms)",
    "workloads.trace": "a mapping with format and optionally path, rate_rps, repeat, ...",
    "workloads.trace.format": f"one of {', '.join(TRACE_FORMATS)}",
    "workloads.trace.path": "a trace file (default: the one shipped for the format)",
    "workloads.trace.rate_rps": f"a number in (0, {MAX_RATE_RPS:.0f}] or null (the trace's own)",
    "workloads.trace.repeat": "true or false",
    "workloads.trace.start_minute": "an integer in [0, 1439] (azure2019 only)",
    "workloads.trace.minutes": "an integer in [1, 1440] (azure2019 only)",
    "workloads.trace.rank": "an integer >= 0: the rank-th busiest function (azure2019 only)",
    "workloads.input": "a file whose bytes are each request's body",
    "workloads.tokens": (
        "a mapping with path, prompt_scale, generated_scale, min_prompt_tokens, "
        "max_prompt_tokens, max_tokens (generative functions only)"
    ),
    "workloads.tokens.path": "an LLM trace file (default: the shipped code trace)",
    "workloads.tokens.prompt_scale": "a number > 0: the trace's context tokens are divided by it",
    "workloads.tokens.generated_scale": "a number > 0: its generated tokens are divided by it",
    "workloads.tokens.min_prompt_tokens": "an integer >= 1",
    "workloads.tokens.max_prompt_tokens": "an integer >= min_prompt_tokens, or null",
    "workloads.tokens.max_tokens": "an integer >= 1, or null (the generated tokens' cap)",
    "workloads.input_json": "any JSON value: each request's body",
}


class ScenarioError(ValueError):
    """A scenario that cannot be read or is invalid; the message is one line naming the
    offending field(s) (module doc)."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Poisson(_Model):
    """Exponential inter-arrival times at ``rate_rps``."""

    rate_rps: Num = Field(gt=0, le=MAX_RATE_RPS)


class Uniform(_Model):
    """Constant intervals (``interval_ms``) or intervals drawn uniformly in ``[lo_ms, hi_ms]``
    (ESG §4.1's streams)."""

    interval_ms: Num | None = Field(default=None, ge=MIN_INTERVAL_MS)
    lo_ms: Num | None = Field(default=None, ge=MIN_INTERVAL_MS)
    hi_ms: Num | None = Field(default=None, ge=MIN_INTERVAL_MS)

    @model_validator(mode="after")
    def _one_form(self) -> Uniform:
        ranged = self.lo_ms is not None or self.hi_ms is not None
        if self.interval_ms is not None and ranged:
            raise ValueError("@interval_ms: give interval_ms, or lo_ms and hi_ms, not both")
        if self.interval_ms is None:
            if self.lo_ms is None or self.hi_ms is None:
                raise ValueError("@interval_ms: required (or both lo_ms and hi_ms)")
            if self.hi_ms < self.lo_ms:
                raise ValueError(
                    f"@hi_ms: must be a number >= lo_ms={self.lo_ms:g} (ms), got {self.hi_ms:g}"
                )
        return self


class Trace(_Model):
    """A replay of a shipped (or given) trace (``gshare.sim.workload``'s readers), optionally
    time-scaled to a mean rate and repeated end to end to fill the duration."""

    format: Literal["azure2019", "azure2021", "llm"]
    path: str | None = None
    """The trace file; None: the one shipped in ``gshare/data`` for the format."""
    rate_rps: Num | None = Field(default=None, gt=0, le=MAX_RATE_RPS)
    """Scale the trace in time to this mean rate (its shape kept); None: its own timing."""
    repeat: bool = True
    """Repeat the trace end to end until the duration is filled."""
    start_minute: Int | None = Field(default=None, ge=0, le=1439)
    minutes: Int | None = Field(default=None, ge=1, le=1440)
    rank: Int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _azure2019_only(self) -> Trace:
        if self.format != "azure2019":
            for k in ("start_minute", "minutes", "rank"):
                if getattr(self, k) is not None:
                    raise ValueError(f"@{k}: only for format azure2019, got format {self.format}")
        return self


class Tokens(_Model):
    """The prompt and generated token counts of a generative function's requests: the rows of
    an LLM trace (``sim.workload.azure_llm_tokens``) in order, scaled and clamped (module
    doc; ``experiments.scenario_arrivals.request_tokens``)."""

    path: str | None = None
    prompt_scale: Num = Field(default=1.0, gt=0)
    generated_scale: Num = Field(default=1.0, gt=0)
    min_prompt_tokens: Int = Field(default=1, ge=1)
    max_prompt_tokens: Int | None = Field(default=None, ge=1)
    max_tokens: Int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _range(self) -> Tokens:
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < self.min_prompt_tokens:
            raise ValueError(
                f"@max_prompt_tokens: must be an integer >= min_prompt_tokens="
                f"{self.min_prompt_tokens}, got {self.max_prompt_tokens}"
            )
        return self


class Workload(_Model):
    """The arrivals of one workflow or function (exactly one of each pair)."""

    workflow: str | None = None
    function: str | None = None
    poisson: Poisson | None = None
    uniform: Uniform | None = None
    trace: Trace | None = None
    input: str | None = None
    """A file whose bytes are every request's body (``gshare load``)."""
    input_json: Any = None
    """A JSON value sent as every request's body (``gshare load``)."""
    tokens: Tokens | None = None
    """A generative function's token counts per request (None: ``Tokens()``'s defaults)."""

    @model_validator(mode="after")
    def _one_each(self) -> Workload:
        if (self.workflow is None) == (self.function is None):
            got = "both" if self.workflow is not None else "neither"
            raise ValueError(
                f"@workflow: exactly one of workflow or function must be set, got {got}"
            )
        kinds = [k for k in ("poisson", "uniform", "trace") if getattr(self, k) is not None]
        if len(kinds) != 1:
            got = " and ".join(kinds) if kinds else "none"
            raise ValueError(
                f"@poisson: exactly one arrival process (poisson, uniform or trace), got {got}"
            )
        if self.input is not None and self.input_json is not None:
            raise ValueError("@input: give input or input_json, not both")
        return self

    def mean_rate_rps(self) -> float | None:
        """Its mean arrival rate as written (None: a trace at its own rate)."""
        if self.poisson is not None:
            return float(self.poisson.rate_rps)
        if self.uniform is not None:
            u = self.uniform
            if u.interval_ms is not None:
                return 1000.0 / float(u.interval_ms)
            return 2000.0 / (float(u.lo_ms or 0) + float(u.hi_ms or 0))
        assert self.trace is not None
        return None if self.trace.rate_rps is None else float(self.trace.rate_rps)

    @property
    def target(self) -> str:
        """The workflow's or function's name."""
        return self.workflow if self.workflow is not None else str(self.function)

    @property
    def kind(self) -> Literal["workflow", "function"]:
        return "workflow" if self.workflow is not None else "function"

    @property
    def process(self) -> str:
        """``poisson``, ``uniform`` or ``trace``."""
        return next(k for k in ("poisson", "uniform", "trace") if getattr(self, k) is not None)


class Cluster(_Model):
    """The simulated cluster (the live one is whatever the server runs on)."""

    nodes: Int = Field(default=1, ge=1, le=MAX_NODES)
    devices_per_node: Int = Field(default=1, ge=1, le=MAX_DEVICES_PER_NODE)
    local_latency_ms: Num = Field(default=1.0, ge=0)
    """A stage's input from a stage that ran on the same device."""
    remote_latency_ms: Num = Field(default=2.0, ge=0)
    """A stage's input from a stage that ran on another device."""
    dispatch_ms: Num = Field(default=0.0, ge=0)
    """The live mechanism's cost per stage task beyond the profiled time (the scheduler's hop,
    input decoding, a quota change; ``WorkflowSimConfig.dispatch_ms``)."""
    frontend_ms: Num = Field(default=0.0, ge=0)
    """A workflow request's cost outside its stages (the client's HTTP exchange)."""

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node


class Policies(_Model):
    """Policy names (checked by the front ends against the registries)."""

    workflow: str = "esg"
    autoscaler: str = "gshare-burst"


class ScenarioDoc(_Model):
    """The scenario file as written (paths not resolved; module doc)."""

    name: str
    description: str = ""
    seed: Int = Field(default=0, ge=0)
    duration_s: Num = Field(gt=0, le=MAX_DURATION_S)
    quick_duration_s: Num = Field(default=10.0, gt=0, le=MAX_DURATION_S)
    warmup_s: Num = Field(default=0.0, ge=0)
    functions: tuple[str, ...] = Field(min_length=1)
    workflows: tuple[str, ...] = ()
    profiles: str | tuple[str, ...] | None = None
    cluster: Cluster = Field(default_factory=Cluster)
    policies: Policies = Field(default_factory=Policies)
    workloads: tuple[Workload, ...] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError("bad name")
        return v

    @model_validator(mode="after")
    def _warmup_ok(self) -> ScenarioDoc:
        if self.warmup_s >= self.duration_s:
            raise ValueError(
                f"@warmup_s: must be a number in [0, duration_s={self.duration_s:g}), "
                f"got {self.warmup_s:g}"
            )
        return self

    @model_validator(mode="after")
    def _arrivals_fit(self) -> ScenarioDoc:
        rates = [w.mean_rate_rps() or 0.0 for w in self.workloads]
        total = sum(rates) * float(self.duration_s)
        if total > MAX_ARRIVALS:
            worst = max(range(len(rates)), key=lambda i: rates[i])
            raise ValueError(
                f"@workloads: {total:.3g} arrivals over duration_s={self.duration_s:g} is more "
                f"than the {MAX_ARRIVALS:,} a scenario may ask for (workload {worst} alone: "
                f"{rates[worst]:.3g} requests/s); shorten duration_s or lower the rates"
            )
        return self

    @property
    def profile_files(self) -> tuple[str, ...]:
        if self.profiles is None:
            return ()
        return (self.profiles,) if isinstance(self.profiles, str) else self.profiles


@dataclass(frozen=True)
class Scenario:
    """A loaded scenario: the document, its function and workflow specs, its profile table and
    its workloads with every path resolved (``input`` and ``trace.path`` absolute)."""

    path: Path
    doc: ScenarioDoc
    functions: Mapping[str, FunctionSpec]
    """By name, in the order of ``functions``."""
    workflows: Mapping[str, WorkflowSpec]
    workflow_files: Mapping[str, Path]
    profiles: ProfileTable | None
    """The rows of ``profiles`` (model = a function's name or a built-in model's), or None."""
    workloads: tuple[Workload, ...]

    @property
    def name(self) -> str:
        return self.doc.name

    @property
    def seed(self) -> int:
        return self.doc.seed

    @property
    def cluster(self) -> Cluster:
        return self.doc.cluster

    @property
    def policies(self) -> Policies:
        return self.doc.policies

    def duration_s(self, quick: bool = False) -> float:
        """The run's length: ``quick_duration_s`` (at most ``duration_s``) when ``quick``."""
        d = self.doc.duration_s
        return min(d, self.doc.quick_duration_s) if quick else d

    def workflow_functions(self) -> list[str]:
        """Functions used by the workflows that have a workload, in scenario order."""
        used = {
            s.function
            for w in self.workloads
            if w.workflow is not None
            for s in self.workflows[w.workflow].stages
        }
        return [f for f in self.functions if f in used]

    def function_workloads(self) -> list[Workload]:
        return [w for w in self.workloads if w.function is not None]

    def workflow_workloads(self) -> list[Workload]:
        return [w for w in self.workloads if w.workflow is not None]


# -- errors -------------------------------------------------------------------------------------


_MODELS: Final[Mapping[str, type[BaseModel]]] = {
    "": ScenarioDoc,
    "cluster": Cluster,
    "policies": Policies,
    "workloads": Workload,
    "workloads.poisson": Poisson,
    "workloads.uniform": Uniform,
    "workloads.trace": Trace,
    "workloads.tokens": Tokens,
}


def _rule_path(loc: Sequence[str | int]) -> str:
    """A location without list indices (the key of ``FIELD_RULES`` and ``_MODELS``)."""
    return ".".join(str(x) for x in loc if not isinstance(x, int))


def _path_of(loc: list[Any]) -> list[Any]:
    """A location without the union member name pydantic adds under ``profiles``."""
    if loc[:1] == ["profiles"] and loc[1:2] and loc[1] in ("str", "tuple[str, ...]"):
        del loc[1]
    return loc


def _format_errors(e: ValidationError) -> str:
    """One line: ``path: must be <rule>, got <value>`` per error, joined by ``"; "`` (the
    wording of ``gshare.spec``'s errors, ``documents.one_line_errors``)."""
    return one_line_errors(
        e.errors(),
        path_of=_path_of,
        rule_of=lambda loc: FIELD_RULES.get(_rule_path(loc)),
        allowed_of=lambda parent: list(_MODELS.get(_rule_path(parent), ScenarioDoc).model_fields),
    )


# -- loading ------------------------------------------------------------------------------------


def parse_scenario_doc(data: Any) -> ScenarioDoc:
    """Validate a mapping (parsed YAML) into a ``ScenarioDoc``; ``ScenarioError`` (one line)."""
    if not isinstance(data, Mapping):
        raise ScenarioError(
            "a scenario must be a mapping with at least name, duration_s, functions and "
            f"workloads, got {type(data).__name__}"
        )
    try:
        return ScenarioDoc.model_validate(dict(data))
    except ValidationError as e:
        raise ScenarioError(_format_errors(e)) from None


def _resolve(base: Path, p: str) -> Path:
    q = Path(p).expanduser()
    return q if q.is_absolute() else (base / q).resolve()


def _file(base: Path, p: str, field: str) -> Path:
    q = _resolve(base, p)
    if not q.is_file():
        raise ScenarioError(f"{field}: no file {str(q)!r}")
    return q


def build_scenario(doc: ScenarioDoc, path: Path) -> Scenario:
    """Load what ``doc`` references (specs, profiles, trace and input files) relative to the
    scenario file ``path`` and check the cross references; ``ScenarioError`` (one line)."""
    base = path.resolve().parent
    functions: dict[str, FunctionSpec] = {}
    where: dict[str, int] = {}
    for i, f in enumerate(doc.functions):
        field = f"functions.{i}"
        try:
            spec = load_function_spec(_file(base, f, field))
        except SpecError as e:
            raise ScenarioError(f"{field}: {e}") from None
        if spec.name in functions:
            raise ScenarioError(
                f"{field}: function {spec.name!r} is already defined by "
                f"functions.{where[spec.name]}"
            )
        functions[spec.name] = spec
        where[spec.name] = i
    workflows: dict[str, WorkflowSpec] = {}
    wf_files: dict[str, Path] = {}
    for i, f in enumerate(doc.workflows):
        field = f"workflows.{i}"
        p = _file(base, f, field)
        try:
            wf = load_workflow(p, known_functions=list(functions))
        except WorkflowSpecError as e:
            raise ScenarioError(f"{field}: {e}") from None
        if wf.name in workflows:
            raise ScenarioError(f"{field}: workflow {wf.name!r} is defined twice")
        workflows[wf.name] = wf
        wf_files[wf.name] = p
    table: ProfileTable | None = None
    if doc.profile_files:
        rows: list[ProfilePoint] = []
        for i, f in enumerate(doc.profile_files):
            field = "profiles" if isinstance(doc.profiles, str) else f"profiles.{i}"
            try:
                rows.extend(ProfileTable.from_csv(_file(base, f, field)))
            except (ProfileError, OSError, UnicodeDecodeError) as e:
                raise ScenarioError(f"{field}: {e}") from None
        try:
            table = ProfileTable(rows)
        except ProfileError as e:
            raise ScenarioError(f"profiles: {e}") from None
    workloads: list[Workload] = []
    for i, w in enumerate(doc.workloads):
        field = f"workloads.{i}"
        if w.workflow is not None and w.workflow not in workflows:
            known = ", ".join(workflows) or "none"
            raise ScenarioError(
                f"{field}.workflow: unknown workflow {w.workflow!r} (the scenario's workflows: "
                f"{known})"
            )
        if w.function is not None and w.function not in functions:
            raise ScenarioError(
                f"{field}.function: unknown function {w.function!r} (the scenario's functions: "
                f"{', '.join(functions)})"
            )
        update: dict[str, Any] = {}
        if w.input is not None:
            update["input"] = str(_file(base, w.input, f"{field}.input"))
        if w.tokens is not None:
            fspec = functions.get(str(w.function)) if w.function is not None else None
            if fspec is None or not fspec.is_generative_builtin:
                raise ScenarioError(
                    f"{field}.tokens: token counts are for a generative function's workload "
                    f"(model one of {', '.join(GENERATIVE_MODELS)}), got {w.target!r}"
                )
            if w.tokens.path is not None:
                tp = _file(base, w.tokens.path, f"{field}.tokens.path")
                update["tokens"] = w.tokens.model_copy(update={"path": str(tp)})
        if w.trace is not None and w.trace.path is not None:
            tp = _file(base, w.trace.path, f"{field}.trace.path")
            update["trace"] = w.trace.model_copy(update={"path": str(tp)})
        workloads.append(w.model_copy(update=update) if update else w)
    return Scenario(path, doc, functions, workflows, wf_files, table, tuple(workloads))


def load_scenario(path: str | Path) -> Scenario:
    """Read, validate and load a scenario file (module doc); ``ScenarioError`` with one line
    that starts with the file's path otherwise."""
    p = Path(path)
    try:
        text = p.read_bytes()
    except OSError as e:
        raise ScenarioError(f"cannot read scenario {str(p)!r}: {e.strerror}") from None
    try:
        data = load_yaml(text)
    except DocumentError as e:
        raise ScenarioError(f"{p}: the scenario {e}") from None
    try:
        return build_scenario(parse_scenario_doc(data), p)
    except ScenarioError as e:
        raise ScenarioError(f"{p}: {e}") from None


__all__ = [
    "FIELD_RULES",
    "TRACE_FORMATS",
    "Cluster",
    "Policies",
    "Poisson",
    "Scenario",
    "ScenarioDoc",
    "ScenarioError",
    "Tokens",
    "Trace",
    "Uniform",
    "Workload",
    "build_scenario",
    "load_scenario",
    "parse_scenario_doc",
]
