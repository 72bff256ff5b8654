"""forkserver: real gcc-built extension modules loaded in children of one real server, verdicts as per process."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from compatlab.incell import loadcheck
from compatlab.incell.forkserver import ForkServer, Refused, ServerGone, enabled
from compatlab.incell.imports.driver import Driver
from compatlab.incell.imports.load import load_entry, load_plan
from compatlab.incell.imports.loader import Loader
from compatlab.incell.imports.plan import Plan
from compatlab.incell.loading.failure import LoadFailure, describe
from compatlab.incell.loading.installed import LoadTarget
from compatlab.incell.probe import RESULT_TAG
from fixtures.sofix import abi_broken_module, compile_so, ext_module
from fixtures.venvs import python_seeing

_CRASH = ("raise(SIGSEGV);", "#include <signal.h>")
_HANG = ("for (;;) sleep(1);", "#include <unistd.h>")
# Writes its pid to $COMPATLAB_TEST_PIDS, then hangs.
_HANG_PID = (
    'FILE *f = fopen(getenv("COMPATLAB_TEST_PIDS"), "w"); fprintf(f, "%d", (int)getpid()); fclose(f);\n'
    "for (;;) sleep(1);",
    "#include <stdio.h>\n#include <stdlib.h>\n#include <unistd.h>",
)
# Forks a grandchild into its process group, writes both pids to $COMPATLAB_TEST_PIDS, then hangs.
_HANG_WITH_CHILD = (
    "pid_t g = fork(); if (g == 0) { for (;;) pause(); }\n"
    'FILE *f = fopen(getenv("COMPATLAB_TEST_PIDS"), "w"); fprintf(f, "%d %d", (int)getpid(), (int)g); fclose(f);\n'
    "for (;;) sleep(1);",
    "#include <stdio.h>\n#include <stdlib.h>\n#include <unistd.h>",
)


@dataclasses.dataclass(frozen=True)
class Case:
    label: str
    path: str | None
    name: str
    pre: tuple[str, ...] = ()
    timeout: float = 60.0


def _cases(tmp: Path) -> list[Case]:
    lib = compile_so(tmp / "libgone.so.7", "int gone(void) { return 7; }\n", soname="libgone.so.7")
    needy = ext_module(tmp, "needy", "gone();", str(lib), prelude="int gone(void);")
    lib.unlink()
    pkg = tmp / "pypath" / "deep_gemm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("import setuptools_that_is_not_there\n", encoding="utf-8")
    # Imports, then crashes in a Python atexit handler of its own: the child runs the handlers registered
    # after the fork (and only those: the server's are the same in every child).
    exiter = tmp / "pypath" / "compatlab_exit_crasher"
    exiter.mkdir()
    (exiter / "__init__.py").write_text(
        "import atexit, os, signal\natexit.register(lambda: os.kill(os.getpid(), signal.SIGSEGV))\n",
        encoding="utf-8",
    )
    modules = {
        "good": ext_module(tmp, "good"),
        "abi": abi_broken_module(tmp / "abi", "abi"),
        "needy": needy,
        "crash": ext_module(tmp, "crash", _CRASH[0], prelude=_CRASH[1]),
        "hang": ext_module(tmp, "hang", _HANG[0], prelude=_HANG[1]),
        "raiser": ext_module(tmp, "raiser", 'PyErr_SetString(PyExc_ImportError, "needs triton"); return NULL;'),
        "quitter": ext_module(tmp, "quitter", "exit(5);", prelude="#include <stdlib.h>"),
        # Loads, then crashes in exit(): a fresh interpreter shows it, and so must a forked child.
        "crash_at_exit": ext_module(
            tmp,
            "crash_at_exit",
            "atexit(boom);",
            prelude="#include <signal.h>\n#include <stdlib.h>\nstatic void boom(void) { raise(SIGSEGV); }",
        ),
    }
    return [
        *(Case(label, str(path), label, timeout=2 if label == "hang" else 60) for label, path in modules.items()),
        Case("good after json", str(modules["good"]), "good", pre=("json",)),
        Case("prerequisite fails", str(modules["good"]), "good", pre=("compatlab_no_such_module",)),
        Case("compatlab_absent_pkg", None, "compatlab_absent_pkg"),
        Case("json", None, "json"),
        Case("deep_gemm", None, "deep_gemm"),
        Case("compatlab_exit_crasher", None, "compatlab_exit_crasher"),
    ]


# What the per-process path says of each (the contract both paths keep), as (kind, describe(label, ...)).
EXPECTED: dict[str, tuple[str, str] | None] = {
    "good": None,
    "good after json": None,
    "json": None,
    "abi": ("undefined-symbol", "abi: undefined symbol ns::check(int)"),
    "needy": ("missing-library", "needy: missing shared library libgone.so.7"),
    "crash": ("signal", "crash: crashed with SIGSEGV while loading"),
    "crash_at_exit": ("signal", "crash_at_exit: crashed with SIGSEGV while loading"),
    "hang": ("timeout", "hang: hung while loading, killed after 2 s"),
    "raiser": ("import-error", "raiser: ImportError: needs triton"),
    "quitter": ("exit", "quitter: exited with status 5"),
    "prerequisite fails": (
        "import-error",
        "prerequisite fails (import compatlab_no_such_module failed): "
        "ModuleNotFoundError: No module named 'compatlab_no_such_module'",
    ),
    "compatlab_absent_pkg": (
        "import-error",
        "compatlab_absent_pkg: ModuleNotFoundError: No module named 'compatlab_absent_pkg'",
    ),
    "compatlab_exit_crasher": ("signal", "compatlab_exit_crasher: crashed with SIGSEGV while loading"),
    "deep_gemm": (
        "missing-dependency",
        "deep_gemm imports setuptools_that_is_not_there, which is not installed: an undeclared dependency",
    ),
}


def _verdict(label: str, failure: LoadFailure | None) -> tuple[str, str] | None:
    return None if failure is None else (failure.kind, describe(label, failure))


def _fields(failure: LoadFailure | None) -> dict[str, Any] | None:
    # Everything but the stderr tail: a traceback's frames name the probe's code, which differs.
    return None if failure is None else {k: v for k, v in failure.to_json().items() if k != "raw"}


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "COMPATLAB_TEST_PIDS": str(tmp_path / "pids")}


@pytest.fixture
def python(tmp_path: Path) -> str:
    """A cell's interpreter whose packages are the folder pypath/ (made here, filled by the test)."""
    (tmp_path / "pypath").mkdir(exist_ok=True)
    return python_seeing(tmp_path / "venv", tmp_path / "pypath")


