"""The static stage: library closure, undefined symbols with near misses, GPU arch coverage, metadata lints."""
