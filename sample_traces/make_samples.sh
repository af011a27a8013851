#!/usr/bin/env bash
# Re-create the recordings in sample_traces/ (see README.md there). Runs on CPU with gloo, 2 ranks.
# Usage: sample_traces/make_samples.sh   (from anywhere; uses .venv/bin/python when present)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
free_port() { "$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }
TINY=(--layers 2 --dim 32 --steps 5 --seed 0)

# 1. FSDP2 under a plain torch.profiler, no fsdpviz: rank{R}.trace.json.gz
out=sample_traces/fsdp2-cpu-2rank
rm -rf "$out"
"$PY" -m torch.distributed.run --nproc_per_node 2 --master_port "$(free_port)" \
    sample_traces/profile_example.py "$out" --framework fsdp2 --wrap block "${TINY[@]}"
ls -l "$out"
