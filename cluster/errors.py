"""Every error of cluster mode, under one root: :class:`ClusterError`.

Each message says what went wrong and what to do; the broker prints it as one line.
"""

from __future__ import annotations


class ClusterError(Exception):
    """Root of every error raised by :mod:`cluster`."""
