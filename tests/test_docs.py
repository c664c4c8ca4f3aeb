"""The docs name tests that exist: every node id in ``docs/guarantees.md`` resolves.

A guarantee is only as good as the test that proves it, so a renamed or deleted test must
fail here rather than leave the guarantees page pointing at nothing.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GUARANTEES = ROOT / "docs" / "guarantees.md"
NODE_ID = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


def test_every_test_named_by_the_guarantees_page_exists() -> None:
    ids = NODE_ID.findall(GUARANTEES.read_text())
    assert len(ids) >= 30, "the guarantees page names its tests as `tests/<file>.py::<test>`"
    missing = [
        f"{file}::{name}"
        for file, name in ids
        if not (ROOT / file).is_file() or name not in _test_names(ROOT / file)
    ]
    assert missing == [], f"docs/guarantees.md names tests that do not exist: {missing}"


def test_the_node_id_pattern_finds_a_missing_test(tmp_path: Path) -> None:
    test_file = tmp_path / "test_x.py"
    test_file.write_text("def test_present() -> None:\n    pass\n")
    assert _test_names(test_file) == {"test_present"}
    assert NODE_ID.findall("`tests/a/test_x.py::test_gone`") == [("tests/a/test_x.py", "test_gone")]
