"""The run folder ``fsdpviz record`` writes: its file names and ``run.json``, typed, defined once.

The recorder (``fsdpviz.record``, on the launcher side) writes these files and the trace loader
(``fsdpviz.trace``) reads them; both import this module, which imports neither torch nor pandas.
``run.json`` is a contract (docs/run-folder.md): fields are only ever added. Its readers get a
:class:`RunInfo`, every field typed and defaulted, so a run.json of an older fsdpviz (or a partial one
written by hand) reads with the defaults; an unknown field is ignored; a field of the wrong type
is an error that names it.

Layout::

    RUN/run.json                    RunInfo
    RUN/traces/rank{R}.trace.json.gz
    RUN/timers/rank{R}.jsonl
    RUN/ranks/rank{R}.json          what rank R reported (merged into run.json)
    RUN/logs/rank{R}.log            the profiler's own log lines
    RUN/logs/command.log            the command's last stderr lines, when it failed
    RUN/report.html
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import msgspec

RUN_JSON: Final = "run.json"
TRACES_DIR: Final = "traces"
TIMERS_DIR: Final = "timers"
RANKS_DIR: Final = "ranks"  # per-rank facts the agents write and the launcher merges into run.json
LOGS_DIR: Final = "logs"  # the profiler's own log lines, kept out of the user's terminal
REPORT_HTML: Final = "report.html"
PREDICTIONS_DIR: Final = "predictions"  # `fsdpviz whatif --save`: one JSON file per predicted setting
TRACE_FILE: Final = "rank{rank}.trace.json.gz"  # inside TRACES_DIR
TIMERS_FILE: Final = "timers/rank{rank}.jsonl"
RANK_FILE: Final = "ranks/rank{rank}.json"
LOG_FILE: Final = "logs/rank{rank}.log"
COMMAND_LOG: Final = "logs/command.log"  # the last lines the command wrote to stderr, when it failed
RUN_ID_FILE: Final = "ranks/run-id"  # --shared: the run id the first node's launcher chose, for the others
TRACE_RUN_ID_KEY: Final = "fsdpvizRunId"  # the run id in a trace's top level (torch.profiler metadata)
PARTIAL_SUFFIX: Final = ".partial"  # files being written; renamed when complete
CACHE_DIR: Final = ".fsdpviz-cache"  # the trace loader's parse cache, beside the traces
OWNED_ENTRIES: Final = (RUN_JSON, TRACES_DIR, TIMERS_DIR, RANKS_DIR, LOGS_DIR, REPORT_HTML, PREDICTIONS_DIR)
# The files a recording (and `whatif --save`) writes inside its folders, partial ones included; Kineto's own
# temporary file ends ".tmp". `record --force` removes these and no other file.
_OWN_FILES: Final = {
    TRACES_DIR: re.compile(r"rank\d+\.trace\.json(?:\.gz)?(?:\.partial)?(?:\.tmp)?"),
    TIMERS_DIR: re.compile(r"rank\d+\.jsonl(?:\.partial)?"),
    RANKS_DIR: re.compile(r"rank\d+\.json(?:\.partial)?|run-id|\.write-test-\d+|\.run-id\..+"),
    LOGS_DIR: re.compile(r"rank\d+\.log|command\.log"),
    PREDICTIONS_DIR: re.compile(r"[^/]+\.json(?:\.partial)?"),
}
# The files a recording's readers take from its folders (the trace loader's, the timers', the ranks'
# facts'): another such file of the user's there would be read as part of the next recording.
# Each is the reader's own test: the trace loader's name check, the timers' and the ranks' globs.
_READ: Final[dict[str, Callable[[Path], bool]]] = {
    TRACES_DIR: lambda path: is_trace_name(path),
    TIMERS_DIR: lambda path: fnmatch.fnmatchcase(path.name, "*.jsonl"),
    RANKS_DIR: lambda path: fnmatch.fnmatchcase(path.name, "rank*.json"),
}


def recording_entries(run_dir: Path) -> tuple[list[Path], list[Path]]:
    """What ``record --force`` removes from ``run_dir``: run.json, report.html, the caches and the files a
    recording writes in its folders (a prediction: a JSON file of ``whatif --save``'s form); and the other
    files there that the next recording's readers would take as its own (a trace of the user's in
    traces/), which it must neither remove nor read. Any other file stays."""
    remove: list[Path] = [run_dir / name for name in (RUN_JSON, REPORT_HTML, CACHE_DIR) if (run_dir / name).exists()]
    foreign: list[Path] = []
    for sub, own in _OWN_FILES.items():
        folder = run_dir / sub
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path.name == CACHE_DIR or (own.fullmatch(path.name) and path.is_file()
                                          and (sub != PREDICTIONS_DIR or _saved_prediction(path))):
                remove.append(path)
            elif sub in _READ and path.is_file() and _READ[sub](path):
                foreign.append(path)
    return remove, foreign


def _saved_prediction(path: Path) -> bool:
    """Whether ``path`` holds a prediction as ``whatif --save`` writes one (a partial one counts)."""
    if path.name.endswith(PARTIAL_SUFFIX):
        return True
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and isinstance(data.get("predicted"), dict)
FORMAT_VERSION: Final = 1
TRACE_SUFFIXES: Final = (".json", ".json.gz")
SCHEDULE_OPTIMIZER_STEPS: Final = "optimizer_steps"  # the profiler stepped by optimizer steps
SCHEDULE_TIME_WINDOW: Final = "time_window"  # the fallback for scripts without a torch optimizer
# The first steps of any run are slower (allocation, caches, lazy init): never a clean step.
SETTLING_STEPS: Final = 2


def number_ranges(numbers: Sequence[int]) -> str:
    """``[2, 3, 4, 7]`` -> ``2-4, 7``: sorted numbers with consecutive runs joined."""
    parts: list[str] = []
    values = sorted(set(numbers))
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ", ".join(parts)


def clean_steps(steps: Iterable[int], *, profiled: Sequence[int], unit_timed: Sequence[int] | None,
                partial: int | None, script_profiled: Iterable[int] = ()) -> set[int]:
    """Which of a rank's ``steps`` are clean: the bare run's pace, what every time figure is calibrated on
    (docs/recording.md, "Kinds of step"). Not clean: the first :data:`SETTLING_STEPS` steps, the profiled
    steps, the profiler's warm-up step (the one before them: Kineto already collects), the step after
    the last profiled one (it follows the trace export), the unit-timed steps (``unit_timed``; None for a
    recording older than them, whose timers timed units in every step), a step the rank ended inside
    (``partial``) and the steps the script's own profiler was on in (``script_profiled``). With no
    profiled step there is nothing to be clean against: none is."""
    if not profiled:
        return set()
    busy = {*profiled, min(profiled) - 1, max(profiled) + 1, *(unit_timed or ()), *script_profiled}
    return {s for s in steps if s >= SETTLING_STEPS and s not in busy and s != partial}

# A unit's prefetch setting: FSDP2 lists the units prefetched explicitly or says "default"; FSDP1
# says whether forward prefetch is on and names its backward prefetch; ZeRO-3 gives a bucket size.
Prefetch = list[str] | str | bool | int | None


class UnitInfo(msgspec.Struct, kw_only=True):
    """One FSDP unit as the framework reported it (run.json ``units[]``, docs/run-folder.md)."""

    unit: str
    """Module FQN as the user wrote it (``fsdpviz.naming``): ``blocks.3``, ``(root)``, ``[norm, output]``."""
    order: int = -1
    """Forward order (0 = the first unit whose forward ran); -1 when unknown."""
    param_numel: int = -1
    """Unsharded parameter elements; -1 when unknown."""
    param_bytes: int = -1
    """Unsharded parameter bytes in the gathered dtype; -1 when unknown."""
    dtype: str = ""
    parent: str = ""
    """ZeRO-3: the enclosing block of a fetched submodule; "" otherwise."""
    reshard_after_forward: bool | None = None
    """What ran (read after the first step): FSDP2 never reshards the root after forward."""
    reshard_after_forward_size: int | None = None
    """FSDP2's ``reshard_after_forward=<int>`` (HSDP): the ranks the unit's parameters stay sharded over
    after forward; None for ``True`` / ``False`` and in older run folders."""
    forward_prefetch: Prefetch = None
    backward_prefetch: Prefetch = None
    shard_size: int | None = None
    """Ranks the unit's parameters are sharded over (the shard group under HSDP)."""
    param_scope: str = ""
    """``local``: ``param_numel``/``param_bytes`` are one rank's part after tensor parallelism split the
    parameters (DTensors); ``global``: the whole parameters; "" when unknown."""
    params: list[tuple[str, int]] = []
    """(FQN under the sharded root, unsharded numel) of each parameter the unit holds, in the order
    the framework holds them; [] when not recorded (older run folders)."""


