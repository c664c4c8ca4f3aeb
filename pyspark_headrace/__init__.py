"""Lets Spark find ``format("headrace")`` by itself, with no ``register()`` call.

Spark looks up Python data sources in every installed top-level module whose name starts
with ``pyspark_`` and that defines ``DefaultSource`` (pyspark's ``lookup_data_sources``).
This module is that hook and nothing more: the connector is :mod:`spark_connector`, and
``spark_connector.register(spark)`` still works, for sessions whose Python cannot see
installed packages.

Imports ``spark_connector`` only.
"""

from spark_connector.source import HeadraceDataSource as DefaultSource

__all__ = ["DefaultSource"]
