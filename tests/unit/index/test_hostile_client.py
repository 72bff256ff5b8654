"""compatlab.index.client against an index on loopback that misbehaves on purpose (fixtures.badindex): answers that
drip, stop short, are cut JSON, name another project, link this machine's files, move to another host, or
carry another release's metadata; wheels whose METADATA cannot be read."""

from __future__ import annotations

import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from compatlab.index import client
from fixtures.badindex import HUGE, BadIndex, serve_bad
from fixtures.hostile import hard_deadline
from fixtures.wheels import build_wheel


@pytest.fixture
def bad(tmp_path: Path) -> Iterator[BadIndex]:
    with serve_bad(build_wheel(tmp_path, "hostpkg", "1.0", requires=["filelock"])) as server:
        yield server


def test_a_dripping_index_is_cut_off_at_the_deadline_not_per_read(bad: BadIndex) -> None:
    start = time.monotonic()
    with hard_deadline(8, "an index that drips a byte every 0.2 s"), pytest.raises(client.IndexUnavailable) as info:
        client.releases(f"{bad.url}/drip/simple", "hostpkg", timeout=2)
    assert time.monotonic() - start < 4
    assert str(info.value) == f"{bad.url}/drip/simple is unreachable: no complete answer within 2 s"


def test_a_page_short_of_its_content_length_is_no_answer(bad: BadIndex) -> None:
    with pytest.raises(
        client.IndexUnavailable,
        match=r"/cut/simple is unreachable: the answer was cut short: (\d+) of the \d+0 bytes its "
        r"Content-Length announced$",
    ):
        client.releases(f"{bad.url}/cut/simple", "hostpkg", timeout=5)


def test_cut_pep691_json_is_no_answer(bad: BadIndex) -> None:
    with pytest.raises(client.IndexUnavailable) as info:
        client.releases(f"{bad.url}/cutjson/simple", "hostpkg", timeout=5)
    assert str(info.value).startswith(f"{bad.url}/cutjson/simple is unreachable: its PEP 691 JSON does not parse (")


def test_a_page_of_another_project_is_no_answer(bad: BadIndex) -> None:
    with pytest.raises(client.IndexUnavailable) as info:
        client.releases(f"{bad.url}/other/simple", "hostpkg", timeout=5)
    assert str(info.value) == f"{bad.url}/other/simple answered the page of 'someone-else' when asked for hostpkg's"


def test_file_links_on_a_remote_page_are_not_followed(bad: BadIndex) -> None:
    found = client.releases(f"{bad.url}/filelink/simple", "hostpkg", timeout=5)
    assert [(r.version, [f.url for f in r.files]) for r in found] == [
        ("1.0", [f"{bad.url}/files/hostpkg-1.0-py3-none-any.whl"])
    ]


def test_after_a_redirect_links_resolve_there_and_get_no_credentials(bad: BadIndex) -> None:
    url = f"http://alice:pw@127.0.0.1:{bad.port}/redirect/simple"
    (release,) = client.releases(url, "hostpkg", timeout=5)
    assert release.files[0].url == f"http://localhost:{bad.port}/files/hostpkg-1.0-py3-none-any.whl"
    assert client.requires_dist(client.core_metadata(url, release, timeout=5)) == ("filelock",)
    files = [(host, auth) for host, path, auth in bad.requests if path.startswith("/files/")]
    assert files
    assert all((host, auth) == (f"localhost:{bad.port}", "") for host, auth in files)


def test_metadata_of_another_project_or_version_is_refused(bad: BadIndex) -> None:
    (release,) = client.releases(f"{bad.url}/liar/simple", "hostpkg", timeout=5)
    with pytest.raises(client.IndexUnavailable) as info:
        client.core_metadata(f"{bad.url}/liar/simple", release, timeout=5)
    assert str(info.value) == (
        f"{bad.url}/liar/simple: cannot read the metadata of 1.0: hostpkg-1.0-py3-none-any.whl: "
        "its metadata is of someone-else 99.0, not of hostpkg 1.0"
    )


def _rewrite(wheel: Path, *, flag_bits: int = 0, method: int | None = None) -> None:
    """Edit the METADATA member's headers in place: the general-purpose flags, the compression method."""
    with zipfile.ZipFile(wheel) as zf:
        info = next(i for i in zf.infolist() if i.filename.endswith(".dist-info/METADATA"))
        local = info.header_offset
    data = bytearray(wheel.read_bytes())
    central = data.index(b"PK\x01\x02")  # the central directory's entries, one of them the METADATA's
    while not data[central + 46 :].startswith(info.filename.encode()):
        central = data.index(b"PK\x01\x02", central + 4)
    for at, flag_off, method_off in ((local, 6, 8), (central, 8, 10)):
        data[at + flag_off] |= flag_bits
        if method is not None:
            data[at + method_off : at + method_off + 2] = method.to_bytes(2, "little")
    wheel.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        ({"flag_bits": 1}, "its METADATA is encrypted"),
        ({"method": 99}, "its METADATA is compressed with method 99; a wheel uses stored or deflate"),
    ],
    ids=["encrypted", "method-99"],
)
def test_an_unreadable_metadata_member_is_one_error_line(tmp_path: Path, edit: dict[str, int], why: str) -> None:
    wheel = build_wheel(tmp_path, "hostpkg", "1.0")
    _rewrite(wheel, **edit)
    with serve_bad(wheel) as bad:
        (release,) = client.releases(f"{bad.url}/good/simple", "hostpkg", timeout=5)
        with pytest.raises(client.IndexUnavailable) as info:
            client.core_metadata(f"{bad.url}/good/simple", release, timeout=5)
    assert str(info.value) == (
        f"{bad.url}/good/simple: cannot read the metadata of 1.0: hostpkg-1.0-py3-none-any.whl: "
        f"not a readable wheel ({why})"
    )


def test_a_yanked_release_asked_for_can_be_read(tmp_path: Path) -> None:
    from fixtures.liveindex import serve_live

    with serve_live([build_wheel(tmp_path, "hostpkg", "1.0", requires=["filelock"])]) as live:
        live.yank("hostpkg-1.0-py3-none-any.whl")
        (release,) = client.releases(f"{live.url}/simple", "hostpkg", timeout=5)
        assert release.yanked
        assert client.requires_dist(client.core_metadata(f"{live.url}/simple", release, timeout=5)) == ("filelock",)


def test_a_zip_directory_claiming_900_gib_is_one_error_line(bad: BadIndex) -> None:
    (release,) = client.releases(f"{bad.url}/huge/simple", "hostpkg", timeout=5)
    with pytest.raises(client.IndexUnavailable) as info:
        client.core_metadata(f"{bad.url}/huge/simple", release, timeout=5)
    assert str(info.value) == (
        f"{bad.url}/huge/simple: cannot read the metadata of 1.0: hostpkg-1.0-py3-none-any.whl: "
        f"reading its metadata would read {HUGE - 98} bytes of it"
    )
