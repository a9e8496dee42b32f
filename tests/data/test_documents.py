"""Bounded parsing of user documents (``gshare.documents``): every hostile document is one
``DocumentError`` line, fast; good documents parse as before."""

from __future__ import annotations

import pytest

from gshare.documents import MAX_DEPTH, DocumentError, load_json, load_yaml

BOMB = "\n".join(
    [f"l0: &l0 [{', '.join(['lol'] * 9)}]"]
    + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
)
"""A YAML "billion laughs": 9^9 values as expanded, 500 bytes as written."""


def test_good_documents_parse() -> None:
    assert load_yaml("name: a\nresources: {sm_pct: 50}\n") == {
        "name": "a",
        "resources": {"sm_pct": 50},
    }
    assert load_yaml(b"a: [1, 2]") == {"a": [1, 2]}
    assert load_yaml("") is None
    assert load_json('{"a": [1, {"b": 2}]}') == {"a": [1, {"b": 2}]}
    # an alias used a few times is fine (it is YAML)
    assert load_yaml("x: &x [1, 2]\ny: *x\n") == {"x": [1, 2], "y": [1, 2]}
    # nesting up to the bound is fine
    assert load_yaml("a: " + "[" * (MAX_DEPTH - 2) + "]" * (MAX_DEPTH - 2)) is not None


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ("a: " + "[" * 3000 + "]" * 3000, "nested more than"),
        ("a:\n" + "".join(" " * i + "- \n" for i in range(1, 80)), "nested more than"),
        (BOMB, "expands to more than"),
        ("name: a\nname: b\n", "appears twice"),
        (b"\xff\xfe\x00n\x00a\x00m\x00e", "not UTF-8"),
        ("a\x00b", "NUL"),
        ("a: [", "not valid YAML"),
        ("x" * (2 << 20), "larger than"),
    ],
)
def test_hostile_yaml_is_one_error_line(doc: str | bytes, fragment: str) -> None:
    with pytest.raises(DocumentError) as ei:
        load_yaml(doc)
    assert fragment in str(ei.value) and "\n" not in str(ei.value)


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ("[" * 5000 + "]" * 5000, "nested more than"),
        ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "nested more than"),
        ("[" + ",".join(["0"] * 200_001) + "]", "more than"),
        ("{bad", "not valid JSON"),
    ],
)
def test_hostile_json_is_one_error_line(doc: str, fragment: str) -> None:
    with pytest.raises(DocumentError) as ei:
        load_json(doc)
    assert fragment in str(ei.value)
