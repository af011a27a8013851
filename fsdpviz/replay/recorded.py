"""What the what-if model reads a recording into: per rank and step, the host's work outside the
units, each unit pass, each all-gather and reduction (:class:`StepProgram`), and the recording's own
settings (:class:`Recording`). :mod:`.recording` reads a recording's tables into these; the program
(:mod:`.program`), the simulator, the calibration and the memory model read them. They live apart
from the reading so that the model's parts depend on what a recording holds, not on how it is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fsdpviz.replay.memory import StepMemory


@dataclass(slots=True)
class Gather:
    """One all-gather of a unit's parameters."""

    unit: str
    phase: str  # the pass that consumed it
    micro: int
    bytes: int
    host_ns: float  # host busy time of issuing it (FSDP2's all_gather label: copy-in, the c10d call)
    copy_in_ns: float  # GPU: the copy-in on its stream (CPU: part of host_ns)
    comm_ns: float  # the collective (CPU: from its issue to its end, the time the host waited)
    copy_out_host_ns: float  # host busy time of the copy-out label
    copy_out_ns: float  # GPU: the copy-out on the compute stream (CPU: part of copy_out_host_ns)
    issued_in: tuple[str, str, str] | None = None  # (unit, phase, part) of the pass that issued it
    kernels_ns: float = 0.0  # GPU: FSDP's other kernels launched in its label: before the copy-in, on the
    # copy-in's stream ahead of it (lead_ns: FSDP2's cast of the parameters), and after it, on the gather's
    # stream before the collective (a fake process group's copies of the shard into each rank's chunk,
    # which stand for the collective)
    # GPU: where in its label the host launched the copy-in and those kernels, as shares of host_ns (1: at
    # the label's end; on B's gathers the cast at 0.14-0.47, the copy-in at 0.37-0.65, a fake group's
    # copies at 0.64-0.83): the device runs them while the host is still in the label
    copy_in_at: float = 1.0
    kernels_at: float = 1.0  # of the kernels launched after the copy-in
    lead_ns: float = 0.0  # of kernels_ns, those launched before the copy-in (FSDP2's cast of the parameters),
    lead_at: float = 1.0  # on the copy-in's stream ahead of it, and where the first of them was launched
    # the kernels after the copy-in in launch order, in groups of consecutive launches (replay.recording's
    # launch_groups): where each group's first was launched (a share of host_ns) and their time; a fake
    # group's copies are launched one by one, and the device waits a launch latency for each
    kernel_launches: list[tuple[float, float]] = field(default_factory=list)


@dataclass(slots=True)
class Reduce:
    """One unit's gradient reduction after its backward: the reduce-scatter and the HSDP all-reduce."""

    unit: str
    micro: int
    bytes: int
    comm_ns: float  # reduce-scatter (CPU: from issue to end)
    ar_bytes: int = 0
    ar_ns: float = 0.0
    host_ns: float = 0.0  # host busy time in its reduction labels (the gradients' copy-in, the call, the
    # sharded gradients after it), without the collective's wait; part of its pass's post_ns
    prep_ns: float = 0.0  # GPU: kernels before it on the compute stream (FSDP2's chunk_cat of the gradients)


