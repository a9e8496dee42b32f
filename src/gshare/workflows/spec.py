"""Workflow specs: a DAG of function stages with an end-to-end latency SLO (ESG §3, §4.1).

A workflow (an *application* in ESG's words) is a list of stages; each stage names the function
it invokes and the stages it runs ``after`` (its predecessors). Linear pipelines and DAGs with
splits (one stage feeding several) and joins (a stage after several) are both allowed. The SLO
``slo_ms`` bounds the end-to-end latency: from the request's arrival to the completion of the
last stage.

YAML form (``load_workflow``)::

    name: image-classification
    slo_ms: 526
    stages:
      - {name: sr,  function: super_resolution}
      - {name: seg, function: segmentation,   after: [sr]}
      - {name: cls, function: classification, after: [seg]}

Validation (each error names the problem): an empty workflow; duplicate stage names; a
predecessor that is not a stage (names it and lists the stages); a cycle (names it, e.g.
``a -> b -> a``); an unknown function (names it and lists the known ones); an SLO outside
``(0, MAX_SLO_MS]`` ms. The known functions are ESG's six (``gshare.workflows.functions``)
unless the caller passes others (``load_workflow(..., known_functions=...)`` or the pydantic
validation context ``{"known_functions": [...]}``).

Who calls it: the CLI and the runtime (``deploy FILE``), the simulator's workload generator
(through the built-in catalogue), and ``gshare.policy.workflow`` (which only reads ``name``,
``slo_ms`` and ``stages`` — see ``policy.workflow.replan.WorkflowLike``).

This module reads a file only in ``load_workflow``; networkx is imported only by ``graph()``
(it pulls in ``socket``/``threading``, which ``gshare.policy`` must not import).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gshare.documents import DocumentError, load_yaml
from gshare.workflows.dag import kahn_order
from gshare.workflows.functions import FUNCTIONS

if TYPE_CHECKING:
    import networkx as nx

MAX_SLO_MS: Final[float] = 3_600_000.0
"""Largest accepted SLO: one hour. Anything longer is not an interactive inference SLO."""

_NAME_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


class WorkflowSpecError(ValueError):
    """A workflow spec that cannot be loaded or is invalid; the message names every problem
    (field, offending value, allowed values) on one line per problem."""


def _check_name(kind: str, v: str) -> str:
    if not _NAME_RE.match(v):
        raise ValueError(
            f"{kind} {v!r} must start with a letter or digit and contain only letters, "
            "digits, '_', '.', '-'"
        )
    return v


class StageSpec(BaseModel):
    """One stage of a workflow: an invocation of ``function`` after the stages in ``after``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """Unique within the workflow."""
    function: str
    """The serverless function the stage invokes (a key of the function catalogue)."""
    after: tuple[str, ...] = ()
    """Predecessor stages: this stage starts when all of them have completed."""

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        return _check_name("stage name", v)

    @field_validator("function")
    @classmethod
    def _function_ok(cls, v: str) -> str:
        return _check_name("function name", v)

    @field_validator("after")
    @classmethod
    def _after_unique(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        dup = sorted({p for p in v if v.count(p) > 1})
        if dup:
            raise ValueError(f"predecessor listed twice: {', '.join(dup)}")
        return v


class WorkflowSpec(BaseModel):
    """A workflow: a DAG of ``stages`` with an end-to-end ``slo_ms``.

    Invariants (checked at construction, see the module doc): non-empty; unique stage names;
    every predecessor is a stage; acyclic; every function known; ``0 < slo_ms <= MAX_SLO_MS``.
    ``stages`` keep the order they were written in; ``topological_order()`` gives a
    deterministic execution order (Kahn's algorithm, ties broken by written order).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    slo_ms: float
    """End-to-end latency objective: request arrival to completion of the last stage, ms."""
    stages: tuple[StageSpec, ...] = Field(default=())

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        return _check_name("workflow name", v)

    @field_validator("slo_ms")
    @classmethod
    def _slo_ok(cls, v: float) -> float:
        if not (math.isfinite(v) and 0.0 < v <= MAX_SLO_MS):
            raise ValueError(f"slo_ms must be in (0, {MAX_SLO_MS:.0f}] ms, got {v}")
        return v

    @model_validator(mode="after")
    def _dag_ok(self, info: ValidationInfo) -> WorkflowSpec:
        if not self.stages:
            raise ValueError(f"workflow {self.name!r} is empty: it needs at least one stage")
        names = [s.name for s in self.stages]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"workflow {self.name!r} has duplicate stage names: {', '.join(dup)}")
        known_stages = set(names)
        unknown = [
            f"stage {s.name!r} runs after unknown stage {p!r}"
            for s in self.stages
            for p in s.after
            if p not in known_stages
        ]
        if unknown:
            raise ValueError(
                f"workflow {self.name!r}: {'; '.join(unknown)} (stages: {', '.join(names)})"
            )
        cycle = find_cycle({s.name: s.after for s in self.stages})
        if cycle:
            raise ValueError(
                f"workflow {self.name!r} has a cycle: {' -> '.join([*cycle, cycle[0]])}"
            )
        known_fns = _known_functions(info.context if info is not None else None)
        bad = [s for s in self.stages if s.function not in known_fns]
        if bad:
            which = ", ".join(f"{s.function!r} (stage {s.name!r})" for s in bad)
            raise ValueError(
                f"workflow {self.name!r} uses unknown function {which}; "
                f"known functions: {', '.join(sorted(known_fns))}"
            )
        return self

    # -- queries ------------------------------------------------------------------------------

    @property
    def stage_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages)

    def stage(self, name: str) -> StageSpec:
        """The stage called ``name``; ``KeyError`` naming the known stages otherwise."""
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(
            f"workflow {self.name!r} has no stage {name!r} (stages: {', '.join(self.stage_names)})"
        )

    def function_of(self, stage: str) -> str:
        return self.stage(stage).function

    def predecessors(self) -> dict[str, tuple[str, ...]]:
        """Stage -> the stages it runs after."""
        return {s.name: s.after for s in self.stages}

    def successors(self) -> dict[str, tuple[str, ...]]:
        """Stage -> the stages that run after it (in written order)."""
        out: dict[str, list[str]] = {s.name: [] for s in self.stages}
        for s in self.stages:
            for p in s.after:
                out[p].append(s.name)
        return {k: tuple(v) for k, v in out.items()}

    def sources(self) -> tuple[str, ...]:
        """Stages without predecessors (they receive the request)."""
        return tuple(s.name for s in self.stages if not s.after)

    def sinks(self) -> tuple[str, ...]:
        """Stages without successors (the request completes when all of them have)."""
        succ = self.successors()
        return tuple(n for n in self.stage_names if not succ[n])

    def is_chain(self) -> bool:
        """True for a linear pipeline (every stage has at most one predecessor and successor)."""
        succ = self.successors()
        return len(self.sources()) == 1 and all(
            len(s.after) <= 1 and len(succ[s.name]) <= 1 for s in self.stages
        )

    def topological_order(self) -> tuple[str, ...]:
        """Stages in an execution order (Kahn; ties in written order)."""
        return topological_order(self.predecessors())

    def critical_path_ms(self, stage_ms: Mapping[str, float] | None = None) -> float:
        """Length of the longest path when stage ``s`` takes ``stage_ms[s]`` ms (default: the
        catalogue's minimum-configuration time of its function, which is ESG's ``L``, §4.1)."""
        if stage_ms is None:
            stage_ms = {s.name: FUNCTIONS[s.function].exec_ms_at_min for s in self.stages}
        finish: dict[str, float] = {}
        preds = self.predecessors()
        for n in self.topological_order():
            finish[n] = max((finish[p] for p in preds[n]), default=0.0) + stage_ms[n]
        return max(finish.values())

    def with_slo(self, slo_ms: float) -> WorkflowSpec:
        """A copy with another SLO (validated)."""
        return type(self).model_validate(
            {**self.model_dump(), "slo_ms": slo_ms},
            context={"known_functions": [s.function for s in self.stages]},
        )

    def graph(self) -> nx.DiGraph:
        """The DAG as a networkx ``DiGraph``: nodes are stage names with attribute
        ``function``; an edge ``p -> s`` for every predecessor ``p`` of ``s``; graph attributes
        ``name`` and ``slo_ms``."""
        import networkx as nx

        g = nx.DiGraph(name=self.name, slo_ms=self.slo_ms)
        for s in self.stages:
            g.add_node(s.name, function=s.function)
        for s in self.stages:
            for p in s.after:
                g.add_edge(p, s.name)
        return g


# -- helpers (pure) -----------------------------------------------------------------------------


def find_cycle(predecessors: Mapping[str, Iterable[str]]) -> list[str]:
    """One cycle of the graph ``stage -> its predecessors`` as a list of stages in execution
    order (``[a, b]`` means a -> b -> a), or ``[]`` when acyclic. Deterministic: stages are
    visited in mapping order. Predecessors that are not keys are ignored."""
    succ: dict[str, list[str]] = {n: [] for n in predecessors}
    for n, ps in predecessors.items():
        for p in ps:
            if p in succ:
                succ[p].append(n)
    colour: dict[str, int] = dict.fromkeys(succ, 0)  # 0 new, 1 on stack, 2 done
    for start in succ:
        if colour[start]:
            continue
        stack: list[tuple[str, int]] = [(start, 0)]
        path: list[str] = [start]
        colour[start] = 1
        while stack:
            node, i = stack[-1]
            if i < len(succ[node]):
                stack[-1] = (node, i + 1)
                nxt = succ[node][i]
                if colour[nxt] == 1:
                    return path[path.index(nxt) :]
                if colour[nxt] == 0:
                    colour[nxt] = 1
                    stack.append((nxt, 0))
                    path.append(nxt)
            else:
                colour[node] = 2
                stack.pop()
                path.pop()
    return []


def topological_order(predecessors: Mapping[str, Collection[str]]) -> tuple[str, ...]:
    """Kahn's algorithm on ``stage -> predecessors``, ties broken by mapping order.
    ``ValueError`` naming a cycle if there is one."""
    cycle = find_cycle(predecessors)
    if cycle:
        raise ValueError(f"cycle: {' -> '.join([*cycle, cycle[0]])}")
    return tuple(kahn_order(predecessors))


def _known_functions(context: Any) -> Collection[str]:
    if isinstance(context, Mapping) and context.get("known_functions") is not None:
        return set(context["known_functions"])
    return set(FUNCTIONS)


def _format_errors(e: ValidationError) -> str:
    lines = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        lines.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(lines)


def parse_workflow(
    data: Mapping[str, Any], *, known_functions: Collection[str] | None = None
) -> WorkflowSpec:
    """Validate a mapping (e.g. parsed YAML) into a ``WorkflowSpec``; ``WorkflowSpecError``
    with every problem on failure."""
    if not isinstance(data, Mapping):
        raise WorkflowSpecError(
            f"a workflow spec must be a mapping with name, slo_ms and stages, got "
            f"{type(data).__name__}"
        )
    ctx = {"known_functions": list(known_functions)} if known_functions is not None else None
    try:
        return WorkflowSpec.model_validate(dict(data), context=ctx)
    except ValidationError as e:
        raise WorkflowSpecError(f"invalid workflow spec: {_format_errors(e)}") from None


def load_workflow(
    path_or_text: str | Path, *, known_functions: Collection[str] | None = None
) -> WorkflowSpec:
    """Load a workflow from a YAML file or YAML text.

    ``path_or_text`` is read as a file when it is a ``Path``, or a one-line string ending in
    ``.yaml``/``.yml`` (a missing file is then an error), and parsed as YAML text otherwise.
    Raises ``WorkflowSpecError`` (one line per problem) on unreadable files, bad YAML and
    invalid specs.
    """
    if isinstance(path_or_text, Path) or (
        "\n" not in path_or_text and path_or_text.strip().endswith((".yaml", ".yml"))
    ):
        p = Path(path_or_text)
        try:
            text: str | bytes = p.read_bytes()
        except OSError as e:
            raise WorkflowSpecError(f"cannot read workflow file {str(p)!r}: {e.strerror}") from None
        source = str(p)
    else:
        text, source = path_or_text, "<text>"
    try:
        data = load_yaml(text)
    except DocumentError as e:
        raise WorkflowSpecError(f"{source}: the workflow spec {e}") from None
    try:
        return parse_workflow(data, known_functions=known_functions)
    except WorkflowSpecError as e:
        raise WorkflowSpecError(f"{source}: {e}") from None
