"""Every malformed matrix file of the corpus (fixtures/matrix_corpus.py) through `compatlab validate`'s own
``main``, in this process: exit status 2, nothing on stdout, one ``error:`` message that names the file and
the problem's key path, no traceback. tests/e2e/config/test_corpus.py shows some of them through the real
``python -m compatlab`` in a subprocess."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from compatlab.cli import main
from compatlab.config.matrix import load_matrix
from fixtures.matrix_corpus import BASE, CORPUS, MINIMAL, check_validate, write_case


def test_the_corpus_base_is_valid(tmp_path: Path) -> None:
    for name, text in (("base", BASE), ("minimal", MINIMAL)):
        path = tmp_path / f"{name}.toml"
        path.write_text(text, encoding="utf-8")
        assert load_matrix(path).size in (1, 2)


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_a_malformed_matrix_is_one_error_and_exit_2(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in [n for n in os.environ if n.startswith("COMPATLAB_")]:
        monkeypatch.delenv(name)  # as the subprocess of the e2e test sees it: nothing of the lab's set
    path = write_case(case, tmp_path)
    returncode = main(["validate", "--matrix", str(path)])
    out, err = capsys.readouterr()
    check_validate(case, path, returncode, out, err)