@dataclass(slots=True)
class Pass:
    """One unit's forward or backward in one micro-batch (the root's: part ``a`` or ``b``)."""

    unit: str
    phase: str
    micro: int
    part: str  # "" for a unit without nested units; the root: "a" before its children, "b" after
    gap_ns: float  # host busy time between the previous pass and this window
    pre_ns: float  # host busy time from the window's start to the compute (no gather or copy-out labels)
    compute_ns: float  # GPU: kernel time on the compute stream; CPU: host time in the unit's ops
    post_ns: float  # host busy time after the compute is issued (GPU) or done (CPU), to the window's end
    reduce_after_ns: float = 0.0  # of post_ns: the part after the reduce-scatter was issued
    reshard_ns: float = 0.0  # of post_ns: the reshard label (post_forward / post_backward_reshard)
    post_framework_ns: float = 0.0  # of post_ns: FSDP's post-forward / post-backward hooks, without the reduction
    reduce_host_ns: float = 0.0  # of post_ns: the host's busy time in the unit's reduction labels (Reduce.host_ns)
    pre_framework_ns: float = 0.0
    """Of ``pre_ns``: the host's busy time in FSDP's own ranges (its pre-forward / pre-backward hooks, less
    the gather and copy-out labels, costed with the gathers). The rest is the module's own code before
    its first op (on a GPU: its first launch), which runs whatever the wrap."""
    launches: list[tuple[float, float]] = field(default_factory=list)
    """GPU: the pass's compute kernels in launch order, in groups: each group's first launch (the host's
    busy time from the pass's first launch) and its kernels' share of ``compute_ns``. A group runs no
    earlier than its launch, so a device ahead of the host waits inside the pass, as a launch-bound trace
    shows. Empty on a CPU, or where the kernels are not known: the compute then runs whole."""
    post_ranges_ns: float = 0.0
    """Of ``post_ns``: the host's busy time in FSDP's own ranges (its post-forward / post-backward hooks and
    the reduction's labels). The rest is the module's own code after its first op (on a GPU: its
    launches), before FSDP's post hooks."""
    # GPU: FSDP's own kernels of this unit beyond its gathers' copy-in and copy-out and its reduction's
    # copy-in (Reduce.prep_ns), launched before its compute (the unshard's: casts, FSDP1's flat-parameter
    # copies) or after it (the gradients' copies and division), on the compute stream and on others
    fsdp_pre_ns: float = 0.0
    fsdp_pre_side_ns: float = 0.0
    fsdp_pre_launches: list[tuple[float, float]] = field(default_factory=list)
    """GPU: ``fsdp_pre_ns`` in launch order, in groups of consecutive launches as :attr:`launches`: each
    group's first launch (the host's busy time from the pass's window, less the gather and copy-out
    labels before it: where in FSDP's pre hook it fell) and its kernels' time. A pre hook that casts
    the parameters one by one (FSDP2 on one rank) runs each cast while the host is still in the hook.
    A kernel launched before the window (a prefetch's, in the pass before) is at 0, the hook's start.
    The program runs the gather and copy-out labels after the hook, so a launch the trace made after
    them is placed in the hook before them (on the shared recordings none is: the casts with a gather
    label are the gather's, ``Gather.lead_ns``)."""
    fsdp_post_ns: float = 0.0
    fsdp_post_side_ns: float = 0.0

    @property
    def key(self) -> tuple[str, str, str]:
        return self.unit, self.phase, self.part


@dataclass(slots=True)
class Segment:
    """Host work outside every unit: busy time, the device work it launched, its synchronisations."""

    busy_ns: float = 0.0
    device_ns: float = 0.0  # GPU: kernels launched here (loss, optimizer), on the compute stream
    sync_at: list[float] = field(default_factory=list)  # busy offsets at which the host waits for the device
    comm_ns: list[float] = field(default_factory=list)  # CPU: collectives outside units the host waited for
    comm_kinds: list[str] = field(default_factory=list)
    """CPU: each of ``comm_ns``'s collective kind (all_gather, reduce_scatter or all_reduce)."""
    lead_ns: float = 0.0
    """The step's end segment on CPU: of its host time (busy and waited), what ran before the optimizer's
    own step (torch's ``Optimizer.step#`` range), where the timers' optimizer phase starts: the rest of
    the backward's framework work, a framework's step before the optimizer's (DeepSpeed's ``engine.step``).
    0 where the trace holds no such range, or on GPU. Read by the phase check alone (:mod:`.phases`)."""


@dataclass(slots=True)
class MicroBatch:
    """One forward and backward of a step."""

    pre: Segment
    forward: list[Pass]
    mid: Segment
    backward: list[Pass]
    micro: int = 0  # its number in the step, as the windows, gathers and reductions name it


