"""Some of the malformed matrix files of the corpus (fixtures/matrix_corpus.py) through the real
`python -m compatlab validate` in a subprocess: the process ends as the CLI's ``main`` does in
tests/unit/config/test_matrix_corpus.py, for every kind of file (undecodable bytes, TOML that does not
parse, a control character, a cap, several problems at once)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.matrix_corpus import check_validate, write_case

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("case", ["gzip", "utf16", "syntax", "ctrl-argv-nul", "cap-432000", "exclude-names-nothing"])
def test_a_malformed_matrix_is_one_error_and_exit_2_in_a_process_of_its_own(case: str, tmp_path: Path) -> None:
    path = write_case(case, tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "compatlab", "validate", "--matrix", str(path)],
        capture_output=True,
        text=True,
        errors="replace",
        check=False,
        timeout=60,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )
    check_validate(case, path, done.returncode, done.stdout, done.stderr)
