"""Every relative link in the README and in ``docs/`` points at something that exists (a file or
folder of the repository; an anchor is not checked, only its file)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def relative_links(text: str) -> list[str]:
    """The targets of ``[text](target)`` links that are paths in the repository (not web
    addresses, mail links or anchors within the page)."""
    out = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        out.append(target.split("#", 1)[0])
    return out


def test_relative_links_are_found_by_the_pattern() -> None:
    text = '[a](docs/x.md) [b](https://e.org) [c](#top) [d](../y.md#sec "t") [e](mailto:a@b)'
    assert relative_links(text) == ["docs/x.md", "../y.md"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    broken = [t for t in relative_links(doc.read_text()) if not (doc.parent / t).resolve().exists()]
    assert not broken, f"{doc.relative_to(ROOT)}: broken links {broken}"
