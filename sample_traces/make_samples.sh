#!/usr/bin/env bash
# Re-create the recordings in sample_traces/ (see README.md there). CPU with gloo, 2 ranks, ~1-2 min.
# Usage: sample_traces/make_samples.sh [NAME...]   (from anywhere; uses .venv/bin/python when present)
#   NAME: only these samples, e.g. zero3-cpu-2rank; default: all of them
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
free_port() { "$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }
torchrun() { echo "$PY" -m torch.distributed.run --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$(free_port)"; }
TINY=(--layers 2 --dim 32 --steps 10 --seed 0)
export OMP_NUM_THREADS=1
WANTED=("$@")
wanted() { [ ${#WANTED[@]} -eq 0 ] || [[ " ${WANTED[*]} " == *" $1 "* ]]; }

# 1. Run folders written by `fsdpviz record` (defaults: steps 2-4 profiled, 6-9 timed unprofiled): FSDP2, FSDP1, ZeRO-3.
record() {
    wanted "$1" || return 0
    local out=sample_traces/$1; shift
    # shellcheck disable=SC2046  # torchrun prints words to split
    "$PY" -m fsdpviz record --out "$out" --force --no-report -- $(torchrun) "$@"
    rm -rf "$out/traces/.fsdpviz-cache"
}
record fsdp2-cpu-2rank examples/train.py --framework fsdp2 --wrap block "${TINY[@]}"
record fsdp1-cpu-2rank examples/train.py --framework fsdp1 --wrap block "${TINY[@]}"
DS_ACCELERATOR=cpu record zero3-cpu-2rank examples/train.py --framework zero3 --wrap submodule "${TINY[@]}"

# 2. FSDP2 under a plain torch.profiler, no fsdpviz: what most existing recordings look like.
if wanted fsdp2-cpu-2rank-plain; then
    out=sample_traces/fsdp2-cpu-2rank-plain
    rm -rf "$out"
    $(torchrun) sample_traces/profile_example.py "$out" --framework fsdp2 --wrap block --layers 2 --dim 32 --steps 5 --seed 0
fi

du -ah sample_traces | grep -v cache | sort -k2
