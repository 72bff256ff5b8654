"""The one table of causes: every red or amber stage result names one of these codes.

A code is what the grid groups red cells by, what a nightly job alarms on, and what the README's table of
causes lists (tests/unit/incell/test_cause_table.py compares the two). The table lives in incell/ because both
sides use it: the import suite classifies a failed load in the cell (standard library only, Python 3.10 and up) and the
lab's stages (install, pins, static, serve, nccl, perf) classify theirs. ``color`` says what the cause makes a
cell: ``red`` (the stack is broken), ``amber`` (this machine could not judge it, or an optional part will not
work) or ``grey`` (the lab or the infrastructure failed: the question is unanswered).
"""

from __future__ import annotations

import dataclasses

__all__ = ["CAUSES", "Cause", "cause", "is_known", "markdown_table"]


@dataclasses.dataclass(frozen=True)
class Cause:
    code: str
    color: str  # red | amber | grey
    title: str  # what it is, in the user's words
    fix: str  # what to do about it


_TABLE = (
    Cause(
        "torch-abi",
        "red",
        "built for another torch (a C++ symbol of torch is missing)",
        "install the release built for the installed torch, or the torch its pin names",
    ),
    Cause(
        "python-abi",
        "red",
        "built for another Python (a symbol or tag of CPython's C API)",
        "install the wheel tagged for this interpreter",
    ),
    Cause(
        "numpy-abi",
        "red",
        "built for NumPy 1.x, NumPy 2 installed",
        "`numpy<2`, or a release of the package built for NumPy 2",
    ),
    Cause(
        "abi-symbol",
        "red",
        "an undefined C/C++ symbol: built against another version of a library",
        "install builds made against the same version of the library that defines it",
    ),
    Cause(
        "symbol-version",
        "red",
        "a versioned symbol (GLIBC_, GLIBCXX_, CUDA) the libraries here lack",
        "a newer system library or driver, or a build for an older one",
    ),
    Cause(
        "missing-library",
        "red",
        "a shared library it needs is not installed or not found",
        "install the package that ships it (for CUDA: the nvidia-* wheel of the same CUDA major)",
    ),
    Cause(
        "cuda-major-mix",
        "red",
        "two CUDA majors in one environment (cu12 beside cu13)",
        "pin every CUDA package to the major torch was built for",
    ),
    Cause(
        "file-clash",
        "red",
        "two distributions install the same file with different bytes",
        "uninstall one of the two (they are alternatives, e.g. opencv-python and opencv-python-headless)",
    ),
    Cause(
        "pin-broken",
        "red",
        "an installed version breaks a requirement another package declares",
        "install what the requirement asks for, or a release of the package that accepts what is installed",
    ),
    Cause("import-error", "red", "the package's own import raises", "read the exception in the details"),
    Cause(
        "undeclared-dependency",
        "amber",
        "a module imports a distribution its package does not declare",
        "install that distribution; report it to the package",
    ),
    Cause("crash", "red", "the process died on a signal while loading", "read the log in the details"),
    Cause("hang", "red", "a load or a start did not finish in its time", "read the log in the details"),
    Cause(
        "no-kernel-image",
        "red",
        "no GPU code for the target's architecture",
        "a build that carries code for it (TORCH_CUDA_ARCH_LIST), or a newer release",
    ),
    Cause("driver-too-old", "red", "it needs a CUDA driver newer than the target's", "a newer driver"),
    Cause("metadata", "red", "a distribution's metadata is broken", "reinstall it"),
    Cause("unsatisfiable", "red", "the pins cannot be installed together", "change one of the pins the message names"),
    Cause(
        "placeholder-sdist",
        "red",
        "the index has only a placeholder for a pinned release",
        "add the index that has the real wheel, or pin another release",
    ),
    Cause(
        "jit-failed",
        "red",
        "a compiler the stack calls at run time failed (Triton, flashinfer's JIT)",
        "read the compiler's own line in the details",
    ),
    Cause(
        "toolchain",
        "red",
        "a compiler the stack calls at run time cannot target the GPU, or is missing (Triton's ptxas)",
        "point TRITON_PTXAS_PATH at a toolkit that knows the arch, or unset it for Triton's own",
    ),
    Cause(
        "jit-toolchain",
        "amber",
        "the nvcc a JIT would build with is missing, of another CUDA major, or does not know the arch",
        "set CUDA_HOME to a toolkit of torch's CUDA major that knows the arch, if a kernel must be built",
    ),
    Cause("serve-failed", "red", "SGLang's server did not start or did not answer right", "read the log"),
    Cause("too-slow", "red", "a measured figure is below its threshold", "compare the figures with the baseline"),
    Cause("nccl", "red", "NCCL failed: init, a hang, a wrong result or too little bandwidth", "read the report"),
    Cause(
        "feature-broken",
        "amber",
        "it imports, but a library it ships for a feature cannot load",
        "install what that library needs, if the feature matters",
    ),
    Cause(
        "needs-gpu",
        "amber",
        "it refuses to import or run without an NVIDIA GPU and driver",
        "run the same check on the GPU box",
    ),
    Cause("not-run", "amber", "a required stage did not run here", "run the stage where it can run"),
    Cause("infra", "grey", "the index, the network or the machine failed", "run again; check the index"),
    Cause(
        "disk-full",
        "grey",
        "the disk filled up (uv's cache or the cells' venvs)",
        "free space, or put UV_CACHE_DIR and COMPATLAB_VENVS on a bigger disk",
    ),
    Cause("lab-error", "grey", "the lab itself failed", "report it with the log"),
    Cause("unclassified", "red", "a failure no rule of the table names yet", "read the reason"),
)

CAUSES: dict[str, Cause] = {c.code: c for c in _TABLE}


def cause(code: str) -> Cause:
    """The table's row for *code*; KeyError for a code not in it (a typo is a bug, never a new cause)."""
    return CAUSES[code]


def is_known(code: str) -> bool:
    return code in CAUSES


def markdown_table() -> str:
    """The table as README.md shows it (tests/unit/incell/test_cause_table.py keeps the two equal)."""
    rows = ["| code | colour | what it means | what to do |", "| --- | --- | --- | --- |"]
    rows += [f"| `{c.code}` | {c.color} | {c.title} | {c.fix} |" for c in _TABLE]
    return "\n".join(rows) + "\n"
