"""`[serve] args` may not give again the flags the lab launches SGLang with: `compatlab validate` and
`compatlab check --serve-from` refuse them at load, naming the file, the key and the flag, in both forms."""

from __future__ import annotations

import sys
from pathlib import Path

from fixtures.labutil import lab

AXES = '[[axes.torch]]\nversion = "2.9.1"\n[[axes.cuda]]\nversion = "12.8"\n'


def test_serve_args_cannot_override_the_labs_launch_flags(tmp_path: Path) -> None:
    (tmp_path / "matrix.toml").write_text(
        AXES
        + "[serve]\n"
        + 'args = ["--mem-fraction-static", "0.35", "--host", "0.0.0.0", "--load-format=auto", "--tp=4",'
        + ' "--model", "/srv/kimi"]\n'
        + 'eagle3-args = ["--speculative-num-steps", "3", "--speculative-draft-model-path", "/srv/other"]\n'
    )
    done = lab(tmp_path, "validate", "--matrix", "matrix.toml")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "error: 5 problems in matrix.toml:\n"
        "  matrix.toml: serve.args[2]: --host is set by the lab (127.0.0.1); remove it\n"
        "  matrix.toml: serve.args[4]: --load-format is set by the lab (dummy); remove it\n"
        "  matrix.toml: serve.args[5]: --tp (--tp-size) is set by the lab ([serve] tp, else the target's GPUs); "
        "remove it\n"
        "  matrix.toml: serve.args[6]: --model (--model-path) is set by the lab (the target's model, shrunk: "
        "[serve] model); remove it\n"
        "  matrix.toml: serve.eagle3-args[2]: --speculative-draft-model-path is set by the lab (the EAGLE-3 draft: "
        "[serve] draft); remove it\n"
    )
    (tmp_path / "serve.toml").write_text('[serve]\nargs = "--port=30000"\n')
    check = lab(tmp_path, "check", "--serve-from", "serve.toml", "--venv", sys.prefix)
    assert (check.returncode, check.stderr) == (
        2,
        "error: serve.toml: serve.args: --port is set by the lab (a free loopback port); remove it\n",
    )
    (tmp_path / "matrix.toml").write_text(
        AXES + '[serve]\nargs = ["--trust-remote-code", "--attention-backend", "triton"]\n'
    )
    assert lab(tmp_path, "validate", "--matrix", "matrix.toml").returncode == 0
