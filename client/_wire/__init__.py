"""Generated copy of the wal record batch codec; see client/_codegen.py."""
