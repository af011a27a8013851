#!/usr/bin/env bash
# Model B on a GPU at this release, in one command: three recordings of one setting (block wrap) under
# profilers of different weight, bare runs of the same script, and the in-process truth of four settings,
# interleaved (truth, bare, recordings, truth, bare), so that the machine's drift falls on all of them.
#
#   bash benchmarks/gpu_model_b_check.sh OUT [MODEL ARGS...]      # e.g. on a lent GPU (../shared/gpu/README.md)
#
# OUT/w gets: truth1.json / truth2.json (gpu_model_b.py truth, a line a round), bare1.jsonl / bare2.jsonl (the script's
# own step times and max_memory_allocated, run bare), light/ (record --no-memory), mem/ (record, defaults),
# heavy/ (record --stack), each beside the script's own output (<name>.jsonl) and fsdpviz's (<name>.err),
# progress.log; all of it in OUT/results.tgz at the end. Read here with
# `python benchmarks/gpu_model_b_read.py results.tgz` (docs/whatif.md, "Model B on an H100 at this release").
set -u
OUT=${1:?usage: gpu_model_b_check.sh OUT [MODEL ARGS...]}
shift
MODEL=("$@")
W=$OUT/w
mkdir -p "$W"
PY=${PYTHON:-python3}
S=("$PY" benchmarks/gpu_model_b.py)
start=$(date +%s)
# BUDGET seconds in all (default 480, for a device call of 540 s): a stage gets at most what is left of
# it less 20 s, so that the results are always packed and brought back.
BUDGET=${BUDGET:-480}
log() { echo "$(( $(date +%s) - start )) s: $*" | tee -a "$W/progress.log"; }
limit() {  # the stage's own limit, or what is left of the budget
    local left=$(( BUDGET - 20 - ($(date +%s) - start) ))
    (( left < $1 )) && echo "$left" || echo "$1"
}
stage() {  # stage NAME LIMIT OUTFILE COMMAND...: run COMMAND (stdout to OUTFILE) unless the budget is spent
    local name=$1 lim; lim=$(limit "$2"); local out=$3; shift 3
    if (( lim < 10 )); then log "$name skipped: the budget is spent"; return; fi
    log "$name (at most $lim s)"
    timeout "$lim" "$@" > "$out" 2>> "$W/$name.err"
    log "$name rc=$?"
}
truth() { stage "truth$1" 150 "$W/truth$1.json" "${S[@]}" truth "${MODEL[@]}" --rounds 3; }
bare() { stage "bare$1" 60 "$W/bare$1.jsonl" "${S[@]}" train "${MODEL[@]}" --wrap block; }
record() {
    local name=$1; shift
    stage "$name" 150 "$W/$name.jsonl" "$PY" -m fsdpviz record --out "$W/$name" --no-report --no-summary "$@" -- \
        "${S[@]}" train "${MODEL[@]}" --wrap block
}

"$PY" -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')" \
    >> "$W/progress.log" 2>&1
truth 1
bare 1
record light --no-memory
record mem
record heavy --stack
bare 2
truth 2
log "done"
tar czf "$OUT/results.tgz" -C "$OUT" w && rm -rf "$W"