@pytest.fixture
def server(python: str, env: dict[str, str]) -> Iterator[ForkServer]:
    with ForkServer.start(python, preload=["json"], env=env, timeout=120) as srv:
        yield srv


def test_each_module_is_classified_as_in_its_own_process(
    tmp_path: Path, python: str, env: dict[str, str], server: ForkServer
) -> None:
    """All at once through one server: a crash, a hang and an exit among them take only themselves down."""
    cases = _cases(tmp_path)

    def forked(case: Case) -> LoadFailure | None:
        failure, _ = server.load(path=case.path, name=case.name, pre_import=case.pre, timeout=case.timeout)
        return failure

    def per_process(case: Case) -> LoadFailure | None:
        failure, _ = loadcheck.load_module(
            python, path=case.path, name=case.name, pre_import=case.pre, timeout=case.timeout, env=env
        )
        return failure

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(cases)) as pool:
        through_server = dict(zip([c.label for c in cases], pool.map(forked, cases), strict=True))
    alone = {c.label: per_process(c) for c in cases}
    assert {k: _verdict(k, v) for k, v in alone.items()} == EXPECTED
    assert {k: _fields(v) for k, v in through_server.items()} == {k: _fields(v) for k, v in alone.items()}
    abi = through_server["abi"]
    assert abi is not None
    assert (abi.symbol, abi.demangled) == ("_ZN2ns5checkEi", "ns::check(int)")
    assert "Traceback" in abi.raw  # the child's own stderr comes back


def test_a_crashing_child_leaves_the_server_serving(tmp_path: Path, server: ForkServer) -> None:
    crash = ext_module(tmp_path, "crash", _CRASH[0], prelude=_CRASH[1])
    failure, done = server.load(path=str(crash), name="crash")
    assert failure is not None
    assert (failure.kind, failure.signal, done.signal_name) == ("signal", "SIGSEGV", "SIGSEGV")
    good = ext_module(tmp_path, "good")
    again, done = server.load(path=str(good), name="good", pre_import=["json"])
    assert again is None, done.stderr
    assert done.returncode == 0


def test_a_hanging_child_is_killed_with_its_process_group_alone(tmp_path: Path, server: ForkServer) -> None:
    hang = ext_module(tmp_path, "hangfork", _HANG_WITH_CHILD[0], prelude=_HANG_WITH_CHILD[1])
    good = ext_module(tmp_path, "good")
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        hung = pool.submit(server.load, path=str(hang), name="hangfork", timeout=2)
        loaded = pool.submit(server.load, path=str(good), name="good")
        (failure, done), (ok, _) = hung.result(), loaded.result()
    assert ok is None
    assert failure is not None
    assert done.timed_out
    assert (failure.kind, failure.message) == ("timeout", "killed after 2 s")
    child, grandchild = (int(p) for p in (tmp_path / "pids").read_text(encoding="utf-8").split())
    assert not _alive(child)
    assert not _alive(grandchild)
    assert server.load(path=None, name="json")[0] is None  # and the server goes on


