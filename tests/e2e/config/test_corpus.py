"""A corpus of malformed matrix files, each run through the real `compatlab validate` in a subprocess.

Every one must end the same way: exit status 2, nothing on stdout, one `error:` message that names the
file and the problem's key path, and no traceback.
"""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pytest

from compatlab.config.matrix import load_matrix

ROOT = Path(__file__).resolve().parents[3]

BASE = """\
schema = 1
name = "corpus"
max-cells = 100

[[axes.torch]]
version = "2.9.1"
cuda = "12.8"

[[axes.torch]]
version = "2.10.0"
cuda = "12.8"

[[axes.sgl-kernel]]
version = "0.3.21"

[[axes.flashinfer]]
version = "0.6.4"
index = "https://flashinfer.example/whl/cu128"
requires = ["apache-tvm-ffi<0.2"]

[[axes.cuda]]
version = "12.8"

[[rules.exclude]]
torch = "2.10.0"
reason = "not this week"

[[rules.expect]]
torch = "2.9.1"
expect = "fail"
reason = "known ABI break"

[[rules.include]]
torch = "2.10.0"
sgl-kernel = "0.3.21"
flashinfer = "0.6.4"
cuda = "12.8"

[install]
timeout = 600
retries = 1
overrides = ["flashinfer-python==0.6.4"]

[targets.h200]
gpu = "NVIDIA H200"
arch = ["sm_90"]
gpus = 8
min-driver = "580.65"

[targets.h200.nccl-env]
NCCL_NVLS_ENABLE = "0"

[thresholds]
import-timeout = 120

[thresholds.nccl]
min-busbw-gbps = 300

[report]
rows = ["torch"]
columns = ["sgl-kernel", "flashinfer"]
tables = ["cuda"]

[perf]
concurrency = [1, 16]
trials = 3

[perf.servers.baseline]
argv = ["python", "-m", "sglang.launch_server", "--port", "{port}"]
startup-timeout = 1200

[perf.servers.eagle3]
argv = ["python", "-m", "sglang.launch_server", "--speculative-algorithm", "EAGLE3", "--port", "{port}"]
env = { HF_HOME = "/models" }

[thresholds.perf]
min-speedup = 1.0
min-tok-s = { "16" = 600.0 }
max-spread = 0.10
"""

MINIMAL = """\
[axes]
torch = "2.9.1"
sgl-kernel = "0.3.21"
flashinfer = "0.6.4"
cuda = "12.8"
"""


def sub(old: str, new: str) -> str:
    assert BASE.count(old) == 1, old
    return BASE.replace(old, new)


def plus(extra: str) -> str:
    return BASE + extra


def axes(**sizes: int) -> str:
    return "".join(
        f'[[axes.{axis.replace("_", "-")}]]\nversion = "{i + 1}.0"\n' for axis, n in sizes.items() for i in range(n)
    )


