"""What a synthetic FSDP2 GPU run looks like: units, prefetch policy, streams, ranks, clocks.

A :class:`Scenario` is a small, explicit model of one training job. ``timeline.simulate`` turns it
into the events every rank would record and, by construction, the answers the analysis must find.
All times are integer nanoseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# CUDA stream ids, as FSDP2's FSDPCommContext would get them on a real device.
STREAM_COMPUTE = 7
STREAM_AG_COPY_IN = 20
STREAM_ALL_GATHER = 24
STREAM_REDUCE_SCATTER = 28
STREAM_ALL_REDUCE = 32

ROOT = "(root)"  # how the analysis names the root unit (its FSDP2 labels carry no name)

Prefetch = Literal["implicit"] | int


@dataclass(kw_only=True, slots=True)
class UnitSpec:
    """One FSDP unit (a module passed to ``fully_shard``)."""

    name: str
    """Module FQN, e.g. ``blocks.0``; :data:`ROOT` for the root module."""
    numel: int
    """Unsharded parameter elements (before padding to a multiple of the shard group size)."""
    fwd_ns: int = 400_000
    """GPU time of the unit's forward compute kernels (the root: split before/after its children)."""
    bwd_ns: int = 800_000
    """GPU time of the unit's backward compute kernels."""
    act_bytes: int = 8 << 20
    """Activation bytes the unit's forward allocates and its backward frees."""
    reshard_after_forward: bool = True
    """FSDP2 ``reshard_after_forward``; the root defaults to ``False`` as in FSDP2."""


