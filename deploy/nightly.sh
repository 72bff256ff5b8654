#!/usr/bin/env bash
# One nightly run on a GPU box outside GitHub (see deploy/systemd/): the matrix, the 8-GPU stages, the
# report, the static site, and only the newest $COMPATLAB_KEEP_RUNS runs kept. Exits non-zero only when a
# verdict is news (the summary's rule), so the timer's failure state means "look at the grid".
set -uo pipefail
cd "$(dirname "$0")/.."
export UV_PYTHON_DOWNLOADS=never
export COMPATLAB_RUN_ID="${COMPATLAB_RUN_ID:-$(date -u +%Y%m%dT%H%M%SZ)-nightly}"
keep="${COMPATLAB_KEEP_RUNS:-30}"
site="${COMPATLAB_SITE:-reports/site}"

# Cells side by side (GPU stages queue on their GPU leases); COMPATLAB_JOBS=1 for one at a time.
python3 -m nox -s matrix -- -j "${COMPATLAB_JOBS:-auto}" || true
python3 -m nox -s gpu8_perf || true
python3 -m nox -s report
python3 -m nox -s publish -- --site "$site" --runs reports/runs
PYTHONPATH=src python3 -m compatlab prune --runs reports/runs --keep "$keep"
PYTHONPATH=src python3 -m compatlab summary "reports/runs/$COMPATLAB_RUN_ID/results.json"
