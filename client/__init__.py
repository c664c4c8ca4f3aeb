"""The Headrace Python client: async-first producers, consumers and admin, with sync twins.

Imports ``proto`` only. The classes arrive with the broker issue; the package is part of
the fixed layout (DESIGN section 1).
"""