class ParallelismInfo(msgspec.Struct, kw_only=True):
    """The data-parallel mesh and tensor-parallel degree the model ran with (run.json ``parallelism``);
    None where the recorder could not tell."""

    dp_shard: int | None = None
    """Ranks FSDP shards the parameters over (the shard group)."""
    dp_replicate: int | None = None
    """Replicas that all-reduce their gradients (HSDP), 1 without."""
    tp: int | None = None
    """Ranks tensor parallelism splits each parameter over, 1 without."""


class ProfileInfo(msgspec.Struct, kw_only=True):
    """How the profiler was driven and which steps its traces hold (run.json ``profile``)."""

    schedule: str = SCHEDULE_OPTIMIZER_STEPS
    steps: list[int] = msgspec.field(default_factory=list)
    warmup: int | None = None
    requested_steps: int | None = None
    window_s: float | None = None
    unit_timed_steps: list[int] | None = None
    """The steps whose units the timers clocked (docs/recording.md, "Kinds of step"); None for a
    recording older than them, whose timers clocked units in every step."""
    unit_timer_steps: int | None = None
    """How many unit-timed steps were asked for (``--unit-timer-steps``); None before the option."""


class TraceStartMemory(msgspec.Struct, kw_only=True):
    """What a rank's training process held on its device when its trace began, measured there by
    the recorder (run.json ``ranks[].memory.trace_start``): the CPU profiler's level starts at 0 then,
    so this is what it does not see. None where it could not be measured."""

    step: int | None = None
    """The step the trace began with."""
    device: str | None = None
    """``cpu`` or ``cuda``: the tensors counted are those on this device."""
    sharded_param_bytes: int | None = None
    """The sharded parameters this rank holds (FSDP2: the DTensors' local shards; FSDP1: the flat
    parameters' local shards; ZeRO-3: the ``ds_tensor`` partitions)."""
    optimizer_state_bytes: int | None = None
    """Every tensor in ``optimizer.state`` of every optimizer that had stepped (DTensors: local shards)."""
    gradient_bytes_kept: int | None = None
    """The parameters' gradients (local shards) alive then and still alive at the next optimizer step
    (``zero_grad(set_to_none=False)`` keeps them; ``set_to_none=True`` frees them). ZeRO-3: the flat
    buffer of gradient partitions its optimizer made when built (DeepSpeed's
    ``grad_partitions_flat_buffer``), kept all along; None where it could not be read (older
    recordings of ZeRO-3 too). Older recordings also hold ``gradient_bytes``, every gradient alive
    then, which nothing read."""
    master_param_bytes: int | None = None
    """ZeRO-3: the optimizer's fp32 partitioned copy of the parameters (DeepSpeed's master weights,
    ``fp32_partitioned_groups_flat``), which its optimizer steps on; part of the optimizer state, as
    in ZeRO's K. None for a framework without one."""

    def baseline_bytes(self) -> int:
        """What the level that starts with the trace leaves out and keeps all along: the sharded
        parameters, the optimizer state (ZeRO-3's master copy too) and the gradients kept (the known ones)."""
        return sum(b for b in (self.sharded_param_bytes, self.optimizer_state_bytes, self.master_param_bytes,
                               self.gradient_bytes_kept) if b is not None)

    def optimizer_bytes(self) -> int | None:
        """The optimizer's whole state: ``optimizer.state`` and ZeRO-3's master copy (None when the
        state was not measured)."""
        if self.optimizer_state_bytes is None:
            return None
        return self.optimizer_state_bytes + (self.master_param_bytes or 0)


