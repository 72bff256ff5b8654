"""compatlab.index.client against a real index on loopback (fixtures.liveindex): releases, yanked and
pre-releases, Requires-Dist read by HTTP ranges or from PEP 658 files, credentials, an index that is gone."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from compatlab.index import client
from fixtures.labutil import closed_port
from fixtures.liveindex import LiveIndex, serve_live
from fixtures.wheels import build_wheel


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveIndex]:
    w = tmp_path / "w"
    wheels = [
        build_wheel(w, "torch", v, requires=["filelock", 'cuda-toolkit[cudart]==13.0.3; platform_system == "Linux"'])
        for v in ("2.13.0", "2.14.0", "2.14.1", "2.15.0rc1")
    ]
    # A big file in the wheel, so that reading its METADATA by ranges is worth it.
    wheels.append(
        build_wheel(
            w,
            "sglang",
            "0.5.23",
            requires=["torch==2.14.1", "flashinfer_python[cu13]==0.7.2"],
            files={"sglang/blob.bin": random.Random(0).randbytes(2 << 20)},  # noqa: S311 - incompressible, not secret
        )
    )
    with serve_live(wheels) as server:
        server.yank("torch-2.14.0-py3-none-any.whl")
        yield server


@pytest.mark.parametrize("json_pages", [True, False], ids=["pep691", "pep503"])
def test_releases_flag_yanked_and_pre_releases(live: LiveIndex, json_pages: bool) -> None:
    live.json_pages = json_pages
    found = client.releases(f"{live.url}/simple", "Torch")
    assert [(r.version, r.yanked, r.prerelease) for r in found] == [
        ("2.13.0", False, False),
        ("2.14.0", True, False),
        ("2.14.1", False, False),
        ("2.15.0rc1", False, True),
    ]
    assert found[0].files[0].url == f"{live.url}/files/torch-2.13.0-py3-none-any.whl"


def test_requires_dist_by_range_requests_reads_only_the_end(live: LiveIndex) -> None:
    release = client.releases(f"{live.url}/simple", "sglang")[0]
    meta = client.core_metadata(f"{live.url}/simple", release)
    assert client.requires_dist(meta) == ("torch==2.14.1", "flashinfer_python[cu13]==0.7.2")
    ranges = [r for p, r, _ in live.requests if p.startswith("/files/")]
    assert ranges
    assert all(r.startswith("bytes=") for r in ranges)


def test_requires_dist_from_pep658_metadata(live: LiveIndex) -> None:
    live.metadata = True
    release = client.releases(f"{live.url}/simple", "torch")[2]
    assert release.files[0].metadata
    meta = client.core_metadata(f"{live.url}/simple", release)
    assert client.requires_dist(meta) == ("filelock", 'cuda-toolkit[cudart]==13.0.3; platform_system == "Linux"')
    assert [p for p, _, _ in live.requests if p.startswith("/files/")] == [
        "/files/torch-2.14.1-py3-none-any.whl.metadata"
    ]


def test_credentials_go_to_the_index_and_never_into_a_message(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path, "torch", "2.14.1")
    with serve_live([wheel], username="alice", password="s3cr:t") as live:
        url = live.url.replace("http://", "http://alice:s3cr%3At@") + "/simple"
        found = client.releases(url, "torch")
        assert client.requires_dist(client.core_metadata(url, found[0])) == ()
        assert {a for _, _, a in live.requests} == {"Basic YWxpY2U6czNjcjp0"}
        with pytest.raises(client.IndexUnavailable) as info:
            client.releases(live.url.replace("http://", "http://alice:wrong@") + "/simple", "torch")
    assert (
        str(info.value)
        == f"{live.url.replace('http://', 'http://***@')}/simple refused the credentials: HTTP 401 for torch's page"
    )


def test_an_unreachable_index_and_a_missing_project_are_errors(live: LiveIndex) -> None:
    with pytest.raises(client.IndexUnavailable) as info:
        client.releases(f"{live.url}/simple", "flashinfer-python")
    assert str(info.value) == (
        f"{live.url}/simple has no project 'flashinfer-python' (HTTP 404 for {live.url}/simple/flashinfer-python/)"
    )
    port = closed_port()
    with pytest.raises(client.IndexUnavailable) as info:
        client.releases(f"http://127.0.0.1:{port}/simple", "torch", timeout=5)
    assert str(info.value) == f"http://127.0.0.1:{port}/simple is unreachable: [Errno 111] Connection refused"
