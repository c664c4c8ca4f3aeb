"""The import arrows of DESIGN section 1, enforced by import-linter's contracts.

The rules (:data:`ALLOWED`): ``proto`` is a leaf that imports nothing of ours (it holds the
wire contract, the record batch codec included); ``wal`` imports ``proto``; ``dispatcher``
imports ``wal`` and ``proto``; ``cluster`` (cluster mode's etcd side) imports
``dispatcher``, ``wal`` and ``proto``; ``broker`` imports ``cluster``, ``dispatcher``,
``wal`` and ``proto``;
``client`` imports ``proto``; ``spark_connector`` imports ``client`` and ``proto`` (the
codec, for Arrow); ``pyspark_headrace`` (Spark's discovery hook) imports
``spark_connector``. Nothing imports ``broker`` but ``broker`` itself: its entry point is
``broker.cli`` (``bench`` and the tests are not packages of the product and are not
checked).

The arrows are checked by ``lint-imports`` (``make lint``) against the contracts in
``pyproject.toml`` ``[tool.importlinter]``: two ``layers`` contracts (the server stack
``broker > cluster > dispatcher > wal > proto`` and the client stack ``pyspark_headrace >
spark_connector > client > proto``) and four ``forbidden`` ones (the two sides apart, and
the discovery hook's own imports). import-linter sees every import statement: ``import
a.b``, ``from a import b``, imports inside functions and under ``if TYPE_CHECKING:``. This
file checks that the contracts forbid exactly the arrows :data:`ALLOWED` forbids, that they
hold on the real tree, and that a wrong arrow planted in a temporary tree breaks the
contract it should, named in the output with its file and line.

One exception, matching only the modules it names:
- the ``headrace`` CLI lives in ``broker`` (``broker/cli*.py``, STYLE's module map), and its
  client commands (topics, produce, consume, lag, dlq, subscriptions) talk to a broker
  through ``client``, as any user program would. The servicers never import ``client``.
  import-linter's wildcards replace whole module names only (``broker.cli_*`` is refused),
  so its ``ignore_imports`` names each CLI module that imports ``client``; a listed import
  that no longer exists is an error, so the list cannot outgrow the code.

What import-linter cannot see, and this file still walks by hand: an
``importlib.import_module("a.b")`` call with a literal name (grimp reads import statements
only). Those calls obey the same :data:`ALLOWED` table and :data:`EXCEPTIONS`.
"""

from __future__ import annotations

