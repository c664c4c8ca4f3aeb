"""The import arrows of DESIGN section 1, checked by walking every module's imports.

``wal`` imports nothing of ours but ``proto``; ``dispatcher`` imports ``wal``; ``broker``
imports ``dispatcher``, ``wal`` and ``proto``; ``client`` imports ``proto``;
``spark_connector`` imports ``client``; ``pyspark_headrace`` (Spark's discovery hook)
imports ``spark_connector``. Nothing imports ``broker`` but ``broker`` itself (its entry
point), ``bench`` and the tests. One allowance: the ``headrace`` CLI lives in ``broker``
(``broker/cli*.py``, STYLE's module map) and runs its client commands through ``client``,
as any user program would.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = {"wal", "dispatcher", "broker", "proto", "client", "spark_connector", "pyspark_headrace"}
ALLOWED = {
    "proto": set(),
    "wal": {"proto"},
    "dispatcher": {"wal", "proto"},
    "broker": {"dispatcher", "wal", "proto"},
    "client": {"proto"},
    "spark_connector": {"client"},
    "pyspark_headrace": {"spark_connector"},
}


def imported_packages(path: Path) -> set[str]:
    """The top-level packages of ours that one module imports (absolute imports)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found.update(name.split(".")[0] for name in names if name.split(".")[0] in OURS)
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_imports_only_what_design_allows(package: str) -> None:
    """Scenario: every module of a package. Expected: it imports, of our packages, only
    itself and the ones its arrow allows; a violation names the file and the import."""
    wrong = []
    for path in sorted((ROOT / package).rglob("*.py")):
        allowed = ALLOWED[package] | {package}
        if package == "broker" and path.name.startswith("cli"):
            allowed = allowed | {"client"}
        extra = imported_packages(path) - allowed
        if extra:
            wrong.append(f"{path.relative_to(ROOT)} imports {sorted(extra)}")
    assert wrong == []


def test_the_walker_sees_both_import_forms(tmp_path: Path) -> None:
    """Scenario: a module with ``import broker.app`` and ``from client import x`` inside a
    function. Expected: both are found, so the test above cannot pass by missing them."""
    module = tmp_path / "m.py"
    module.write_text("import broker.app\n\ndef f():\n    from client import x\n")
    assert imported_packages(module) == {"broker", "client"}
