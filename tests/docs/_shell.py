"""Shell blocks of the docs, and a bash session that runs them as printed.

A page's ```sh / ```bash / ```console block is read with :func:`shell_blocks`, split into
its commands with :func:`commands` (continuation lines joined; lines that are only a
comment, which the pages use to show output, dropped; trailing comments kept, since bash
ignores them), and run in one bash process by :func:`session`, so that an ``export`` in
one command holds for the next, as in a reader's terminal. Each command's exit code,
stdout and stderr come back apart. The only changes a test makes to a command are the
substitutions it passes, which it names in its docstring.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Where this interpreter's ``headrace`` and ``python`` live (the page's ``.venv/bin``).
BIN = Path(sys.executable).parent
#: A shell block (indented too, ``~~~`` fences too, attributes after the language).
SHELL_BLOCK = re.compile(
    r"^[ \t]*(?P<fence>```|~~~)[ \t]*(?P<lang>sh|bash|console|shell|zsh)\b[^\n]*\n"
    r"(?P<body>.*?)^[ \t]*(?P=fence)[ \t]*$",
    re.DOTALL | re.MULTILINE,
)
_MARK = "@@docs-shell-step@@"


def shell_blocks(page: Path) -> list[str]:
    """The bodies of ``page``'s shell blocks, in order."""
    return [m["body"] for m in SHELL_BLOCK.finditer(page.read_text())]


def block_after(page: Path, marker: str) -> str:
    """The body of the first shell block after the text ``marker`` on ``page``."""
    text = page.read_text()
    found = SHELL_BLOCK.search(text, text.index(marker))
    assert found is not None, (page, marker)
    return found["body"]


def commands(block: str) -> list[str]:
    """The block's commands: ``\\``-continued lines joined, comment-only lines left out."""
    out: list[str] = []
    pending = ""
    for line in block.splitlines():
        if not pending and line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        out.append(pending + line)
        pending = ""
    assert not pending, f"a block ends in a continuation: {block!r}"
    return [c for c in out if c.strip()]


def without_comment(command: str) -> str:
    """``command`` without its trailing ``  # ...`` comment (the pages' style)."""
    return command.split("  #", 1)[0].rstrip()


@dataclass(frozen=True)
class Step:
    """One command's outcome in a :func:`session`."""

    command: str
    returncode: int
    stdout: str
    stderr: str


def substitute(command: str, substitutions: dict[str, str]) -> str:
    """``command`` with each listed text replaced (and no other change)."""
    for old, new in substitutions.items():
        command = command.replace(old, new)
    return command


def environment(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment without any ``HEADRACE_`` variable, ``PATH`` starting
    at :data:`BIN`, and ``extra``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")}
    return clean | {"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"} | extra


def session(
    steps: list[str], cwd: Path, env: dict[str, str], *, prelude: str = "", timeout: float = 120
) -> list[Step]:
    """Run ``steps`` one after another in one bash process in ``cwd``, with
    ``PATH`` starting at this environment's bin directory (so ``headrace`` and
    ``.venv/bin/headrace`` are this checkout's) and ``env`` added; ``prelude`` runs first.
    Each step's exit code, stdout and stderr."""
    script = [prelude.replace(".venv/bin/", f"{BIN}/")]
    for step in steps:
        script.append(step.replace(".venv/bin/", f"{BIN}/"))
        script.append(f"__rc=$?; printf '%s %s\\n' {_MARK} $__rc; printf '%s\\n' {_MARK} >&2")
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
        env=environment(env),
    )
    outs = re.split(rf"^{_MARK} (\d+)\n", done.stdout, flags=re.MULTILINE)
    errs = done.stderr.split(f"{_MARK}\n")
    assert len(outs) == 2 * len(steps) + 1, (done.stdout, done.stderr)
    codes = [int(c) for c in outs[1::2]]
    return [
        Step(c, rc, out, err)
        for c, rc, out, err in zip(steps, codes, outs[0::2], errs, strict=False)
    ]
