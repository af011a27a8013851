#!/usr/bin/env bash
# Record the example trainer with three FSDP2 wrap policies and compare them (docs/tutorial-wrap-policies.md).
#
#   make setup                                 # once, on a fresh clone (`make demo` does it too)
#   examples/compare_wrap_policies.sh [OUT]    # default OUT: runs/wrap-policies
#
# Policies: block (one unit per transformer block), pair (two blocks per unit), root (one unit for
# the whole model). Each run is 2 ranks on CPU with gloo; all three take 1-3 minutes on 2 cores.
# Writes OUT/block, OUT/pair, OUT/root (run folders with report.html), OUT/compare.html (the
# compare page) and OUT/compare.json (`fsdpviz compare --json`).
#
# Environment: PYTHON (default .venv/bin/python), MODEL_ARGS (default "--layers 4 --dim 256 --steps 9"),
# RECORD_ARGS (default "--warmup 2 --steps 6": profile optimizer steps 2-7, all of them analysed).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
if ! "$PY" -c "import fsdpviz, torch" 2>/dev/null; then
    echo "error: $PY cannot import fsdpviz and torch: run 'make setup' first (or set PYTHON)" >&2
    exit 2
fi
OUT=${1:-runs/wrap-policies}
read -r -a MODEL <<< "${MODEL_ARGS:---layers 4 --dim 256 --steps 9}"
read -r -a RECORD <<< "${RECORD_ARGS:---warmup 2 --steps 6}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # 2 ranks on a small machine: one thread each

mkdir -p "$OUT"
for wrap in block pair root; do
    echo "== recording --wrap $wrap into $OUT/$wrap" >&2
    "$PY" -m fsdpviz record --out "$OUT/$wrap" --label "$wrap" --force --no-summary "${RECORD[@]}" -- \
        "$PY" -m torch.distributed.run --standalone --nproc_per_node 2 \
        examples/train.py --framework fsdp2 --wrap "$wrap" "${MODEL[@]}"
done

echo "== comparing" >&2
"$PY" -m fsdpviz compare "$OUT/block" "$OUT/pair" "$OUT/root" --json -o "$OUT/compare.html" > "$OUT/compare.json"
echo "compare page: $OUT/compare.html" >&2
echo "numbers:      $OUT/compare.json" >&2
