"""The import stage's floor: one interpreter importing, one after another, the modules the stage loaded.

Run with the cell's interpreter: ``python _import_floor.py MODULES.json`` (a list of {"module": label,
"dist": ...} as the stage's details hold them). A package is imported by name, an extension module by its
dotted name (what its package would import); a failure is counted and the rest go on. Prints one JSON line:
{"torch": seconds to import torch, "all": seconds for everything, "cpu": CPU seconds of this process and
what it started (user and system), "ok": n, "failed": n}.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time


def _dotted(label: str) -> str:
    if not label.endswith(".so"):
        return label
    *folders, file = label.split("/")
    return ".".join([*folders, file.split(".", 1)[0]])


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as file:
        modules = [str(m["module"]) for m in json.load(file)]
    start = time.monotonic()
    importlib.import_module("torch")  # the first thing the stage's server imports too

    torch_s = time.monotonic() - start
    ok = failed = 0
    for name in [_dotted(m) for m in modules if m.endswith(".so")] + [m for m in modules if not m.endswith(".so")]:
        try:
            importlib.import_module(name)
            ok += 1
        except BaseException:  # noqa: BLE001 - a failure is counted; the floor goes on
            failed += 1
    seconds = time.monotonic() - start
    used = os.times()  # what the imports started (a package's background builds) counts where it has ended
    cpu = used.user + used.system + used.children_user + used.children_system
    print(json.dumps({"torch": torch_s, "all": seconds, "cpu": cpu, "ok": ok, "failed": failed}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
