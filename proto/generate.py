"""Generate the Python code for every ``proto/*.proto``: the one and only code generator.

Usage: ``python -m proto.generate`` writes ``*_pb2.py``, ``*_pb2.pyi`` and
``*_pb2_grpc.py`` next to the sources; ``python -m proto.generate --check`` regenerates into
a temporary directory and exits 1 if anything committed differs (CI runs this).
Generated imports are rewritten to ``from proto import x_pb2`` so the package imports work.
"""

from __future__ import annotations

import argparse
import filecmp
import re
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc  # a dev dependency: this script runs only at development time

PROTO_DIR = Path(__file__).resolve().parent
_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out_dir: Path) -> list[Path]:
    """Run protoc over every .proto in this package; return the files written."""
    sources = sorted(PROTO_DIR.glob("*.proto"))
    if not sources:
        return []
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *map(str, sources),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed; see the messages above")
    written = sorted(p for p in out_dir.iterdir() if p.name.endswith(_SUFFIXES))
    for path in written:
        text = re.sub(
            r"^import (\w+_pb2)", r"from proto import \1", path.read_text(), flags=re.MULTILINE
        )
        path.write_text(text)
    return written


def main(argv: list[str] | None = None) -> int:
    """Entry point; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m proto.generate")
    parser.add_argument("--check", action="store_true", help="fail if generated code is stale")
    args = parser.parse_args(argv)
    if not args.check:
        written = generate(PROTO_DIR)
        print(f"generated {len(written)} files" if written else "no .proto files to compile")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name: p for p in generate(Path(tmp))}
        committed = {p.name: p for p in PROTO_DIR.iterdir() if p.name.endswith(_SUFFIXES)}
        stale = sorted(
            n
            for n in fresh.keys() | committed.keys()
            if n not in fresh
            or n not in committed
            or not filecmp.cmp(fresh[n], committed[n], shallow=False)
        )
    if stale:
        print(
            "generated protobuf code is stale: "
            + ", ".join(stale)
            + "; run `make proto` and commit the result",
            file=sys.stderr,
        )
        return 1
    print("generated protobuf code is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
