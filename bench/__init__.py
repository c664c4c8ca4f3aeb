"""Headrace benchmarks: each scenario measures Headrace and its peers side by side in one run.

Run ``python -m bench <scenario> [--json] [--quick] [--dir DIR]``. ``--json`` prints one
JSON object per line (``bench, system, metric, value, unit, params``); without it the output
is a table and a goals section. See DESIGN.md section 4, "Bench output".

Modules:
    __main__  the command line: parse arguments, run one scenario, print its results
    _runner   ``RunOptions``, the scenario registry, the scratch data directory
    _measure  event loop choice (uvloop when importable), percentiles, rates
    _output   ``Result`` and ``Goal`` records, JSON lines and table rendering
    wal       scenario ``wal``: the write-ahead log against the disk's physical limits
"""
