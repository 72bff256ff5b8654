#!/usr/bin/env bash
# The serve stage on the one-GPU H200 device machine, with the SGLang stack carried there in parts
# (../shared/gpu/README.md: prepare-sglang-carry.sh here, parts copied to $HOME/sglang-parts there, and the
# zstandard wheel of the carry beside them: the device has no zstd tool, scripts/device/unzstd.py unpacks).
#   scripts/device/serve-h200.sh ok       compatlab check --stage serve on the carried stack (baseline + EAGLE-3)
#   scripts/device/serve-h200.sh broken   the same on two broken copies: IPython missing; sgl_kernel's sm90 build gone
#   scripts/device/serve-h200.sh toolchain  static + serve with Triton's ptxas broken: TRITON_PTXAS_PATH at CUDA
#                                         11.8's ptxas (a real one, carried as ptxas-11.8: it does not know
#                                         sm_90a), and a Triton without its ptxas; each with an empty Triton cache
#   scripts/device/serve-h200.sh abi      serve with sgl_kernel's sm90 common_ops built for another torch (the
#                                         carried common_ops.abi3.so: gcc-made, needs a c10 symbol torch lacks)
#   scripts/device/serve-h200.sh bench    benchmarks/bench_vs_sglang.py --real: SGLang's client and ours, 5 rounds
# The verdicts, results.json and the servers' logs go to $OUT (the device tool's output folder, 8 files at most).
set -uo pipefail
mode=${1:?ok, broken or bench}
OUT=${OUT:-/tmp/compatlab-out}; mkdir -p "$OUT"
site=$HOME/sglang-site
if [ ! -f "$site/.done" ] && ! command -v zstd >/dev/null; then  # the device has no zstd tool: Python unpacks
  cat "$HOME"/sglang-parts/site.part.* > "$HOME/site.tar.zst" || exit 1
  python3 scripts/device/unzstd.py "$HOME"/sglang-parts/zstandard-*.whl "$HOME/site.tar.zst" "$HOME/site.tar" &&
    mkdir -p "$site" && tar -xf "$HOME/site.tar" -C "$site" && touch "$site/.done" || exit 1
  rm -f "$HOME/site.tar" "$HOME/site.tar.zst"
fi
# Wheels carried beside the stack in parts (extra-NAME.whl.partNN: nvidia-cutlass-dsl-libs-cu13, which
# SGLang 0.5.17 imports at start and prepare-sglang-carry.sh leaves out) go into it once.
for first in "$HOME"/sglang-parts/extra-*.whl.part00; do
  [ -e "$first" ] || continue
  whl=${first%.part00}; [ -f "$whl.done" ] && continue
  cat "$whl".part* > "$whl" && python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
    "$whl" "$site" && rm -f "$whl" && touch "$whl.done" || exit 1
done
. "$HOME/sglang-parts/unpack-sglang.sh" || exit 1
export PYTHONPATH=${LAB_SRC:-$PWD/src}:$site  # the lab itself (LAB_SRC: another copy of it, for a baseline); packaging and pyelftools come with the carried stack
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# A venv over the device's own torch whose site-packages holds the carried stack (links), minus *drop*.
make_cell() {  # name [entries to leave out...]
  local venv=$HOME/$1; shift
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv --system-site-packages --without-pip "$venv" || return 1
    local sp; sp=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    for f in "$site"/*; do ln -sfn "$f" "$sp/"; done
    # python3 there may itself be a venv, whose packages (torch, numpy) --system-site-packages does not see:
    # its site folders go after the carried stack, by a .pth file.
    python3 -c 'import sys; print("\n".join(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))))' \
      > "$sp/zz-device-python.pth"
    for d in "$@"; do rm -rf "${sp:?}/$d"; done
  fi
  echo "$venv"
}

check() {  # venv label [stages...]: the report stays in $HOME/reports/label; the verdict goes to $OUT/label.log,
  # results.json and the servers' logs to $OUT/label.tar (the device tool brings back 8 files at most)
  local venv=$1 label=$2; shift 2
  local stages=(--stage serve); [ $# -gt 0 ] && stages=(); for st in "$@"; do stages+=(--stage "$st"); done
  [ "${PACKAGE:-}" ] && stages+=(--package "$PACKAGE")  # static of that distribution only (the toolchain check is whole)
  python3 -m compatlab check --venv "$venv" "${stages[@]}" --target sm_90 --serve-from examples/serve-device.toml \
    --out "$HOME/reports/$label" 2>&1 | tee "$OUT/$label.log"
  local keep=$HOME/keep/$label; rm -rf "$keep"; mkdir -p "$keep"
  cp "$HOME/reports/$label/results.json" "$keep/results.json"
  for log in "$HOME/reports/$label"/runs/*/cells/*/serve/logs/*.log; do [ -f "$log" ] && cp "$log" "$keep/"; done
  tar -C "$HOME/keep" -cf "$OUT/$label.tar" "$label"
}

with_triton() {  # venv: a copy of the device's Triton (links) and its dist-info in the cell's own site-packages
  local sp; sp=$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  local tdir; tdir=$(python3 -c 'import os, triton; print(os.path.dirname(triton.__file__))')
  rm -rf "${sp:?}/triton"; cp -rs "$tdir" "$sp/triton"
  for info in "$(dirname "$tdir")"/triton-*.dist-info; do cp -r "$info" "$sp/"; done
  echo "$sp"
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
  toolchain)
    chmod +x "$HOME/sglang-parts/ptxas-11.8"
    cell=$(make_cell cell-oldptxas) && with_triton "$cell" >/dev/null || exit 1
    PACKAGE=triton TRITON_CACHE_DIR=$(mktemp -d) TRITON_PTXAS_PATH=$HOME/sglang-parts/ptxas-11.8 \
      check "$cell" check-oldptxas static serve
    cell=$(make_cell cell-noptxas) || exit 1
    sp=$(with_triton "$cell") && rm -f "$sp/triton/backends/nvidia/bin/ptxas" || exit 1
    PACKAGE=triton TRITON_CACHE_DIR=$(mktemp -d) check "$cell" check-noptxas static serve ;;
  abi)
    cell=$(make_cell cell-abi sgl_kernel) || exit 1
    sp=$("$cell/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    cp -r "$site/sgl_kernel" "$sp/sgl_kernel" && cp "$HOME/sglang-parts/common_ops.abi3.so" "$sp/sgl_kernel/sm90/" &&
      check "$cell" check-abi ;;
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
