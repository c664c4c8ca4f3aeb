"""Write the forwarding half of every bridged blocking twin from its async class.

Usage: ``python -m client._sync._generate`` rewrites the generated block of
``client/_sync/admin.py``, ``consumer.py`` and ``producer.py``;
``python -m client._sync._generate --check`` writes nothing and exits 1, naming the file,
when a block differs from what it would write (a stale twin: an async method added,
renamed, or given another parameter or docstring).

What is generated, in each twin's class between the two marker lines (``BEGIN`` and
``END`` below), from the async class as Python sees it (its methods through the MRO, each
signature and docstring read from its source with :mod:`ast`, so defaults keep their
names, e.g. ``broker: str = DEFAULT_BROKER``):

* ``__init__``: the async constructor's parameters less ``channel`` (a ``grpc.aio``
  channel is bound to the loop it was made on, and the twin's loop is private). It makes
  the :class:`~client._sync._bridge.LoopThread` and the async object on it, then calls
  the twin's own ``_created()`` when the hand-written part defines one;
* every public method of the async class that the hand-written part of the twin does not
  define: an ``async def`` runs on the loop (``self._bridge.run(...)``), a plain ``def``
  is called there (``self._bridge.call(...)``), with the async docstring;
* ``close`` (for ``aclose``), unless hand-written. (``__enter__`` and ``__exit__`` come
  from :class:`~client._sync._bridge.Blocking`, which each twin's class derives from.)

What a twin defines by hand (outside the block) is its deliberate difference from the
async class, said in its module docstring. Plumbing methods of an async class (called by
the blocking twin, not by users) are listed in :data:`TWINS` and get no twin.

Must not be imported by the client at run time: only this script and its test use it.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from client._async.admin import AsyncAdminClient
from client._async.consumer import AsyncConsumer
from client._async.producer import AsyncProducer

SYNC_DIR = Path(__file__).resolve().parent
COMMAND = "python -m client._sync._generate"
BEGIN = f"    # -- generated from {{name}} by `{COMMAND}`; do not edit --"
END = "    # -- end of generated code --"


@dataclass(frozen=True, slots=True)
class Twin:
    """One bridged blocking twin.

    Attributes:
        path: Its module, under ``client/_sync``.
        name: The blocking class ("AdminClient").
        async_cls: The async class it drives.
        attr: The attribute that holds the async object ("_admin").
        plumbing: Public methods of the async class that get no twin.
    """

    path: Path
    name: str
    async_cls: type
    attr: str
    plumbing: frozenset[str] = frozenset()


TWINS = (
    Twin(SYNC_DIR / "admin.py", "AdminClient", AsyncAdminClient, "_admin"),
    Twin(SYNC_DIR / "consumer.py", "Consumer", AsyncConsumer, "_consumer"),
    Twin(
        SYNC_DIR / "producer.py",
        "Producer",
        AsyncProducer,
        "_producer",
        frozenset({"new_producer_id", "batch_sealed", "publish_batch", "released", "enqueue"}),
    ),
)


def public_methods(cls: type) -> dict[str, Callable[..., Any]]:
    """The public methods of ``cls`` through its MRO, in source order (its own first)."""
    found: dict[str, Callable[..., Any]] = {}
    for klass in cls.__mro__[:-1]:
        own = [
            (name, value)
            for name, value in vars(klass).items()
            if inspect.isfunction(value) and not name.startswith("_")
        ]
        own.sort(key=lambda item: item[1].__code__.co_firstlineno)
        for name, value in own:
            found.setdefault(name, value)
    return found


def _source_def(
    function: Callable[..., Any],
) -> tuple[ast.FunctionDef | ast.AsyncFunctionDef, str]:
    """The definition of ``function`` as parsed from its source, and that source."""
    source = textwrap.dedent(inspect.getsource(function))
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    return node, source


def _call_arguments(args: ast.arguments) -> str:
    """How a forwarding body passes its own parameters on (``self`` left out)."""
    out = [a.arg for a in [*args.posonlyargs, *args.args][1:]]
    if args.vararg is not None:
        out.append(f"*{args.vararg.arg}")
    out += [f"{a.arg}={a.arg}" for a in args.kwonlyargs]
    if args.kwarg is not None:
        out.append(f"**{args.kwarg.arg}")
    return ", ".join(out)


def _docstring(node: ast.FunctionDef | ast.AsyncFunctionDef, owner: str) -> list[str]:
    """The forward's docstring: the async method's first paragraph, and where the rest
    is (the async docstring is the one place its arguments and errors are told)."""
    text = ast.get_docstring(node)
    if not text:
        return []
    first, _, rest = text.partition("\n\n")
    if rest:
        first += f"\n\nAs :meth:`{owner}.{node.name}`, blocking."
    body = textwrap.indent(first, " " * 8).lstrip()
    end = "\n        " if "\n" in body else ""  # a long docstring's quotes close on their own line
    return [f'        """{body}{end}"""']


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef, name: str, source: str) -> str:
    """The ``def`` line of a forward: the parameters as written in ``source`` (``1_000``
    stays ``1_000``, ``DEFAULT_BROKER`` stays a name)."""

    def text(expr: ast.expr) -> str:
        return ast.get_source_segment(source, expr) or ast.unparse(expr)

    def param(arg: ast.arg, default: ast.expr | None = None, star: str = "") -> str:
        out = star + arg.arg
        if arg.annotation is not None:
            out += f": {text(arg.annotation)}"
        if default is not None:
            out += f" = {text(default)}"
        return out

    args = node.args
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    params = [param(a, d) for a, d in zip(positional, [*defaults, *args.defaults], strict=True)]
    if args.vararg is not None:
        params.append(param(args.vararg, star="*"))
    elif args.kwonlyargs:
        params.append("*")
    params += [param(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    if args.kwarg is not None:
        params.append(param(args.kwarg, star="**"))
    returns = f" -> {text(node.returns)}" if node.returns is not None else ""
    return f"    def {name}({', '.join(params)}){returns}:"


def _forward(twin: Twin, name: str, function: Callable[..., Any]) -> list[str]:
    node, source = _source_def(function)
    target = f"self.{twin.attr}.{name}"
    arguments = _call_arguments(node.args)
    if isinstance(node, ast.AsyncFunctionDef):
        call = f"self._bridge.run({target}({arguments}))"
    else:
        call = f"self._bridge.call({target}{', ' if arguments else ''}{arguments})"
    returns_none = node.returns is None or ast.unparse(node.returns) == "None"
    return [
        _signature(node, name, source),
        *_docstring(node, twin.async_cls.__name__),
        f"        {call}" if returns_none else f"        return {call}",
    ]


def _init(twin: Twin, hand_written: set[str]) -> list[str]:
    node, source = _source_def(twin.async_cls.__init__)  # type: ignore[misc]
    args = node.args
    keep = [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    keep = [(a, d) for a, d in keep if a.arg != "channel"]
    args.kwonlyargs = [a for a, _ in keep]
    args.kw_defaults = [d for _, d in keep]
    args.args = [a for a in args.args if a.arg != "channel"]
    lines = [
        _signature(node, "__init__", source),
        f'        self._bridge = LoopThread("{twin.name}", "{twin.async_cls.__name__}")',
        f"        self.{twin.attr} = self._bridge.create(",
        f"            {twin.async_cls.__name__}, {_call_arguments(args)}",
        "        )",
    ]
    if "_created" in hand_written:
        lines.append("        self._created()")
    return lines


def _closing(twin: Twin, hand_written: set[str]) -> list[list[str]]:
    blocks: list[list[str]] = []
    if "close" not in hand_written:
        blocks.append(
            [
                "    def close(self) -> None:",
                '        """Close the async client on the loop, then stop the loop thread.',
                '        Idempotent; later calls raise ``ClientClosed``."""',
                f"        self._bridge.close(self.{twin.attr}.aclose())",
            ]
        )
    return blocks


