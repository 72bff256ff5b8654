"""matrix.toml (+ lock) -> typed, frozen model; every section validated at load, once."""
