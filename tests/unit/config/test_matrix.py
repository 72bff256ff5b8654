"""matrix.toml validation: every problem at once, each with its key path, asserted whole."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from compatlab.cells import expand
from compatlab.config.matrix import load_matrix
from compatlab.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]

GOOD = """
schema = 1
name = "t"
[[axes.torch]]
version = "2.9.1+cu130"
index = "https://download.example.org/whl/cu130"
cuda = "13.0"
[[axes.torch]]
version = "2.10.0"
cuda = "12.8"
[[axes.sgl-kernel]]
version = "0.3.21"
find-links = "file:///srv/wheels"
[[axes.flashinfer]]
version = "0.6.4"
requires = ["apache-tvm-ffi<0.2"]
[[axes.cuda]]
version = "12.8"
[[axes.cuda]]
version = "13.0"
[[rules.exclude]]
torch = "2.10.0"
cuda = "12.8"
reason = "not this week"
[[rules.expect]]
torch = "2.9.1+cu130"
expect = "fail"
reason = "known ABI break"
[install]
overrides = ["flashinfer-python==0.6.4"]
[targets.box]
gpu = "NVIDIA RTX PRO 6000"
arch = ["sm_120"]
gpus = 8
min-driver = "580.65"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "matrix.toml"
    path.write_text(textwrap.dedent(text))
    return path


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_matrix(write(tmp_path, text))
    return info.value.problems


def test_good_matrix_expands(tmp_path: Path) -> None:
    matrix = load_matrix(write(tmp_path, GOOD))
    cells = {c.id: c for c in expand(matrix)}
    assert list(cells) == [
        "torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.6.4-cuda12.8",
        "torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.6.4-cuda13.0",
        "torch2.10.0-sglkernel0.3.21-flashinfer0.6.4-cuda12.8",
        "torch2.10.0-sglkernel0.3.21-flashinfer0.6.4-cuda13.0",
    ]
    assert cells["torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.6.4-cuda12.8"].na == (
        "torch 2.9.1+cu130 is built for CUDA 13.0, this column is CUDA 12.8"
    )
    assert cells["torch2.10.0-sglkernel0.3.21-flashinfer0.6.4-cuda12.8"].na == "not this week"
    assert cells["torch2.10.0-sglkernel0.3.21-flashinfer0.6.4-cuda13.0"].na == (
        "torch 2.10.0 is built for CUDA 12.8, this column is CUDA 13.0"
    )
    live = cells["torch2.9.1+cu130-sglkernel0.3.21-flashinfer0.6.4-cuda13.0"]
    assert live.na is None
    assert (live.expect, live.expect_reason) == ("fail", "known ABI break")
    fi = live.value("flashinfer")
    assert fi is not None
    assert fi.package == "flashinfer-python"
    assert fi.requires == ("apache-tvm-ffi<0.2",)
    assert matrix.archs == ("sm_120",)


def test_include_adds_an_excluded_cell_back(tmp_path: Path) -> None:
    text = GOOD + textwrap.dedent("""
        [[rules.include]]
        torch = "2.10.0"
        sgl-kernel = "0.3.21"
        flashinfer = "0.6.4"
        cuda = "13.0"
        """)
    cells = {c.id: c for c in expand(load_matrix(write(tmp_path, text)))}
    assert cells["torch2.10.0-sglkernel0.3.21-flashinfer0.6.4-cuda13.0"].na is None


