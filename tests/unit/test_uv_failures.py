"""uv's failures told by their cause: a full disk is the machine's, never the index's (uv_failures.py), and its
code is one row of the cause table (incell/causes.py), grey like the infrastructure's."""

from __future__ import annotations

from compatlab import uv_failures
from compatlab.incell.causes import CAUSES
from compatlab.incell.proc import Completed
from compatlab.runs.model import StageResult, StageState
from compatlab.stages import blame

# uv 0.13.9's stderr, installing numpy 2.2.6 with its cache on a 3 MB tmpfs (recorded on this machine): its first
# line names a download, its innermost cause the disk.
ENOSPC = """\
Using Python 3.11.7 environment at: tiny/v
Resolved 1 package in 91ms
Downloading numpy (16.0MiB)
error: Failed to download `numpy==2.2.6`
  cause: Failed to extract archive: numpy-2.2.6-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
  cause: I/O operation failed during extraction
  cause: failed to write to file `/tmp/tiny/cache/.tmpqrMrKq/numpy/ma/tests/test_core.py`: No space left on device \
(os error 28)
"""


def _uv(stderr: str) -> Completed:
    return Completed(argv=["uv", "pip", "install"], returncode=2, stdout="", stderr=stderr, seconds=0.4)


def test_a_full_disk_is_said_as_one_with_where_to_make_room() -> None:
    assert uv_failures.classify_uv_failure(_uv(ENOSPC)) == (
        "error",
        "disk full: Failed to download `numpy==2.2.6` (cause: failed to write to file "
        "`/tmp/tiny/cache/.tmpqrMrKq/numpy/ma/tests/test_core.py`: No space left on device (os error 28)); "
        "free space there, or put uv's cache and the cells' venvs on a bigger disk (UV_CACHE_DIR, "
        "COMPATLAB_VENVS; README: Disk)",
    )


def test_a_full_disk_is_its_own_grey_cause() -> None:
    state, reason = uv_failures.classify_uv_failure(_uv(ENOSPC))
    code = blame.cause_of(StageResult(name="install", state=StageState(state), reason=reason))
    assert (code, CAUSES[code].color) == ("disk-full", "grey")


def test_a_download_that_failed_on_the_network_is_still_the_index() -> None:
    stderr = (
        "error: Failed to download `torch==2.9.1`\n"
        "  Caused by: error sending request for url (https://download.pytorch.org/whl/torch-2.9.1.whl)\n"
    )
    state, reason = uv_failures.classify_uv_failure(_uv(stderr))
    assert state == "error"
    assert reason.startswith("index or network failure: ")
    assert blame.cause_of(StageResult(name="install", state=StageState.ERROR, reason=reason)) == "infra"
