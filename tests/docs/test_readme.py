"""The README is a landing page: short, and every link it makes leads somewhere.

MkDocs checks the links of the pages under docs/ (`mkdocs build --strict`); the README is
not one of them, so its relative links are checked here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_every_relative_link_of_the_readme_exists() -> None:
    """Scenario: every Markdown link in README.md that is not a URL. Expected: the file or
    directory it names exists in the repository (so it works on GitHub too)."""
    targets = [t for t in LINK.findall(README.read_text()) if "://" not in t]
    assert len(targets) >= 10, "the README links into the docs"
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert missing == [], f"README.md links to files that do not exist: {missing}"


def test_the_readme_is_a_landing_page() -> None:
    """Scenario: README.md. Expected: at most about 200 lines; `make run` and `make test`
    come first, before any section; it links to the quickstart and the configuration
    reference."""
    text = README.read_text()
    assert len(text.splitlines()) <= 210
    first_section = text.index("\n## ")
    assert "make run" in text[:first_section]
    assert "make test" in text[:first_section]
    assert "(docs/quickstart.md)" in text
    assert "(docs/operations/configuration.md)" in text
