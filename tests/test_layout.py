"""The import arrows of DESIGN section 1, enforced by walking every module's imports.

The rules (:data:`ALLOWED`): ``proto`` is a leaf that imports nothing of ours (it holds the
wire contract, the record batch codec included); ``wal`` imports ``proto``; ``dispatcher``
imports ``wal`` and ``proto``; ``broker`` imports ``dispatcher``, ``wal`` and ``proto``;
``client`` imports ``proto``; ``spark_connector`` imports ``client`` and ``proto`` (the
codec, for Arrow); ``pyspark_headrace`` (Spark's discovery hook) imports
``spark_connector``. Nothing imports ``broker`` but ``broker`` itself: its entry point is
``broker.cli`` (``bench`` and the tests are not packages of the product and are not
walked).

Justified exceptions are listed in :data:`EXCEPTIONS`, each with its reason, and match
only the files they name:
- the ``headrace`` CLI lives in ``broker`` (``broker/cli*.py``, STYLE's module map), and its
  client commands (topics, produce, consume, lag, dlq, subscriptions) talk to a broker
  through ``client``, as any user program would. The servicers never import ``client``.

Every import form counts: ``import a.b``, ``from a import b``, imports inside functions
(lazy imports are still arrows), and ``importlib.import_module("a.b")`` with a literal name.
"""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = frozenset(
    {"wal", "dispatcher", "broker", "proto", "client", "spark_connector", "pyspark_headrace"}
)
ALLOWED: dict[str, frozenset[str]] = {
    "proto": frozenset(),
    "wal": frozenset({"proto"}),
    "dispatcher": frozenset({"wal", "proto"}),
    "broker": frozenset({"dispatcher", "wal", "proto"}),
    "client": frozenset({"proto"}),
    "spark_connector": frozenset({"client", "proto"}),
    "pyspark_headrace": frozenset({"spark_connector"}),
}
#: ``(file glob relative to the root, extra package allowed, reason)``.
EXCEPTIONS: tuple[tuple[str, str, str], ...] = (
    (
        "broker/cli*.py",
        "client",
        "the headrace CLI's client commands talk to a broker through the client library",
    ),
)


def imported_packages(path: Path) -> dict[str, int]:
    """The top-level packages of ours that one module imports, each with the line of its
    first import (absolute imports, at any depth, and literal ``import_module`` calls)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top in OURS:
                found.setdefault(top, node.lineno)
    return found


def violations(
    root: Path,
    allowed: dict[str, frozenset[str]] = ALLOWED,
    exceptions: tuple[tuple[str, str, str], ...] = EXCEPTIONS,
) -> list[str]:
    """Every import under ``root`` that runs against an arrow, as ``"file:line imports
    pkg"`` (empty when the layering holds)."""
    wrong = []
    for package, arrows in sorted(allowed.items()):
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            ok = arrows | {package}
            ok |= {extra for glob, extra, _ in exceptions if fnmatch.fnmatch(rel, glob)}
            for imported, line in sorted(imported_packages(path).items()):
                if imported not in ok:
                    wrong.append(f"{rel}:{line} imports {imported}")
    return wrong


def test_every_import_runs_the_way_design_allows() -> None:
    """Scenario: every module of the seven packages. Expected: no import runs against an
    arrow; a violation names the file, the line and the package."""
    assert violations(ROOT) == []


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_has_modules(package: str) -> None:
    """Scenario: the walk's package list. Expected: each is a real package with modules,
    so the walk cannot pass by finding nothing."""
    assert (ROOT / package / "__init__.py").is_file()
    assert len(list((ROOT / package).rglob("*.py"))) >= 1


def test_the_codec_is_one_module_not_a_copy() -> None:
    """Scenario: the record batch codec. Expected: it lives in proto only; the old client
    copy and its generator are gone, and wal re-exports the very same objects."""
    import client
    import proto.batch
    import proto.errors
    import wal

    assert not (ROOT / "client" / "_wire").exists()
    assert not (ROOT / "client" / "_codegen.py").exists()
    assert not (ROOT / "wal" / "batch.py").exists()
    assert wal.RecordBatch is proto.batch.RecordBatch is client.RecordBatch
    assert wal.encode_columns is proto.batch.encode_columns
    assert wal.CorruptBatchError is proto.errors.CorruptBatchError


def test_the_walker_sees_every_import_form(tmp_path: Path) -> None:
    """Scenario: a module with ``import broker.app``, ``from client import x`` inside a
    function and ``importlib.import_module("dispatcher.x")``. Expected: all three are
    found, with their lines, so the check cannot pass by missing them."""
    module = tmp_path / "m.py"
    module.write_text(
        "import importlib\nimport broker.app\n\ndef f():\n    from client import x\n"
        "    importlib.import_module('dispatcher.x')\n"
    )
    assert imported_packages(module) == {"broker": 2, "client": 5, "dispatcher": 6}


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name in ALLOWED:
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "__init__.py").write_text("")
    for rel, text in files.items():
        (root / rel).write_text(text)
    return root


@pytest.mark.parametrize(
    ("rel", "text", "expected"),
    [
        pytest.param("proto/batch.py", "from wal import Record\n", "proto/batch.py:1 imports wal"),
        pytest.param(
            "wal/log.py", "def f():\n    import broker.app\n", "wal/log.py:2 imports broker"
        ),
        pytest.param("wal/seg.py", "from dispatcher import x\n", "wal/seg.py:1 imports dispatcher"),
        pytest.param("client/x.py", "import wal\n", "client/x.py:1 imports wal"),
        pytest.param(
            "spark_connector/a.py",
            "from broker import app\n",
            "spark_connector/a.py:1 imports broker",
        ),
        pytest.param(
            "broker/service.py",
            "from client import Producer\n",
            "broker/service.py:1 imports client",
        ),
        pytest.param(
            "dispatcher/r.py", "from broker.errors import E\n", "dispatcher/r.py:1 imports broker"
        ),
    ],
)
def test_a_planted_wrong_arrow_fails(tmp_path: Path, rel: str, text: str, expected: str) -> None:
    """Scenario: a synthetic tree of the seven packages with one import that runs the wrong
    way (including a function-level one, and broker -> client outside the CLI). Expected:
    the checker reports exactly that file, line and package."""
    root = _tree(tmp_path, {rel: text})
    assert violations(root) == [expected]


def test_the_cli_exception_is_narrow(tmp_path: Path) -> None:
    """Scenario: ``broker/cli_lag.py`` imports ``client`` (the listed exception) and
    ``proto`` imports nothing of ours. Expected: no violation; the exception names only the
    CLI's files (the planted ``broker/service.py`` case above fails)."""
    root = _tree(
        tmp_path,
        {"broker/cli_lag.py": "from client import AdminClient\n", "proto/b.py": "import struct\n"},
    )
    assert violations(root) == []