import ast
import fnmatch
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = frozenset(
    {
        "wal",
        "dispatcher",
        "cluster",
        "broker",
        "proto",
        "client",
        "spark_connector",
        "pyspark_headrace",
    }
)
ALLOWED: dict[str, frozenset[str]] = {
    "proto": frozenset(),
    "wal": frozenset({"proto"}),
    "dispatcher": frozenset({"wal", "proto"}),
    "cluster": frozenset({"dispatcher", "wal", "proto"}),
    "broker": frozenset({"cluster", "dispatcher", "wal", "proto"}),
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
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _config() -> dict[str, Any]:
    """The ``[tool.importlinter]`` table of the project's ``pyproject.toml``."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        table: dict[str, Any] = tomllib.load(f)["tool"]["importlinter"]
    return table


def _contract(contract_id: str) -> dict[str, Any]:
    """The contract with this ``id``."""
    contracts: list[dict[str, Any]] = _config()["contracts"]
    (found,) = [c for c in contracts if c["id"] == contract_id]
    return found


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """Run ``lint-imports`` on the packages under ``root`` with the project's contracts.

    ``root`` comes first on the path (lint-imports adds its working directory), so a
    temporary tree shadows the installed packages of the same names. ``--no-cache``
    leaves no ``.import_linter_cache`` behind; a wide ``COLUMNS`` keeps names on one line.
    """
    if root != ROOT:
        (root / "pyproject.toml").write_bytes((ROOT / "pyproject.toml").read_bytes())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"COLUMNS": "400"}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", str(root / "pyproject.toml")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def broken_contracts(output: str) -> list[str]:
    """The names of the contracts ``lint-imports`` reports as broken, in its order (a
    count of ignored imports may follow the verdict)."""
    return re.findall(r"^(.+) BROKEN(?: \(\d+ ignored imports?\))?$", output, flags=re.MULTILINE)


def forbidden_pairs(contracts: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """Every ``(importer, imported)`` pair of our packages that the contracts forbid as a
    direct import: a lower layer importing a higher one, or a source importing a
    forbidden module."""
    pairs: set[tuple[str, str]] = set()
    for contract in contracts:
        if contract["type"] == "layers":
            layers = contract["layers"]
            pairs |= {(low, high) for i, high in enumerate(layers) for low in layers[i + 1 :]}
        elif contract["type"] == "forbidden":
            pairs |= {
                (source, banned)
                for source in contract["source_modules"]
                for banned in contract["forbidden_modules"]
            }
        else:
            raise AssertionError(f"contract type {contract['type']!r} is not read here")
    return pairs


def test_the_contracts_forbid_what_the_table_forbids() -> None:
    """Scenario: the contracts of ``pyproject.toml`` read as direct arrows. Expected: they
    forbid exactly the arrows between our packages that :data:`ALLOWED` leaves out, and
    their root packages are the eight packages."""
    config = _config()
    assert set(config["root_packages"]) == OURS == set(ALLOWED)
    table = {(p, q) for p in ALLOWED for q in OURS if q != p and q not in ALLOWED[p]}
    assert forbidden_pairs(config["contracts"]) == table


def test_the_contracts_ignore_only_the_cli_importing_client() -> None:
    """Scenario: every ``ignore_imports`` entry of every contract. Expected: each is a
    ``broker/cli*.py`` module importing ``client`` (the one entry of :data:`EXCEPTIONS`),
    and a listed import that has gone is an error, not silence."""
    config = _config()
    assert config["unmatched_ignore_imports_alerting"] == "error"
    ignored = [i for c in config["contracts"] for i in c.get("ignore_imports", [])]
    assert ignored
    for entry in ignored:
        importer, imported = (side.strip() for side in entry.split("->"))
        rel = importer.replace(".", "/") + ".py"
        assert [extra for glob, extra, _ in EXCEPTIONS if fnmatch.fnmatch(rel, glob)] == [
            imported.split(".")[0]
        ], entry


def test_every_import_runs_the_way_design_allows() -> None:
    """Scenario: ``lint-imports`` on the real tree. Expected: every contract kept, and it
    analysed every module of the eight packages, so it cannot pass by finding nothing."""
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert broken_contracts(result.stdout) == []
    modules = sum(len(list((ROOT / p).rglob("*.py"))) for p in sorted(OURS))
    assert f"Analyzed {modules} files" in result.stdout, result.stdout


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_has_modules(package: str) -> None:
    """Scenario: the checked package list. Expected: each is a real package with modules,
    so the check cannot pass by finding nothing."""
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


def _tree(root: Path, files: dict[str, str]) -> Path:
    """A temporary tree of the eight packages: each ``__init__`` imports every package it
    may (inside a function), so allowed arrows chain as they do in the real tree; the CLI
    modules that the exception names import client (the contracts error on an exception
    that matches nothing); then ``files`` on top."""
    for name, arrows in ALLOWED.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        allowed = "".join(f"    import {other}\n" for other in sorted(arrows))
        (root / name / "__init__.py").write_text(f"def f() -> None:\n{allowed}    pass\n")
        (root / name / "arrows.py").write_text("")
    ignored = [i for c in _config()["contracts"] for i in c.get("ignore_imports", [])]
    for entry in ignored:
        importer, imported = (side.strip() for side in entry.split("->"))
        module = root / (importer.replace(".", "/") + ".py")
        module.write_text((module.read_text() if module.exists() else "") + f"import {imported}\n")
        target = root / imported.replace(".", "/")
        if not target.is_dir():
            target.with_suffix(".py").write_text("")
    for rel, text in files.items():
        (root / rel).write_text(text)
    return root


def test_a_tree_with_every_allowed_arrow_passes(tmp_path: Path) -> None:
    """Scenario: a temporary tree where every package's ``__init__`` imports each package
    it may (inside a function), so pyspark_headrace reaches client and proto through
    spark_connector, and the CLI modules import client. Expected: every contract kept, so
    the contracts forbid nothing the table allows, indirect imports included."""
    result = lint_imports(_tree(tmp_path, {}))
    assert result.returncode == 0, result.stdout + result.stderr
    assert broken_contracts(result.stdout) == []
    assert "Contracts: 6 kept, 0 broken." in result.stdout


@pytest.mark.parametrize(
    ("rel", "text", "contract", "expected"),
    [
        pytest.param(
            "proto/batch.py",
            "from wal import Record\n",
            "server-stack",
            "proto.batch -> wal (l.1)",
            id="proto-imports-wal",
        ),
        pytest.param(
            "wal/log.py",
            "def f():\n    import broker.app\n",
            "server-stack",
            "wal.log -> broker (l.2)",
            id="function-level",
        ),
        pytest.param(
            "wal/seg.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dispatcher import x\n",
            "server-stack",
            "wal.seg -> dispatcher (l.3)",
            id="type-checking",
        ),
        pytest.param(
            "dispatcher/r.py",
            "from broker.arrows import f\n",
            "server-stack",
            "dispatcher.r -> broker.arrows (l.1)",
            id="dispatcher-imports-broker",
        ),
        pytest.param(
            "client/y.py",
            "import spark_connector\n",
            "client-stack",
            "client.y -> spark_connector (l.1)",
            id="client-imports-connector",
        ),
        pytest.param(
            "dispatcher/q.py",
            "import client\n",
            "storage-without-client",
            "dispatcher.q -> client (l.1)",
            id="dispatcher-imports-client",
        ),
        pytest.param(
            "client/x.py",
            "import wal\n",
            "client-without-server",
            "client.x -> wal (l.1)",
            id="client-imports-wal",
        ),
        pytest.param(
            "spark_connector/a.py",
            "from broker import app\n",
            "client-without-server",
            "spark_connector.a -> broker (l.1)",
            id="connector-imports-broker",
        ),
        pytest.param(
            "broker/service.py",
            "from client import Producer\n",
            "broker-without-client",
            "broker.service -> client (l.1)",
            id="broker-outside-cli",
        ),
        pytest.param(
            "broker/cli_lag.py",
            "import client\nimport spark_connector\n",
            "broker-without-client",
            "broker.cli_lag -> spark_connector (l.2)",
            id="cli-beyond-client",
        ),
        pytest.param(
            "pyspark_headrace/h.py",
            "import proto\n",
            "discovery-hook-direct",
            "pyspark_headrace.h -> proto (l.1)",
            id="hook-imports-proto",
        ),
    ],
)
def test_a_planted_wrong_arrow_fails(
    tmp_path: Path, rel: str, text: str, contract: str, expected: str
) -> None:
    """Scenario: the tree of every allowed arrow with one import that runs the wrong way
    (at module level, inside a function, under ``TYPE_CHECKING``; broker -> client outside
    the CLI; the CLI importing more than client). Expected: ``lint-imports`` fails, names
    exactly that one contract as broken, and names the file and line of the import."""
    result = lint_imports(_tree(tmp_path, {rel: text}))
    assert result.returncode == 1, result.stdout + result.stderr
    assert broken_contracts(result.stdout) == [_contract(contract)["name"]]
    assert expected in result.stdout, result.stdout


def dynamic_imports(path: Path) -> dict[str, int]:
    """The top-level packages of ours that one module loads through
    ``import_module("a.b")`` with a literal name, each with the line of its first call
    (import-linter reads import statements only, so these are walked here)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            top = node.args[0].value.split(".")[0]
            if top in OURS:
                found.setdefault(top, node.lineno)
    return found


def dynamic_violations(root: Path) -> list[str]:
    """Every literal ``import_module`` call under ``root`` that runs against an arrow, as
    ``"file:line imports pkg"`` (empty when the layering holds)."""
    wrong = []
    for package, arrows in sorted(ALLOWED.items()):
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            ok = arrows | {package}
            ok |= {extra for glob, extra, _ in EXCEPTIONS if fnmatch.fnmatch(rel, glob)}
            for imported, line in sorted(dynamic_imports(path).items()):
                if imported not in ok:
                    wrong.append(f"{rel}:{line} imports {imported}")
    return wrong


def test_every_literal_import_module_runs_the_way_design_allows() -> None:
    """Scenario: every module of the eight packages, walked for ``import_module`` calls.
    Expected: none loads a package against an arrow."""
    assert dynamic_violations(ROOT) == []


def test_the_walker_sees_both_import_module_forms(tmp_path: Path) -> None:
    """Scenario: a module with ``importlib.import_module("dispatcher.x")`` and a bare
    ``import_module("broker")`` inside a function, beside a plain ``import client``.
    Expected: both calls are found with their lines; the statement is left to
    import-linter."""
    module = tmp_path / "m.py"
    module.write_text(
        "import importlib\nfrom importlib import import_module\nimport client\n\n"
        "def f():\n    importlib.import_module('dispatcher.x')\n    import_module('broker')\n"
    )
    assert dynamic_imports(module) == {"dispatcher": 6, "broker": 7}


@pytest.mark.parametrize(
    ("rel", "text", "expected"),
    [
        pytest.param(
            "wal/log.py",
            "import importlib\nimportlib.import_module('broker.app')\n",
            ["wal/log.py:2 imports broker"],
            id="wal-loads-broker",
        ),
        pytest.param(
            "broker/service.py",
            "from importlib import import_module\nimport_module('client')\n",
            ["broker/service.py:2 imports client"],
            id="broker-loads-client",
        ),
        pytest.param(
            "broker/cli_lag.py",
            "import importlib\nimportlib.import_module('client')\n",
            [],
            id="cli-loads-client",
        ),
    ],
)
def test_a_planted_import_module_call_is_checked(
    tmp_path: Path, rel: str, text: str, expected: list[str]
) -> None:
    """Scenario: a temporary tree with one literal ``import_module`` call, wrong or (in
    the CLI, for client) allowed. Expected: exactly the wrong one is reported, by file,
    line and package."""
    root = _tree(tmp_path, {rel: text})
    assert dynamic_violations(root) == expected
