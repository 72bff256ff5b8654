"""[serve] in matrix.toml: defaults written once, paths against the matrix's folder, every problem at once."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from compatlab.config.matrix import load_matrix
from compatlab.config.serve import ServeConfig
from compatlab.errors import ConfigError

AXES = """
[[axes.torch]]
version = "2.9.1"
[[axes.cuda]]
version = "12.8"
[targets.box]
gpus = 8
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "matrix.toml"
    path.write_text(AXES + textwrap.dedent(text), encoding="utf-8")
    return path


def test_without_serve_the_built_in_model_is_served(tmp_path: Path) -> None:
    assert load_matrix(_write(tmp_path, "")).serve == ServeConfig()
    assert (ServeConfig().model, ServeConfig().layers, ServeConfig().concurrency) == (None, 2, (1, 8))


def test_paths_are_read_against_the_matrix_folder(tmp_path: Path) -> None:
    serve = load_matrix(
        _write(
            tmp_path,
            """
        [serve]
        model = "models/kimi-k2/config.json"
        draft = "/srv/drafts/kimi-eagle3"
        layers = 3
        tp = 8
        concurrency = [1, 16, 16]
        args = ["--trust-remote-code"]
        eagle3 = false
        """,
        )
    ).serve
    assert serve == ServeConfig(
        model=tmp_path / "models/kimi-k2/config.json",
        draft=Path("/srv/drafts/kimi-eagle3"),
        layers=3,
        tp=8,
        concurrency=(1, 16),
        args=("--trust-remote-code",),
        eagle3=False,
    )


def test_every_problem_of_serve_at_once(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
        [serve]
        layer = 2
        tp = 0
        model = 42
        concurrency = []
        args = "--trust-remote-code\\n"
        eagle3 = "yes"
        """,
    )
    with pytest.raises(ConfigError) as info:
        load_matrix(path)
    assert info.value.problems == [
        "serve.layer: unknown key; perhaps you meant 'layers'?",
        "serve.model: expected a string, got 42",
        "serve.tp: expected a positive integer, got 0",
        "serve.concurrency: expected a non-empty array of positive integers, got []",
        "serve.args: '--trust-remote-code\\n' contains the control character U+000A; remove it (values are one "
        "line, without control characters)",
        "serve.eagle3: expected true or false, got 'yes'",
    ]