@dataclass(slots=True)
class StepProgram:
    """One rank's step, as recorded."""

    rank: int
    step: int
    step_ns: int
    micro: list[MicroBatch]
    post: Segment
    gathers: list[Gather]
    reduces: list[Reduce]
    comm_exposed_ns: int = 0
    comm_ns: int = 0
    start_ns: int = 0  # where the step starts in the analysis' (aligned) time
    memory: StepMemory | None = None  # the step's memory by category, for the memory model (None: no samples)

    @property
    def peak_bytes(self) -> int:
        """The highest allocated level in the step (-1: no memory samples)."""
        return self.memory.peak_bytes if self.memory is not None else -1


@dataclass(slots=True)
class Recording:
    """Everything the what-if model reads from one recording."""

    framework: str
    device: str  # "gpu" or "cpu"
    world_size: int
    units: list[str]  # forward order, the root first when it has parameters
    unit_bytes: dict[str, int]  # unsharded parameter bytes
    modules: dict[str, list[str]]  # unit -> the modules it covers
    reshard_after_forward: dict[str, bool]
    prefetch: str  # what the recording did: "implicit", "none" or "N" (explicit, N units ahead)
    steps: list[StepProgram]
    ranks_per_host: int
    cpu_count: int  # cores of a host (0: unknown)
    notes: list[str] = field(default_factory=list)
    host_ops_per_step: float = 0.0  # the host threads' traced events (ops, runtime calls, ranges) per step
    prefetch_args: dict[str, object] = field(default_factory=dict)
    reshard_sizes: dict[str, int] = field(default_factory=dict)
    """FSDP2's ``reshard_after_forward=<int>`` per unit that ran with one (run.json); the written code
    keeps it where the setting does not change resharding."""
    """The framework's own arguments that gave ``prefetch`` (:mod:`.prefetch_args`); {} where run.json does not say."""
    prefetch_depths: tuple[int, int] | None = None
    """FSDP2: the recorded explicit prefetch depths, (forward, backward), 0 for FSDP2's default
    (:func:`.prefetch_args.fsdp2_depths`); None where run.json does not say, and for other frameworks."""
    unit_numels: dict[str, int] = field(default_factory=dict)
    """Unsharded parameter elements per unit, where run.json says (ZeRO-3's prefetch bucket is in elements)."""
    unit_params: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Per unit, its parameters' unsharded elements in the framework's order, where run.json lists them
    (ZeRO-3 buckets parameters: :mod:`.zero3_fetch`)."""
    unit_param_names: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Per unit, its own parameters' names (from the model's root), where run.json lists them: whether a
    module a ``match:`` wrap names holds a unit's parameters (:func:`.program.group_units`)."""
    serial_collectives: bool = False
    """GPU: FSDP's collectives ran on a host backend (gloo on CUDA tensors). FSDP's all-gather and
    reduce labels hold the host while their gloo op runs, so one rank's collectives run one after
    another, and the replay queues them so (on ``h100-fsdp2-gloo2-block`` the host-side ``gloo:*`` ops
    of the analysed steps overlap for 0 of 4,053 ms on rank 0)."""

    fsdp1_strategy: str | None = None
    """FSDP1: the ``ShardingStrategy`` name run.json's units say the recording ran with
    (:func:`fsdpviz.replay.recording_facts.fsdp1_strategy`); None where they do not tell, and for other
    frameworks. The written code keeps it."""

    launch_latency_ns: float = 0.0
    """GPU: the median time from a launch to its work's start, over the work that started on an idle
    device and was launched while it idled (the device waited for nothing else); 0 on a CPU."""

    @property
    def gathered_units(self) -> set[str]:
        """Units the recording all-gathered at least once (the others' parameters were never
        sharded, e.g. a root without parameters of its own)."""
        return {g.unit for s in self.steps for g in s.gathers}

    @property
    def reduced_units(self) -> set[str]:
        """Units whose gradients the recording reduced after their own backward (ZeRO-3 on CPU
        reduces in buckets at the step's end instead: that time stays where it was recorded)."""
        return {r.unit for s in self.steps for r in s.reduces}