def _split(twin: Twin, text: str) -> tuple[str, str, str]:
    """The module's text before the generated block, the block, and after it."""
    begin = BEGIN.format(name=twin.async_cls.__name__)
    try:
        head, rest = text.split(begin + "\n", 1)
        block, tail = rest.split(END + "\n", 1)
    except ValueError:
        raise SystemExit(f"{twin.path}: the generated block's marker lines are missing") from None
    return head, block, tail


def _hand_written(twin: Twin, head: str, tail: str) -> set[str]:
    """The methods the twin's class defines outside the generated block."""
    tree = ast.parse(head + tail)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == twin.name:
            return {
                n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            }
    raise SystemExit(f"{twin.path}: no class {twin.name}")


def render(twin: Twin, text: str) -> str:
    """``text`` (the twin's module) with its generated block written afresh, formatted."""
    head, _, tail = _split(twin, text)
    hand_written = _hand_written(twin, head, tail)
    blocks = [_init(twin, hand_written)]
    for name, function in public_methods(twin.async_cls).items():
        if name in twin.plumbing or name in hand_written or name in {"aclose", "close"}:
            continue
        blocks.append(_forward(twin, name, function))
    blocks += _closing(twin, hand_written)
    body = "\n\n".join("\n".join(block) for block in blocks)
    begin = BEGIN.format(name=twin.async_cls.__name__)
    return _format(f"{head}{begin}\n{body}\n\n{END}\n{tail}", twin.path)


def _format(source: str, path: Path) -> str:
    """``source`` as ``ruff format`` writes it (with the project's settings)."""
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(path), "-"],
        input=source,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{path}: ruff format failed on the generated code:\n{done.stderr}")
    return done.stdout


def main(argv: list[str] | None = None) -> int:
    """Entry point; see the module docstring."""
    parser = argparse.ArgumentParser(prog=COMMAND)
    parser.add_argument("--check", action="store_true", help="fail if a twin is stale")
    args = parser.parse_args(argv)
    stale = []
    for twin in TWINS:
        text = twin.path.read_text()
        fresh = render(twin, text)
        if fresh == text:
            continue
        stale.append(twin.path)
        if not args.check:
            twin.path.write_text(fresh)
    if args.check and stale:
        names = ", ".join(str(p.relative_to(SYNC_DIR.parents[1])) for p in stale)
        print(f"stale blocking twins: {names}; run `{COMMAND}`", file=sys.stderr)
        return 1
    if not args.check:
        print(f"rewrote {len(stale)} of {len(TWINS)} twins" if stale else "twins up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
