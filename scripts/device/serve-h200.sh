#!/usr/bin/env bash
# The serve stage on the one-GPU H200 device machine, with the SGLang stack carried there in parts
# (../shared/gpu/README.md: prepare-sglang-carry.sh here, parts copied to $HOME/sglang-parts there).
#   scripts/device/serve-h200.sh ok       compatlab check --stage serve on the carried stack (baseline + EAGLE-3)
#   scripts/device/serve-h200.sh broken   the same on two broken copies: IPython missing; sgl_kernel's sm90 build gone
#   scripts/device/serve-h200.sh bench    benchmarks/bench_vs_sglang.py --real: SGLang's client and ours, 5 rounds
# The verdicts, results.json and the servers' logs go to $OUT (the device tool's output folder, 8 files at most).
set -uo pipefail
mode=${1:?ok, broken or bench}
OUT=${OUT:-/tmp/compatlab-out}; mkdir -p "$OUT"
. "$HOME/sglang-parts/unpack-sglang.sh" || exit 1
site=$HOME/sglang-site
export PYTHONPATH=$PWD/src:$site  # the lab itself: packaging and pyelftools come with the carried stack
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# A venv over the device's own torch whose site-packages holds the carried stack (links), minus *drop*.
make_cell() {  # name [entries to leave out...]
  local venv=$HOME/$1; shift
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv --system-site-packages --without-pip "$venv" || return 1
    local sp; sp=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    for f in "$site"/*; do ln -sfn "$f" "$sp/"; done
    for d in "$@"; do rm -rf "${sp:?}/$d"; done
  fi
  echo "$venv"
}

check() {  # venv label: the report stays in $HOME/reports/label; the verdict, results and server logs go to $OUT
  python3 -m compatlab check --venv "$1" --stage serve --serve-from examples/serve-device.toml \
    --out "$HOME/reports/$2" 2>&1 | tee "$OUT/$2.log"
  cp "$HOME/reports/$2/results.json" "$OUT/$2-results.json"
  for log in "$HOME/reports/$2"/runs/*/cells/*/serve/logs/*.log; do cp "$log" "$OUT/$2-$(basename "$log")"; done
}

case $mode in
  ok)
    nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
    cell=$(make_cell cell) && check "$cell" check-ok ;;
  broken)
    cell=$(make_cell cell-noipython IPython) && check "$cell" check-noipython
    cell=$(make_cell cell-nosm90 sgl_kernel) || exit 1
    sp=$("$cell/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    cp -r "$site/sgl_kernel" "$sp/sgl_kernel" && rm -rf "$sp/sgl_kernel/sm90"
    check "$cell" check-nosm90 ;;
  bench)
    cell=$(make_cell cell) || exit 1
    python3 -c 'import sys; from pathlib import Path; from compatlab.stages.serve.model import make_model
make_model(Path(sys.argv[1]), model=None, layers=2, eagle3=False)' "$HOME/bench-model" || exit 1
    model=$HOME/bench-model/target
    python3 benchmarks/bench_vs_sglang.py --real "$cell/bin/python" --model "$model" --rounds 5 \
      --concurrency 1,8 --output-len 128 --log "$OUT/bench-server.log" \
      --launch-arg=--attention-backend --launch-arg=triton --launch-arg=--sampling-backend \
      --launch-arg=pytorch --launch-arg=--mem-fraction-static --launch-arg=0.35 2>&1 | tee "$OUT/bench.log" ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
