"""The docs' code examples run, and every example in the docs is a file some test runs.

Examples live as files under ``docs/examples/`` and pages include them with
``--8<-- "docs/examples/NAME.py"`` (pymdownx.snippets), so what a reader copies is what a
test ran. ``client_quickstart.py`` is run by ``tests/test_readme_example.py``; this module
runs the others and checks the rule for every page.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._certs import Pki
from tests.broker.test_cli_security import _tls_serve

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXAMPLES = DOCS / "examples"
#: A ```python block and its body.
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)
SNIPPET = re.compile(r'^--8<-- "(docs/examples/[\w.]+)"$')
TIMEOUT_S = 60


def _pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "examples" not in p.parts)


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        args,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
        env=os.environ | {"PYTHONPATH": str(ROOT)} | (env or {}),
    )
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def _shown_after(page: Path, marker: str) -> str:
    """The body of the first ```text block after ``marker`` on ``page``."""
    text = page.read_text()
    rest = text[text.index(marker) :]
    start = rest.index("```text\n") + len("```text\n")
    return rest[start : rest.index("```", start)]


def test_every_python_block_in_the_docs_is_an_example_file() -> None:
    """Scenario: every ```python block of every page under docs/. Expected: each is one
    snippet line that includes an existing file under docs/examples/ (code written
    straight into a page would be run by no test)."""
    inline = []
    for page in _pages():
        for body in PYTHON_BLOCK.findall(page.read_text()):
            match = SNIPPET.match(body.strip())
            if match is None or not (ROOT / match[1]).is_file():
                inline.append(f"{page.relative_to(ROOT)}: {body.strip().splitlines()[0]}")
    assert inline == [], f"python blocks that are not docs/examples/ files: {inline}"


def test_every_example_file_is_run_by_a_test() -> None:
    """Scenario: each file under docs/examples/. Expected: a test module other than this
    one names it (and so runs it), and some page includes it."""
    tests = [
        p.read_text()
        for p in (ROOT / "tests").rglob("test_*.py")
        if p.resolve() != Path(__file__).resolve()
    ]
    run_here = {"wal_demo.py", "tls_producer.py"}  # run below
    pages = "".join(p.read_text() for p in _pages())
    examples = sorted(EXAMPLES.glob("*.py"))
    assert examples, "docs/examples/ holds the docs' code"
    for example in examples:
        name = example.name
        assert f'--8<-- "docs/examples/{name}"' in pages, f"no page includes {name}"
        assert name in run_here or any(name in t for t in tests), f"no test runs {name}"


def test_the_wal_example_prints_what_the_page_shows_and_inspects_clean(tmp_path: Path) -> None:
    """Scenario: docs/examples/wal_demo.py run in an empty directory, then `headrace wal
    inspect ./wal-demo` on the log it wrote (docs/operations/wal.md). Expected: the
    example prints the page's two lines; inspect prints the page's table, status `clean`."""
    page = DOCS / "operations" / "wal.md"
    out = _run([sys.executable, str(EXAMPLES / "wal_demo.py")], tmp_path)
    assert out == _shown_after(page, "It prints the offsets")
    cli = [sys.executable, "-c", "from broker.cli import main; main()"]
    table = _run([*cli, "wal", "inspect", "./wal-demo"], tmp_path)
    assert table == _shown_after(page, "For the log of the example above")
    assert table.splitlines()[1].split()[-1] == "clean"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[dict[str, str]]:
    """A `headrace serve` with TLS and tokens, a topic "orders", and the environment the
    TLS example reads: HEADRACE_BROKER, HEADRACE_TOKEN (produce on orders), HEADRACE_TLS_CA."""
    tmp = tmp_path_factory.mktemp("docs-tls")
    tokens = str(tmp / "tokens.json")
    cli = [sys.executable, "-c", "from broker.cli import main; main()"]

    def token(name: str, grant: str) -> str:
        args = [*cli, "tokens", "create", "--name", name, "--grant", grant]
        return _run([*args, "--tokens-file", tokens], tmp).strip()

    admin, app = token("ops", "admin:*"), token("app", "produce:orders")
    for address in _tls_serve(tmp, pki, "--tokens-file", tokens):
        env = {"HEADRACE_BROKER": address, "HEADRACE_TLS_CA": pki.ca}
        _run([*cli, "topics", "create", "orders", "--token", admin], tmp, env)
        yield env | {"HEADRACE_TOKEN": app}


def test_the_tls_example_publishes_with_a_token(secured: dict[str, str], tmp_path: Path) -> None:
    """Scenario: docs/examples/tls_producer.py with a produce token and the test CA,
    against a broker with TLS and tokens. Expected: exit 0 and one line giving where
    the record was stored (partition 0, offset 0 of the new topic)."""
    out = _run([sys.executable, str(EXAMPLES / "tls_producer.py")], tmp_path, secured)
    assert out == "published at 0 0\n"