def test_every_problem_is_reported_with_its_key_path(tmp_path: Path) -> None:
    text = """
    schema = 1
    nmae = "typo"
    [[axes.torch]]
    version = "2.9.1"
    index = "https://x.example/simple"
    [[axes.torch]]
    version = "2.10.0"
    [[axes.torch]]
    version = "2.11.0"
    index = 42
    [[axes.sgl-kernel]]
    version = "0.3.21"
    find-link = "https://x.example/wheels"
    [[axes.flashinfer]]
    version = "latest"
    [[axes.cuda]]
    version = "13.0"
    [[rules.exclude]]
    torch = "2.12.0"
    [install]
    overides = ["torch"]
    index-url = "ftp://mirror.example/simple"
    [targets.box]
    arch = ["sm90", "sm_120a"]
    gpus = true
    """
    assert problems(tmp_path, text) == [
        "nmae: unknown key; perhaps you meant 'name'?",
        "axes.torch[2].index: expected a URL, got 42",
        "axes.sgl-kernel[0].find-link: unknown key; perhaps you meant 'find-links'?",
        "axes.flashinfer[0].version: 'latest' is not a valid PEP 440 version",
        "rules.exclude[0].torch: '2.12.0' is not a value of axis 'torch' (2.9.1, 2.10.0, 2.11.0)",
        "rules.exclude[0].reason: missing; this key is required",
        "install.overides: unknown key; perhaps you meant 'overrides'?",
        "install.index-url: expected an http(s):// or file:// URL, got 'ftp://mirror.example/simple'",
        "targets.box.arch[0]: expected an SM arch like 'sm_90', 'sm_90a' or 'sm_120', got 'sm90'",
        "targets.box.gpus: expected a positive integer, got true",
    ]


def test_one_problem_reads_as_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace('version = "0.3.21"', 'version = "0.3.21"\nwhl = "x"'))
    with pytest.raises(ConfigError) as info:
        load_matrix(path)
    assert str(info.value) == f"{path}: axes.sgl-kernel[0].whl: unknown key; allowed keys: cuda, find-links, index, package, requires, version"


def test_missing_axes_and_bad_expectations(tmp_path: Path) -> None:
    text = """
    [[axes.torch]]
    version = "2.9.1"
    [[rules.expect]]
    torch = "2.9.1"
    expect = "pass"
    [[rules.exclude]]
    torch = "2.9.1"
    reason = "r"
    expect = "fail"
    [[rules.include]]
    torch = "2.9.1"
    """
    assert problems(tmp_path, text) == [
        "axes.sgl-kernel: missing; the lab needs the axes torch, sgl-kernel, flashinfer, cuda",
        "axes.flashinfer: missing; the lab needs the axes torch, sgl-kernel, flashinfer, cuda",
        "axes.cuda: missing; the lab needs the axes torch, sgl-kernel, flashinfer, cuda",
        "rules.exclude[0].expect: an excluded cell does not run; move this rule to [[rules.expect]]",
        "rules.expect[0].reason: missing; this key is required",
        'rules.expect[0].expect: the only expectation is "fail", got \'pass\'',
    ]


def test_value_cuda_must_match_a_column(tmp_path: Path) -> None:
    text = GOOD.replace('cuda = "12.8"\n[[axes.sgl-kernel]]', 'cuda = "11.8"\n[[axes.sgl-kernel]]')
    assert problems(tmp_path, text) == [
        "axes.torch[1].cuda: '11.8' matches no value of axis 'cuda' (12.8, 13.0)",
    ]


def test_toml_syntax_error_names_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "[[axes.torch]]\nversion = 2.9.1\n")
    with pytest.raises(ConfigError) as info:
        load_matrix(path)
    assert str(info.value) == f"{path}: invalid TOML: Expected newline or end of document after a statement (at line 2, column 14)"


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_matrix(tmp_path / "nope.toml")
    assert str(info.value) == f"{tmp_path / 'nope.toml'}: no such file; set COMPATLAB_MATRIX or create matrix.toml"


def test_cli_exits_2_with_one_message_and_no_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace('gpus = 8', 'gpus = "eight"'))
    done = subprocess.run(
        [sys.executable, "-m", "compatlab", "validate", "--matrix", str(path)],
        capture_output=True, text=True, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
        check=False, timeout=60,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == f"error: {path}: targets.box.gpus: expected a positive integer, got 'eight'\n"


def test_shipped_matrices_are_valid() -> None:
    default = load_matrix(ROOT / "matrix.toml")
    cells = expand(default)
    assert len(cells) == 12
    assert sum(c.na is None for c in cells) == 6
    born = load_matrix(ROOT / "examples" / "born-from.toml")
    (cell,) = expand(born)
    assert cell.axes == {"torch": "2.9.1+cu130", "sgl-kernel": "0.3.21+cu130", "flashinfer": "0.6.4", "cuda": "13.0"}
    assert born.archs == ("sm_120",)
