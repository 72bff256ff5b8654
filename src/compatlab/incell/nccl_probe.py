"""What the cell's torch sees for the NCCL suite, as one JSON line on stdout: ``python -m
compatlab.incell.nccl_probe`` prints ``{"gpus": N, "nccl": bool, "gloo": bool, "torch": "2.9.1+cu130"}``.

It imports torch, so a torch that does not load fails it (its stderr says why): the NCCL stage's parent
(``stages.nccl.stage.probe``) reads both.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    del argv  # no arguments
    torch = importlib.import_module("torch")
    dist = importlib.import_module("torch.distributed")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    seen = {
        "gpus": gpus,
        "nccl": bool(dist.is_available() and dist.is_nccl_available()),
        "gloo": bool(dist.is_available() and dist.is_gloo_available()),
        "torch": torch.__version__,
    }
    sys.stdout.write(json.dumps(seen) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
