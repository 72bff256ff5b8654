"""Credentials in URLs: split off percent-decoded, redacted wherever a URL is shown, refused in find-links."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from compatlab.config.matrix import load_matrix
from compatlab.errors import ConfigError
from compatlab.urls import Credentials, has_credentials, redact, redact_text, split


def test_split_takes_the_userinfo_off_and_decodes_it() -> None:
    clean, creds = split("https://alice:p%40ss%3Aword@pypi.corp.example:8443/simple/?x=1")
    assert clean == "https://pypi.corp.example:8443/simple/?x=1"
    assert creds == Credentials(username="alice", password="p@ss:word")
    # A token as the user name alone (GitLab, Artifactory): no password, not an empty one.
    assert split("https://gl-token@host/simple") == ("https://host/simple", Credentials(username="gl-token"))
    assert split("https://host/simple") == ("https://host/simple", None)
    assert split("file:///srv/wheels") == ("file:///srv/wheels", None)


def test_the_last_at_ends_the_userinfo_as_uv_reads_it() -> None:
    clean, creds = split("https://alice:p@ss@host/simple")
    assert (clean, creds) == ("https://host/simple", Credentials(username="alice", password="p@ss"))
    assert redact("https://alice:p@ss@host/simple") == "https://***@host/simple"


def test_the_password_is_never_in_a_repr() -> None:
    assert repr(Credentials(username="alice", password="hunter2")) == "Credentials(username='alice')"


def test_redact_masks_the_whole_userinfo() -> None:
    assert redact("https://user:pass@host/simple") == "https://***@host/simple"
    assert redact("http://token@127.0.0.1:8080/simple") == "http://***@127.0.0.1:8080/simple"
    assert redact("https://host/simple") == "https://host/simple"
    assert has_credentials("https://user:pass@host/simple")
    assert not has_credentials("https://host/simple")


def test_redact_text_finds_every_url_in_prose_toml_and_shell() -> None:
    text = textwrap.dedent("""\
        error: Failed to fetch: https://u:s3cret@host/simple/torch/ (see http://other@host2:81/x)
        url = "https://u:s3cret@host/simple"
        uv pip install --default-index 'default=https://u:s3cret@host/simple' --find-links https://h/w
        mail alice@example.org about https://host/simple
        """)
    assert redact_text(text) == textwrap.dedent("""\
        error: Failed to fetch: https://***@host/simple/torch/ (see http://***@host2:81/x)
        url = "https://***@host/simple"
        uv pip install --default-index 'default=https://***@host/simple' --find-links https://h/w
        mail alice@example.org about https://host/simple
        """)
    # JSON without spaces: the match never runs across a quote into the next string.
    assert redact_text('["https://host/simple","a@b"]') == '["https://host/simple","a@b"]'


def _matrix(tmp_path: Path, sgl: str) -> Path:
    path = tmp_path / "matrix.toml"
    path.write_text(
        textwrap.dedent(f"""
        [[axes.torch]]
        version = "2.9.1"
        [[axes.sgl-kernel]]
        version = "0.3.21"
        {sgl}
        [[axes.flashinfer]]
        version = "0.6.4"
        [[axes.cuda]]
        version = "12.8"
        """)
    )
    return path


def test_matrix_refuses_credentials_in_find_links(tmp_path: Path) -> None:
    path = _matrix(tmp_path, 'find-links = "https://bob:hunter2@wheels.example/sgl/"')
    with pytest.raises(ConfigError) as info:
        load_matrix(path)
    assert info.value.problems == [
        "axes.sgl-kernel[0].find-links: credentials in a find-links URL are not supported (got "
        "'https://***@wheels.example/sgl/'): uv can be given credentials only for a named index, and the lab "
        "writes no secret to disk; serve these files as a simple index and give it as 'index'"
    ]
    assert "hunter2" not in str(info.value)


def test_a_bad_url_is_shown_without_its_password(tmp_path: Path) -> None:
    path = _matrix(tmp_path, 'index = "ftp://bob:hunter2@wheels.example/simple"')
    with pytest.raises(ConfigError) as info:
        load_matrix(path)
    assert info.value.problems == [
        "axes.sgl-kernel[0].index: expected an http(s):// or file:// URL, got 'ftp://***@wheels.example/simple'"
    ]


def test_credentials_in_an_index_are_accepted(tmp_path: Path) -> None:
    path = _matrix(tmp_path, 'index = "https://bob:hunter2@wheels.example/simple"')
    value = load_matrix(path).axes[1].values[0]
    assert value.index == "https://bob:hunter2@wheels.example/simple"
