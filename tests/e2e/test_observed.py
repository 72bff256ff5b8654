"""Verdicts from what an import really did, on tiny real wheels built here and installed by real uv.

Each package is built in the test: shared objects with gcc, wheels with fixtures.wheels, a venv with uv.
`compatlab check` then judges it in process, as a box owner runs it; each case is one class the lab got
wrong when it guessed what an import needs from names (issue 30).
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from compatlab.cli.check import run_check
from compatlab.existing import inspect_environment
from compatlab.incell import fakecuda
from compatlab.incell.causes import CAUSES
from compatlab.runner import ExistingRequest
from compatlab.runs.model import CellResult, CellState, StageState
from fixtures.sofix import EXT_SUFFIX, compile_so, ext_module, provider
from fixtures.wheels import build_wheel, venv_with

pytestmark = pytest.mark.slow

TAG = f"cp{sys.version_info.major}{sys.version_info.minor}-cp{sys.version_info.major}{sys.version_info.minor}-linux_x86_64"

VISION_INIT = """\
import ctypes, os
_here = os.path.dirname(__file__)
try:
    ctypes.CDLL(os.path.join(_here, "_C.so"))  # what torch.ops.load_library does
    _ops = True
except OSError:
    _ops = False
if not _ops:
    raise RuntimeError("operator visionish::nms does not exist")
"""

HOST_INIT = """\
import ctypes, os
ctypes.CDLL(os.path.join(os.path.dirname(__file__), "lib", "libffihost.so"), mode=ctypes.RTLD_GLOBAL)
"""

NUMPY_SHIM = '''\
"""NumPy 2's numpy.core._multiarray_umath: what it answers a module built for NumPy 1.x."""
import sys


def __getattr__(name):
    if name == "_ARRAY_API":
        msg = ("A module that was compiled using NumPy 1.x cannot be run in\\n"
               "NumPy 2.0.2 as it may crash. To support both 1.x and 2.x\\n"
               "versions of NumPy, modules must be compiled with NumPy 2.0.")
        sys.stderr.write(msg + "\\n")
        raise ImportError(msg)
    raise AttributeError(name)
