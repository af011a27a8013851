"""Column names and dtypes of every table fsdpviz passes between layers.

One module owns the schema so that the loader, the analysis, the report, the cache and the
exporters agree on it. Tables are pandas DataFrames; times are integer nanoseconds on one
run-wide clock (Kineto's ``ts`` plus the trace's ``baseTimeNanoseconds`` when present, i.e. wall
clock nanoseconds for recent PyTorch). Durations are ``int64`` ns. String columns that repeat
(lanes, kinds, names) use ``category`` to keep millions of rows small.

``make_empty(SCHEMA)`` gives a correctly typed empty table; ``conform(df, SCHEMA)`` checks and
casts a table a producer built, so a mistake shows up where it is made, not three layers later.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:  # imported where used: parser processes build tables without pandas
    import pandas as pd

# pandas' storage for string columns in a process fsdpviz owns (its commands, and a parser's per-rank
# analysis): Python objects, not Arrow (pandas' default where pyarrow is installed). fsdpviz's tables are
# many and small (a step's spans, a unit's collectives, one rank's pieces), and on them each Arrow call's
# fixed cost outweighs its speed: an uncached summary of a bundled sample runs about a quarter faster,
# with the same bytes of ``summary --json`` (docs/performance.md, "String storage";
# tests/unit/test_string_storage.py). A notebook's process is the user's: pandas keeps its own setting.
STRING_STORAGE: Final = "python"
_owned = {"process": False}


def own_this_process() -> None:
    """Say that this process is fsdpviz's own (the command line), so that the tables it builds hold
    :data:`STRING_STORAGE` strings (:func:`use_string_storage`); pandas is not imported here."""
    _owned["process"] = True


def use_string_storage() -> None:
    """In a process fsdpviz owns (:func:`own_this_process`), set pandas' ``mode.string_storage`` to
    :data:`STRING_STORAGE` for the rest of it; elsewhere (a notebook) leave pandas as the user has it.
    Called where the loader builds the tables, once pandas is imported."""
    if not _owned["process"]:
        return
    import pandas as pd

    pd.set_option("mode.string_storage", STRING_STORAGE)


def string_storage() -> Any:
    """A context in which pandas stores strings as :data:`STRING_STORAGE`, whoever owns the process (a
    parser process or a Dask worker analysing one rank: the setting is theirs only while it lasts)."""
    import pandas as pd

    return pd.option_context("mode.string_storage", STRING_STORAGE)


# --- event kinds -------------------------------------------------------------------------------
# Kineto categories map onto these; anything else is skipped and counted by the loader.
KIND_CPU_OP: Final = "cpu_op"  # cat cpu_op (aten ops, gloo:* ops, autograd functions)
KIND_ANNOTATION: Final = "annotation"  # cat user_annotation (record_function ranges, FSDP:: labels)
KIND_GPU_ANNOTATION: Final = "gpu_annotation"  # cat gpu_user_annotation (GPU-side copies of ranges)
KIND_KERNEL: Final = "kernel"
KIND_MEMCPY: Final = "memcpy"
KIND_MEMSET: Final = "memset"
KIND_RUNTIME: Final = "runtime"  # cuda_runtime / cuda_driver / hip runtime launches
EVENT_KINDS: Final = (
    KIND_CPU_OP,
    KIND_ANNOTATION,
    KIND_GPU_ANNOTATION,
    KIND_KERNEL,
    KIND_MEMCPY,
    KIND_MEMSET,
    KIND_RUNTIME,
)

# --- the words columns hold ---------------------------------------------------------------------
# fsdpviz.vocabulary spells them: ``comm`` holds ``COLLECTIVES`` ("" = not communication), a unit span's
# ``kind`` ``SPAN_KINDS``, ``phase`` ``PHASES``, ``framework`` ``FRAMEWORKS``.

# --- lane kinds --------------------------------------------------------------------------------
LANE_CPU_MAIN: Final = "cpu_main"  # the thread that runs the training loop (ProfilerStep#N lives here)
LANE_CPU_AUTOGRAD: Final = "cpu_autograd"  # autograd engine threads (backward on GPU builds)
LANE_CPU_GLOO: Final = "cpu_gloo"  # gloo worker threads (pt_gloo_runloop): collectives on CPU
LANE_CPU_OTHER: Final = "cpu_other"
LANE_GPU_STREAM: Final = "gpu_stream"
LANE_KINDS: Final = (LANE_CPU_MAIN, LANE_CPU_AUTOGRAD, LANE_CPU_GLOO, LANE_CPU_OTHER, LANE_GPU_STREAM)

NO_STEP: Final = -1  # ``step`` of an event outside every ProfilerStep#N
NO_ID: Final = -1  # missing correlation / external id
UNKNOWN_BYTES: Final = -1

Schema = dict[str, str]

# One row per trace event the analysis can use (X events of the kinds above), sorted by start_ns
# within each rank (ranks in ascending order).
EVENTS: Final[Schema] = {
    "rank": "int32",
    "lane": "category",  # human-readable lane name, unique within a rank (see LANES)
    "kind": "category",  # one of EVENT_KINDS
    "name": "category",
    "start_ns": "int64",
    "dur_ns": "int64",
    "correlation": "int64",  # CUDA correlation id (kernel <-> runtime launch), NO_ID if none
    "external_id": "int64",  # Kineto "External id" (kernel -> launching cpu_op), NO_ID if none
    "step": "int32",  # ProfilerStep number the event starts in, NO_STEP outside
    # One of vocabulary.COLLECTIVES, "" when not communication. Set on events that run a collective (NCCL
    # kernels, gloo:* ops on gloo threads) and on CPU ops that issue one (c10d::*, nccl:*,
    # record_param_comms): select by kind / lane to tell them apart.
    "comm": "category",
    "comm_bytes": "int64",  # bytes moved per rank (output side of a gather), UNKNOWN_BYTES if unknown
    "pg": "category",  # process group name from record_param_comms args, "" if unknown
    "comm_dtype": "category",  # element type of a communication event's data ("bfloat16", ...), "" if unknown
    # Elements of the tensor a host backend runs the collective on: a gloo op's own input, and for an
    # issuing op the tensor it hands the backend (a gather's shard, a reduce-scatter's whole input);
    # -1 if unknown. It pairs a gloo thread's op with the op that issued it (structure/collectives.py).
    "comm_numel": "int64",
}

# One row per lane (CPU thread or GPU stream) of a rank.
LANES: Final[Schema] = {
    "rank": "int32",
    "lane": "string",
    "lane_kind": "string",  # one of LANE_KINDS
    "pid": "int64",
    "tid": "int64",  # thread id for CPU lanes; stream id for GPU lanes
    "device": "int32",  # GPU index for streams, -1 for CPU threads
    "thread_name": "string",  # from thread_name metadata, "" if none
    "order": "int32",  # display order within the rank (main first, then autograd, gloo, streams)
    "n_events": "int64",
}

# One row per ProfilerStep#N range per rank (the CPU-side annotation).
STEPS: Final[Schema] = {
    "rank": "int32",
    "step": "int32",
    "start_ns": "int64",
    "end_ns": "int64",
}

# Allocator samples from ``[memory]`` instant events.
MEMORY: Final[Schema] = {
    "rank": "int32",
    "device": "string",  # "cpu" or "cuda:N"
    "t_ns": "int64",
    "allocated_bytes": "int64",
    "reserved_bytes": "int64",
    "delta_bytes": "int64",  # the allocation (+) or free (-) that produced this sample
    "addr": "int64",  # the block allocated or freed (-1: not recorded): pairs a free with its allocation
}

# One row per source trace file (one per rank).
RANKS: Final[Schema] = {
    "rank": "int32",
    "path": "string",
    "world_size": "int32",  # from distributedInfo, -1 if unknown
    "backend": "string",  # nccl / gloo / "" if unknown
    "rank_source": "string",  # "distributedInfo" | "filename" | "default"
    "base_time_ns": "int64",
    "start_ns": "int64",
    "end_ns": "int64",
    "n_events": "int64",  # rows in EVENTS from this file
    "n_skipped": "int64",  # events skipped (unknown phase/category, bad durations)
    "n_comm_events": "int64",  # events with a communication kind (comm != "")
    "n_kernels": "int64",  # GPU kernels (0 on CPU)
    "n_backward_events": "int64",  # autograd's backward functions: the trace holds training (a backward pass)
    "memory_device": "string",  # the device its memory is analysed on (analysis.memory.main_devices), "" if none
    "device_name": "string",  # deviceProperties[0].name, "" on CPU
    "device_memory_bytes": "int64",  # that device's totalGlobalMem, -1 if unknown (CPU)
    "complete_steps": "string",  # fsdpviz exports: the steps shown complete, "3,4,5"; "" when unknown
    "run_id": "string",  # the recording that wrote the trace (fsdpviz record's fsdpvizRunId); "" when unknown
    "fsdpviz_export": "bool",  # read from fsdpviz's own Perfetto export (fsdpviz export --format perfetto)
    "nccl_version": "string",
    # distributedInfo's process groups, "desc:size:name" joined by ";" ("default_pg:4:0;mesh_tp:2:3");
    # "" when the trace lists none (structure/parallelism.py reads it)
    "process_groups": "string",
}

# Per-unit timeline (built by fsdpviz.structure.spans from FSDP labels).
SPANS: Final[Schema] = {
    "rank": "int32",
    "step": "int32",
    "unit": "string",  # "" for work of no unit (the optimizer step)
    "phase": "string",  # one of PHASES
    "kind": "string",  # one of vocabulary.SPAN_KINDS
    "lane": "string",
    "start_ns": "int64",  # when it ran on ``lane`` (a collective: its kernel / gloo op)
    "end_ns": "int64",
    "bytes": "int64",  # UNKNOWN_BYTES when not a transfer or unknown
    # when the CPU issued it: a collective's issuing op; GPU work's first launch; CPU work: start_ns
    "issue_ns": "int64",
    "n_units": "int32",  # units one collective carried (ZeRO-3 buckets: > 1, one row per unit); else 1
    "micro": "int32",  # forward/backward pass of the step: 0, 1, ... per micro-batch (gradient accumulation)
}

# FSDP units (from run.json when recorded by fsdpviz, else from the labels).
UNITS: Final[Schema] = {
    "unit": "string",  # module FQN as the user wrote it; "(root)" for the root
    "order": "int32",  # forward order
    "param_numel": "int64",  # -1 if unknown
    "param_bytes": "int64",  # unsharded bytes, -1 if unknown
    "framework": "string",
    "parent": "string",  # grouping block (ZeRO-3 submodule -> its block), "" if none
    "dtype": "string",  # dtype of the gathered (unsharded) parameters, "" if unknown
    "size_source": "string",  # where param_numel / param_bytes come from: UNIT_SIZES_* ("" when unknown)
}
UNIT_SIZES_RUN: Final = "run.json"  # the framework's own objects, as `fsdpviz record` read them
UNIT_SIZES_TRACE: Final = "trace"  # the arguments of the unit's all-gathers in the trace

# Per-step timers written by the recorder (timers/rank{R}.jsonl).
TIMERS: Final[Schema] = {
    "rank": "int32",
    "step": "int32",
    "unit": "string",  # "" for whole-step records
    "phase": "string",
    "kind": "string",
    "ms": "float64",  # NaN for memory records (they carry ``bytes``)
    "bytes": "int64",  # peak bytes of memory records (kind peak_rss / peak_allocated / ...), else -1
}

# Whole-step communication/computation overlap, one row per rank (fsdpviz.analysis.overlap).
OVERLAP_GPU: Final = "gpu"  # comm = NCCL kernels, compute = other kernels (HTA's definition)
OVERLAP_CPU: Final = "cpu"  # comm = gloo collectives, compute = main/autograd ops outside waits
OVERLAP: Final[Schema] = {
    "rank": "int32",
    "device": "string",  # OVERLAP_GPU or OVERLAP_CPU
    "n_steps": "int32",  # ProfilerSteps analysed (0 = whole trace: no steps in it)
    "first_step": "int32",  # NO_STEP when n_steps == 0
    "last_step": "int32",
    "window_start_ns": "int64",  # GPU: first analysed GPU event; CPU: first analysed step start
    "window_end_ns": "int64",
    "window_ns": "int64",
    "comm_ns": "int64",  # |union of comm intervals|
    "compute_ns": "int64",  # |union of compute intervals|
    "overlap_ns": "int64",  # |comm ∩ compute|
    "exposed_comm_ns": "int64",  # comm_ns - overlap_ns
    "busy_ns": "int64",  # |union of every analysed interval| (GPU: kernels, copies, memsets)
    "idle_ns": "int64",  # window_ns - busy_ns
    "non_compute_ns": "int64",  # busy_ns - compute_ns (HTA's "non-compute time")
    "overlap_pct": "float64",  # 100 * overlap_ns / comm_ns; NaN without communication
    # What bounds the step (fsdpviz.analysis.bound), summed over the analysed steps' CPU-side spans;
    # the parts add up to bound_window_ns; host_wait_ns -1: unknown (a CPU rank, no launches)
    "bound_window_ns": "int64",
    "bound_compute_ns": "int64",  # the model's: FSDP's per-unit work is in the two fsdp_ columns
    "bound_exposed_comm_ns": "int64",
    "host_wait_ns": "int64",
    "other_idle_ns": "int64",
    "fsdp_kernels_ns": "int64",  # GPU time of the copies FSDP's hooks launched (0 on a CPU rank)
    "fsdp_host_ns": "int64",  # host wait while FSDP's hooks ran (CPU rank: the thread's ops inside them)
    "bound_comm_ns": "int64",  # |union of comm intervals| in the same spans (beside the parts, not one of them)
    # GPU time the spans ran only work launched before them, beyond their own work's run past the last
    # (analysis/bound.py carried_work): a part, shown as other idle where the de-profiler keeps it
    "carried_ns": "int64",
}


# --- per-unit analysis results (fsdpviz.analysis.run.RunAnalysis) -------------------------------
NO_DEPTH: Final = -1  # issue_depth of a unit pass without an all-gather

# One row per rank, step, unit and pass (forward / backward): what the unit did and waited for.
UNIT_STEPS: Final[Schema] = {
    "rank": "int32",
    "step": "int32",
    "unit": "string",
    "phase": "string",
    "window_start_ns": "int64",  # pre-forward / pre-backward label start (-1 if no window)
    "window_end_ns": "int64",  # post-forward / last post-backward label end
    "compute_start_ns": "int64",  # first compute of the unit in this pass (-1 if none)
    "compute_end_ns": "int64",
    "compute_ns": "int64",  # sum of the unit's compute spans in the pass (nested units excluded)
    "ag_issue_ns": "int64",  # all-gather issued on the CPU (-1 if the pass gathered nothing)
    "ag_start_ns": "int64",  # all-gather ran on its lane
    "ag_end_ns": "int64",
    # summed duration of the pass's all-gathers (one, or one per parameter group); of a gather
    # carrying several units (ZeRO-3 buckets) the unit's share by parameter bytes (rs/ar likewise)
    "ag_ns": "int64",
    "ag_exposed_ns": "int64",  # part of it with no compute on the rank (once per shared ZeRO-3 bucket)
    "ag_bytes": "int64",
    "prefetch_lead_ns": "float64",  # compute_start - ag_end (NaN without gather or compute)
    "issue_depth": "int32",  # other units computing between the gather's start and the unit's (NO_DEPTH: no gather)
    "rs_ns": "int64",
    "rs_exposed_ns": "int64",
    "ar_ns": "int64",  # HSDP all-reduce of the gradients
    "ar_exposed_ns": "int64",
    "copy_in_ns": "int64",
    "copy_out_ns": "int64",
    "reshard_ns": "int64",
    "peak_allocated_bytes": "int64",  # highest allocated level in the window (-1 unknown)
    # Passes of the step in which the unit ran this phase: 1, or the micro-batches under gradient
    # accumulation. Durations and exposed times above are sums over them; start/end times span
    # all of them; prefetch_lead_ns and issue_depth are the smallest (the pass that waited most).
    "n_passes": "int32",
    # GPU idle that waited for a launch the host made in this unit pass's window (its innermost one):
    # the unit's host work (hooks, copy-in / copy-out launches) keeping the GPU waiting
    # (fsdpviz.analysis.bound); -1 where it does not apply (a CPU rank) or cannot be known
    "host_wait_ns": "int64",
    # GPU idle inside the pass's compute spans (compute_ns holds it: a span runs from its first kernel to
    # its last), split as the bound splits idle: the GPU waiting for a launch (host_gap_ns) or for
    # anything else (idle_gap_ns); -1 on a CPU rank. Not host_wait_ns: that counts the gaps, wherever
    # they lie, whose awaited launch the host made inside the unit's window
    "host_gap_ns": "int64",
    "idle_gap_ns": "int64",
    # compute_ns on the run's clock (fsdpviz.analysis.units.moved_pass_ns: its gaps moved as the step's idle
    # parts, its kernels by the bound's device_scale); NaN until the run's analysis moves it
    "compute_clock_ns": "float64",
}

# One row per unit: medians over ranks and steps (what ``summary --json`` reports per unit).
UNIT_STATS: Final[Schema] = {
    "unit": "string",
    "order": "int32",  # forward order
    "param_numel": "int64",  # -1 if unknown
    "param_bytes": "int64",  # unsharded parameter bytes (run.json, else gathered bytes), -1 unknown
    "n_samples": "int32",  # (rank, step) pairs the medians are over
    "all_gather_ns": "float64",  # per step, forward + backward gathers
    "forward_ns": "float64",
    "backward_ns": "float64",
    "reduce_scatter_ns": "float64",
    "all_reduce_ns": "float64",
    "exposed_comm_ns": "float64",  # exposed all-gathers + reduce-scatter + all-reduce per step
    "forward_ag_exposed_ns": "float64",
    "backward_ag_exposed_ns": "float64",
    "rs_exposed_ns": "float64",
    "forward_prefetch_lead_ns": "float64",
    "backward_prefetch_lead_ns": "float64",
    "forward_issue_depth": "float64",
    "backward_issue_depth": "float64",
    "peak_allocated_bytes": "int64",  # max over ranks, steps and passes
    "forward_peak_allocated_bytes": "int64",
    "backward_peak_allocated_bytes": "int64",
    "unsharded_bytes": "int64",  # its unsharded parameters + gradients (param_bytes * 2), -1 unknown
    "host_wait_ns": "float64",  # per step, the GPU's wait for launches of the unit's passes; NaN: unknown
    # forward_ns / backward_ns on the run's clock: medians of UNIT_STEPS' compute_clock_ns
    "forward_clock_ns": "float64",
    "backward_clock_ns": "float64",
}

# Where each rank's step went on its training threads.
STEP_TIMES: Final[Schema] = {
    "rank": "int32",
    "step": "int32",
    "start_ns": "int64",
    "end_ns": "int64",
    "step_ns": "int64",
    "unit_compute_ns": "int64",  # CPU time in the units' own compute pieces
    "framework_ns": "int64",  # CPU time in FSDP / fsdpviz / FSDP1 labels
    "optimizer_ns": "int64",  # after the last backward label: the optimizer step (and Optimizer.step#)
    "other_ns": "int64",  # the rest (data loading, loss, framework work outside labels)
    "comm_ns": "int64",  # |union of the step's collectives|
    "exposed_comm_ns": "int64",  # part of it with no compute on the rank
    "late_ns": "int64",  # sum over the step's collectives of (this rank's start - earliest rank's start)
}

# Allocator peak of each rank's step and where it fell.
MEMORY_PEAKS: Final[Schema] = {
    "rank": "int32",
    "step": "int32",
    "device": "string",
    "peak_allocated_bytes": "int64",
    "peak_reserved_bytes": "int64",
    "peak_t_ns": "int64",  # first sample at the peak
    "unit": "string",  # innermost unit window holding it ("" outside every unit)
    "phase": "string",
}

# Per-rank clock offsets estimated from collective end times.
CLOCK: Final[Schema] = {
    "rank": "int32",
    "offset_ns": "int64",  # rank clock - reference rank clock (median over matched collectives)
    "applied": "bool",  # whether the analysis shifted this rank's times by -offset_ns
    "n_matched": "int64",  # collectives matched with the reference rank
    "n_violations": "int64",  # matched collectives that end on one rank before they start on the other
}

# One row per collective seen on several ranks: how far apart the ranks started it.
SKEW: Final[Schema] = {
    "step": "int32",
    "pg": "string",
    "comm": "string",
    "seq": "int32",  # k-th collective of (step, pg, comm) on each rank
    "unit": "string",  # the unit it belongs to on the reference rank ("" none)
    "phase": "string",
    "kind": "string",  # span kind, "" when not a unit's collective
    "n_ranks": "int32",
    "first_start_ns": "int64",  # aligned clock
    "start_skew_ns": "int64",  # latest start - earliest start
    "late_rank": "int32",
    "early_rank": "int32",
}

# Findings in words, ranked by time lost per step.
FINDINGS: Final[Schema] = {
    "rank": "int32",  # -1: all ranks (medians)
    "unit": "string",
    "phase": "string",
    "kind": "string",  # exposed_all_gather / exposed_reduce_scatter / exposed_all_reduce / straggler / exposed_other / profiler
    "lost_ns": "float64",  # time lost per step
    "message": "string",
    "evidence": "string",  # the numbers behind it
    "knob": "string",  # what to try, "" when the trace shows no clear cause
    "cause": "string",  # the cause as a word (analysis/findings.py CAUSE_*): alike findings group by it
    "why_not": "string",  # why the cause leaves nothing to try where the trace's figures say so, else ""
}


def make_empty(schema: Schema) -> pd.DataFrame:
    """Return an empty DataFrame with the columns and dtypes of ``schema``."""
    import pandas as pd

    return pd.DataFrame({col: pd.Series(dtype=dtype) for col, dtype in schema.items()})


def conform(df: pd.DataFrame, schema: Schema, *, table: str = "table") -> pd.DataFrame:
    """Return ``df`` with exactly the schema's columns, in order, cast to its dtypes.

    Raises ``ValueError`` naming the table and the missing columns: that is a bug in the producer,
    not a user error. Extra columns are dropped.
    """
    import pandas as pd

    missing = [col for col in schema if col not in df.columns]
    if missing:
        raise ValueError(f"{table}: missing columns {missing}")
    # Column by column rather than ``df.loc[:, cols].astype(casts)``: the tables are many and small, and
    # the frame-wide calls' fixed cost was a tenth of an uncached summary (three times this loop's).
    dtypes = df.dtypes
    casts = {col: dtype for col, dtype in schema.items() if str(dtypes[col]) != dtype}
    if _copy_on_write() and df.columns.is_unique and df.flags.allows_duplicate_labels:
        # Many tables arrive with the schema's columns in order and dtypes: a lazy copy, and a cast of the
        # columns that differ, cost a fifth to a half of building a new frame from the columns (under
        # copy-on-write no write through pandas' indexing of ``out`` reaches ``df``).
        cols = pd.Index(list(schema))
        out = df.copy(deep=False) if df.columns.equals(cols) else df[cols]
        if out.columns.dtype != cols.dtype:  # e.g. labels of object dtype: the schema's own, as built anew
            out.columns = cols
        for col, dtype in casts.items():
            out[col] = df[col].astype(pd.api.types.pandas_dtype(dtype))
    else:
        data = {col: df[col] if col not in casts else df[col].astype(pd.api.types.pandas_dtype(dtype))
                for col, dtype in schema.items()}
        out = pd.DataFrame(data, index=df.index)
    out.attrs = df.attrs
    out.columns.name = df.columns.name
    return out


def _copy_on_write() -> bool:
    """pandas copies a frame's columns lazily (always from pandas 3, by option in pandas 2)."""
    import pandas as pd

    return int(pd.__version__.split(".", 1)[0]) >= 3 or pd.options.mode.copy_on_write is True
