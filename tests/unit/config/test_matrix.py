"""matrix.toml validation: every problem at once, each with its key path, asserted whole."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest

from compatlab.cells import expand
from compatlab.cli import main
from compatlab.config.axes import AXIS_KINDS, axis_of_package
from compatlab.config.matrix import Report, load_matrix
from compatlab.config.nccl import NcclThresholds
from compatlab.config.thresholds import Thresholds, suite_thresholds
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
    assert (
        str(info.value)
        == f"{path}: axes.sgl-kernel[0].whl: unknown key; allowed keys: cuda, find-links, index, package, requires, version"
    )


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
        "axes.cuda: missing; the lab needs the axes torch, cuda",
        "rules.exclude[0].expect: an excluded cell does not run; move this rule to [[rules.expect]]",
        "rules.expect[0].reason: missing; this key is required",
        "rules.expect[0].expect: the only expectation is \"fail\", got 'pass'",
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
    assert (
        str(info.value)
        == f"{path}: invalid TOML: Expected newline or end of document after a statement (at line 2, column 14)"
    )


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_matrix(tmp_path / "nope.toml")
    assert str(info.value) == f"{tmp_path / 'nope.toml'}: no such file; set COMPATLAB_MATRIX or create matrix.toml"


def test_cli_exits_2_with_one_message_and_no_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, GOOD.replace("gpus = 8", 'gpus = "eight"'))
    assert main(["validate", "--matrix", str(path)]) == 2
    assert capsys.readouterr() == ("", f"error: {path}: targets.box.gpus: expected a positive integer, got 'eight'\n")


def test_shipped_matrices_are_valid() -> None:
    pinned = load_matrix(ROOT / "examples" / "pinned-2026-01.toml")  # the seed's matrix, its traps testable
    cells = expand(pinned)
    assert len(cells) == 12
    assert sum(c.na is None for c in cells) == 6
    default = load_matrix(ROOT / "matrix.toml")  # today's stack, by selectors, from the committed lock
    assert default.notes == ()
    cells = expand(default)
    assert len(cells) == 72
    assert sorted(c.id for c in cells if c.shipped) == [
        "sglang0.5.23-torch2.14.1-sglangkernel0.4.10-flashinfer0.7.2-cuda12.8",
        "sglang0.5.23-torch2.14.1-sglangkernel0.4.10-flashinfer0.7.2-cuda13.0",
        "sglang0.5.23-torch2.14.1-sglangkernel0.4.10-flashinfer0.7.2-cuda13.2",
    ]
    assert sum(c.na is None for c in cells) == 6
    born = load_matrix(ROOT / "examples" / "born-from.toml")
    (cell,) = expand(born)
    assert cell.axes == {
        "torch": "2.9.1+cu130",
        "sgl-kernel": "0.3.21+cu130",
        "flashinfer": "0.6.4",
        "sglang": "0.5.9",
        "cuda": "13.0",
    }
    assert cell.force  # SGLang's own pins yield to the axis pins
    assert born.archs == ("sm_120",)


# One test per class of problem that used to pass silently or end in a traceback.

MINIMAL = """
[[axes.torch]]
version = "2.9.1"
[[axes.sgl-kernel]]
version = "0.3.21"
[[axes.flashinfer]]
version = "0.6.4"
[[axes.cuda]]
version = "12.8"
[targets.box]
gpus = 8
"""

PERF = """
[perf.servers.baseline]
argv = ["python", "-m", "sglang.launch_server", "--port", "{port}"]
[perf.servers.eagle3]
argv = ["python", "-m", "sglang.launch_server", "--speculative-algorithm", "EAGLE3", "--port", "{port}"]
"""


def message(tmp_path: Path, text: str | bytes) -> str:
    path = tmp_path / "matrix.toml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_matrix(path)
    prefix = f"{path}: "
    text_of = str(info.value)
    return text_of.removeprefix(prefix) if text_of.startswith(prefix) else text_of.replace(str(path), "FILE")


def test_a_file_that_is_not_utf8_is_named_with_where(tmp_path: Path) -> None:
    latin1 = MINIMAL.replace("gpus = 8", 'gpu = "GeForce ™"').encode("utf-8").replace("™".encode(), b"\x99")
    assert message(tmp_path, latin1) == (
        "not UTF-8 text: byte 0x99 at line 11 (offset 171) cannot be decoded; save the file as UTF-8"
    )


def test_binary_garbage_is_invalid_toml(tmp_path: Path) -> None:
    assert message(tmp_path, b"\x00\x01\x02PK\x03\x04") == "invalid TOML: Invalid statement (at line 1, column 1)"
    assert message(tmp_path, b"x = " + b"[" * 5000 + b"]" * 5000) == (
        "invalid TOML: arrays or tables nested too deeply to read"
    )


def test_a_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "matrix.toml"
    path.write_bytes(b"\xef\xbb\xbf" + MINIMAL.encode())
    assert load_matrix(path).size == 1


def test_a_string_where_a_number_is_wanted(tmp_path: Path) -> None:
    text = MINIMAL + '[perf]\ntrials = "3"\nrequest-timeout = "60"\n' + PERF
    assert message(tmp_path, text) == (
        "2 problems in FILE:\n"
        "  FILE: perf.trials: expected a positive integer, got '3'\n"
        "  FILE: perf.request-timeout: expected a positive number, got '60'"
    )


def test_nan_and_infinity_are_refused_everywhere(tmp_path: Path) -> None:
    text = (
        MINIMAL
        + PERF
        + """
    [install]
    timeout = nan
    [thresholds]
    import-timeout = inf
    [thresholds.nccl]
    min-busbw-gbps = -inf
    [thresholds.perf]
    max-spread = nan
    min-tok-s = { "1" = nan }
    """
    )
    assert message(tmp_path, text) == (
        "5 problems in FILE:\n"
        "  FILE: install.timeout: expected a finite number, got nan\n"
        "  FILE: thresholds.perf.min-tok-s.1: expected a finite number, got nan\n"
        "  FILE: thresholds.perf.max-spread: expected a finite number, got nan\n"
        "  FILE: thresholds.import-timeout: expected a finite number, got inf\n"
        "  FILE: thresholds.nccl.min-busbw-gbps: expected a finite number, got -inf"
    )


def test_control_characters_are_refused_in_values_and_keys(tmp_path: Path) -> None:
    text = MINIMAL.replace('version = "2.9.1"', 'version = "2.9.1\\n"\nindex = "https://mirror.example/\\tsimple"')
    text += '[targets."h200\\n"]\narch = ["sm_90\\r"]\n'
    shown = "(values are one line, without control characters)"
    assert message(tmp_path, text) == (
        "4 problems in FILE:\n"
        f"  FILE: axes.torch[0].version: '2.9.1\\n' contains the control character U+000A; remove it {shown}\n"
        "  FILE: axes.torch[0].index: 'https://mirror.example/\\tsimple' contains the control character U+0009; "
        f"remove it {shown}\n"
        f"  FILE: targets.h200\\n.arch[0]: 'sm_90\\r' contains the control character U+000D; remove it {shown}\n"
        "  FILE: targets.h200\\n: the key 'h200\\n' contains the control character U+000A; rename it"
    )


def test_a_version_with_spaces_around_it(tmp_path: Path) -> None:
    assert message(tmp_path, MINIMAL.replace('"2.9.1"', '" 2.9.1"')) == (
        "axes.torch[0].version: ' 2.9.1' has spaces around it; write '2.9.1'"
    )


def test_empty_lists_in_rules(tmp_path: Path) -> None:
    text = (
        MINIMAL
        + """
    [[rules.exclude]]
    torch = []
    reason = "would have made every cell n/a"
    [[rules.include]]
    torch = ["2.9.1"]
    sgl-kernel = []
    flashinfer = "0.6.4"
    cuda = "12.8"
    """
    )
    assert message(tmp_path, text) == (
        "2 problems in FILE:\n"
        "  FILE: rules.exclude[0].torch: an empty list names no version; give at least one, or remove the key\n"
        "  FILE: rules.include[0].sgl-kernel: an empty list names no version; give at least one, or remove the key"
    )


def test_an_include_names_one_version_per_axis(tmp_path: Path) -> None:
    text = (
        MINIMAL.replace("[[axes.cuda]]", '[[axes.torch]]\nversion = "2.10.0"\n[[axes.cuda]]')
        + """
    [[rules.include]]
    torch = ["2.9.1", "2.10.0"]
    sgl-kernel = "0.3.21"
    flashinfer = "0.6.4"
    cuda = "12.8"
    """
    )
    assert message(tmp_path, text) == (
        "rules.include[0].torch: an included cell has one version per axis, got 2; write one [[rules.include]] per cell"
    )


def test_unknown_keys_and_tables_at_every_level(tmp_path: Path) -> None:
    text = (
        MINIMAL
        + PERF
        + """
    [reprot]
    rows = ["torch"]
    [[rules.exlude]]
    torch = "2.9.1"
    [thresholds]
    import-timout = 60
    [thresholds.ncll]
    min-busbw-gbps = 300
    [thresholds.nccl]
    min-busbw-gbp = 300
    [thresholds.nccl.box]
    min-busbw = 300
    [thresholds.perf]
    min-sppedup = 1.1
    """
    )
    text = text.replace("[targets.box]\ngpus = 8", "[targets.box]\ngpus = 8\nmin-drvier = '580.65'")
    text = text.replace('"{port}"]\n[perf.servers.eagle3]', '"{port}"]\nstartup-timeuot = 5\n[perf.servers.eagle3]')
    assert message(tmp_path, text) == (
        "9 problems in FILE:\n"
        "  FILE: reprot: unknown key; perhaps you meant 'report'?\n"
        "  FILE: rules.exlude: unknown key; perhaps you meant 'exclude'?\n"
        "  FILE: targets.box.min-drvier: unknown key; perhaps you meant 'min-driver'?\n"
        "  FILE: perf.servers.baseline.startup-timeuot: unknown key; perhaps you meant 'startup-timeout'?\n"
        "  FILE: thresholds.perf.min-sppedup: unknown key; perhaps you meant 'min-speedup'?\n"
        "  FILE: thresholds.import-timout: unknown key; perhaps you meant 'import-timeout'?\n"
        "  FILE: thresholds.ncll: unknown key; perhaps you meant 'nccl'?\n"
        "  FILE: thresholds.nccl.min-busbw-gbp: unknown key; perhaps you meant 'min-busbw-gbps'?\n"
        "  FILE: thresholds.nccl.box.min-busbw: unknown key; perhaps you meant 'min-busbw-gbps'?"
    )


def test_a_misspelled_axis_does_not_become_a_package(tmp_path: Path) -> None:
    text = MINIMAL + '[[axes.flashinfr]]\nversion = "0.7.4"\n'
    assert message(tmp_path, text) == (
        "axes.flashinfr: 'flashinfr' is not a known axis (cuda, flashinfer, python, sgl-kernel, sglang, "
        "sglang-kernel, torch, torchaudio, torchvision, xformers); perhaps you meant 'flashinfer'? An extra axis "
        "installs a package: name it with "
        'package = "..." on each value, or write [axes.flashinfr] with package and values'
    )
    text = (
        MINIMAL
        + '[[axes.deep-gemm]]\nversion = "2.1.0"\npackage = "deep-gemm"\n[[axes.deep-gemm]]\nversion = "2.2.0"\n'
    )
    assert message(tmp_path, text) == (
        "axes.deep-gemm[1].package: missing; 'deep-gemm' is not a known axis, so each value names the "
        "distribution it installs"
    )


def test_an_extra_axis_names_its_package_at_axis_level_or_per_value(tmp_path: Path) -> None:
    text = (
        MINIMAL
        + """
    [axes.deep-gemm]
    package = "deep-gemm"
    values = ["2.1.0", { version = "2.2.0", index = "https://wheels.example/simple" }]
    [[axes.sglang]]
    version = "0.5.6"
    """
    )
    matrix = load_matrix(write(tmp_path, text))
    assert [(v.requirement, v.index) for v in matrix.axis("deep-gemm").values] == [
        ("deep-gemm==2.1.0", None),
        ("deep-gemm==2.2.0", "https://wheels.example/simple"),
    ]
    assert matrix.axis("sglang").values[0].requirement == "sglang==0.5.6"
    assert [c.id for c in expand(matrix)] == [
        "torch2.9.1-sglkernel0.3.21-flashinfer0.6.4-cuda12.8-deepgemm2.1.0-sglang0.5.6",
        "torch2.9.1-sglkernel0.3.21-flashinfer0.6.4-cuda12.8-deepgemm2.2.0-sglang0.5.6",
    ]


def test_schema_is_the_integer_1(tmp_path: Path) -> None:
    assert message(tmp_path, "schema = 1.0\n" + MINIMAL) == (
        "schema: this lab reads schema 1 (an integer), got 1.0; write schema = 1"
    )


def test_a_report_layout_names_each_axis_once(tmp_path: Path) -> None:
    text = MINIMAL + '[report]\nrows = ["torch"]\ncolumns = ["torch", "flashinfer"]\ntables = ["cuda", "cuda"]\n'
    assert message(tmp_path, text) == (
        "2 problems in FILE:\n"
        "  FILE: report.columns[0]: 'torch' is already in report.rows[0]; an axis goes in one place: rows, "
        "columns or tables\n"
        "  FILE: report.tables[1]: 'cuda' is already in report.tables[0]; an axis goes in one place: rows, "
        "columns or tables"
    )
    assert message(tmp_path, MINIMAL + '[report]\nrows = ["cuda"]\n') == (
        "report.tables: the default tables (cuda) name 'cuda', which report.rows[0] has too; set tables as well"
    )


def test_the_default_columns_are_every_axis_the_rows_and_tables_leave(tmp_path: Path) -> None:
    assert load_matrix(write(tmp_path, MINIMAL)).report == Report(
        rows=("torch",), columns=("sgl-kernel", "flashinfer"), tables=("cuda",)
    )
    matrix = load_matrix(write(tmp_path, MINIMAL + '[report]\nrows = ["flashinfer"]\n'))
    assert matrix.report == Report(rows=("flashinfer",), columns=("torch", "sgl-kernel"), tables=("cuda",))


def _big(sizes: dict[str, int], head: str = "") -> str:
    return head + "".join(f'[[axes.{axis}]]\nversion = "{i + 1}.0"\n' for axis, n in sizes.items() for i in range(n))


def test_a_matrix_over_max_cells_is_refused_before_it_expands(tmp_path: Path) -> None:
    big = {"torch": 60, "sgl-kernel": 40, "flashinfer": 30, "cuda": 6}
    assert message(tmp_path, _big(big)) == (
        "axes: 432,000 cells (torch 60 × sgl-kernel 40 × flashinfer 30 × cuda 6), more than max-cells = 2,000; "
        "drop values from an axis, or raise max-cells (a top-level key) if that many are meant"
    )
    small = {"torch": 50, "sgl-kernel": 50, "flashinfer": 1, "cuda": 1}
    assert len(expand(load_matrix(write(tmp_path, _big(small, "max-cells = 2500\n"))))) == 2500
    assert message(tmp_path, _big(small, "max-cells = 0\n")).startswith(
        "2 problems in FILE:\n  FILE: max-cells: expected a positive integer, got 0\n"
    )


def test_expand_keeps_the_cap_for_a_matrix_made_in_code(tmp_path: Path) -> None:
    matrix = dataclasses.replace(load_matrix(write(tmp_path, GOOD)), max_cells=3)
    with pytest.raises(ConfigError) as info:
        expand(matrix)
    assert str(info.value) == (
        f"{tmp_path / 'matrix.toml'}: axes: 4 cells (torch 2 × sgl-kernel 1 × flashinfer 1 × cuda 2), "
        "more than max-cells = 3; drop values from an axis, or raise max-cells (a top-level key) if that many "
        "are meant"
    )


def test_stages_get_typed_thresholds_and_perf(tmp_path: Path) -> None:
    text = (
        MINIMAL
        + PERF
        + """
    [thresholds]
    import-timeout = 60
    jit-timeout = 1200
    [thresholds.nccl]
    min-busbw-gbps = 300
    [thresholds.nccl.box]
    min-busbw-gbps = 350.5
    [thresholds.perf]
    min-tok-s = { "16" = 600 }
    """
    )
    matrix = load_matrix(write(tmp_path, text))
    th = matrix.thresholds
    assert th.for_suites() == {"import-timeout": 60.0, "cuda-op-timeout": 180.0, "jit-timeout": 1200.0}
    shown = str(tmp_path / "matrix.toml")
    assert th.nccl.for_target("box") == NcclThresholds(
        min_busbw_gbps=350.5, source=f"{shown}: thresholds.nccl.box.min-busbw-gbps"
    )
    assert th.nccl.for_target(None) == NcclThresholds(
        min_busbw_gbps=300.0, source=f"{shown}: thresholds.nccl.min-busbw-gbps"
    )
    assert matrix.perf is not None
    assert matrix.perf.thresholds is th.perf
    assert (th.perf.min_speedup, th.perf.min_tok_s, th.perf.max_spread) == ({1: 1.0, 16: 1.0}, {16: 600.0}, 0.10)
    assert matrix.perf.trials == 3
    bare = load_matrix(write(tmp_path, MINIMAL))
    assert bare.perf is None
    assert bare.thresholds.for_suites() == Thresholds().for_suites()
    assert bare.thresholds.nccl.for_target("box") == NcclThresholds()


def test_suite_thresholds_from_the_command_line() -> None:
    assert suite_thresholds({"jit-timeout": 600.0}, source="--threshold").jit_timeout == 600.0
    with pytest.raises(ConfigError) as info:
        suite_thresholds({"jit-timout": 600.0, "import-timeout": float("nan")}, source="--threshold")
    assert str(info.value) == (
        "2 problems in --threshold:\n"
        "  --threshold: jit-timout: unknown key; perhaps you meant 'jit-timeout'?\n"
        "  --threshold: import-timeout: expected a finite number, got nan"
    )


def test_a_python_axis_gives_each_cell_its_interpreter_and_install_python_cannot_say_otherwise(tmp_path: Path) -> None:
    text = MINIMAL + '[axes.python]\nvalues = ["3.10", "3.12"]\n'
    assert [c.python for c in expand(load_matrix(write(tmp_path, text)))] == ["3.10", "3.12"]
    assert message(tmp_path, text + '[install]\npython = "3.11"\n') == (
        "install.python: the matrix has a 'python' axis, which gives each cell its own interpreter; remove "
        "install.python, or the axis"
    )
    assert message(tmp_path, MINIMAL + '[axes.python]\npackage = "cpython"\nvalues = ["3.10"]\n') == (
        "axes.python.package: axis 'python' is not a package; remove this key"
    )


def test_the_readme_lists_the_axis_kinds_as_the_table_says() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = readme.split("| axis | role | installs | imports | required | forces its cells |\n", 1)[1].split("\n\n", 1)[
        0
    ]
    listed = {}
    for line in rows.splitlines()[1:]:
        axis, role, installs, imports, required, forces = (c.strip() for c in line.strip("|").split("|"))
        listed[axis.strip("`")] = (
            installs.split(" ")[0].strip("`") if role == "package" else None,
            imports.strip("`") or None,
            required == "yes",
            forces.startswith("yes"),
        )
    assert listed == {
        name: (kind.package, " ".join(kind.imports) or None, kind.required, kind.forces)
        for name, kind in AXIS_KINDS.items()
    }


def test_a_distribution_is_known_by_its_kinds_axis() -> None:
    assert [axis_of_package(d) for d in ("Flashinfer_Python", "sglang-kernel", "torch", "deep-gemm")] == [
        "flashinfer",
        "sglang-kernel",
        "torch",
        "deep-gemm",
    ]


def test_a_misspelled_axis_is_one_problem_that_names_the_axis_meant(tmp_path: Path) -> None:
    text = """
    [[axes.torch]]
    version = "2.9.1"
    cuda = "12.8"
    [axes.flashinfr]
    select = { latest = 1 }
    [[axes.cuda]]
    version = "12.8"
    [report]
    columns = ["flashinfer"]
    [[rules.exclude]]
    flashinfer = "0.6.4"
    reason = "x"
    """
    found = problems(tmp_path, text)
    assert len(found) == 1, found
    problem = found[0]
    assert problem.startswith("axes.flashinfr: 'flashinfr' is not a known axis (")
    assert "; perhaps you meant 'flashinfer'? An extra axis installs a package" in problem