class OptimizerMemory(msgspec.Struct, kw_only=True):
    """One optimizer's state after its last recorded step (run.json ``ranks[].memory.optimizers[]``)."""

    optimizer: str
    """Its class (``torch.optim.AdamW``, or the script's own)."""
    state_bytes: int
    """Every tensor in its ``state`` on the rank's device (DTensors: local shards)."""
    state_tensors: int
    params: int
    """Parameters with state."""
    step: int


class RankMemory(msgspec.Struct, kw_only=True):
    """What the recorder measured of a rank's memory in the training process (run.json ``ranks[].memory``)."""

    trace_start: TraceStartMemory | None = None
    optimizers: list[OptimizerMemory] = msgspec.field(default_factory=list)


class ObserverInfo(msgspec.Struct, kw_only=True):
    """What the recorder itself spent in a rank's clean steps, measured by its agent (run.json
    ``ranks[].observer``; docs/run-folder.md)."""

    clean_steps: list[int] = msgspec.field(default_factory=list)
    agent_ms: list[float] = msgspec.field(default_factory=list)
    """The agent's own time in each of ``clean_steps``, in ms."""
    agent_ms_median: float | None = None
    """The agent's own time per clean step: its hooks and the step boundary (timed), and the wrapped
    framework calls that passed straight through (counted, times their measured cost)."""
    agent_ms_max: float | None = None
    agent_share_median: float | None = None
    """``agent_ms`` over the step's time (the timers'), median over the clean steps."""
    agent_share_max: float | None = None
    pass_through_calls_per_step: float | None = None
    pass_through_ns_each: float | None = None
    unit_intervals_max: int | None = None
    """Per-unit intervals the timers marked in a clean step: 0."""
    cuda_events_max: int | None = None
    """CUDA events the timers created in a clean step: 2 on a GPU (the step's ends: its phases are timed on
    a CPU only; 8 in folders recorded while GPU clean steps timed them too), 0 on a CPU."""


