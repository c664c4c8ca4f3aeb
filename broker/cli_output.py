"""How every ``headrace`` command prints for people: one table style and counted nouns.

Role: :func:`table` renders rows as the one table style of the CLI (``topics list`` and
``describe``, ``lag``, ``dlq peek``, ``wal inspect``): a header of the lower-case field
names, as in ``--json``; numbers right-aligned, text left-aligned; two spaces between
columns, no borders and no colour, so the output greps and pipes well. On a terminal a
long text column wraps to the terminal's width; anywhere else (a pipe, a file) nothing is
wrapped or cut: each row is one line however wide it gets. :func:`plural` writes "1
record" and "2 records".

Example::

    >>> print(table([{"topic": "orders", "partition": 0, "head": 1200}],
    ...             ("topic", "partition", "head")))
    topic   partition  head
    orders          0  1200

Every cell goes through :func:`proto.shown.shown_text`: a control character a broker
sent (in a consumer name, a reason) is printed escaped, never sent to the terminal.
Imports nothing of ours but that helper; ``rich`` is imported on the first table, so a
command that prints none does not pay for it.
"""

from __future__ import annotations

import io
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from proto.shown import shown_text

#: Width a table is laid out in when stdout is not a terminal: wide enough that no row is
#: ever wrapped; the lines are then as long as their content.
_UNBOUNDED = 1 << 20
#: The most characters of one cell (longer ones are cut, their length said).
_CELL = 2_000
#: On a terminal, the last column keeps at least this many characters a line.
_LAST_MIN = 20


def table(rows: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> str:
    """``rows`` as aligned columns, one per field, under a header of the field names.

    A column whose every value is an ``int`` or ``float`` (not a ``bool``) is right-
    aligned; ``None`` prints as an empty cell. Lines carry no trailing spaces.

    Args:
        rows: One mapping per row, holding at least every name in ``fields``.
        fields: The columns, in order; also the header.

    Returns:
        The table, lines joined by ``\\n``, without a final newline.
    """
    from rich.console import Console  # noqa: PLC0415 - ~60 ms, only when a table is printed
    from rich.table import Table  # noqa: PLC0415
    from rich.text import Text  # noqa: PLC0415

    grid = Table(box=None, pad_edge=False, show_edge=False, header_style="", padding=(0, 1))
    for i, field in enumerate(fields):
        cells = [r[field] for r in rows if r[field] is not None and r[field] != ""]
        numeric = bool(cells) and all(_is_number(c) or _looks_numeric(c) for c in cells)
        last = i == len(fields) - 1
        grid.add_column(  # only the last column wraps: no name, state or number is split
            field, justify="right" if numeric else "left", no_wrap=not last, overflow="fold"
        )
    # Every cell escaped: a name or reason from a broker must not move the cursor.
    texts = [["" if r[f] is None else shown_text(str(r[f]), _CELL) for f in fields] for r in rows]
    for cells_of_row in texts:
        grid.add_row(*(Text(cell) for cell in cells_of_row))
    width = _UNBOUNDED
    if _stdout_is_terminal():
        # At least what the unwrapped columns need beside a little of the last one: on a
        # narrower terminal the lines run past its edge (and it wraps them) rather than
        # cut or split a name, state or number.
        natural = [max([len(f), *(len(row[i]) for row in texts)]) for i, f in enumerate(fields)]
        needed = sum(natural[:-1]) + 2 * (len(fields) - 1) + min(natural[-1], _LAST_MIN)
        width = max(shutil.get_terminal_size().columns, needed)
    out = io.StringIO()
    Console(
        file=out,
        width=width,
        color_system=None,
        markup=False,
        highlight=False,
        emoji=False,
    ).print(grid)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())


_NUMERIC = re.compile(r"[-+]?[\d,]*\.?\d+(e[-+]?\d+)?[a-z%/]{0,3}")


def _looks_numeric(value: object) -> bool:
    """A number a command formatted as text before the table ("1,200", "764.3", "12s")."""
    return isinstance(value, str) and _NUMERIC.fullmatch(value) is not None


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``count`` and ``noun``, the noun in the plural unless the count is 1.

    Example: ``plural(1, "record")`` is ``"1 record"``, ``plural(0, "record")`` is
    ``"0 records"``, ``plural(2, "entry", "entries")`` is ``"2 entries"``.
    """
    return f"{count} {noun if count == 1 else many or noun + 's'}"


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _stdout_is_terminal() -> bool:
    isatty = getattr(sys.stdout, "isatty", None)
    return bool(isatty and isatty())
