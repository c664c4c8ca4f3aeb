"""The Spark connector: PySpark's Python Data Source API over a Headrace subscription.

Imports ``client`` only. The data source arrives with its own issue; the package is part of
the fixed layout (DESIGN section 1).
"""
