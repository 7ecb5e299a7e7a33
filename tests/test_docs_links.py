"""Everything the repository's text points to is in the repository: relative Markdown links (and their
#anchors), "docs/X.md section N" citations in code and docs, and no reference to a science document that
only exists outside a clone. Links that leave the repository go to public papers and packages only."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {
    ".git",
    ".venv",
    ".venv-verl",
    ".venv-bench",
    ".hypothesis",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    "__pycache__",
    "node_modules",
    "build",
    "dist",
    "test-artifacts",
}
TEXT_SUFFIXES = {".py", ".md", ".toml", ".json", ".yml", ".yaml", ".txt", ".cfg", ".ini", ".sh"}
EXTERNAL_HOSTS = {"arxiv.org", "pypi.org", "doi.org"}
"""Public papers and packages: the only places a link may leave the repository for."""

LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CITATION = re.compile(r"\b(docs/[\w.-]+\.md),? (?:sections?|sec\.) (\d+)(?:\s*-\s*(\d+))?")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)


def _files(suffixes: set[str], root: Path = ROOT) -> Iterator[Path]:
    for path in sorted(root.iterdir()):
        if path.is_dir():
            if path.name not in SKIP_DIRS and not path.name.endswith(".egg-info"):
                yield from _files(suffixes, path)
        elif path.suffix in suffixes:
            yield path


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _prose(markdown: str) -> str:
    """The Markdown without code blocks and code spans, where bracketed text is not a link."""
    return INLINE_CODE.sub("", FENCE.sub("", markdown))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(markdown: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for match in HEADING.finditer(FENCE.sub("", markdown.read_text(encoding="utf-8"))):
        base = slug(match.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def numbered_sections(markdown: Path) -> set[int]:
    """Numbers of the headings written "## N. Title" (what a "section N" citation names)."""
    text = FENCE.sub("", markdown.read_text(encoding="utf-8"))
    return {int(m.group(2).split(".")[0]) for m in HEADING.finditer(text) if re.match(r"\d+\.", m.group(2))}


MARKDOWN = list(_files({".md"}))
TEXT = list(_files(TEXT_SUFFIXES))


def test_the_walk_finds_the_documents() -> None:
    names = {_rel(p) for p in MARKDOWN}
    assert {"README.md", "docs/science.md", "docs/detector.md"} <= names


def test_slug_matches_github() -> None:
    assert slug("2. Likelihood displacement: what the hooks measure") == (
        "2-likelihood-displacement-what-the-hooks-measure"
    )
    assert slug("Deploying (compose)") == "deploying-compose"
    assert slug("LLDS and SAPO (docs/science.md sections 4-5)") == "llds-and-sapo-docssciencemd-sections-4-5"


@pytest.mark.parametrize("doc", MARKDOWN, ids=_rel)
def test_relative_links_resolve(doc: Path) -> None:
    broken: list[str] = []
    for match in LINK.finditer(_prose(doc.read_text(encoding="utf-8"))):
        target = match.group(1)
        parts = urlsplit(target)
        if parts.scheme or target.startswith("//"):
            continue  # external: test_external_links_are_papers_or_packages
        path, fragment = unquote(parts.path), unquote(parts.fragment)
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif not dest.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{fragment} in {_rel(dest)}")
    assert not broken, f"{_rel(doc)}: " + "; ".join(broken)


@pytest.mark.parametrize("doc", MARKDOWN, ids=_rel)
def test_external_links_are_papers_or_packages(doc: Path) -> None:
    """A newcomer's clone is the whole product: other links would lead to pages nobody here controls."""
    foreign = []
    for match in LINK.finditer(_prose(doc.read_text(encoding="utf-8"))):
        parts = urlsplit(match.group(1))
        if parts.scheme in ("http", "https") and (parts.hostname or "") not in EXTERNAL_HOSTS:
            foreign.append(match.group(1))
    assert not foreign, f"{_rel(doc)} links outside the repository: {foreign}"


def _citations() -> Iterator[tuple[str, int, str, int]]:
    for path in TEXT:
        for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for match in CITATION.finditer(line):
                first = int(match.group(2))
                last = int(match.group(3) or first)
                for number in range(first, last + 1):
                    yield _rel(path), lineno, match.group(1), number


def test_section_citations_resolve() -> None:
    """ "docs/science.md section 4" in a comment must name a file and a numbered heading that exist."""
    citations = list(_citations())
    assert any(doc == "docs/science.md" for _, _, doc, _ in citations), "no citation found: pattern broken?"
    broken = []
    for where, lineno, doc, number in citations:
        target = ROOT / doc
        if not target.is_file():
            broken.append(f"{where}:{lineno}: {doc} does not exist")
        elif number not in numbered_sections(target):
            broken.append(f"{where}:{lineno}: {doc} has no heading '## {number}. ...'")
    assert not broken, "\n".join(broken)


def test_no_citation_of_documents_outside_the_repository() -> None:
    """The science reference lives in docs/; a clone has no ../shared/docs, and the old file name
    would send a reader looking for a document that is not there."""
    offenders = []
    for path in TEXT:
        if path.suffix not in (".py", ".md") or _rel(path).startswith("tests/"):
            continue
        for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if re.search(r"shared/docs|lld-reference\.md|lld-ref\. sec", line):
                offenders.append(f"{_rel(path)}:{lineno}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_science_reference_covers_what_the_code_cites() -> None:
    """The sections the code cites, in the order it cites them, with the paper it follows."""
    science = ROOT / "docs" / "science.md"
    assert numbered_sections(science) == {1, 2, 3, 4, 5, 6}
    text = science.read_text(encoding="utf-8")
    for term in ("arxiv.org/abs/2512.04220", "D = log pi_new", "anchor set", "lld/xmb/", "LLDS", "SAPO"):
        assert term in text, term