def _alive(pid: int) -> bool:
    """True while *pid* runs (a zombie waiting for its reaper is dead: SIGKILL reached it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def test_a_prerequisite_that_fails_to_import_keeps_the_server_from_starting(
    tmp_path: Path, python: str, env: dict[str, str]
) -> None:
    with pytest.raises(ServerGone) as info:
        ForkServer.start(python, preload=["compatlab_no_such_module"], env=env)
    assert str(info.value) == (
        "import compatlab_no_such_module failed: ModuleNotFoundError: No module named 'compatlab_no_such_module'"
    )
    ext_module(tmp_path / "pypath", "crash", _CRASH[0], prelude=_CRASH[1])
    with pytest.raises(ServerGone) as info:
        ForkServer.start(python, preload=["crash"], env=env)
    assert str(info.value).startswith("the server died while importing crash: exit status -11")


def _wait_for(check: Callable[[], bool]) -> bool:
    """Wait (up to a minute) for something a process does; whether it happened."""
    for _ in range(600):
        if check():
            return True
        time.sleep(0.1)
    return False


def test_a_server_that_dies_fails_the_load_it_owed_and_takes_its_child(tmp_path: Path, server: ForkServer) -> None:
    hang = ext_module(tmp_path, "hangpid", _HANG_PID[0], prelude=_HANG_PID[1])
    pids = tmp_path / "pids"
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(server.load, path=str(hang), name="hangpid", timeout=600)
        assert _wait_for(lambda: pids.is_file() and pids.stat().st_size > 0)
        os.kill(server.pid, signal.SIGKILL)
        with pytest.raises(ServerGone) as info:
            pending.result()
    assert str(info.value) == "exit status -9"
    child = int(pids.read_text(encoding="utf-8"))
    assert _wait_for(lambda: not _alive(child))  # PR_SET_PDEATHSIG: no hung load outlives its server
    with pytest.raises(ServerGone) as info:
        server.load(path=None, name="json")
    assert str(info.value) == "exit status -9"


@pytest.mark.parametrize(("value", "expected"), [(None, True), ("1", True), ("0", False), ("off", False)])
def test_the_switch(value: str | None, expected: bool) -> None:
    assert enabled({} if value is None else {"COMPATLAB_IMPORT_FORKSERVER": value}) is expected


def _torch_python() -> str:
    given = os.environ.get("COMPATLAB_TEST_TORCH_PYTHON")
    if given:
        return given
    if importlib.util.find_spec("torch") is not None:
        return sys.executable
    pytest.skip("no interpreter with torch: set COMPATLAB_TEST_TORCH_PYTHON to one (CPU torch will do)")


def test_real_torch_once_then_its_modules_as_per_process() -> None:
    python = _torch_python()
    found = subprocess.run(
        [python, "-c", "import torch; print(torch._C.__file__)"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert found.returncode == 0, found.stderr
    cases = [
        Case("torch/_C", found.stdout.strip(), "torch._C", pre=("torch",)),
        Case("torch", None, "torch"),
        Case("torchgen", None, "torchgen", pre=("torch",)),
        Case("compatlab_absent_pkg", None, "compatlab_absent_pkg", pre=("torch",)),
    ]
    with ForkServer.start(python, preload=["torch"], timeout=300) as server:
        forked = {c.label: server.load(path=c.path, name=c.name, pre_import=c.pre, timeout=300)[0] for c in cases}
    alone = {
        c.label: loadcheck.load_module(python, path=c.path, name=c.name, pre_import=c.pre, timeout=300)[0]
        for c in cases
    }
    assert {k: _verdict(k, v) for k, v in alone.items()} == {
        "torch/_C": None,
        "torch": None,
        "torchgen": None,
        "compatlab_absent_pkg": (
            "import-error",
            "compatlab_absent_pkg: ModuleNotFoundError: No module named 'compatlab_absent_pkg'",
        ),
    }
    assert {k: _fields(v) for k, v in forked.items()} == {k: _fields(v) for k, v in alone.items()}


def _package(root: Path, name: str, code: str) -> None:
    folder = root / "pypath" / Path(*name.split("."))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "__init__.py").write_text(code, encoding="utf-8")


def test_an_adopted_package_is_inherited_by_later_children_and_never_under_its_own(
    tmp_path: Path, server: ForkServer
) -> None:
    _package(tmp_path, "compatlab_dep", "import os\nPID = os.getpid()\n")
    said = tmp_path / "said"
    _package(
        tmp_path,
        "compatlab_user",
        "import os, compatlab_dep\n"
        f"open({str(said)!r}, 'w').write('inherited' if compatlab_dep.PID != os.getpid() else 'imported')\n",
    )
    failure, _done = server.load(path=None, name="compatlab_dep", own=["compatlab_dep"], adopt=True)
    assert failure is None
    assert server.load(path=None, name="compatlab_user", own=["compatlab_user"])[0] is None
    assert said.read_text(encoding="utf-8") == "inherited"  # imported once, by the server, before the fork
    assert server.adopted == ["compatlab_dep"]
    # The package's own modules are never loaded where it is imported already: refused, for the other server.
    with pytest.raises(Refused, match="compatlab_dep imported here already"):
        server.load(path=None, name="compatlab_dep", own=["compatlab_dep"])


def test_a_load_refused_names_the_adoption_that_brought_its_own_in_and_the_loader_learns_the_order(
    tmp_path: Path, python: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # compatlab_user imports compatlab_dep, which no Requires-Dist of it names: once it is adopted, every load
    # of compatlab_dep's distribution is refused and answered by the server that adopts nothing.
    _package(tmp_path, "compatlab_dep", "")
    (tmp_path / "pypath" / "compatlab_dep" / "_m.py").write_text("", encoding="utf-8")
    _package(tmp_path, "compatlab_user", "import compatlab_dep\n")
    monkeypatch.setattr(sys, "executable", python)
    loader = Loader(Driver(str(tmp_path / "work"), []), [], 60, fork=True)
    user = LoadTarget(dist="compatlab-user", label="compatlab_user", name="compatlab_user")
    dep = LoadTarget(dist="compatlab-dep", label="compatlab_dep", name="compatlab_dep")
    module = LoadTarget(
        dist="compatlab-dep",
        label="compatlab_dep/_m.py",
        name="compatlab_dep._m",
        path=str(tmp_path / "pypath" / "compatlab_dep" / "_m.py"),
    )
    loader.own.update({"compatlab-user": ["compatlab_user"], "compatlab-dep": ["compatlab_dep", "compatlab_dep._m"]})
    try:
        assert loader.load(user, adopt=True)[0] is None
        adopting = next(s for s in loader.adopting.values() if s is not None)
        with pytest.raises(Refused, match="by the import of compatlab_user") as refused:
            adopting.load(path=module.path, name=module.name, own=loader.own["compatlab-dep"])
        assert refused.value.by == ("compatlab_user",)
        assert loader.load(module)[0] is None  # refused there, loaded by the other
        assert loader.load(dep)[0] is None
        assert loader.refused == 2
        assert loader.learned == {"compatlab-user": {"compatlab-dep"}}  # the next run: compatlab-dep first
    finally:
        loader.close()


# Like onnxruntime's: the import starts a thread, and what runs at exit waits for that thread's answer. In a
# process of its own the thread answers; in a child forked after the server imported it, no thread was copied.
_EXIT_WAITS = """
import atexit, os, threading
_r, _w = os.pipe()
_stop = threading.Event()