class RankInfo(msgspec.Struct, kw_only=True):
    """One recording rank (run.json ``ranks[]``)."""

    rank: int
    local_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    device: str | None = None
    backend: str | None = None
    framework: str | None = None
    status: str | None = None
    reason: str | None = None
    trace: str | None = None
    log: str | None = None
    profiled_steps: list[int] | None = None
    """Steps the rank's profiler recorded; None when unknown (then ``profile.steps`` holds)."""
    timers: str | None = None
    timer_steps: int = 0
    steps_seen: int | None = None
    partial_step: int | None = None
    """The step the rank was inside when it ended, if it ended inside one."""
    start_time: str | None = None
    end_time: str | None = None
    cpu_count: int | None = None
    """CPU cores the rank's process could run on (its affinity), for predicting CPU runs."""
    memory: RankMemory | None = None
    """What the recorder measured of the rank's memory in the training process."""
    unit_timed_steps: list[int] | None = None
    """The steps whose units this rank's timers clocked; None in recordings older than them."""
    script_profiled_steps: list[int] | None = None
    """The steps the script's own torch.profiler was on in (never clean steps); None where it was never on."""
    observer: ObserverInfo | None = None
    """What the recorder itself spent in this rank's clean steps; None where unmeasured."""


class RunInfo(msgspec.Struct, kw_only=True):
    """run.json: the recorded command and what every rank reported (docs/run-folder.md)."""

    fsdpviz_version: str = ""
    format: int = FORMAT_VERSION
    label: str = ""
    command: list[str] = msgspec.field(default_factory=list)
    cwd: str = ""
    start_time: str = ""
    end_time: str = ""
    exit_code: int | None = None
    status: str = ""
    reason: str = ""
    run_id: str = ""
    """Names this recording; every trace it wrote carries it (``fsdpvizRunId``). "" before fsdpviz wrote one."""
    command_log: str | None = None
    """``logs/command.log`` when the command failed: its last stderr lines; else None."""
    world_size: int | None = None
    hosts: list[str] = msgspec.field(default_factory=list)
    framework: str = "unknown"
    units: list[UnitInfo] = msgspec.field(default_factory=list)
    parallelism: ParallelismInfo | None = None
    versions: dict[str, str | None] = msgspec.field(default_factory=dict)
    options: dict[str, Any] = msgspec.field(default_factory=dict)
    profile: ProfileInfo = msgspec.field(default_factory=ProfileInfo)
    ranks: list[RankInfo] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)

    def rank_info(self, rank: int) -> RankInfo | None:
        """The ``ranks[]`` entry of ``rank``, if it recorded."""
        return next((r for r in self.ranks if r.rank == rank), None)


_DECODER: Final = msgspec.json.Decoder(RunInfo)


class RunJsonError(ValueError):
    """run.json cannot be read as a RunInfo (the message names the field)."""


def decode_run_json(data: bytes) -> RunInfo:
    """run.json's bytes as a :class:`RunInfo`; :class:`RunJsonError` when they are not one."""
    try:
        return _DECODER.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise RunJsonError(str(exc)) from None


def encode_run_json(run: RunInfo) -> bytes:
    """run.json's text (indented, one field per line, a final newline). ``profile.window_s`` is
    written only for the time-window schedule it belongs to."""
    data = msgspec.to_builtins(run)
    if data["profile"].get("window_s") is None:
        del data["profile"]["window_s"]
    return msgspec.json.format(msgspec.json.encode(data), indent=2) + b"\n"


def run_info_from(data: dict[str, Any]) -> RunInfo:
    """A RunInfo from plain values (as the launcher assembles them); RunJsonError when one does not fit."""
    try:
        return msgspec.convert(data, RunInfo)
    except msgspec.ValidationError as exc:
        raise RunJsonError(str(exc)) from None


def to_builtins(run: RunInfo | UnitInfo | RankInfo) -> dict[str, Any]:
    """The JSON object of a run.json struct, as plain Python values."""
    out: dict[str, Any] = msgspec.to_builtins(run)
    return out


def rank_path(run_dir: Path, template: str, rank: int) -> Path:
    """``run_dir / template`` with the rank filled in (``TIMERS_FILE``, ``RANK_FILE``, ``LOG_FILE``)."""
    return run_dir / template.format(rank=rank)


def trace_path(run_dir: Path, rank: int) -> Path:
    """Where rank ``rank``'s trace goes in a run folder."""
    return run_dir / TRACES_DIR / TRACE_FILE.format(rank=rank)


def is_trace_name(path: Path) -> bool:
    """A file name that looks like a Kineto trace (and not like fsdpviz's own run.json)."""
    name = path.name.lower()
    return name.endswith(TRACE_SUFFIXES) and name != RUN_JSON and not name.startswith(".")
