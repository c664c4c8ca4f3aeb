"""Subscription dispatch: notifier fast path, heartbeat lag monitor, acks and redelivery.

Imports ``wal`` only. The modules arrive with the dispatch issue; this package is part of
the fixed layout (DESIGN section 1) so that the import graph is in place from the start.
"""
