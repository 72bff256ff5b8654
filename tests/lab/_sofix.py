"""Tiny real shared objects for the loader tests, compiled with gcc inside the test."""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
import textwrap
from pathlib import Path

import pytest

EXT_SUFFIX = str(sysconfig.get_config_var("EXT_SUFFIX"))


def cc() -> str:
    found = shutil.which("gcc") or shutil.which("cc")
    if found is None:
        pytest.skip("no C compiler (gcc or cc) on PATH")
    return found


def compile_so(out: Path, source: str, *args: str, soname: str | None = None) -> Path:
    """Compile C *source* into the shared object *out*; extra *args* go last (libraries, rpath)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.with_name(out.name.replace(".", "_") + ".c")
    src.write_text(textwrap.dedent(source), encoding="utf-8")
    argv = [cc(), "-shared", "-fPIC", "-O0", "-I", sysconfig.get_paths()["include"], "-o", str(out), str(src)]
    if soname:
        argv.append(f"-Wl,-soname,{soname}")
    done = subprocess.run([*argv, *args], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return out


def ext_module(directory: Path, name: str, body: str = "", *args: str, prelude: str = "") -> Path:
    """A Python extension module *name* whose PyInit runs *body* first (C statements)."""
    source = f"""
        #include <Python.h>
        {prelude}
        static struct PyModuleDef def = {{PyModuleDef_HEAD_INIT, "{name}", NULL, -1, NULL}};
        PyMODINIT_FUNC PyInit_{name}(void) {{
            {body}
            return PyModule_Create(&def);
        }}
    """
    return compile_so(directory / f"{name}{EXT_SUFFIX}", source, *args)


def provider(directory: Path, symbol: str) -> Path:
    """libprov.so defining one C++-mangled function, e.g. _ZN2ns5checkEi = ns::check(int)."""
    return compile_so(directory / "libprov.so", f"void {symbol}(void) {{}}\n", soname="libprov.so")


def abi_broken_module(directory: Path, name: str) -> Path:
    """An extension module built against ns::check(int), then left with a provider of ns::check(unsigned)."""
    provider(directory, "_ZN2ns5checkEi")
    mod = ext_module(directory, name, "_ZN2ns5checkEi();", f"-L{directory}", "-lprov",
                     "-Wl,-rpath,$ORIGIN", prelude="void _ZN2ns5checkEi(void);")
    provider(directory, "_ZN2ns5checkEj")  # the "new torch": the parameter became unsigned
    return mod
