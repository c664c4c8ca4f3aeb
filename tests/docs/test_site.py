"""The documentation site builds with no warning: no broken link, anchor or snippet.

`make test` runs `mkdocs build --strict` too; this test also reads the log, because
`mkdocs build --strict --quiet` exits 0 on warnings (mkdocs 1.6 counts only the warnings
it logs, and --quiet logs none), and it names the warnings in the failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_site_builds_strictly_with_no_warning(tmp_path: Path) -> None:
    """Scenario: `mkdocs build --strict` of mkdocs.yml into a temporary directory.
    Expected: exit 0, no WARNING or ERROR line, and the pages the README links to built
    (the quickstart, the generated configuration reference, the client API reference
    with `Fetcher`)."""
    pytest.importorskip("mkdocs")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=os.environ | {"NO_MKDOCS_2_WARNING": "1"},
    )
    problems = [line for line in done.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert (done.returncode, problems) == (0, []), done.stderr[-3000:]
    assert (tmp_path / "quickstart" / "index.html").is_file()
    assert "max_request_bytes" in (tmp_path / "operations/configuration/index.html").read_text()
    assert 'id="client.Fetcher"' in (tmp_path / "client/reference/index.html").read_text()
