"""``python -m compatlab.incell.runpytest OVERLAY ARGS…``: pytest run from the overlay folder OVERLAY, put
*last* on sys.path, so that every package of the environment (its own packaging, pluggy, even its pytest)
wins over the overlay's copies (stages/suite.tools_overlay): how `compatlab check` runs a suite in an
environment without pytest and installs nothing into it."""

from __future__ import annotations

import sys


def main() -> int:
    if len(sys.argv) < 2:
        sys.stderr.write("usage: python -m compatlab.incell.runpytest OVERLAY [PYTEST-ARGS…]\n")
        return 2
    sys.path.append(sys.argv.pop(1))
    import pytest

    return int(pytest.main(sys.argv[1:]))


if __name__ == "__main__":
    raise SystemExit(main())
