"""The words fsdpviz's tables, files and predictions share, each spelled once.

Collective kinds (the ``comm`` column of the trace tables, the ``kind`` of communication spans, the
timers' and the what-if programs' collectives), the kinds of a unit's spans, the phases and the
framework names. Everything imports these from here, the recorder included: this module imports
nothing, so that every layer may (docs/architecture.md).
"""

from __future__ import annotations

from typing import Final

# --- collectives ---------------------------------------------------------------------------------
ALL_GATHER: Final = "all_gather"
REDUCE_SCATTER: Final = "reduce_scatter"
ALL_REDUCE: Final = "all_reduce"
BROADCAST: Final = "broadcast"
SEND_RECV: Final = "send_recv"
ALL_TO_ALL: Final = "all_to_all"
REDUCE: Final = "reduce"
BARRIER: Final = "barrier"
OTHER_COMM: Final = "other"  # a communication kernel whose collective cannot be told (RCCL Generic)
# the ``comm`` column of the trace tables
COLLECTIVES: Final = (ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE, BROADCAST, SEND_RECV, ALL_TO_ALL, REDUCE, BARRIER,
                      OTHER_COMM)
# The collectives FSDP issues for its units: the parameters' gather, the gradients' reduction
# (an all-reduce where nothing is sharded, and across replicas under HSDP).
UNIT_COLLECTIVES: Final = (ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE)

# What a collective served (structure/purposes.py decides): FSDP's parameter all-gathers and gradient
# reduce-scatters, HSDP's all-reduce across replicas, tensor parallelism's collectives, and the rest
# (barriers, object collectives, anything issued outside FSDP's and TP's code).
FSDP_ALL_GATHER: Final = "fsdp_all_gather"
FSDP_REDUCE_SCATTER: Final = "fsdp_reduce_scatter"
HSDP_ALL_REDUCE: Final = "hsdp_all_reduce"
TENSOR_PARALLEL: Final = "tensor_parallel"
OTHER_PURPOSE: Final = "other"
PURPOSES: Final = (FSDP_ALL_GATHER, FSDP_REDUCE_SCATTER, HSDP_ALL_REDUCE, TENSOR_PARALLEL, OTHER_PURPOSE)
FSDP_PURPOSES: Final = (FSDP_ALL_GATHER, FSDP_REDUCE_SCATTER, HSDP_ALL_REDUCE)

# Where a unit's parameter counts stand: after tensor parallelism split them (each rank's part) or whole.
PARAM_SCOPE_LOCAL: Final = "local"
PARAM_SCOPE_GLOBAL: Final = "global"

# --- a unit's spans (besides its collectives) ------------------------------------------------------
COPY_IN: Final = "copy_in"  # FSDP2 packs the shards into the all-gather input
COPY_OUT: Final = "copy_out"  # FSDP2 unpacks the all-gather output into the parameters
COMPUTE: Final = "compute"
RESHARD: Final = "reshard"
SPAN_KINDS: Final = (ALL_GATHER, COPY_IN, COPY_OUT, COMPUTE, REDUCE_SCATTER, ALL_REDUCE, RESHARD)

# --- phases ----------------------------------------------------------------------------------------
FORWARD: Final = "forward"
BACKWARD: Final = "backward"
OPTIMIZER: Final = "optimizer"
PHASES: Final = (FORWARD, BACKWARD, OPTIMIZER)

# --- frameworks ------------------------------------------------------------------------------------
FSDP2: Final = "fsdp2"
FSDP1: Final = "fsdp1"
ZERO3: Final = "zero3"
DDP: Final = "ddp"
UNKNOWN: Final = "unknown"
FRAMEWORKS: Final = (FSDP2, FSDP1, ZERO3, DDP, UNKNOWN)
FRAMEWORKS_WITH_UNITS: Final = (FSDP2, FSDP1, ZERO3)  # the frameworks whose units fsdpviz analyses

# --- process groups in a CPU trace (gloo names none; fsdpviz record names them, record/groups.py) ----
GROUP_LABEL_PREFIX: Final = "fsdpviz.group "  # a range around one collective call: "fsdpviz.group <pg name>"
GLOO_THREAD_PREFIX: Final = "gloo pg "  # a gloo worker thread of a group: "gloo pg <pg name>"