'''

# What numpy 1.x's __multiarray_api.h compiles into every extension: _import_array().
IMPORT_ARRAY = """
    PyObject *numpy = PyImport_ImportModule("numpy.core._multiarray_umath");
    PyObject *api = numpy ? PyObject_GetAttrString(numpy, "_ARRAY_API") : NULL;
    if (api == NULL) {
        PyErr_Print();
        PyErr_SetString(PyExc_ImportError, "numpy.core.multiarray failed to import");
        return NULL;
    }
"""


def _so(path: Path) -> bytes:
    return path.read_bytes()


def _visionish(build: Path, wheels: Path) -> Path:
    """A torch-extension-like wheel: __init__ loads _C.so by ctypes; _C.so needs ns::check(int), which its
    libprov.so (the "torch" beside it) no longer defines."""
    d = build / "vision"
    provider(d, "_ZN2ns5checkEi")
    lib_c = compile_so(
        d / "_C.so",
        "void _ZN2ns5checkEi(void);\nvoid nms(void) { _ZN2ns5checkEi(); }\n",
        f"-L{d}",
        "-lprov",
        "-Wl,-rpath,$ORIGIN",
    )
    provider(d, "_ZN2ns5checkEj")
    return build_wheel(
        wheels,
        "visionish",
        "1.0",
        files={
            "visionish/__init__.py": VISION_INIT,
            "visionish/_C.so": _so(lib_c),
            "visionish/libprov.so": _so(d / "libprov.so"),
        },
        tag=TAG,
    )


def _host_and_bindings(build: Path, wheels: Path) -> list[Path]:
    """ffihost loads lib/libffihost.so itself; bindings' __init__ imports ffihost, then loads its
    libbindings.so by ctypes, which needs libffihost.so with no RUNPATH to it (xgrammar beside tvm_ffi)."""
    d = build / "host"
    host = compile_so(d / "libffihost.so", "int ffihost_call(void) { return 7; }\n", soname="libffihost.so")
    lib = compile_so(
        d / "libbindings.so",
        "int ffihost_call(void);\nint bind(void) { return ffihost_call(); }\n",
        f"-L{d}",
        "-lffihost",
    )
    init = "import ctypes, os\nimport ffihost\nctypes.CDLL(os.path.join(os.path.dirname(__file__), 'libbindings.so'))\n"
    return [
        build_wheel(
            wheels,
            "ffihost",
            "1.0",
            files={"ffihost/__init__.py": HOST_INIT, "ffihost/lib/libffihost.so": _so(host)},
            tag=TAG,
        ),
        build_wheel(
            wheels,
            "bindings",
            "1.0",
            requires=["ffihost"],
            files={"bindings/__init__.py": init, "bindings/libbindings.so": _so(lib)},
            tag=TAG,
        ),
    ]


def _pure(wheels: Path) -> list[Path]:
    """purecore 1.0 installed beside purefail 1.0, which pins purecore==2.0 and refuses another at import."""
    init = (
        "import purecore\n"
        "if purecore.__version__ != '2.0':\n"
        "    raise SystemError(f'The installed purecore version ({purecore.__version__}) is incompatible with "
        "the current purefail version, which requires 2.0.')\n"
    )
    return [
        build_wheel(wheels, "purecore", "1.0"),
        build_wheel(wheels, "purefail", "1.0", requires=["purecore==2.0"], files={"purefail/__init__.py": init}),
    ]


def _numpy1(build: Path, wheels: Path) -> list[Path]:
    """A stand-in numpy 2.0.2 (its _ARRAY_API shim) and oldext, an extension built against NumPy 1.x."""
    mod = ext_module(build / "np", "_oldext", IMPORT_ARRAY)
    return [
        build_wheel(
            wheels,
            "numpy",
            "2.0.2",
            files={"numpy/core/__init__.py": "", "numpy/core/_multiarray_umath.py": NUMPY_SHIM},
        ),
        build_wheel(
            wheels,
            "oldext",
            "1.0",
            requires=["numpy"],
            files={"oldext/__init__.py": "from oldext import _oldext\n", f"oldext/_oldext{EXT_SUFFIX}": _so(mod)},
            tag=TAG,
        ),
    ]


PICK_INIT = """\
import ctypes, os
_here = os.path.dirname(__file__)
for _build in ("libkern_cu12.so", "libkern_cu13.so"):  # one build per CUDA major, the first that loads
    try:
        _lib = ctypes.CDLL(os.path.join(_here, "lib", _build))
        break
    except OSError:
        continue
try:
    _provider = ctypes.CDLL(os.path.join(_here, "lib", "libprovider_gpu.so"))  # optional, as onnxruntime's
except OSError:
    _provider = None
"""


def _picker(build: Path, wheels: Path) -> Path:
    """picker ships libkern_cu12.so (needs libcudart.so.12, absent) and libkern_cu13.so (loads), and an
    optional provider that needs libcublasLt.so.12 (absent)."""
    d = build / "picker"
    cudart = compile_so(d / "fake" / "libcudart.so.12", "int cudart12(void) { return 0; }\n", soname="libcudart.so.12")
    cublas = compile_so(
        d / "fake" / "libcublasLt.so.12", "int cublas12(void) { return 0; }\n", soname="libcublasLt.so.12"
    )
    cu12 = compile_so(d / "libkern_cu12.so", "int cudart12(void);\nint k(void) { return cudart12(); }\n", str(cudart))
    cu13 = compile_so(d / "libkern_cu13.so", "int k(void) { return 13; }\n")
    prov = compile_so(
        d / "libprovider_gpu.so", "int cublas12(void);\nint p(void) { return cublas12(); }\n", str(cublas)
    )
    files: dict[str, bytes | str] = {"picker/__init__.py": PICK_INIT}
    files.update({f"picker/lib/{p.name}": _so(p) for p in (cu12, cu13, prov)})
    return build_wheel(wheels, "picker", "1.0", files=files, tag=TAG)


AUDIO_INIT = """\
import ctypes, os
_here = os.path.dirname(__file__)
ctypes.CDLL(os.path.join(_here, "lib", "libaudioish.so"))  # what torch.ops.load_library does
from audioish.lib import _audioish
"""


def _audioish(build: Path, wheels: Path, *, cuda12: bool) -> list[Path]:
    """A torch +cu130 stand-in (its torch/version.py) and audioish, whose lib/_audioish extension needs its
    own lib/libaudioish.so with no RUNPATH to it (torchaudio's): __init__ loads that library first. With
    *cuda12* libaudioish.so needs libcudart.so.12, absent: a CUDA 12 build beside a CUDA 13 torch."""
    d = build / ("audio12" if cuda12 else "audio")
    cudart = compile_so(d / "fake" / "libcudart.so.12", "int cudart12(void) { return 0; }\n", soname="libcudart.so.12")
    body = (
        "int cudart12(void);\nint audio(void) { return cudart12(); }\n" if cuda12 else "int audio(void) { return 1; }\n"
    )
    lib = compile_so(d / "libaudioish.so", body, *([str(cudart)] if cuda12 else []), soname="libaudioish.so")
    mod = ext_module(d, "_audioish", "audio();", f"-L{d}", "-laudioish", prelude="int audio(void);")
    torch = build_wheel(
        wheels,
        "torch",
        "2.14.1",
        files={"torch/__init__.py": "", "torch/version.py": "__version__ = '2.14.1+cu130'\ncuda = '13.0'\n"},
    )
    files: dict[str, bytes | str] = {
        "audioish/__init__.py": AUDIO_INIT,
        "audioish/lib/__init__.py": "",
        "audioish/lib/libaudioish.so": _so(lib),
        f"audioish/lib/_audioish{EXT_SUFFIX}": _so(mod),
    }
    return [torch, build_wheel(wheels, "audioish", "12.0" if cuda12 else "13.0", files=files, tag=TAG)]


def _cplugin(build: Path, wheels: Path) -> Path:
    """cplugin's extension dlopen()s libcplugin_backend.so.3 from C at init (absent here) and raises
    RuntimeError without naming it: only the loader's own log (LD_DEBUG) sees the load."""
    body = """
        void *h = dlopen("libcplugin_backend.so.3", RTLD_NOW);
        if (h == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "cplugin: no backend available");
            return NULL;
        }
    """
    mod = ext_module(build / "cplugin", "_boot", body, "-ldl", prelude="#include <dlfcn.h>")
    files: dict[str, bytes | str] = {
        "cplugin/__init__.py": "from cplugin import _boot\n",
        f"cplugin/_boot{EXT_SUFFIX}": _so(mod),
    }
    return build_wheel(wheels, "cplugin", "1.0", files=files, tag=TAG)


CODEC_INIT = """\
import ctypes, os
_here = os.path.dirname(__file__)
for _major in (6, 5):  # one build per FFmpeg major, as torchcodec tries them; none is required
    try:
        ctypes.CDLL(os.path.join(_here, f"libcore{_major}.so"))
        break
    except OSError:
        continue
"""


def _codec_and_brokenpkg(build: Path, wheels: Path) -> list[Path]:
    """codecish tries two builds (each needing an absent libavutil) and does without; brokenpkg imports it, then
    fails for a reason of its own (torchaudio's CUDA check beside sglang)."""
    d = build / "codec"
    # Its own helper loads, as torchcodec's libtorchcodec_image.so does: the folder is not all failures.
    helper = compile_so(d / "libhelper.so", "int h(void) { return 1; }\n")
    files: dict[str, bytes | str] = {
        "codecish/__init__.py": "import ctypes, os\n"
        + "ctypes.CDLL(os.path.join(os.path.dirname(__file__), 'libhelper.so'))\n"
        + CODEC_INIT,
        "codecish/libhelper.so": _so(helper),
    }
    for major in (5, 6):
        dep = compile_so(
            d / "fake" / f"libavutil.so.{major}", "int av(void) { return 0; }\n", soname=f"libavutil.so.{major}"
        )
        core = compile_so(d / f"libcore{major}.so", "int av(void);\nint c(void) { return av(); }\n", str(dep))
        files[f"codecish/libcore{major}.so"] = _so(core)
    brokenpkg = "import codecish\nraise RuntimeError('Detected that PyTorch and TorchAudio were compiled with different CUDA versions.')\n"
    return [
        build_wheel(wheels, "codecish", "1.0", files=files, tag=TAG),
        build_wheel(wheels, "brokenpkg", "1.0", files={"brokenpkg/__init__.py": brokenpkg}),
    ]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    build, out = tmp_path_factory.mktemp("build"), tmp_path_factory.mktemp("wheels")
    # clashb's clasha/util.py overwrites clasha's, which `import clasha` needs (pymongo's bson/ beside bson's).
    clash_a = build_wheel(
        out,
        "clasha",
        "1.0",
        files={"clasha/__init__.py": "from clasha.util import NEEDED\n", "clasha/util.py": "NEEDED = 1\n"},
    )
    clash_b = build_wheel(out, "clashb", "1.0", files={"clasha/util.py": "X = 2\n"})
    # Two builds of one module, each whole: whichever is on disk imports (opencv-python and -headless).
    twin_a = build_wheel(out, "twina", "1.0", files={"twin/__init__.py": "KIND = 'gui'\n"}, top_level=["twin"])
    twin_b = build_wheel(out, "twinb", "1.0", files={"twin/__init__.py": "KIND = 'headless'\n"}, top_level=["twin"])
    return {
        "vision": [_visionish(build, out)],
        "bindings": _host_and_bindings(build, out),
        "pure": _pure(out),
        "numpy": _numpy1(build, out),
        "clash": [clash_a, clash_b],
        "twins": [twin_a, twin_b],
        "picker": [_picker(build, out)],
        "cplugin": [_cplugin(build, out)],
        "codec": _codec_and_brokenpkg(build, out),
        "audio12": _audioish(build, out / "12", cuda12=True),
        "audio": _audioish(build, out / "13", cuda12=False),
    }


def _check(tmp: Path, *batches: list[Path], packages: list[str]) -> CellResult:
    if fakecuda.real_driver() is not None:
        pytest.skip("this machine has a real NVIDIA driver: the cuda stage would run")
    python = venv_with(tmp / "env", *batches)
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
    )
    # The dev environment's pytest, seen through a path entry, so that check installs nothing.
    (site / "devenv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    env = inspect_environment(python)
    return run_check(env, ExistingRequest(packages=tuple(packages)), out=tmp / "out").result


def _stage(result: CellResult, name: str) -> tuple[StageState, str, str]:
    stage = result.stage(name)
    assert stage is not None, name
    return stage.state, stage.reason, stage.cause


def test_a_library_loaded_by_ctypes_with_an_undefined_symbol_is_the_cause(
    wheels: dict[str, list[Path]], tmp_path: Path
) -> None:
    result = _check(tmp_path, wheels["vision"], packages=["visionish"])
    assert result.state == CellState.FAIL
    assert _stage(result, "import") == (
        StageState.FAIL,
        "visionish (it loads visionish/_C.so): undefined symbol ns::check(int); "
        "then RuntimeError: operator visionish::nms does not exist",
        "abi-symbol",
    )
    # Static's finding on _C.so is no longer a note nobody reads: the import tried to load it.
    assert [(b.stage, b.code) for b in result.causes] in ([("import", "abi-symbol")], [])


def test_a_library_the_process_already_has_is_not_missing(wheels: dict[str, list[Path]], tmp_path: Path) -> None:
    result = _check(tmp_path, wheels["bindings"], packages=["ffihost", "bindings"])
    imported = result.stage("import")
    assert imported is not None
    assert imported.details["loaded_by_path"] == {"bindings/libbindings.so": "bindings"}
    # Static alone cannot see that `import ffihost` mapped libffihost.so first; the load that worked can.
    assert [f["kind"] for f in imported.details["loaded_by_path_findings"]] == []
    assert (imported.state, result.state) == (StageState.PASS, CellState.PARTIAL), result.reason


def test_a_pure_python_package_that_fails_at_import_is_red_with_its_pin(
    wheels: dict[str, list[Path]], tmp_path: Path
) -> None:
    result = _check(tmp_path, wheels["pure"], packages=["purecore", "purefail"])
    state, reason, cause = _stage(result, "import")
    assert (state, cause) == (StageState.FAIL, "pin-broken")
    assert reason == (
        "purefail: SystemError: The installed purecore version (1.0) is incompatible with the current purefail "
        "version, which requires 2.0.; purefail 1.0 requires purecore==2.0; purecore 1.0 is installed"
    )
    assert [(b.stage, b.code) for b in result.causes] == [("import", "pin-broken")]


def test_an_extension_built_for_numpy_1_is_named_so(wheels: dict[str, list[Path]], tmp_path: Path) -> None:
    result = _check(tmp_path, wheels["numpy"], packages=["numpy", "oldext"])
    state, reason, cause = _stage(result, "import")
    assert (state, cause) == (StageState.FAIL, "numpy-abi")
    assert reason.startswith(f"oldext/_oldext{EXT_SUFFIX}: built for NumPy 1.x, numpy 2.0.2 installed")
    assert reason.endswith("fix: `numpy<2`, or a release built for NumPy 2 (and 1 more)")


def test_a_cell_with_two_independent_causes_names_both(wheels: dict[str, list[Path]], tmp_path: Path) -> None:
    [clasha, clashb] = wheels["clash"]
    result = _check(tmp_path, [clasha], [clashb], wheels["vision"], packages=["clasha", "clashb", "visionish"])
    assert result.state == CellState.FAIL
    assert [(b.stage, b.code) for b in result.causes] == [("pins", "file-clash"), ("import", "abi-symbol")]
    assert result.reason.startswith("2 causes: pins: clasha 1.0 and clashb 1.0 both install 1 file")
    assert "; also import: visionish (it loads visionish/_C.so): undefined symbol ns::check(int)" in result.reason
    assert all(b.code in CAUSES for b in result.causes)
    pins = result.stage("pins")
    assert pins is not None
    assert pins.state == StageState.FAIL
    assert pins.details["file_clashes"][0]["fails"] is True


def test_a_file_clash_whose_imports_all_work_is_a_warning(wheels: dict[str, list[Path]], tmp_path: Path) -> None:
    [twina, twinb] = wheels["twins"]
    result = _check(tmp_path, [twina], [twinb], packages=["twina", "twinb"])
    state, reason, _cause = _stage(result, "pins")
    assert state == StageState.WARN
    assert reason.startswith(
        "twina 1.0 and twinb 1.0 both install 1 file (twin/__init__.py, all code) with different bytes: the bytes "
        "on disk are twinb 1.0's; every module of theirs loads here (`import twin`): what needs the other owner's "
        "own code gets these bytes instead"
    ), reason
    [clash] = result.stage("pins").details["file_clashes"]  # type: ignore[union-attr]
    assert (clash["fails"], clash["observed"].startswith("every module of theirs loads")) == (False, True)
    assert result.state == CellState.PARTIAL, result.reason


def test_a_build_not_picked_is_silent_and_a_feature_that_cannot_load_warns(
    wheels: dict[str, list[Path]], tmp_path: Path
) -> None:
    result = _check(tmp_path, wheels["picker"], packages=["picker"])
    imported = result.stage("import")
    assert imported is not None
    entry = next(m for m in imported.details["modules"] if m["module"] == "picker")
    assert [(f["name"], f["judged"], f.get("instead")) for f in entry["failed_loads"]] == [
        ("picker/lib/libkern_cu12.so", "not-picked", "picker/lib/libkern_cu13.so"),
        ("picker/lib/libprovider_gpu.so", "feature", None),
    ]
    assert imported.state == StageState.WARN
    assert imported.details["warnings"] == [
        "picker: `import picker` works, but picker/lib/libprovider_gpu.so: missing shared library "
        "libcublasLt.so.12: what needs it will not work"
    ]
    assert (imported.cause, result.state) == ("feature-broken", CellState.PARTIAL)


def test_a_cuda_12_library_beside_a_cuda_13_torch_is_a_cuda_major_mix_through_its_own_library(
    wheels: dict[str, list[Path]], tmp_path: Path
) -> None:
    result = _check(tmp_path, wheels["audio12"], packages=["torch", "audioish"])
    imported = result.stage("import")
    assert imported is not None
    assert (imported.state, imported.cause) == (StageState.FAIL, "cuda-major-mix"), imported.reason
    by_module = {m["module"]: m for m in imported.details["modules"]}
    ext = by_module[f"audioish/lib/_audioish{EXT_SUFFIX}"]
    # Loaded alone it cannot find libaudioish.so; loaded after it, as its package does, the root shows.
    assert (ext["preloaded"], ext["failure"]["library"]) == ("audioish/lib/libaudioish.so", "libcudart.so.12")
    assert ext["failure"]["cuda_mix"] == {"library": 12, "env": 13}
    assert ext["reason"] == (
        f"audioish/lib/_audioish{EXT_SUFFIX} (it needs libaudioish.so of its own package, which does not load): "
        "missing shared library libcudart.so.12, a CUDA 12 library in a CUDA 13 environment (built for another "
        "CUDA major than torch's)"
    )
    assert by_module["audioish"]["cause"] == "cuda-major-mix"
    static = result.stage("static")
    assert [(b.stage, b.code) for b in result.causes] == [("import", "cuda-major-mix")], (
        static.details["findings"] if static else None
    )


def test_a_module_that_needs_its_own_package_library_loads_after_it(
    wheels: dict[str, list[Path]], tmp_path: Path
) -> None:
    result = _check(tmp_path, wheels["audio"], packages=["torch", "audioish"])
    imported = result.stage("import")
    assert imported is not None
    ext = next(m for m in imported.details["modules"] if m["module"] == f"audioish/lib/_audioish{EXT_SUFFIX}")
    assert (ext["ok"], ext["preloaded"]) == (True, "audioish/lib/libaudioish.so")
    assert ext["loaded"] == (
        "after audioish/lib/libaudioish.so, a library of its own package it needs: loaded alone, "
        f"audioish/lib/_audioish{EXT_SUFFIX}: missing shared library libaudioish.so"
    )
    assert imported.state == StageState.PASS, imported.reason


def test_a_library_c_code_could_not_load_is_named_from_the_loaders_own_log(
    wheels: dict[str, list[Path]], tmp_path: Path
) -> None:
    result = _check(tmp_path, wheels["cplugin"], packages=["cplugin"])
    state, reason, cause = _stage(result, "import")
    assert (state, cause) == (StageState.FAIL, "missing-library"), reason
    imported = result.stage("import")
    assert imported is not None
    entry = next(m for m in imported.details["modules"] if m["module"] == "cplugin")
    assert entry["reason"] == (
        f"cplugin (it loads cplugin/_boot{EXT_SUFFIX}): missing shared library libcplugin_backend.so.3; "
        "then RuntimeError: cplugin: no backend available"
    )
    seen = [(f["name"], f["how"], f["error"]) for f in entry["failed_loads"] if f["how"] == "dlopen (C)"]
    assert seen == [("libcplugin_backend.so.3", "dlopen (C)", f"not loaded; asked by cplugin/_boot{EXT_SUFFIX}")]
    # Read from the failed load's own lines in the server that adopts nothing, whose log is on: no load again,
    # in a server of its own or a fresh interpreter.
    loader = imported.details["loader"]
    assert "with the loader's log on (read for 2 failure(s) that named no library)" in loader, loader
    assert "loads again with the loader's log" not in loader, loader
    # The module loaded alone says the same: its C code's dlopen, not Python's exception, is the cause.
    alone = next(m for m in imported.details["modules"] if m["module"] == f"cplugin/_boot{EXT_SUFFIX}")
    assert (alone["cause"], alone["failure"]["library"]) == ("missing-library", "libcplugin_backend.so.3")
    assert alone["reason"] == (
        f"cplugin/_boot{EXT_SUFFIX} (it loads libcplugin_backend.so.3): missing shared library "
        "libcplugin_backend.so.3; then RuntimeError: cplugin: no backend available"
    )


def test_another_package_trying_its_alternatives_is_not_why_an_import_failed(
    wheels: dict[str, list[Path]], tmp_path: Path
) -> None:
    result = _check(tmp_path, wheels["codec"], packages=["codecish", "brokenpkg"])
    imported = result.stage("import")
    assert imported is not None
    entry = next(m for m in imported.details["modules"] if m["module"] == "brokenpkg")
    assert entry["reason"] == (
        "brokenpkg: RuntimeError: Detected that PyTorch and TorchAudio were compiled with different CUDA versions."
    )
    assert {f["judged"] for f in entry["failed_loads"]} == {"feature"}
    assert (imported.state, imported.cause) == (StageState.FAIL, "import-error")
