"""rehearse.request: what the lab reads of `uv pip install`'s arguments, and what it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from compatlab.errors import UsageError
from compatlab.rehearse.request import parse_request, pip_conf_indexes


def test_the_packages_asked_for_are_read_from_every_place_uv_takes_them(tmp_path: Path) -> None:
    (tmp_path / "base.txt").write_text("Flashinfer_Python>=0.6  # the kernels\n--index-url https://x/simple\n")
    (tmp_path / "req.txt").write_text("-r base.txt\n# a comment\nsglang[all]==0.5.23 ; python_version >= '3.10'\n")
    request = parse_request(
        ["-U", "--index-url=https://i/simple", "-P", "numpy", "torchvision", "./local.whl", "--no-deps"],
        requirements=[tmp_path / "req.txt"],
    )
    assert request.packages == ("numpy", "torchvision", "flashinfer-python", "sglang")
    assert (request.has_index, request.upgrade_all) == (True, True)
    assert request.args[-2:] == ("-r", str(tmp_path / "req.txt"))
    assert request.argv("uv", Path("/e/bin/python"), constraints=Path("/o/c.txt")) == [
        "uv", "pip", "install", "--python", "/e/bin/python", *request.args, "--constraint", "/o/c.txt",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--python", "/usr/bin/python3", "x"],
            "rehearse: --python: the rehearsal installs into its copy of the "
            "environment; drop it from the install's arguments",
        ),
        (
            ["--system", "x"],
            "rehearse: --system: the rehearsal installs into its copy of the environment; drop it "
            "from the install's arguments",
        ),
        (
            ["--dry-run", "x"],
            "rehearse: --dry-run: the rehearsal installs for real, into a copy; drop it from the install's arguments",
        ),
        (["x", "--index-url"], "rehearse: --index-url needs a value (uv pip install --index-url VALUE)"),
    ],
)
def test_what_would_aim_the_install_elsewhere_is_refused(args: list[str], message: str) -> None:
    with pytest.raises(UsageError) as got:
        parse_request(args)
    assert str(got.value) == message


def test_the_environments_pip_conf_gives_its_indexes(tmp_path: Path) -> None:
    assert pip_conf_indexes(tmp_path) == []
    (tmp_path / "pip.conf").write_text(
        "[global]\nindex-url = https://a/simple\nfind-links = /w1\n"
        "[install]\nextra-index-url =\n  https://b/simple\n  https://c/simple\n"
    )
    assert pip_conf_indexes(tmp_path) == [
        "--index-url", "https://a/simple",
        "--extra-index-url", "https://b/simple", "--extra-index-url", "https://c/simple",
        "--find-links", "/w1",
    ]  # fmt: skip
    (tmp_path / "pip.conf").write_text("index-url = no section\n")
    with pytest.raises(UsageError, match=r"pip\.conf: cannot read it as pip reads it"):
        pip_conf_indexes(tmp_path)


def test_a_short_option_glued_to_its_value_is_read_as_uv_reads_it(tmp_path: Path) -> None:
    (tmp_path / "r.txt").write_text("numpy\n")
    request = parse_request([f"-r{tmp_path / 'r.txt'}", "-ihttps://i/simple"])
    assert (request.packages, request.has_index) == (("numpy",), True)
