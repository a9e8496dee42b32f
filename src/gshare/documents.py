"""Bounded parsing of the YAML and JSON documents users send: function and workflow specs.

Who calls it: ``gshare.spec.load_function_spec`` and ``gshare.workflows.spec`` (files and text
the CLI reads), and the control API (``runtime.control.api``: a spec posted to
``/system/functions``, parsed off the event loop). A document is data a stranger may have
written, so parsing it must end quickly and in one clear error whatever it is:

* at most ``MAX_DOCUMENT_BYTES`` of UTF-8;
* nested at most ``MAX_DEPTH`` levels (a spec needs 4; deep nesting used to overflow the
  recursion limit: a 500 on the server, a traceback in the CLI);
* at most ``MAX_NODES`` values *as expanded*: YAML anchors and aliases share nodes, so a
  400-byte "billion laughs" document expands to 10^9 values in whatever walks it afterwards
  (pydantic's validation); the expanded size is counted on the composed graph, with memo,
  before anything is constructed;
* a mapping with the same key twice is an error (YAML would keep the last one silently).

Every failure is a ``DocumentError`` with a one-line message. Data layer: no I/O here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_DOCUMENT_BYTES: Final[int] = 1 << 20
MAX_DEPTH: Final[int] = 32
MAX_NODES: Final[int] = 100_000


class DocumentError(ValueError):
    """A document that is not valid, too large or too deep; the message is one line."""


class _BoundedLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses deep nesting while composing and duplicate keys."""

    _depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise DocumentError(
                    f"nested more than {MAX_DEPTH} levels deep (line {mark.line + 1})"
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, ScalarNode):
                key = key_node.value
                if key in seen:
                    raise DocumentError(
                        f"key {key!r} appears twice in one mapping "
                        f"(line {key_node.start_mark.line + 1})"
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _expanded_size(root: Node) -> int:
    """Values in the document with every alias expanded (iterative, memoised by node)."""
    memo: dict[int, int] = {}
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in memo:
            continue
        children: list[Node] = []
        if isinstance(node, SequenceNode):
            children = list(node.value)
        elif isinstance(node, MappingNode):
            children = [n for kv in node.value for n in kv]
        if done or not children:
            memo[id(node)] = 1 + sum(memo[id(c)] for c in children)
            if memo[id(node)] > MAX_NODES:
                raise DocumentError(
                    f"expands to more than {MAX_NODES} values (YAML aliases multiply them)"
                )
            continue
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in memo)
    return memo[id(root)]


def _check_json_shape(doc: Any) -> None:
    """Depth and size of a decoded JSON document (iterative)."""
    count = 0
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        v, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise DocumentError(f"has more than {MAX_NODES} values")
        if depth > MAX_DEPTH:
            raise DocumentError(f"nested more than {MAX_DEPTH} levels deep")
        if isinstance(v, dict):
            stack.extend((x, depth + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, depth + 1) for x in v)


def _text(data: str | bytes) -> str:
    if isinstance(data, bytes):
        if len(data) > MAX_DOCUMENT_BYTES:
            raise DocumentError(f"is larger than {MAX_DOCUMENT_BYTES} bytes")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DocumentError(f"is not UTF-8 text (byte {e.start})") from None
    if len(data) > MAX_DOCUMENT_BYTES:
        raise DocumentError(f"is larger than {MAX_DOCUMENT_BYTES} characters")
    return data


def load_yaml(data: str | bytes) -> Any:
    """One YAML document (JSON is YAML too) within the bounds of the module doc."""
    text = _text(data)
    if "\x00" in text:
        raise DocumentError("is not text (it contains NUL characters)")
    loader = _BoundedLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _expanded_size(root)
        return loader.construct_document(root)
    except DocumentError:
        raise
    except yaml.YAMLError as e:
        first = " ".join(str(e).split())[:300]
        raise DocumentError(f"is not valid YAML ({first})") from None
    except RecursionError:
        raise DocumentError(f"nested more than {MAX_DEPTH} levels deep") from None
    finally:
        loader.dispose()


def load_json(data: str | bytes) -> Any:
    """One JSON document within the bounds of the module doc."""
    text = _text(data)
    try:
        doc = json.loads(text)
    except RecursionError:
        raise DocumentError(f"nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as e:
        raise DocumentError(f"is not valid JSON ({e})") from None
    _check_json_shape(doc)
    return doc


__all__ = [
    "MAX_DEPTH",
    "MAX_DOCUMENT_BYTES",
    "MAX_NODES",
    "DocumentError",
    "load_json",
    "load_yaml",
]


def short_repr(v: Any) -> str:
    """``repr(v)`` cut to 60 characters (an offending value in an error line)."""
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def one_line_errors(
    errors: Iterable[Mapping[str, Any]],
    *,
    path_of: Callable[[list[Any]], list[Any]],
    rule_of: Callable[[list[Any]], str | None],
    allowed_of: Callable[[list[Any]], Sequence[str]],
) -> str:
    """pydantic's ``ValidationError.errors()`` as ONE line, ``path: must be <rule>, got
    <value>`` per error joined by ``"; "`` (duplicates dropped) — the wording of every spec
    error (``gshare.spec``, ``gshare.scenario``). ``path_of`` normalises a location (drops the
    union member names pydantic adds), ``rule_of`` gives the allowed values of a field,
    ``allowed_of`` the fields of a mapping (for an unknown field). A cross-field check whose
    message starts with ``@sub: ...`` names its sub-field itself."""
    out: list[str] = []
    for err in errors:
        loc = path_of(list(err["loc"]))
        path = ".".join(str(x) for x in loc)
        msg = str(err["msg"]).removeprefix("Value error, ")
        if msg.startswith("@"):
            sub, _, rest = msg[1:].partition(": ")
            out.append(f"{path + '.' if path else ''}{sub}: {rest}")
        elif err["type"] == "missing":
            out.append(f"{path}: required, must be {rule_of(loc) or 'set'}")
        elif err["type"] == "extra_forbidden":
            out.append(f"{path}: unknown field (allowed: {', '.join(allowed_of(loc[:-1]))})")
        else:
            rule = rule_of(loc)
            got = short_repr(err.get("input"))
            out.append(
                f"{path}: must be {rule}, got {got}" if rule else f"{path}: {msg}, got {got}"
            )
    return "; ".join(dict.fromkeys(out))
