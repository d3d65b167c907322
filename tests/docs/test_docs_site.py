"""The documentation site builds offline with ``mkdocs build --strict``, and no link of README.md or docs/ dangles.

Strict mode turns every warning into a failure: a page missing from ``nav``, a link to a file that does not
exist, or (``validation.anchors: warn`` in mkdocs.yml) to a heading that does not exist. The README is not
part of the site, so its links are checked here, with the docs' own: every relative link names an existing
file, and a link into a docs page with ``#anchor`` names one of that page's headings. Runnable code blocks of
these pages are run by ``tests/e2e/test_readme_commands.py``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((REPO_ROOT / "docs").glob("*.md"))
DOCUMENTS = [REPO_ROOT / "README.md", *DOCS]

#: ``[text](target)`` outside code: the target up to a space or the closing parenthesis.
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def prose(path: Path) -> str:
    """The document without its fenced blocks and inline code spans (links there are not links)."""
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """The anchor Python-Markdown's ``toc`` extension (MkDocs) gives a heading."""
    text = re.sub(r"[`*_]", "", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*$", text, flags=re.M)}


def relative_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path)) if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def test_the_site_builds_offline_and_strict(tmp_path):
    """``mkdocs build --strict``: every page in the nav, every internal link and anchor resolves."""
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]' (the dev extra includes it)")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    for page in DOCS:
        name = "index.html" if page.stem == "index" else f"{page.stem}/index.html"
        assert (tmp_path / "site" / name).is_file(), f"{page.name} was not built"
    html = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "fonts.googleapis.com" not in html, "the theme loads web fonts: set theme.font: false"


def test_every_docs_page_is_in_the_nav():
    nav = (REPO_ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    missing = [p.name for p in DOCS if not re.search(rf":\s*{re.escape(p.name)}\s*$", nav, flags=re.M)]
    assert not missing, f"docs pages missing from mkdocs.yml's nav: {missing}"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_relative_link_resolves(document):
    """A relative link names a file of the repository; with ``#anchor`` into a markdown page, one of its headings."""
    dangling = []
    for target in relative_links(document):
        file, _, anchor = target.partition("#")
        resolved = (document.parent / file).resolve()
        if not resolved.exists():
            dangling.append(f"{target}: no {resolved.relative_to(REPO_ROOT) if resolved.is_relative_to(REPO_ROOT) else resolved}")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            dangling.append(f"{target}: no heading #{anchor} in {file}")
    assert not dangling, "\n".join(dangling)


def test_the_link_checker_finds_links():
    """The checker is not vacuous: the README links into docs/, and a made-up link would dangle."""
    links = relative_links(REPO_ROOT / "README.md")
    assert "docs/quickstart.md" in links, links
    assert slug("The demo model's training") == "the-demo-models-training"
    assert slug("`X-MemT-Session` naming") == "x-memt-session-naming"


def test_no_reference_to_files_outside_the_repository():
    """The docs describe the design in place; they never send the reader to a file the clone lacks (DESIGN.md)."""
    stale = [f"{p.relative_to(REPO_ROOT)}: {m.group(0)}" for p in DOCUMENTS
             for m in re.finditer(r"DESIGN(?:\.md)?\s*§\s*\w+|\bDESIGN\.md\b", p.read_text(encoding="utf-8"))]
    assert not stale, stale