def _serve():
    _stop.wait()
    os.write(_w, b"x")


threading.Thread(target=_serve, daemon=True).start()


def _end():
    _stop.set()
    os.read(_r, 1)


atexit.register(_end)
"""


def test_an_exit_that_waits_on_a_thread_of_the_adoption_is_cut_short_there_and_asked_again(
    tmp_path: Path, python: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _package(tmp_path, "compatlab_exit_waits", _EXIT_WAITS)
    done = subprocess.run([python, "-c", "import compatlab_exit_waits"], timeout=60, check=False)
    assert done.returncode == 0  # in a process of its own it ends
    monkeypatch.setattr(sys, "executable", python)
    loader = Loader(Driver(str(tmp_path / "work"), []), [], 300, fork=True)
    target = LoadTarget(dist="compatlab-exit-waits", label="compatlab_exit_waits", name="compatlab_exit_waits")
    loader.own["compatlab-exit-waits"] = ["compatlab_exit_waits"]
    try:
        started = time.monotonic()
        first = loader.ask_adopting(target, adopt=True)
        assert first is not None
        failure, there = first
        # Its record came, then its exit hung: killed after the grace, long before the load's 300 s.
        assert failure is not None
        assert failure.kind == "timeout", failure
        assert there.timed_out
        assert time.monotonic() - started < 120
        assert loader.load(target)[0] is None  # asked again where the thread is the process's own: it ends
    finally:
        loader.close()


def test_a_module_an_adopted_package_imported_is_loaded_there_when_the_client_allows_it(
    tmp_path: Path, server: ForkServer
) -> None:
    ran = tmp_path / "ran"
    _package(tmp_path, "compatlab_eager", "import compatlab_eager.fast\n")
    folder = tmp_path / "pypath" / "compatlab_eager"
    body = f"import os\nopen({str(ran)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
    (folder / "fast.py").write_text(body, encoding="utf-8")
    (folder / "lazy.py").write_text(body, encoding="utf-8")
    (tmp_path / "elsewhere.py").write_text(body, encoding="utf-8")
    own = ["compatlab_eager", "compatlab_eager.fast", "compatlab_eager.lazy"]
    assert server.load(path=None, name="compatlab_eager", own=own, adopt=True)[0] is None
    # Imported once, by the server itself (its child only ends it): the import is paid once.
    assert ran.read_text(encoding="utf-8").split() == [str(server.pid)]
    # Imported here by the adopted package, from that file: the server answers it with no child (a child would
    # find it loaded and run nothing again); by name, a child finds it loaded.
    fast = str(folder / "fast.py")
    failure, done = server.load(path=fast, name="compatlab_eager.fast", own=own, imported_ok=True)
    assert (failure, done.returncode, done.pid) == (None, 0, None)
    failure, done = server.load(path=None, name="compatlab_eager.fast", own=own, imported_ok=True)
    assert failure is None
    assert done.pid is not None
    assert done.pid != server.pid
    assert len(ran.read_text(encoding="utf-8").split()) == 1
    # Asked without its distribution's modules (own), one the package did not import is loaded in a child.
    failure, done = server.load(path=str(folder / "lazy.py"), name="compatlab_eager.lazy", imported_ok=True)
    assert (failure, done.returncode) == (None, 0)
    assert ran.read_text(encoding="utf-8").split() == [str(server.pid), str(done.pid)]
    # Refused as before: without the client's leave, a module not imported here, and another file of that name.
    for path, name, allowed in [
        (fast, "compatlab_eager.fast", False),
        (str(folder / "lazy.py"), "compatlab_eager.lazy", True),
        (str(tmp_path / "elsewhere.py"), "compatlab_eager.fast", True),
    ]:
        with pytest.raises(Refused, match="imported here already"):
            server.load(path=path, name=name, own=own, imported_ok=allowed)
    assert len(ran.read_text(encoding="utf-8").split()) == 2


def test_a_load_python_refused_by_path_is_asked_by_name_there_and_only_a_double_failure_elsewhere(
    tmp_path: Path, python: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The import stage's loader over real fork servers of an interpreter that sees pypath/: one module Python
    # refuses by path (it is not under its name in sys.modules while it runs) but imports by name, and one
    # that fails both ways and says which server forked the child that ran it.
    _package(tmp_path, "compatlab_twice", "")
    folder = tmp_path / "pypath" / "compatlab_twice"
    refuse = "import sys\nif __name__ not in sys.modules:\n    raise ImportError('cannot import name X from itself')\n"
    (folder / "byname.py").write_text(refuse, encoding="utf-8")
    (folder / "never.py").write_text("import os\nraise ImportError(f'never, in a child of {os.getppid()}')\n")
    monkeypatch.setattr(sys, "executable", python)
    driver = Driver(str(tmp_path / "work"), [])
    loader = Loader(driver, [], 60, fork=True)

    def target(name: str) -> LoadTarget:
        return LoadTarget(
            dist="compatlab-twice",
            label=f"compatlab_twice/{name}.py",
            name=f"compatlab_twice.{name}",
            path=str(folder / f"{name}.py"),
        )

    try:
        entry, _mapped = load_entry(target("byname"), driver, loader)
        assert entry.ok
        assert (entry.loaded or "").startswith("by name (import compatlab_twice.byname): by path, ")
        # Both ways in the adopting server: nothing confirmed, no server that adopts nothing started.
        assert loader.confirmed == 0
        assert not any(loader.servers.values())
        entry, _mapped = load_entry(target("never"), driver, loader)
        assert not entry.ok
        plain = [s for s in loader.servers.values() if s is not None]
        assert len(plain) == 1
        assert f"never, in a child of {plain[0].pid}" in (entry.reason or "")  # the verdict is that server's
        assert loader.confirmed == 1
    finally:
        loader.close()


def test_modules_python_refuses_by_path_are_imported_by_name_once_their_package_is_adopted(
    tmp_path: Path, python: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The import stage's plan over real fork servers: three modules that Python refuses by path (they are
    # not under their names in sys.modules while they run) but imports by name, then their package, whose
    # import writes down each time it runs. Each import by name runs the package's import first: asked
    # before the package was adopted, each would import it again; asked after, none does.
    ran = tmp_path / "ran"
    _package(tmp_path, "compatlab_late", f"import os\nopen({str(ran)!r}, 'a').write(f'{{os.getpid()}}\\n')\n")
    folder = tmp_path / "pypath" / "compatlab_late"
    refuse = "import sys\nif __name__ not in sys.modules:\n    raise ImportError('cannot import name X from itself')\n"
    modules = [
        LoadTarget(
            dist="compatlab-late",
            label=f"compatlab_late/_m{i}.py",
            name=f"compatlab_late._m{i}",
            path=str(folder / f"_m{i}.py"),
        )
        for i in range(3)
    ]
    for module in modules:
        Path(str(module.path)).write_text(refuse, encoding="utf-8")
    package = LoadTarget(dist="compatlab-late", label="compatlab_late", name="compatlab_late")
    monkeypatch.setattr(sys, "executable", python)
    monkeypatch.setenv("COMPATLAB_IMPORT_JOBS", "2")
    monkeypatch.delenv("COMPATLAB_PROGRESS_FD", raising=False)
    driver = Driver(str(tmp_path / "work"), [])
    loader = Loader(driver, [], 60, fork=True)
    try:
        answers = load_plan(
            Plan(targets=[*modules, package], order=[0, 1, 2, 3], owned={}, warnings=[]), driver, loader
        )
        assert [entry.module for entry, _mapped in answers] == [t.label for t in [*modules, package]]
        for entry, _mapped in answers[:3]:
            assert entry.ok, entry
            assert (entry.loaded or "").startswith(f"by name (import {entry.module[:-3].replace('/', '.')}): by path, ")
        assert answers[3][0].ok
        # The adopting server's own import of the package, once: never again for the modules' imports by name.
        adopting = next(s for s in loader.adopting.values() if s is not None)
        assert ran.read_text(encoding="utf-8").split() == [str(adopting.pid)]
        assert loader.confirmed == 0
    finally:
        loader.close()


@pytest.mark.parametrize(
    ("words", "imports"),
    [
        # The same words by path in both servers: the failure by name in the adopting one is the answer.
        ("raise ImportError('the same words everywhere')", ["adopting: by name"]),
        # Other words by path (what the adopting server had imported changed them): asked by name again.
        (
            "import sys\nraise ImportError('adopted' if 'compatlab_had' in sys.modules else 'alone')",
            ["adopting: by name", "plain: by name"],
        ),
    ],
)
def test_a_failure_by_path_the_same_in_both_servers_is_not_asked_by_name_again(
    tmp_path: Path, python: str, monkeypatch: pytest.MonkeyPatch, words: str, imports: list[str]
) -> None:
    # Its package's import says which server's child ran it; the module fails by path and by name.
    said = tmp_path / "said"
    _package(tmp_path, "compatlab_had", "")
    _package(
        tmp_path,
        "compatlab_same",
        "import sys\n"
        f"open({str(said)!r}, 'a').write(('adopting' if 'compatlab_had' in sys.modules else 'plain') + ': by name\\n')\n",
    )
    folder = tmp_path / "pypath" / "compatlab_same"
    (folder / "_m.py").write_text(words + "\n", encoding="utf-8")
    monkeypatch.setattr(sys, "executable", python)
    driver = Driver(str(tmp_path / "work"), [])
    loader = Loader(driver, [], 60, fork=True)
    target = LoadTarget(
        dist="compatlab-same", label="compatlab_same/_m.py", name="compatlab_same._m", path=str(folder / "_m.py")
    )
    try:
        assert (
            loader.load(LoadTarget(dist="compatlab-had", label="compatlab_had", name="compatlab_had"), adopt=True)[0]
            is None
        )
        entry, _mapped = load_entry(target, driver, loader)
        assert not entry.ok
        assert loader.confirmed == 1  # the failure is still the plain server's, by path
        assert said.read_text(encoding="utf-8").splitlines() == imports
    finally:
        loader.close()


def test_an_adoption_that_fails_is_undone(tmp_path: Path, server: ForkServer) -> None:
    _package(tmp_path, "compatlab_halfway", "import compatlab_halfway.part\nraise RuntimeError('halfway')\n")
    (tmp_path / "pypath" / "compatlab_halfway" / "part.py").write_text("X = 1\n", encoding="utf-8")
    failure, _done = server.load(path=None, name="compatlab_halfway", own=["compatlab_halfway"], adopt=True)
    assert failure is not None
    assert failure.message == "RuntimeError: halfway"
    # Not adopted, and what it imported on the way (its part) forgotten: its loads are not refused.
    again, _done = server.load(path=None, name="compatlab_halfway", own=["compatlab_halfway"])
    assert again is not None
    assert again.message == "RuntimeError: halfway"
    assert server.adopted == []
    # A child forked after it finds neither its part nor the mark the server found it by in sys.modules.
    said = tmp_path / "said"
    _package(
        tmp_path,
        "compatlab_looker",
        f"import sys\nopen({str(said)!r}, 'w').write(repr(sorted(n for n in sys.modules if 'halfway' in n or"
        " n == 'compatlab-fork-server-mark')))\n",
    )
    assert server.load(path=None, name="compatlab_looker")[0] is None
    assert said.read_text(encoding="utf-8") == "[]"


def test_a_package_that_starts_a_thread_is_named(tmp_path: Path, server: ForkServer) -> None:
    _package(
        tmp_path,
        "compatlab_threader",
        "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n",
    )
    assert server.load(path=None, name="compatlab_threader", adopt=True)[0] is None
    assert server.load(path=None, name="json")[0] is None  # the reply after the adoption tells it
    assert (server.adopted, server.threaded) == (["compatlab_threader"], ["compatlab_threader"])


def test_the_adopting_load_is_answered_after_the_adoption(tmp_path: Path, server: ForkServer) -> None:
    """The package imports at once in the child and takes a second in the server itself: the child is done
    while the adoption still imports, and its reply waits for the adoption, so that it tells what it did."""
    _package(
        tmp_path, "compatlab_slow_here", f"import os, time\nif os.getpid() == {server.pid}:\n    time.sleep(1.0)\n"
    )
    assert server.load(path=None, name="compatlab_slow_here", adopt=True)[0] is None
    assert server.adopted == ["compatlab_slow_here"]


def _gated(root: Path, name: str, gate: Path) -> None:
    """A package whose import says it began (a file named for its pid) and then waits for *gate* to exist."""
    _package(
        root,
        name,
        "import os, time, pathlib\n"
        f"pathlib.Path({str(root / 'began')!r}, {name!r} + '.' + str(os.getpid())).touch()\n"
        f"gate = pathlib.Path({str(gate)!r})\n"
        "for _ in range(600):\n"
        "    if gate.exists():\n"
        "        break\n"
        "    time.sleep(0.1)\n",
    )


def test_an_adoption_under_way_answers_the_children_already_running(tmp_path: Path, server: ForkServer) -> None:
    (tmp_path / "began").mkdir()
    _gated(tmp_path, "compatlab_first", tmp_path / "first-may-end")
    _gated(tmp_path, "compatlab_adopted", tmp_path / "adoption-may-end")

    def began(name: str) -> int:
        return len(list((tmp_path / "began").glob(name + ".*")))

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(server.load, path=None, name="compatlab_first")
        assert _wait_for(lambda: began("compatlab_first") == 1)
        adopted = pool.submit(server.load, path=None, name="compatlab_adopted", adopt=True)
        # The server itself is importing it: it is inside the adoption.
        assert _wait_for(lambda: began("compatlab_adopted") == 1)
        assert next((tmp_path / "began").glob("compatlab_adopted.*")).suffix == f".{server.pid}"
        (tmp_path / "first-may-end").touch()
        # The child forked before the adoption is answered while the adoption still waits.
        assert first.result(timeout=20)[0] is None
        assert not adopted.done()
        (tmp_path / "adoption-may-end").touch()
        assert adopted.result(timeout=60)[0] is None
    assert server.adopted == ["compatlab_adopted"]


def test_a_client_gone_mid_adoption_ends_the_server_and_its_children(tmp_path: Path, python: str) -> None:
    (tmp_path / "began").mkdir()
    _gated(tmp_path, "compatlab_forever", tmp_path / "never")
    srv = ForkServer.start(python, preload=["json"], timeout=120)
    pool = concurrent.futures.ThreadPoolExecutor(1)
    pool.submit(srv.load, path=None, name="compatlab_forever", adopt=True)
    try:
        assert _wait_for(lambda: len(list((tmp_path / "began").glob("*"))) == 1)
        pids = [int(p.suffix[1:]) for p in (tmp_path / "began").glob("*")]
        assert pids == [srv.pid]  # the server itself imports it
        srv.close()  # its stdin closed: the adoption's import is broken off, no child forked for it
        assert srv.returncode == 0  # it ended itself, not killed by close after its wait
        assert _wait_for(lambda: not any(_alive(pid) for pid in pids))
    finally:
        (tmp_path / "never").touch()
        pool.shutdown(wait=True)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


def test_a_child_that_ends_as_an_adoption_is_asked_survives_the_adoption(tmp_path: Path, server: ForkServer) -> None:
    """One poll finds a child done and a request to adopt: the adoption's tick reads and closes that child's
    pipes, and the loop must not read them again (the server died of KeyError on the SGLang stack)."""
    (tmp_path / "began").mkdir()
    _gated(tmp_path, "compatlab_first", tmp_path / "first-may-end")
    _package(
        tmp_path, "compatlab_slow_here", f"import os, time\nif os.getpid() == {server.pid}:\n    time.sleep(1.0)\n"
    )
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(server.load, path=None, name="compatlab_first")
        assert _wait_for(lambda: len(list((tmp_path / "began").glob("compatlab_first.*"))) == 1)
        child = int(next((tmp_path / "began").glob("compatlab_first.*")).suffix[1:])
        os.kill(server.pid, signal.SIGSTOP)  # the server polls nothing until both are there
        try:
            (tmp_path / "first-may-end").touch()
            assert _wait_for(lambda: _zombie(child))  # done, its pipes closed, not yet reaped
            adopted = pool.submit(server.load, path=None, name="compatlab_slow_here", adopt=True)
            time.sleep(0.5)  # the request is in the server's pipe
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert first.result(timeout=60)[0] is None
        assert adopted.result(timeout=60)[0] is None
    assert server.load(path=None, name="json")[0] is None  # still serving
    assert server.adopted == ["compatlab_slow_here"]


def test_a_package_the_server_adopts_in_place_is_told_as_in_its_own_process(
    tmp_path: Path, python: str, env: dict[str, str], server: ForkServer
) -> None:
    """The server imports an adopted package itself and a child only ends it: what the import printed, how
    it failed, hung or crashed at exit is told as a fresh interpreter tells it, and the exit handlers of one
    adoption never run in the child of another."""
    crash_at_exit = ext_module(
        tmp_path,
        "compatlab_c_exit_crash",
        "atexit(boom);",
        prelude="#include <signal.h>\n#include <stdlib.h>\nstatic void boom(void) { raise(SIGSEGV); }",
    )
    (tmp_path / "pypath" / crash_at_exit.name).symlink_to(crash_at_exit)
    _package(
        tmp_path,
        "compatlab_py_exit_crash",
        "import atexit, os, signal\natexit.register(lambda: os.kill(os.getpid(), signal.SIGSEGV))\n",
    )
    _package(tmp_path, "compatlab_c_exit_user", "import compatlab_c_exit_crash\n")
    _package(
        tmp_path, "compatlab_clean", "import sys\nprint('said on stdout')\nprint('said on stderr', file=sys.stderr)\n"
    )
    _package(
        tmp_path, "compatlab_refuses", "import sys\nprint('why', file=sys.stderr)\nraise ImportError('needs a GPU')\n"
    )
    _package(tmp_path, "compatlab_hangs", "import time\nwhile True:\n    time.sleep(0.1)\n")
    names = [
        "compatlab_py_exit_crash",
        "compatlab_clean",
        "compatlab_c_exit_user",
        "compatlab_refuses",
        "compatlab_hangs",
        "compatlab_clean2",
    ]
    _package(tmp_path, "compatlab_clean2", "")
    timeout = {"compatlab_hangs": 2.0}
    in_place = {}
    for name in names:  # one after another, as the plan asks them: each adoption after the one before it
        in_place[name] = server.load(path=None, name=name, timeout=timeout.get(name, 60.0), own=[name], adopt=True)
    alone = {
        name: loadcheck.load_module(python, path=None, name=name, timeout=timeout.get(name, 60.0), env=env)
        for name in names
    }
    assert {n: _verdict(n, f) for n, (f, _done) in alone.items()} == {
        "compatlab_py_exit_crash": ("signal", "compatlab_py_exit_crash: crashed with SIGSEGV while loading"),
        "compatlab_clean": None,
        "compatlab_c_exit_user": ("signal", "compatlab_c_exit_user: crashed with SIGSEGV while loading"),
        "compatlab_refuses": ("import-error", "compatlab_refuses: ImportError: needs a GPU"),
        "compatlab_hangs": ("timeout", "compatlab_hangs: hung while loading, killed after 2 s"),
        "compatlab_clean2": None,
    }
    assert {n: _fields(f) for n, (f, _done) in in_place.items()} == {n: _fields(f) for n, (f, _d) in alone.items()}
    clean = in_place["compatlab_clean"][1]
    assert (clean.stdout, clean.stderr.partition(RESULT_TAG)[0]) == ("said on stdout\n", "said on stderr\n")
    assert in_place["compatlab_refuses"][1].stderr.startswith("why\n")
    assert in_place["compatlab_hangs"][1].timed_out
    # What imported is adopted (a crash at exit is the child's, not the import's); a failure is undone.
    assert server.adopted == ["compatlab_py_exit_crash", "compatlab_clean", "compatlab_c_exit_user", "compatlab_clean2"]
    assert server.load(path=None, name="json")[0] is None  # still serving, its children unharmed


@pytest.mark.skipif(
    tuple(int(p) for p in os.uname().release.split(".")[:2]) < (6, 1), reason="MADV_COLLAPSE needs Linux 6.1"
)
@pytest.mark.parametrize("switch", ["1", "0"])
def test_an_adoptions_memory_goes_into_2_mib_pages_and_its_children_read_it_as_it_was(
    tmp_path: Path, python: str, env: dict[str, str], switch: str
) -> None:
    """The server's memory in 2 MiB pages (fork/pages.py) as an adoption grows it: told in its replies, and
    a child forked after it reads what the adoption wrote, byte for byte. Switched off, it stays in 4 KiB."""
    _package(
        tmp_path,
        "compatlab_big",
        "import hashlib, os\nDATA = bytearray(os.urandom(24 << 20))\nDIGEST = hashlib.sha256(DATA).hexdigest()\n",
    )
    said = tmp_path / "said"
    _package(
        tmp_path,
        "compatlab_reader",
        "import hashlib, compatlab_big\n"
        f"open({str(said)!r}, 'w').write(str(hashlib.sha256(compatlab_big.DATA).hexdigest() == compatlab_big.DIGEST))\n",
    )
    with ForkServer.start(python, preload=["json"], env={**env, "COMPATLAB_IMPORT_HUGEPAGES": switch}) as srv:
        first = srv.huge_mib
        assert srv.load(path=None, name="compatlab_big", own=["compatlab_big"], adopt=True)[0] is None
        assert srv.load(path=None, name="compatlab_reader", own=["compatlab_reader"])[0] is None
        grown = srv.huge_mib
    assert said.read_text(encoding="utf-8") == "True"
    if switch == "0":
        assert (first, grown) == (0, 0)
    else:
        assert grown >= first + 20  # the 24 MiB the adoption made, less its unaligned ends


_SPIN = "import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end:\n    pass\n"


def test_a_server_tells_at_its_end_the_cpu_it_and_its_children_used(
    tmp_path: Path, python: str, env: dict[str, str]
) -> None:
    """What the import stage's figures of where its time goes rest on: the CPU an adoption burns in the server
    is the server's own, the CPU a load burns is its children's, and neither is told before the end."""
    _package(tmp_path, "compatlab_spin_here", _SPIN.format(seconds=0.4))
    _package(tmp_path, "compatlab_spin_child", _SPIN.format(seconds=1.5))
    with ForkServer.start(python, preload=["json"], env=env) as srv:
        assert srv.load(path=None, name="compatlab_spin_here", own=["compatlab_spin_here"], adopt=True)[0] is None
        assert srv.load(path=None, name="compatlab_spin_child", own=["compatlab_spin_child"])[0] is None
        assert srv.cpu is None
    cpu = srv.cpu
    assert cpu is not None
    # The server's own: its start and the adoption's 0.4 s, not the load's 1.5 s.
    assert 0.4 <= cpu.user + cpu.system < 1.5
    # Its children's: the load's 1.5 s, and two children's starts and ends.
    assert 1.5 <= cpu.children_user + cpu.children_system < 1.5 + 1.0
    # Two forks: the child that ended the adoption, and the load's.
    assert cpu.forks == 2
    assert 0 < cpu.fork_cpu < cpu.user + cpu.system


def test_a_server_that_is_killed_tells_no_cpu(python: str, env: dict[str, str]) -> None:
    with ForkServer.start(python, preload=["json"], env=env) as srv:
        os.kill(srv.pid, signal.SIGKILL)
    assert srv.cpu is None
