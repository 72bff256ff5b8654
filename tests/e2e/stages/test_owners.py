"""Files owned by two distributions, on a venv that real uv filled with tiny wheels built here.

The real case, shrunk: cuda-bindings 13.5.0 is installed first, then cuda-python 12.6.2.post1 (which
flashinfer-python asks for as `cuda-python>=12.0`) overwrites its `cuda/bindings/` files.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from compatlab.existing import existing_cell, inspect_environment
from compatlab.stages.base import CellContext
from compatlab.stages.pins import run_pins_stage
from fixtures.wheels import build_wheel, venv_with

NAMESPACE = "__path__ = __import__('pkgutil').extend_path(__path__, __name__)\n"


@pytest.fixture(scope="module")
def clashing_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("owners")
    w = tmp / "wheels"
    new = {
        "cuda/bindings/__init__.py": "",
        "cuda/bindings/runtime.py": "cudaLibrary_t = object\n",
        "cuda/bindings/driver.py": "CUresult = int\n",
        "cuda/bindings/runtime.pxd": "# 13.5\n",
        "nvidia/__init__.py": "",
        "cuda/__init__.py": f"# 13.5\n{NAMESPACE}",
    }
    old = {
        "cuda/bindings/__init__.py": "",
        "cuda/bindings/runtime.py": "# 12.6: no cudaLibrary_t\n",
        "cuda/bindings/driver.py": "CUresult = int  # 12.6\n",
        "cuda/bindings/runtime.pxd": "# 12.6\n",
        "nvidia/__init__.py": "",
        "cuda/__init__.py": f"# cuda-python 12.6\n{NAMESPACE}",
    }
    first = [
        build_wheel(w, "cuda-bindings", "13.5.0", files=new),
        build_wheel(w, "flashinfer-python", "0.7.4", requires=["cuda-python>=12.0", "cuda-bindings>=12"]),
        build_wheel(w, "docs-a", "1.0", files={"share/compat/LICENSE.txt": "A\n"}),
        # flashinfer-python 0.7.2 and torch_c_dlpack_ext 0.1.5 each ship their build helper as a top-level
        # build_backend.py: a stray module no package of theirs imports, not their code.
        build_wheel(w, "tool-a", "1.0", files={"tool_a/__init__.py": "", "build_backend.py": "# a\n"}),
    ]
    later = [
        build_wheel(w, "cuda-python", "12.6.2.post1", files=old),
        build_wheel(
            w, "docs-b", "2.0", requires=["docs-a>=2", "absent-dep"], files={"share/compat/LICENSE.txt": "B\n"}
        ),
        build_wheel(w, "tool-b", "1.0", files={"tool_b/__init__.py": "", "build_backend.py": "# b\n"}),
    ]
    venv_with(tmp / "venv", first, later)  # installed in this order: the later wheels' bytes win
    return tmp / "venv"


def test_a_file_two_distributions_own_is_a_failure_on_code_and_a_warning_on_data(
    clashing_venv: Path, tmp_path: Path
) -> None:
    env = inspect_environment(clashing_venv / "bin" / "python")
    matrix, cell = existing_cell(env, packages=["flashinfer-python", "cuda-bindings"])
    ctx = CellContext(
        matrix=matrix, cell=cell, venv=clashing_venv, python=env.python, work_dir=tmp_path, site_packages=env.site
    )
    result = run_pins_stage(ctx)
    code = (
        "cuda-bindings 13.5.0 and cuda-python 12.6.2.post1 both install 3 files (cuda/bindings/, 2 of them "
        "code) with different bytes: the bytes on disk are cuda-python 12.6.2.post1's; cuda-python "
        "12.6.2.post1 is here because flashinfer-python 0.7.4 requires 'cuda-python>=12.0'"
    )
    data = (
        "docs-a 1.0 and docs-b 2.0 both install 1 file (share/compat/LICENSE.txt, data files only) with "
        "different bytes: the bytes on disk are docs-b 2.0's"
    )
    assert (result.state, result.reason) == ("fail", code)
    assert result.details["failures"] == [code]
    # As `compatlab check` sees an environment installed by hand: the pins it breaks, as `uv pip check` would.
    stray = (
        "tool-a 1.0 and tool-b 1.0 both install 1 file (build_backend.py, a top-level module neither is "
        "named after: only `import build_backend` gets one of them) with different bytes: the bytes on disk "
        "are tool-b 1.0's"
    )
    assert result.details["warnings"] == [
        data,
        stray,
        "docs-b 2.0 requires docs-a>=2; docs-a 1.0 is installed",
        "docs-b 2.0 requires absent-dep, which is not installed",
    ]
    [first, _, _] = result.details["file_clashes"]
    assert first["on_disk"] == {"cuda-bindings 13.5.0": 0, "cuda-python 12.6.2.post1": 3, "neither": 0}
    # nvidia/__init__.py: both ship the same empty file; cuda/__init__.py: each declares the namespace in its
    # own words. Neither is a clash.
    assert first["examples"] == ["cuda/bindings/driver.py", "cuda/bindings/runtime.pxd", "cuda/bindings/runtime.py"]
