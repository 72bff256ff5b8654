"""The compat suites the lab runs with pytest inside a cell (found with importlib.resources)."""