# id -> (file content, a fragment the one error message must hold: the key path and the problem)
CORPUS: dict[str, tuple[str | bytes, str]] = {
    # not UTF-8, not TOML
    "latin1": (BASE.replace('"corpus"', '"caf\u00e9"').encode("latin-1"), "not UTF-8 text: byte 0xe9 at line 2"),
    "utf16": (BASE.encode("utf-16"), "not UTF-8 text: byte 0xff at line 1 (offset 0)"),
    "png": (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00", "not UTF-8 text: byte 0x89"),
    "zeros": (b"\x00" * 64, "invalid TOML: Invalid statement (at line 1, column 1)"),
    "gzip": (gzip.compress(BASE.encode(), mtime=0), "not UTF-8 text: byte 0x8b at line 1 (offset 1)"),
    "all-bytes": (bytes(range(256)), "not UTF-8 text: byte 0x80"),
    "ascii-controls": (bytes(range(32)), "invalid TOML: Invalid statement"),
    "syntax": (sub('version = "2.9.1"', "version = 2.9.1"), "invalid TOML: Expected newline or end of document"),
    "unclosed-table": (plus("[targets.box\n"), "invalid TOML: Expected ']' at the end of a table declaration"),
    "duplicate-key": (
        sub('name = "corpus"', 'name = "corpus"\nname = "again"'),
        "invalid TOML: Cannot overwrite a value",
    ),
    "nested-deep": ("x = " + "[" * 3000 + "]" * 3000, "invalid TOML: arrays or tables nested too deeply"),
    "empty": ("", "axes.torch: missing; the lab needs the axes torch, cuda"),
    "comments-only": ("# a matrix\n", "axes.torch: missing; the lab needs the axes"),
    # wrong types
    "schema-float": (sub("schema = 1", "schema = 1.0"), "schema: this lab reads schema 1 (an integer), got 1.0"),
    "schema-string": (sub("schema = 1", 'schema = "1"'), "schema: this lab reads schema 1 (an integer), got '1'"),
    "schema-2": (sub("schema = 1", "schema = 2"), "schema: this lab reads schema 1 (an integer), got 2"),
    "schema-bool": (sub("schema = 1", "schema = true"), "schema: this lab reads schema 1 (an integer), got true"),
    "name-int": (sub('name = "corpus"', "name = 5"), "name: expected a string, got 5"),
    "axes-string": ('axes = "torch"\n', "axes: expected a table, got 'torch'"),
    "axis-int": (MINIMAL.replace('torch = "2.9.1"', "torch = 5"), "axes.torch: expected an array of values, got 5"),
    "version-int": (
        sub('version = "0.3.21"', "version = 3"),
        "axes.sgl-kernel[0].version: expected a version string, got 3",
    ),
    "version-float": (
        sub('version = "0.3.21"', "version = 0.3"),
        "axes.sgl-kernel[0].version: expected a version string, got 0.3",
    ),
    "version-date": (
        sub('version = "0.3.21"', "version = 2024-01-01"),
        "axes.sgl-kernel[0].version: expected a version string, got a date",
    ),
    "version-latest": (
        sub('version = "0.3.21"', 'version = "latest"'),
        "axes.sgl-kernel[0].version: 'latest' is not a valid PEP 440 version",
    ),
    "version-empty": (
        sub('version = "0.3.21"', 'version = ""'),
        "axes.sgl-kernel[0].version: '' is not a valid PEP 440 version",
    ),
    "version-spaces": (
        sub('version = "0.3.21"', 'version = "0.3.21 "'),
        "axes.sgl-kernel[0].version: '0.3.21 ' has spaces around it",
    ),
    "index-int": (
        sub('index = "https://flashinfer.example/whl/cu128"', "index = 42"),
        "axes.flashinfer[0].index: expected a URL, got 42",
    ),
    "index-ftp": (
        sub("https://flashinfer", "ftp://flashinfer"),
        "axes.flashinfer[0].index: expected an http(s):// or file:// URL",
    ),
    "find-links-table": (
        sub('version = "0.3.21"', 'version = "0.3.21"\nfind-links = { url = "x" }'),
        "axes.sgl-kernel[0].find-links: expected a URL, got a table",
    ),
    "requires-int": (
        sub('requires = ["apache-tvm-ffi<0.2"]', "requires = 5"),
        "axes.flashinfer[0].requires: expected a string or an array of strings, got 5",
    ),
    "requires-invalid": (
        sub("apache-tvm-ffi<0.2", "apache-tvm-ffi<<0.2"),
        "axes.flashinfer[0].requires[0]: 'apache-tvm-ffi<<0.2' is not a valid requirement",
    ),
    "value-cuda-bad": (
        sub('cuda = "12.8"\n\n[[axes.torch]]', 'cuda = "twelve"\n\n[[axes.torch]]'),
        "axes.torch[0].cuda: 'twelve' is not a valid PEP 440 version",
    ),
    "value-cuda-no-column": (
        sub('cuda = "12.8"\n\n[[axes.torch]]', 'cuda = "11.8"\n\n[[axes.torch]]'),
        "axes.torch[0].cuda: '11.8' matches no value of axis 'cuda' (12.8)",
    ),
    "install-timeout-string": (
        sub("timeout = 600", 'timeout = "600"'),
        "install.timeout: expected a positive number of seconds, got '600'",
    ),
    "install-timeout-negative": (
        sub("timeout = 600", "timeout = -1"),
        "install.timeout: expected a positive number of seconds, got -1",
    ),
    "install-retries-float": (
        sub("retries = 1", "retries = 1.5"),
        "install.retries: expected a non-negative integer, got 1.5",
    ),
    "install-overrides-int": (
        sub('overrides = ["flashinfer-python==0.6.4"]', "overrides = [1]"),
        "install.overrides[0]: expected a string, got 1",
    ),
    "install-python-bad": (
        sub("retries = 1", 'retries = 1\npython = "three"'),
        "install.python: 'three' is not a valid PEP 440 version",
    ),
    "target-gpus-string": (
        sub("gpus = 8", 'gpus = "eight"'),
        "targets.h200.gpus: expected a positive integer, got 'eight'",
    ),
    "target-gpus-zero": (sub("gpus = 8", "gpus = 0"), "targets.h200.gpus: expected a positive integer, got 0"),
    "target-arch-bad": (
        sub('arch = ["sm_90"]', 'arch = ["sm90"]'),
        "targets.h200.arch[0]: expected an SM arch like 'sm_90'",
    ),
    "target-arch-unicode-digit": (
        sub('arch = ["sm_90"]', 'arch = ["sm_\u0669\u0660"]'),
        "targets.h200.arch[0]: expected an SM arch like 'sm_90'",
    ),
    "target-min-driver-float": (
        sub('min-driver = "580.65"', "min-driver = 580.65"),
        "targets.h200.min-driver: expected a driver version string like '580.65', got 580.65",
    ),
    "target-nccl-env-int": (
        sub('NCCL_NVLS_ENABLE = "0"', "NCCL_NVLS_ENABLE = 0"),
        "targets.h200.nccl-env.NCCL_NVLS_ENABLE: expected a string, got 0",
    ),
    "target-nccl-env-name": (
        sub('NCCL_NVLS_ENABLE = "0"', 'nccl_nvls = "0"'),
        "targets.h200.nccl-env.nccl_nvls: expected an environment variable name",
    ),
    "target-not-table": (MINIMAL + "[targets]\nbox = 5\n", "targets.box: expected a table ([targets.box]), got 5"),
    "perf-trials-string": (sub("trials = 3", 'trials = "3"'), "perf.trials: expected a positive integer, got '3'"),
    "perf-concurrency-empty": (
        sub("concurrency = [1, 16]", "concurrency = []"),
        "perf.concurrency: expected a non-empty array of positive integers",
    ),
    "perf-concurrency-string": (
        sub("concurrency = [1, 16]", 'concurrency = ["1", 16]'),
        "perf.concurrency[0]: expected a positive integer, got '1'",
    ),
    "perf-protocol-bad": (
        sub("trials = 3", 'trials = 3\nprotocol = "grpc"'),
        'perf.protocol: expected "generate" or "openai", got \'grpc\'',
    ),
    "perf-argv-string": (
        sub(
            'argv = ["python", "-m", "sglang.launch_server", "--port", "{port}"]',
            'argv = "python -m sglang.launch_server"',
        ),
        "perf.servers.baseline.argv: expected an array of strings (never a shell string)",
    ),
    "perf-port-big": (
        sub("startup-timeout = 1200", "startup-timeout = 1200\nport = 70000"),
        "perf.servers.baseline.port: expected a port number 1-65535, got 70000",
    ),
    "perf-missing-eagle3": (
        sub(
            '[perf.servers.eagle3]\nargv = ["python", "-m", "sglang.launch_server", "--speculative-algorithm", "EAGLE3", "--port", "{port}"]\nenv = { HF_HOME = "/models" }\n',
            "",
        ),
        "perf.servers.eagle3: missing; the suite needs [perf.servers.eagle3]",
    ),
    "perf-unknown-server": (
        plus('[perf.servers.eagle]\nargv = ["x", "{port}"]\n'),
        "perf.servers.eagle: unknown server; the suite compares baseline and eagle3",
    ),
    "perf-prompts-missing": (
        sub("trials = 3", 'trials = 3\nprompts = "no-such-prompts.json"'),
        "perf.prompts: 'no-such-prompts.json': no such file",
    ),
    "perf-warmup-negative": (
        sub("trials = 3", "trials = 3\nwarmup = -1"),
        "perf.warmup: expected an integer >= 0, got -1",
    ),
    "perf-startup-timeout-string": (
        sub("startup-timeout = 1200", 'startup-timeout = "20m"'),
        "perf.servers.baseline.startup-timeout: expected a positive number, got '20m'",
    ),
    "perf-env-int": (
        sub('env = { HF_HOME = "/models" }', "env = { HF_HOME = 1 }"),
        "perf.servers.eagle3.env.HF_HOME: expected a string, got 1",
    ),
    "perf-not-table": ('perf = "fast"\n' + MINIMAL, "perf: expected a table, got 'fast'"),
    "thresholds-perf-level": (
        sub('min-tok-s = { "16" = 600.0 }', 'min-tok-s = { "4" = 600.0 }'),
        "thresholds.perf.min-tok-s.4: '4' is not a concurrency level of [perf] (1, 16)",
    ),
    "thresholds-perf-string": (
        sub("min-speedup = 1.0", 'min-speedup = "1.0"'),
        "thresholds.perf.min-speedup: expected a positive number, got '1.0'",
    ),
    "thresholds-nccl-string": (
        sub("min-busbw-gbps = 300", 'min-busbw-gbps = "fast"'),
        "thresholds.nccl.min-busbw-gbps: expected a positive number of GB/s, got 'fast'",
    ),
    "thresholds-nccl-not-table": (MINIMAL + "[thresholds]\nnccl = 300\n", "thresholds.nccl: expected a table, got 300"),
    "thresholds-import-string": (
        sub("import-timeout = 120", 'import-timeout = "2m"'),
        "thresholds.import-timeout: expected a positive number of seconds, got '2m'",
    ),
    "thresholds-import-zero": (
        sub("import-timeout = 120", "import-timeout = 0"),
        "thresholds.import-timeout: expected a positive number of seconds, got 0",
    ),
    "thresholds-not-table": ("thresholds = [1]\n" + MINIMAL, "thresholds: expected a table, got an array"),
    # NaN and infinity
    "nan-install-timeout": (
        sub("timeout = 600", "timeout = nan"),
        "install.timeout: expected a finite number, got nan",
    ),
    "inf-import-timeout": (
        sub("import-timeout = 120", "import-timeout = inf"),
        "thresholds.import-timeout: expected a finite number, got inf",
    ),
    "nan-nccl": (
        sub("min-busbw-gbps = 300", "min-busbw-gbps = nan"),
        "thresholds.nccl.min-busbw-gbps: expected a finite number, got nan",
    ),
    "inf-nccl": (
        sub("min-busbw-gbps = 300", "min-busbw-gbps = +inf"),
        "thresholds.nccl.min-busbw-gbps: expected a finite number, got inf",
    ),
    "nan-spread": (
        sub("max-spread = 0.10", "max-spread = nan"),
        "thresholds.perf.max-spread: expected a finite number, got nan",
    ),
    "nan-min-tok-s": (
        sub('min-tok-s = { "16" = 600.0 }', 'min-tok-s = { "16" = nan }'),
        "thresholds.perf.min-tok-s.16: expected a finite number, got nan",
    ),
    "inf-min-speedup": (
        sub("min-speedup = 1.0", "min-speedup = inf"),
        "thresholds.perf.min-speedup: expected a finite number, got inf",
    ),
    "nan-startup-timeout": (
        sub("startup-timeout = 1200", "startup-timeout = nan"),
        "perf.servers.baseline.startup-timeout: expected a finite number, got nan",
    ),
    "nan-request-timeout": (
        sub("trials = 3", "trials = 3\nrequest-timeout = nan"),
        "perf.request-timeout: expected a finite number, got nan",
    ),
    "inf-max-cells": (sub("max-cells = 100", "max-cells = -inf"), "max-cells: expected a finite number, got -inf"),
    "nan-gpus": (sub("gpus = 8", "gpus = nan"), "targets.h200.gpus: expected a finite number, got nan"),
    "nan-concurrency": (
        sub("concurrency = [1, 16]", "concurrency = [1, nan]"),
        "perf.concurrency[1]: expected a finite number, got nan",
    ),
    "huge-integer": (
        sub("timeout = 600", "timeout = 99999999999999999999999"),
        "install.timeout: expected a positive number of seconds, got an integer outside TOML's 64-bit range",
    ),
    # control characters
    "ctrl-version": (
        sub('version = "0.3.21"', 'version = "0.3.21\\n"'),
        "axes.sgl-kernel[0].version: '0.3.21\\n' contains the control character U+000A",
    ),
    "ctrl-index": (
        sub("https://flashinfer.example/whl", "https://flash\\tinfer.example/whl"),
        "axes.flashinfer[0].index: 'https://flash\\tinfer.example/whl/cu128' contains the control character U+0009",
    ),
    "ctrl-arch": (
        sub('arch = ["sm_90"]', 'arch = ["sm_90\\n"]'),
        "targets.h200.arch[0]: 'sm_90\\n' contains the control character U+000A",
    ),
    "ctrl-target-key": (
        sub("[targets.h200]\n", '[targets."h200\\n"]\n').replace(
            "[targets.h200.nccl-env]", '[targets."h200\\n".nccl-env]'
        ),
        "targets.h200\\n: the key 'h200\\n' contains the control character U+000A; rename it",
    ),
    "ctrl-reason": (
        sub('reason = "not this week"', 'reason = """not\nthis week"""'),
        "rules.exclude[0].reason: 'not\\nthis week' contains the control character U+000A",
    ),
    "ctrl-gpu-del": (
        sub('gpu = "NVIDIA H200"', 'gpu = "NVIDIA\\u007fH200"'),
        "targets.h200.gpu: 'NVIDIA\\x7fH200' contains the control character U+007F",
    ),
    "ctrl-argv-nul": (
        sub('"--speculative-algorithm", "EAGLE3"', '"--speculative-algorithm", "EAGLE3\\u0000"'),
        "perf.servers.eagle3.argv[4]: 'EAGLE3\\x00' contains the control character U+0000",
    ),
    "ctrl-env-value": (
        sub('HF_HOME = "/models"', 'HF_HOME = "/models\\r"'),
        "perf.servers.eagle3.env.HF_HOME: '/models\\r' contains the control character U+000D",
    ),
    "ctrl-override": (
        sub("flashinfer-python==0.6.4", "flashinfer-python==0.6.4\\n"),
        "install.overrides[0]: 'flashinfer-python==0.6.4\\n' contains the control character U+000A",
    ),
    "ctrl-line-separator": (
        sub('name = "corpus"', 'name = "cor\\u2028pus"'),
        "name: 'cor\\u2028pus' contains the control character U+2028",
    ),
    "ctrl-prompts-nul": (
        sub("trials = 3", 'trials = 3\nprompts = "p\\u0000.json"'),
        "perf.prompts: 'p\\x00.json' contains the control character U+0000",
    ),
    "ctrl-nccl-env": (
        sub('NCCL_NVLS_ENABLE = "0"', 'NCCL_NVLS_ENABLE = "0\\n"'),
        "targets.h200.nccl-env.NCCL_NVLS_ENABLE: '0\\n' contains the control character U+000A",
    ),
    "ctrl-rule-version": (
        sub('torch = "2.10.0"\nreason', 'torch = "2.10.0\\t"\nreason'),
        "rules.exclude[0].torch: '2.10.0\\t' contains the control character U+0009",
    ),
    "ctrl-not-needed": (
        sub("gpus = 8", 'gpus = 8\nnot-needed = ["sgl_kernel/\\u001b[31m*"]'),
        "targets.h200.not-needed[0]: 'sgl_kernel/\\x1b[31m*' contains the control character U+001B",
    ),
    # rules
    "exclude-empty-list": (
        sub('torch = "2.10.0"\nreason = "not this week"', 'torch = []\nreason = "not this week"'),
        "rules.exclude[0].torch: an empty list names no version",
    ),
    "include-empty-list": (
        sub('torch = "2.10.0"\nsgl-kernel', "torch = []\nsgl-kernel"),
        "rules.include[0].torch: an empty list names no version",
    ),
    "expect-empty-list": (
        sub('torch = "2.9.1"\nexpect', "torch = []\nexpect"),
        "rules.expect[0].torch: an empty list names no version",
    ),
    "include-two-versions": (
        sub('torch = "2.10.0"\nsgl-kernel', 'torch = ["2.9.1", "2.10.0"]\nsgl-kernel'),
        "rules.include[0].torch: an included cell has one version per axis, got 2",
    ),
    "exclude-no-reason": (
        sub('reason = "not this week"\n', ""),
        "rules.exclude[0].reason: missing; this key is required",
    ),
    "exclude-unknown-version": (
        sub('torch = "2.10.0"\nreason', 'torch = "2.11.0"\nreason'),
        "rules.exclude[0].torch: '2.11.0' is not a value of axis 'torch' (2.9.1, 2.10.0)",
    ),
    "exclude-unknown-axis": (
        sub('torch = "2.10.0"\nreason', 'troch = "2.10.0"\nreason'),
        "rules.exclude[0].troch: not an axis and not 'reason' or 'expect'; perhaps you meant 'torch'?",
    ),
    "exclude-names-nothing": (
        sub('torch = "2.10.0"\nreason = "not this week"', 'reason = "not this week"'),
        "rules.exclude[0]: names no axis, so it would match every cell",
    ),
    "expect-pass": (
        sub('expect = "fail"', 'expect = "pass"'),
        "rules.expect[0].expect: the only expectation is \"fail\", got 'pass'",
    ),
    "expect-without-expect": (sub('expect = "fail"\n', ""), 'rules.expect[0].expect: missing; write expect = "fail"'),
    "include-missing-axis": (
        sub('flashinfer = "0.6.4"\ncuda = "12.8"', 'cuda = "12.8"'),
        "rules.include[0]: an included cell names a value for every axis; missing flashinfer",
    ),
    "rules-not-array": (
        MINIMAL + "[rules]\nexclude = 5\n",
        "rules.exclude: expected an array of tables ([[rules.exclude]]), got 5",
    ),
    "rules-kind-typo": (
        MINIMAL + '[[rules.exlude]]\ntorch = "2.9.1"\n',
        "rules.exlude: unknown key; perhaps you meant 'exclude'?",
    ),
    # unknown keys, at every level
    "top-typo": (sub('name = "corpus"', 'nmae = "corpus"'), "nmae: unknown key; perhaps you meant 'name'?"),
    "table-typo": (sub("[report]", "[reprot]"), "reprot: unknown key; perhaps you meant 'report'?"),
    "install-typo": (sub("retries = 1", "retires = 1"), "install.retires: unknown key; perhaps you meant 'retries'?"),
    "target-typo": (sub("gpus = 8", "gpuss = 8"), "targets.h200.gpuss: unknown key; perhaps you meant 'gpus'?"),
    "value-typo": (
        sub('index = "https', 'indx = "https'),
        "axes.flashinfer[0].indx: unknown key; perhaps you meant 'index'?",
    ),
    "thresholds-table-typo": (
        sub("[thresholds.nccl]", "[thresholds.ncll]"),
        "thresholds.ncll: unknown key; perhaps you meant 'nccl'?",
    ),
    "thresholds-flat-typo": (
        sub("import-timeout = 120", "import-timout = 120"),
        "thresholds.import-timout: unknown key; perhaps you meant 'import-timeout'?",
    ),
    "thresholds-nccl-typo": (
        sub("min-busbw-gbps = 300", "min-busbw-gpbs = 300"),
        "thresholds.nccl.min-busbw-gpbs: unknown key; perhaps you meant 'min-busbw-gbps'?",
    ),
    "thresholds-nccl-target": (
        sub("min-busbw-gbps = 300", "[thresholds.nccl.h100]\nmin-busbw-gbps = 300"),
        "thresholds.nccl.h100: not a target; perhaps you meant 'h200'?",
    ),
    "thresholds-perf-typo": (
        sub("max-spread = 0.10", "max-sprad = 0.10"),
        "thresholds.perf.max-sprad: unknown key; perhaps you meant 'max-spread'?",
    ),
    "perf-typo": (sub("trials = 3", "trails = 3"), "perf.trails: unknown key; perhaps you meant 'trials'?"),
    "perf-server-typo": (
        sub("startup-timeout = 1200", "startup-timout = 1200"),
        "perf.servers.baseline.startup-timout: unknown key; perhaps you meant 'startup-timeout'?",
    ),
    "report-typo": (sub('rows = ["torch"]', 'row = ["torch"]'), "report.row: unknown key; perhaps you meant 'rows'?"),
    # axes
    "axis-typo": (plus('[[axes.flashinfr]]\nversion = "0.7.4"\n'), "axes.flashinfr: 'flashinfr' is not a known axis"),
    "axis-extra-partial": (
        plus('[[axes.deep-gemm]]\nversion = "2.1.0"\npackage = "deep-gemm"\n[[axes.deep-gemm]]\nversion = "2.2.0"\n'),
        "axes.deep-gemm[1].package: missing; 'deep-gemm' is not a known axis",
    ),
    "axis-missing-required": (
        MINIMAL.replace('cuda = "12.8"\n', ""),
        "axes.cuda: missing; the lab needs the axes torch, cuda",
    ),
    "axis-no-values": (
        MINIMAL.replace('torch = "2.9.1"', "torch = []"),
        "axes.torch: has no values; give at least one",
    ),
    "axis-duplicate": (
        sub('version = "2.10.0"', 'version = "2.9.1"'),
        "axes.torch[1].version: '2.9.1' is listed twice",
    ),
    "axis-bad-name": (MINIMAL + 'Torch = "2.9.1"\n', "axes.Torch: an axis name is lower-case letters, digits and '-'"),
    "axis-bad-package": (
        sub('version = "0.3.21"', 'version = "0.3.21"\npackage = "-sgl-"'),
        "axes.sgl-kernel[0].package: '-sgl-' is not a valid distribution name",
    ),
    "axis-cuda-package": (
        sub('[[axes.cuda]]\nversion = "12.8"', '[[axes.cuda]]\nversion = "12.8"\npackage = "cuda"'),
        "axes.cuda[0].package: axis 'cuda' is not a package; remove this key",
    ),
    "axis-values-not-list": (
        MINIMAL + '[axes.deep-gemm]\npackage = "deep-gemm"\nvalues = "2.1.0"\n',
        "axes.deep-gemm.values: expected an array of values, got '2.1.0'",
    ),
    "axis-form-typo": (
        MINIMAL + '[axes.deep-gemm]\npackge = "deep-gemm"\nvalues = ["2.1.0"]\n',
        "axes.deep-gemm.packge: unknown key; perhaps you meant 'package'?",
    ),
    # report layout
    "report-twice": (
        sub('columns = ["sgl-kernel", "flashinfer"]', 'columns = ["torch", "flashinfer"]'),
        "report.columns[0]: 'torch' is already in report.rows[0]",
    ),
    "report-twice-default": (
        MINIMAL + '[report]\ntables = ["torch"]\n',
        "report.tables[0]: 'torch' is already in report.rows (by default)",
    ),
    "report-unknown-axis": (sub('tables = ["cuda"]', 'tables = ["cdua"]'), "report.tables[0]: 'cdua' is not an axis"),
    "report-empty": (sub('rows = ["torch"]', "rows = []"), "report.rows: an empty list; name at least one axis"),
    # the cap on cells
    "cap-432000": (
        axes(torch=60, sgl_kernel=40, flashinfer=30, cuda=6),
        "axes: 432,000 cells (torch 60 × sgl-kernel 40 × flashinfer 30 × cuda 6), more than max-cells = 2,000",
    ),
    "cap-own": (
        sub("max-cells = 100", "max-cells = 1"),
        "axes: 2 cells (torch 2 × sgl-kernel 1 × flashinfer 1 × cuda 1), more than max-cells = 1",
    ),
    "cap-zero": (sub("max-cells = 100", "max-cells = 0"), "max-cells: expected a positive integer, got 0"),
    "cap-string": (sub("max-cells = 100", 'max-cells = "many"'), "max-cells: expected a positive integer, got 'many'"),
}


def test_the_corpus_base_is_valid(tmp_path: Path) -> None:
    for name, text in (("base", BASE), ("minimal", MINIMAL)):
        path = tmp_path / f"{name}.toml"
        path.write_text(text, encoding="utf-8")
        assert load_matrix(path).size in (1, 2)


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_a_malformed_matrix_is_one_error_and_exit_2(case: str, tmp_path: Path) -> None:
    content, fragment = CORPUS[case]
    path = tmp_path / f"{case}.toml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "compatlab", "validate", "--matrix", str(path)],
        capture_output=True,
        text=True,
        errors="replace",
        check=False,
        timeout=60,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    lines = done.stderr.splitlines()
    assert [line for line in lines if line.startswith("error:")] == lines[:1], done.stderr
    assert lines[0].startswith((f"error: {path}: ", f"error: {len(lines) - 1} problems in {path}:")), done.stderr
    assert all(line.startswith(f"  {path}: ") for line in lines[1:]), done.stderr
    assert fragment in done.stderr, done.stderr