@dataclass(kw_only=True, slots=True)
class Scenario:
    """A synthetic FSDP2 job on ``world_size`` GPUs (one GPU per rank, NCCL)."""

    units: list[UnitSpec]
    """Child units in forward order (excluding the root)."""
    root: UnitSpec | None = None
    """The root unit with its own parameters (embedding + head), or ``None`` when the root
    module holds no parameters (then it writes only ``FSDP::root_pre_forward``)."""
    world_size: int = 2
    hsdp_replicas: int = 1
    """> 1: HSDP, shard groups of ``world_size // hsdp_replicas`` ranks plus an all-reduce of the
    gradients across replicas after each reduce-scatter."""
    steps: tuple[int, ...] = (3, 4)
    """ProfilerStep numbers recorded."""
    micro_batches: int = 1
    """Forward + backward passes per step (gradient accumulation): each micro-batch loads its data
    and runs the whole forward and backward (FSDP2 gathers and reduce-scatters every time), then
    one optimizer step ends the step."""
    forward_prefetch: Prefetch = "implicit"
    """``"implicit"``: FSDP2's default (gather issued in the unit's own pre-forward, overlapping the
    previous unit's compute on the GPU only because the CPU runs ahead); ``N``: explicit
    ``set_modules_to_forward_prefetch`` of the next ``N`` units (``0``: none)."""
    backward_prefetch: Prefetch = "implicit"
    """``"implicit"``: FSDP2's default one-unit prefetch nested in ``FSDP::pre_backward``;
    ``N``: explicit ``set_modules_to_backward_prefetch`` of the next ``N`` units; ``0``: none."""
    sync_per_unit: bool = False
    """The training loop synchronises with the GPU after every unit's compute (e.g. ``.item()``),
    so no gather can run ahead: the no-overlap case."""
    no_overlap: bool = False
    """Every all-gather waits for the compute before it (the all-gather stream waits on the compute
    stream): nothing gathers while a unit computes."""
    gradients_per_kernel: bool = True
    """Autograd allocates each gradient when the kernel computing it runs (spread over a unit's
    backward); ``False`` allocates a unit's gradients at its first backward kernel."""
    dtype_bytes: int = 2
    """Unsharded parameter / gradient element size (bf16)."""
    optimizer_bytes_per_param: int = 4  # torch's AdamW: two states in the shards' dtype
    """Sharded optimizer state per parameter element (fp32 master + Adam m, v)."""
    comm_latency_ns: int = 20_000
    comm_bytes_per_ns: float = 25.0
    """Collective time = latency + bytes moved / this bandwidth."""
    ring_comm: bool = False
    """Collectives as rings over the group: ``(n - 1)`` latency steps and ``(n - 1) / n`` of the bytes
    through each rank's link (``comm_latency_ns`` and ``comm_bytes_per_ns`` then describe 2 ranks),
    so the same model on another world size gets the collective times a ring would."""
    kernels_per_unit: int = 4
    """Compute kernels per unit forward (backward launches twice as many)."""
    cpu_op_ns: int = 12_000
    """CPU time of one compute op (including its kernel launch)."""
    launch_ns: int = 6_000
    launch_latency_ns: int = 4_000
    """Earliest a kernel can start after its launch call began."""
    label_ns: int = 3_000
    """CPU overhead of entering and leaving one FSDP label."""
    data_ns: int = 150_000
    """Data loading at the start of each step."""
    optimizer_ns: int = 300_000
    step_delay_ns: dict[int, int] = field(default_factory=dict)
    """Extra data-loading time per rank (a straggler)."""
    step_data_ns: dict[int, int] = field(default_factory=dict)
    """Extra data-loading time per step on every rank (steps that differ: a run's step-to-step spread)."""
    clock_offset_ns: dict[int, int] = field(default_factory=dict)
    """How far each rank's clock is ahead of the true time (ranks on hosts whose clocks disagree)."""
    base_time_ns: int = 1_767_189_312_000_000_000
    """Kineto ``baseTimeNanoseconds``; event ``ts`` are microseconds after it."""
    start_ns: int = 4_458_676_522_690_655
    """True time (ns after ``base_time_ns``) at which recording starts; large like real traces."""
    nccl_launch_driver: bool = True
    """Launch NCCL kernels with ``cuLaunchKernelEx`` (``cuda_driver``, NCCL 2.27) instead of
    ``cudaLaunchKernel``."""
    shared_timeline: bool = False
    """All ranks behave identically (no stragglers): simulate once and reuse the event body for
    every rank, which is what makes very large runs cheap."""

    def __post_init__(self) -> None:
        if self.world_size < 1 or self.world_size % self.hsdp_replicas:
            raise ValueError("world_size must be a positive multiple of hsdp_replicas")
        if self.micro_batches < 1:
            raise ValueError("micro_batches must be at least 1")
        names = [u.name for u in self.units]
        if len(set(names)) != len(names) or ROOT in names:
            raise ValueError("unit names must be unique and not the root's")
        if self.shared_timeline and (self.step_delay_ns or self.hsdp_replicas > 1):
            raise ValueError("a shared timeline cannot have per-rank step delays or HSDP groups")

    @property
    def shard_size(self) -> int:
        return self.world_size // self.hsdp_replicas

    def all_units(self) -> list[UnitSpec]:
        """The root (if it has parameters) first, then the children in forward order."""
        return ([self.root] if self.root is not None else []) + list(self.units)

    def padded_numel(self, unit: UnitSpec) -> int:
        """Elements FSDP2 gathers for ``unit``: padded to a multiple of the shard group size."""
        n = self.shard_size
        return -(-unit.numel // n) * n


def make_units(n: int, *, numel: int = 4_000_000, fwd_ns: int = 400_000, bwd_ns: int = 800_000,
               prefix: str = "blocks") -> list[UnitSpec]:
    """``n`` identical transformer-block-like units named ``{prefix}.{i}``."""
    return [UnitSpec(name=f"{prefix}.{i}", numel=numel, fwd_ns=fwd_ns, bwd_ns=bwd_ns) for i in range(n)]


def merge_units(units: list[UnitSpec], k: int) -> list[UnitSpec]:
    """The same model with every ``k`` consecutive units wrapped as one (``fully_shard([a, b])``):
    sizes, compute and activations add up; FSDP2 names such a unit ``a, b``."""
    out = []
    for i in range(0, len(units), k):
        chunk = units[i:i + k]
        out.append(UnitSpec(name=", ".join(u.name for u in chunk), numel=sum(u.numel for u in chunk),
                            fwd_ns=sum(u.fwd_ns for u in chunk), bwd_ns=sum(u.bwd_ns for u in chunk),
                            act_bytes=sum(u.act_bytes for u in chunk),
                            reshard_after_forward=all(u.reshard_after_forward for u in chunk)))
    return out


def merge_into_root(root: UnitSpec, units: list[UnitSpec]) -> UnitSpec:
    """The same model wrapped as one unit: the root holds every parameter and all the compute."""
    return UnitSpec(name=ROOT, numel=root.numel + sum(u.numel for u in units),
                    fwd_ns=root.fwd_ns + sum(u.fwd_ns for u in units), bwd_ns=root.bwd_ns + sum(u.bwd_ns for u in units),
                    act_bytes=root.act_bytes + sum(u.act_bytes for u in units), reshard_after_forward=False)


def make_root(*, numel: int = 2_000_000, fwd_ns: int = 200_000, bwd_ns: int = 400_000) -> UnitSpec:
    """A root unit holding embedding + head parameters (not resharded after forward)."""
    return UnitSpec(name=ROOT, numel=numel, fwd_ns=fwd_ns, bwd_ns=bwd_ns, reshard_after_forward=False)
