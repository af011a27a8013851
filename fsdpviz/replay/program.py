"""A recorded step rewritten for a setting: the host's instructions in the order FSDP would run them.

Units are formed first (:func:`group_units`): each recorded unit belongs to one new unit, named
after the modules it covers. Recorded units are a tree (:func:`unit_parents`: a unit sharded inside
another's module is nested in it); ``merge:K`` merges siblings only. A pass of a merged unit is its
members' passes back to back: their compute and the model's own host work inside their windows (the
kernel launches, and their code before the first op) are kept, while what FSDP does once per unit
is kept once: the pre-forward / pre-backward hooks (FSDP's own ranges), the reshard, and on CPU the hook dispatch between two units' windows (the gap
before a member's window: the module call's hook path in forward, FSDP's autograd nodes in backward;
the example trainer leaves about 0.6 ms of such gaps a step per block, one root unit none:
benchmarks/bench_merged_parts.py).
The new unit gathers all its members' parameters at once (one collective of their summed bytes,
costed by :mod:`.comm`, the step's first also holding the ranks' meeting) and reduces their gradients
at once; on CPU its reduction's host work is the fitted line's at its bytes rather than its members'
sum, and its members' where no line prices it (the trace holds the reductions' labels and no
collective: torch's fake group). On GPU the members' gaps and reductions' host work stay: there the shared H200 recordings of
model B predicted one root unit and pairs 0.03-0.08 further from their bare runs without them.

Then the order (:func:`build`): each pass issues its unit's all-gather if nothing issued it
earlier; with prefetch it also issues the next units' (FSDP2's implicit default: none ahead in
forward -- on GPU the host running ahead of the device overlaps them anyway -- and one ahead in
backward; ``N``: N ahead in both; ``none``: nothing ahead, and on GPU a gather waits for the
compute before it); a unit with nothing of its own to gather issues none. ZeRO-3 gathers parameters,
not units: under another prefetch bucket its forward's gathers are DeepSpeed's for that bucket
(:func:`zero3_bucket`, :mod:`.zero3_fetch`), each priced by the fitted line at its bytes. A unit kept
unsharded after forward is not gathered again in backward. When no setting changes, the recorded
order is kept, gather by gather.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Final

from fsdpviz.errors import UsageError
from fsdpviz.naming import ROOT_UNIT, group_name, unit_modules
from fsdpviz.replay import prefetch_args, zero3_fetch
from fsdpviz.replay.comm import CommModel, Target
from fsdpviz.replay.recorded import (
    Gather,
    Pass,
    Recording,
    Reduce,
    Segment,
    StepProgram,
)
from fsdpviz.replay.settings import Settings
from fsdpviz.vocabulary import ALL_GATHER, BACKWARD, FORWARD, REDUCE_SCATTER, ZERO3

GATHER_HOST: Final = "gather_host"  # fitted like a collective: the host time of issuing a gather
COPY_OUT_HOST: Final = "copy_out_host"
REDUCE_HOST: Final = "reduce_host"  # the host's busy time in a unit's reduction labels, fitted the same way


@dataclass(slots=True)
class GatherOp:
    """Issue an all-gather (host busy ``host_ns``; copy-in, the collective)."""

    gid: int


@dataclass(slots=True)
class CopyOutOp:
    """Use a gathered unit: wait for its all-gather, copy out (host busy + GPU copy)."""

    gid: int


@dataclass(slots=True)
class BusyOp:
    """Host busy time: ``what`` says whose. ``gap``: between two passes' windows (the model's code
    between units, FSDP's hook dispatch); ``pre`` / ``post``: FSDP's own ranges in a pass before its
    first op and after it (its hooks, the reduction's host work); ``own``: the module's own code in
    its window around them (on a GPU its launches); "" elsewhere."""

    ns: float
    what: str = ""


@dataclass(slots=True)
class ComputeOp:
    unit: str
    phase: str
    ns: float
    launches: list[tuple[float, float]] = field(default_factory=list)  # GPU: Pass.launches


@dataclass(slots=True)
class ReduceOp:
    rid: int


@dataclass(slots=True)
class FsdpKernelsOp:
    """GPU: FSDP's own kernels of a pass beyond its gathers' and reduction's copies, launched now: on the
    compute stream (``main_ns``) and on FSDP's other streams (``side_ns``). ``before``: the unshard's,
    which the unit's compute waits for; else after the compute, which the optimizer waits for."""

    unit: str
    phase: str
    main_ns: float
    side_ns: float
    before: bool
    # GPU, before: ``main_ns`` as Pass.fsdp_pre_launches, each group launched where it was in the pass's
    # pre hook (empty: all of it now)
    launches: list[tuple[float, float]] = field(default_factory=list)


@dataclass(slots=True)
class SegmentOp:
    """Work outside units: host busy, device work, synchronisations, collectives outside units."""

    name: str
    segment: Segment
    finalize: bool = False  # the end of backward: the device waits for every reduction first


Op = GatherOp | CopyOutOp | BusyOp | ComputeOp | FsdpKernelsOp | ReduceOp | SegmentOp


@dataclass(slots=True)
class SimGather:
    unit: str
    phase: str
    bytes: int
    host_ns: float
    copy_in_ns: float
    comm_ns: float
    copy_out_host_ns: float
    copy_out_ns: float
    after_compute: bool = False  # prefetch "none": starts only when the compute before it is done
    kernels_ns: float = 0.0  # GPU: FSDP's other kernels in its label (Gather.kernels_ns), before the collective
    # GPU: where in host_ns the copy-in, the kernels after it and those before it are launched, and how long
    # the latter run (Gather.copy_in_at, .kernels_at, .lead_at, .lead_ns)
    copy_in_at: float = 1.0
    kernels_at: float = 1.0
    lead_ns: float = 0.0
    lead_at: float = 1.0
    kernel_launches: list[tuple[float, float]] = field(default_factory=list)  # Gather.kernel_launches


@dataclass(slots=True)
class SimReduce:
    unit: str
    bytes: int
    comm_ns: float
    ar_bytes: int
    ar_ns: float
    prep_ns: float = 0.0


@dataclass(slots=True)
class Program:
    """One step's instructions for the simulator."""

    ops: list[Op]
    gathers: list[SimGather]
    reduces: list[SimReduce]
    units: list[str]  # forward order
    unit_bytes: dict[str, int]
    notes: list[str] = field(default_factory=list)
    serial_collectives: bool = False
    """GPU: the rank's collectives run one at a time, in the order issued (a host backend's process
    group, gloo on CUDA tensors: :attr:`fsdpviz.replay.recorded.Recording.serial_collectives`)."""
    launch_latency_ns: float = 0.0
    """GPU: from a launch to the earliest its work starts on an idle device
    (:attr:`fsdpviz.replay.recorded.Recording.launch_latency_ns`)."""


# --- units -----------------------------------------------------------------------------------

def group_units(rec: Recording, settings: Settings) -> dict[str, str]:
    """Recorded unit -> the unit that holds it under ``settings.wrap``."""
    units = rec.units
    children = [u for u in units if u != ROOT_UNIT]
    wrap = settings.wrap
    if wrap.kind == "recorded":
        return {u: u for u in units}
    if wrap.kind == "root":
        return dict.fromkeys(units, ROOT_UNIT)
    if wrap.kind == "merge":
        # siblings only: a unit merged with one nested in it would gather the nested unit's
        # parameters twice over (FSDP2 shards a module already sharded inside it apart), so a
        # nested unit stays a unit of its own, and merges with its own siblings
        out = {ROOT_UNIT: ROOT_UNIT} if ROOT_UNIT in units else {}
        parents = unit_parents(rec)
        siblings: dict[str, list[str]] = {}
        for u in children:
            siblings.setdefault(parents[u], []).append(u)
        for kids in siblings.values():
            for i in range(0, len(kids), wrap.k):
                chunk = kids[i:i + wrap.k]
                name = group_name([m for u in chunk for m in rec.modules.get(u, unit_modules(u))])
                out.update(dict.fromkeys(chunk, name))
        return out
    return _match(rec, wrap.pattern)


def unit_parents(rec: Recording) -> dict[str, str]:
    """Recorded unit (not the root) -> the recorded unit it is nested in: the innermost one holding a
    module above each of its own modules (``blocks.4`` for ``blocks.4.moe.experts``), else the root.
    FSDP2 units form a tree this way: a module sharded inside another's keeps its parameters, and
    its parent's unit holds only the parameters outside every nested unit."""
    modules = {u: rec.modules.get(u, unit_modules(u)) for u in rec.units if u != ROOT_UNIT}
    out = {}
    for unit, own in modules.items():
        best, depth = ROOT_UNIT, -1
        for other, theirs in modules.items():
            held = [len(x) for x in theirs if other != unit and any(m.startswith(x + ".") for m in own)]
            if held and all(any(m.startswith(x + ".") for x in theirs) for m in own) and max(held) > depth:
                best, depth = other, max(held)
        out[unit] = best
    return out


def regrouped(rec: Recording, settings: Settings) -> tuple[dict[str, str], list[str], dict[str, list[str]]]:
    """Under ``settings.wrap``: recorded unit -> its new unit (:func:`group_units`), the new units in
    forward order, and each new unit's recorded members."""
    group = group_units(rec, settings)
    new_units = list(dict.fromkeys(group[u] for u in rec.units if u in group))
    return group, new_units, {n: [u for u in rec.units if group.get(u) == n] for n in new_units}


def _match(rec: Recording, pattern: str) -> dict[str, str]:
    regex = re.compile(pattern)
    modules = {u: rec.modules.get(u, unit_modules(u)) for u in rec.units if u != ROOT_UNIT}
    known = sorted({a for ms in modules.values() for m in ms for a in _ancestors(m)})
    matched = [m for m in known if m and regex.search(m)]
    # a matched module strictly inside a recorded unit's module, and no unit's own module, would take
    # part of that unit's parameters; a matched nested unit (match:experts$ inside blocks.4) is a
    # recorded unit with its own times, and stays one while its parent goes to its own holder. A
    # matched container whose parameters all belong to units it holds whole (a ModuleList of experts,
    # each sharded apart, inside its block) takes nothing of its block's: its units become one, as a
    # merge makes them (run.json's parameter names say so; without them it is refused)
    own = {m for ms in modules.values() for m in ms}
    finer = [m for m in matched if m not in own and any(m.startswith(x + ".") for x in own)
             and _splits_a_unit(rec, modules, m) is not False]
    if finer:
        raise UsageError(f"--wrap match:{pattern} makes units inside recorded units ({', '.join(finer[:3])}): "
                         "that needs per-module times, which this recording does not have")
    if not matched and not any(regex.search(x) for x in _all_names(rec)):
        raise UsageError(f"--wrap match:{pattern}: matches none of the recorded units' modules "
                         f"({', '.join(rec.units[:6])}{' ...' if len(rec.units) > 6 else ''}); wraps finer than "
                         "the recorded units need per-module times, which recordings do not hold yet")
    out = {ROOT_UNIT: ROOT_UNIT} if ROOT_UNIT in rec.units else {}
    for unit, ms in modules.items():
        holders = [m for m in matched if any(x == m or x.startswith(m + ".") for x in ms)]
        # the innermost matched module holds it, as FSDP2 shards a module matched inside another apart
        # (match:^blocks\.\d+$|experts$ keeps each block's experts a unit of their own)
        holder = max(holders, key=len) if holders else ROOT_UNIT
        left = [x for x in ms if holders and not (x == holder or x.startswith(holder + "."))]
        if left:  # FSDP shards a unit whole: one of several modules cannot become a unit of its own
            raise UsageError(
                f"--wrap match:{pattern} splits the recorded unit {unit} (it matches {holder}, not "
                f"{', '.join(left)}): a unit of several modules is sharded whole, and a finer wrap needs "
                "per-module times, which this recording does not have")
        out[unit] = holder
    # units that end up in one matched module form one unit, sharded as the list of their modules (FSDP2
    # refuses a container without a forward of its own, such as a ModuleList) and named as FSDP2 names
    # that list
    held: dict[str, list[str]] = {}
    for unit, holder in out.items():
        if holder != ROOT_UNIT:
            held.setdefault(holder, []).extend(modules[unit])
    # a holder that is itself a held unit's module (a block matched, its nested experts not) is sharded
    # as that module, which takes its unmatched nested units' parameters with it
    names = {holder: holder if holder in ms else group_name(ms) for holder, ms in held.items()}
    return {unit: names.get(holder, holder) for unit, holder in out.items()}


def _ancestors(fqn: str) -> list[str]:
    """``fqn`` and every module above it (``blocks.0.moe.experts``, ``blocks.0.moe``, ``blocks.0``, ``blocks``)."""
    parts = fqn.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def _splits_a_unit(rec: Recording, modules: dict[str, list[str]], module: str) -> bool | None:
    """Whether ``module`` holds parameters of a recorded unit (the root included) that it does not hold
    whole, so that a unit made of it would take part of that unit's parameters; None where run.json
    does not list every unit's parameters."""
    names = rec.unit_param_names
    if not names or any(u not in names for u in rec.units if u != ROOT_UNIT):
        return None
    for unit, params in names.items():
        whole = unit != ROOT_UNIT and all(x == module or x.startswith(module + ".") for x in modules.get(unit, [unit]))
        if not whole and any(p.startswith(module + ".") for p in params):
            return True
    return False


def _all_names(rec: Recording) -> list[str]:
    return [m for u in rec.units for m in rec.modules.get(u, unit_modules(u))]


# --- the program ------------------------------------------------------------------------------

@dataclass(slots=True)
class CostModel:
    """What one step's collectives cost under a setting: a new unit's all-gather and reduction, from
    its members' recorded ones -- as recorded where nothing changes, the recorded time scaled by the
    fitted line to another world size, the line itself for a merged unit."""

    step: StepProgram
    comm: CommModel
    members: dict[str, list[str]]  # new unit -> the recorded units it holds
    unit_bytes: dict[str, int]  # new unit -> its unsharded parameter bytes (0: unknown)
    where: Target
    world_changed: bool
    gathers: dict[tuple[str, str], Gather]  # (recorded unit, phase) -> a recorded gather, this step's first

    def recorded_gather(self, unit: str, phase: str) -> Gather | None:
        """A recorded unit's gather costs: from this phase, else any phase of it."""
        g = self.gathers
        return g.get((unit, phase)) or g.get((unit, FORWARD)) or g.get((unit, BACKWARD))

    def bucket_gather(self, unit: str, nbytes: int, first: bool = False) -> SimGather:
        """A ZeRO-3 forward gather of ``nbytes`` (unsharded) that the recording did not run as one
        (another prefetch bucket groups the parameters otherwise): priced by the fitted lines, as a
        merged unit's is; ``unit`` the first unit whose parameters it carries."""
        comm_ns = self.comm.time_ns(ALL_GATHER, nbytes, self.where, in_step=not first)
        if first and comm_ns > 0:  # one rank meets nobody
            comm_ns += self.comm.meeting_ns
        return SimGather(unit=unit, phase=FORWARD, bytes=nbytes, host_ns=self.comm.time_ns(GATHER_HOST, nbytes),
                         copy_in_ns=0.0, comm_ns=comm_ns, copy_out_host_ns=self.comm.time_ns(COPY_OUT_HOST, nbytes),
                         copy_out_ns=0.0)

    def gather(self, unit: str, phase: str, recorded: Gather | None, first: bool = False) -> SimGather:
        """The all-gather of new unit ``unit`` in ``phase`` (``recorded``: its own in this step; ``first``:
        the step's first, which also waits for the ranks to meet after the step's boundary)."""
        ms = self.members[unit]
        parts = [recorded] if recorded is not None and len(ms) == 1 else [self.recorded_gather(u, phase) for u in ms]
        known = [g for g in parts if g is not None]
        nbytes = self.unit_bytes[unit] or sum(g.bytes for g in known)
        if recorded is not None and len(ms) == 1 and not self.world_changed:
            comm_ns = recorded.comm_ns
        elif len(ms) == 1 and known:
            comm_ns = known[0].comm_ns * self.comm.scale(ALL_GATHER, known[0].bytes, self.where)
        else:
            comm_ns = self.comm.time_ns(ALL_GATHER, nbytes, self.where)
            if first and comm_ns > 0:  # one rank meets nobody
                comm_ns += self.comm.meeting_ns
        single = len(ms) == 1 and bool(known)
        return SimGather(unit=unit, phase=phase, bytes=nbytes,
                         host_ns=sum(g.host_ns for g in known) if single else self.comm.time_ns(GATHER_HOST, nbytes),
                         copy_in_ns=sum(g.copy_in_ns for g in known), comm_ns=comm_ns,
                         copy_out_host_ns=sum(g.copy_out_host_ns for g in known) if single
                         else self.comm.time_ns(COPY_OUT_HOST, nbytes),
                         copy_out_ns=sum(g.copy_out_ns for g in known), kernels_ns=sum(g.kernels_ns for g in known),
                         # a merged unit's gather runs its members' steps once, in the same order: where
                         # in the label is a member's that has the copy or kernel
                         copy_in_at=(copy_in_at := next((g.copy_in_at for g in known if g.copy_in_ns), 1.0)),
                         kernels_at=next((g.kernels_at for g in known if g.kernels_ns > g.lead_ns), 1.0),
                         lead_ns=sum(g.lead_ns for g in known),
                         lead_at=min(copy_in_at, next((g.lead_at for g in known if g.lead_ns), 1.0)),
                         # a merged unit's gather is not its members' labels one after another: its
                         # kernels run from the first launch, as one
                         kernel_launches=known[0].kernel_launches if single else [])

    def _member_reduces(self, unit: str, micro: int | None = None) -> list[Reduce]:
        """The recorded reductions of new unit ``unit``'s members in ``micro`` (None: any micro-batch)."""
        ms = self.members[unit]
        return [r for r in self.step.reduces if r.unit in ms and (micro is None or r.micro == micro)]

    def _recorded_reduces(self, unit: str, micro: int) -> list[Reduce]:
        """The recorded reductions of new unit ``unit``'s members in ``micro``, else in any micro-batch."""
        return self._member_reduces(unit, micro) or self._member_reduces(unit)

    def reduce_host(self, unit: str, micro: int) -> float | None:
        """The host's busy time in new unit ``unit``'s reduction (its gradients' copy-in, the call, the
        sharded gradients after it) when it holds several recorded units: the fitted line at its bytes,
        since it reduces once where its members reduced one by one. None: one member, no line, or no
        member reduced in ``micro`` (frozen members; a micro-batch without gradient sync). Read on CPU
        recordings (module docstring)."""
        ms = self.members[unit]
        line = self.comm.lines.get(REDUCE_HOST)
        here = self._member_reduces(unit, micro)
        if len(ms) == 1 or line is None or not here:
            return None
        return line.typical(self.unit_bytes[unit] or sum(r.bytes for r in here))

    def reduce(self, unit: str, micro: int) -> SimReduce:
        """The reduction of new unit ``unit``'s gradients after its backward in ``micro``."""
        ms = self.members[unit]
        recorded = self._recorded_reduces(unit, micro)
        nbytes = self.unit_bytes[unit] or sum(r.bytes for r in recorded)
        if len(ms) == 1 and len(recorded) == 1 and not self.world_changed:
            r = recorded[0]
            return SimReduce(unit, r.bytes, r.comm_ns, r.ar_bytes, r.ar_ns, r.prep_ns)
        if len(ms) == 1 and recorded:
            r = recorded[0]
            return SimReduce(unit, r.bytes, r.comm_ns * self.comm.scale(REDUCE_SCATTER, r.bytes, self.where),
                             r.ar_bytes, r.ar_ns, r.prep_ns)
        return SimReduce(unit, nbytes, self.comm.time_ns(REDUCE_SCATTER, nbytes, self.where),
                         sum(r.ar_bytes for r in recorded), sum(r.ar_ns for r in recorded),
                         sum(r.prep_ns for r in recorded))


def build(rec: Recording, step: StepProgram, settings: Settings, comm: CommModel,
          all_gathers: dict[tuple[str, str], Gather]) -> Program:
    """The instructions of ``step`` under ``settings`` (see the module docstring)."""
    group, new_units, members = regrouped(rec, settings)
    unchanged_units = settings.wrap.kind == "recorded"
    # ZeRO-3: a depth that writes the recorded bucket (another depth, the same elements) gathers as
    # recorded, and the recorded gathers are replayed; another bucket regroups the forward's gathers
    bucket = written_bucket(rec, settings)
    if bucket is not None and bucket == rec.prefetch_args.get("stage3_prefetch_bucket_size"):
        settings, bucket = replace(settings, prefetch="recorded"), None
    replay = unchanged_units and settings.prefetch == "recorded" and settings.reshard_after_forward is None
    prefetch = rec.prefetch if settings.prefetch == "recorded" else settings.prefetch
    unit_bytes = {n: sum(max(0, rec.unit_bytes.get(u, 0)) for u in ms) for n, ms in members.items()}
    reshard = unit_reshard(rec, settings, new_units, members)
    recorded_reshard = {n: all(rec.reshard_after_forward.get(u, True) for u in ms) for n, ms in members.items()}
    world = settings.world_size or rec.world_size
    where = Target(world_size=world, ranks_per_host=settings.gpus_per_node or rec.ranks_per_host,
                    inter_host_gbps=settings.inter_node_gbps or None)
    world_changed = world != rec.world_size or bool(settings.gpus_per_node and settings.gpus_per_node
                                                    != rec.ranks_per_host)
    costs = CostModel(step=step, comm=comm, members=members, unit_bytes=unit_bytes, where=where,
                      world_changed=world_changed,
                      gathers={**all_gathers, **{(g.unit, g.phase): g for g in step.gathers}})
    compute_scale = _compute_scale(rec, settings)
    cpu = rec.device == "cpu"
    element_bytes = element_bytes_of(rec)

    gathers: list[SimGather] = []
    reduces: list[SimReduce] = []
    ops: list[Op] = []
    gathered_units, reduced_units = rec.gathered_units, rec.reduced_units
    # Units reduce in the micro-batches where the step's trace shows reductions: under gradient
    # accumulation without sync (FSDP2's set_requires_gradient_sync(False), FSDP1's no_sync()) a
    # micro-batch reduces nothing, and a step may reduce nothing at all. In one that synced, every unit
    # the recording reduces does (one whose reduction the attribution missed there too).
    synced = {r.micro for r in step.reduces}
    kept_after = kept_across_micro_batches(step)
    carried: set[str] = set()  # new units kept unsharded from the micro-batch before
    for mb in step.micro:
        micro = mb.micro
        ops.append(SegmentOp("pre", mb.pre))
        unsharded: set[str] = set(carried)
        # units the recording kept unsharded after this micro-batch's backward (each of their members)
        keep = {n for n, ms in members.items() if all(u in kept_after.get(micro, ()) for u in ms)}
        issued: dict[str, int] = {}  # unit -> gather id of its in-flight gather
        for phase, passes in ((FORWARD, mb.forward), (BACKWARD, mb.backward)):
            leaders = _leaders(passes, group)
            order = list(dict.fromkeys(group.get(passes[i].unit, ROOT_UNIT) for i in sorted(leaders)))
            recorded_issues = _recorded_issues(step, micro, phase) if replay else {}
            # ZeRO-3 under another prefetch bucket: its forward's gathers as DeepSpeed groups them
            fetch = _Fetch(order, rec, bucket, world) if bucket is not None and phase == FORWARD else None
            for i, p in enumerate(passes):
                unit = group.get(p.unit, ROOT_UNIT)
                lead = i in leaders
                last = _is_last(i, passes, group)
                # on CPU, between two members' windows ran FSDP's hook dispatch at the unit boundary (the
                # module call's hook path in forward, FSDP's autograd nodes in backward): merged, neither
                # runs (on GPU, where it was not measured to help, the gap stays)
                merged = len(members.get(unit, [unit])) > 1  # a unit run twice in a row keeps its gaps
                keep_gap = lead or p.part == "b" or not (cpu and merged)
                ops.append(BusyOp(p.gap_ns if keep_gap else 0.0, "gap"))
                # FSDP's hooks (once a unit: a merged unit's later members run none; part b opens no
                # unit), then, once the unit is gathered, the module's own code before its first op
                hooks = min(p.pre_ns, p.pre_framework_ns)
                ops.append(BusyOp(hooks if lead or p.part == "b" or not merged else 0.0, "pre"))
                if lead and not gathered_units.intersection(members.get(unit, [unit])):
                    unsharded.add(unit)  # never sharded: nothing to gather
                if lead and fetch is not None:
                    fetch.at(unit, ops, gathers, costs, settings, element_bytes)
                    unsharded.add(unit)
                elif lead and unit not in unsharded:
                    if unit not in issued:
                        own = _own_gather(step, micro, unit, phase, members)
                        issued[unit] = _issue(ops, gathers, costs.gather(unit, phase, own, first=not gathers),
                                              settings)
                    ops.append(CopyOutOp(issued.pop(unit)))
                    unsharded.add(unit)
                if lead and fetch is None:
                    for target in _prefetch_targets(recorded_issues if replay else None, p, order, unit, phase,
                                                    prefetch):
                        # a unit with nothing of its own to gather (a block around nested units, a root
                        # without parameters) is passed over, as FSDP2's unshard of it and DeepSpeed's
                        # bucket (counted in elements) pass it over: it issues no gather
                        if (target not in unsharded and target not in issued
                                and gathered_units.intersection(members.get(target, [target]))):
                            recorded = _own_gather(step, micro, target, phase, members)
                            issued[target] = _issue(ops, gathers,
                                                    costs.gather(target, phase, recorded, first=not gathers), settings)
                # the unshard's own kernels run where the unit is gathered, not where a setting keeps it
                # unsharded from forward to backward that the recording resharded
                kept = phase == BACKWARD and not reshard.get(unit, True) and recorded_reshard.get(unit, True)
                if not kept and (p.fsdp_pre_ns or p.fsdp_pre_side_ns):
                    ops.append(FsdpKernelsOp(unit, phase, p.fsdp_pre_ns, p.fsdp_pre_side_ns, before=True,
                                             launches=p.fsdp_pre_launches))
                if p.pre_ns > hooks:  # the module's own code, after FSDP's pre hook unsharded it
                    ops.append(BusyOp(p.pre_ns - hooks, "own"))
                ops.append(ComputeOp(unit, phase, p.compute_ns * compute_scale, p.launches))
                if p.fsdp_post_ns or p.fsdp_post_side_ns:
                    ops.append(FsdpKernelsOp(unit, phase, p.fsdp_post_ns, p.fsdp_post_side_ns, before=False))
                # a merged unit's members do not run their own hooks; on CPU neither their own reductions'
                # host work where the unit's reduction is priced once, at its bytes, by the fitted line (on
                # GPU each member's stays; so it does where no line prices it: no member reduced in this
                # micro-batch, or the trace holds the reductions' labels but no collective of them -- torch's
                # fake group, where each member's labelled work, mostly its gradients' copies, stays, as the
                # merged unit copies them all; what each pays per call is then counted per member).
                # A part a ends at a child's window, not with the unit's hooks: its post is the module's
                # own code, which runs; so do a recorded unit's own windows (a module list's, one a module)
                if last or p.part == "a" or not merged:
                    post = p.post_ns
                else:
                    own_reduce = p.reduce_host_ns if cpu and costs.reduce_host(unit, micro) is not None else 0.0
                    post = max(0.0, p.post_ns - p.post_framework_ns - own_reduce)
                after = p.reduce_after_ns if last else 0.0
                if cpu and last and phase == BACKWARD and (host := costs.reduce_host(unit, micro)) is not None:
                    post = max(0.0, post - p.reduce_host_ns) + host
                    after = min(after, post)
                # the module's own code after its first op (GPU: its launches), then FSDP's post hooks
                post_hooks = max(p.post_ranges_ns, p.post_framework_ns + p.reduce_host_ns)
                code = min(post - after, max(0.0, p.post_ns - post_hooks))
                if code > 0:
                    ops.append(BusyOp(code, "own"))
                ops.append(BusyOp(post - after - code, "post"))
                # forward frees a resharding unit; backward every unit but those kept into the next micro-batch
                frees = reshard.get(unit, True) if phase == FORWARD else unit not in keep
                if last and frees:
                    unsharded.discard(unit)
                if last and phase == BACKWARD:
                    if micro in synced and reduced_units.intersection(members.get(unit, [unit])):
                        reduces.append(costs.reduce(unit, micro))
                        ops.append(ReduceOp(len(reduces) - 1))
                    ops.append(BusyOp(after, "post"))
            if phase == FORWARD:
                ops.append(SegmentOp("mid", mb.mid))
        ops.append(SegmentOp("finalize", Segment(), finalize=True))
        carried = unsharded & keep
    ops.append(SegmentOp("post", step.post))
    notes = []
    if compute_scale != 1.0:
        notes.append(f"compute {compute_scale:.2f}x slower: more ranks than cores on a host")
    return Program(ops=ops, gathers=gathers, reduces=reduces, units=new_units, unit_bytes=unit_bytes, notes=notes,
                   serial_collectives=rec.serial_collectives, launch_latency_ns=rec.launch_latency_ns)


def kept_across_micro_batches(step: StepProgram) -> dict[int, set[str]]:
    """micro-batch -> the recorded units whose parameters stayed unsharded after its backward into the
    next micro-batch of the step: the units the next one's forward runs without gathering them, though
    the step gathers them in forward elsewhere (FSDP2's ``set_reshard_after_backward(False)`` under
    gradient accumulation: the next forward needs no all-gather). Empty without gradient accumulation,
    and after the step's last micro-batch (the next step gathers again)."""
    gathered_forward: dict[int, set[str]] = {}
    for g in step.gathers:
        if g.phase == FORWARD:
            gathered_forward.setdefault(g.micro, set()).add(g.unit)
    ever = set().union(*gathered_forward.values()) if gathered_forward else set()
    out: dict[int, set[str]] = {}
    for mb, following in zip(step.micro, step.micro[1:]):
        ran = {p.unit for p in following.forward}
        out[mb.micro] = (ever & ran) - gathered_forward.get(following.micro, set())
    return out


def meeting_ns(rec: Recording, comm: CommModel) -> float:
    """How much longer than its typical time a step's first all-gather takes: the first collective
    after the optimizer step, which the step's first all-gather holds under any setting. Per rank the
    median over its steps (a step where another process held a core makes one far longer), and of the
    ranks the least: the rank that arrives last waits for nobody, so what it still takes is the
    gather's own; what the others take beyond it is their lead on it, which a load on one rank's core
    makes and a setting does not."""
    waits: dict[int, list[float]] = {}
    for s in rec.steps:
        if s.gathers:
            first = s.gathers[0]
            waits.setdefault(s.rank, []).append(max(0.0, first.comm_ns - comm.time_ns(ALL_GATHER, first.bytes)))
    return min(statistics.median(w) for w in waits.values()) if waits else 0.0


def _issue(ops: list[Op], gathers: list[SimGather], g: SimGather, settings: Settings) -> int:
    """Issue all-gather ``g`` here; with no prefetch it waits for the compute before it."""
    g.after_compute = settings.prefetch == "none"
    gathers.append(g)
    ops.append(GatherOp(len(gathers) - 1))
    return len(gathers) - 1


def _leaders(passes: Sequence[Pass], group: dict[str, str]) -> set[int]:
    """Indices of the passes that open their unit's pass (its pre-forward / pre-backward runs first):
    the first of a run of passes of one unit; the root's part b only continues its part a."""
    out = set()
    for i, p in enumerate(passes):
        unit = group.get(p.unit, ROOT_UNIT)
        if p.part != "b" and (i == 0 or group.get(passes[i - 1].unit, ROOT_UNIT) != unit):
            out.add(i)
    return out


def _is_last(i: int, passes: Sequence[Pass], group: dict[str, str]) -> bool:
    """Whether pass ``i`` closes its unit's pass (its post-forward / post-backward runs after it)."""
    p = passes[i]
    if p.part == "a":
        return False
    return i + 1 == len(passes) or group.get(passes[i + 1].unit, ROOT_UNIT) != group.get(p.unit, ROOT_UNIT)


def _own_gather(step: StepProgram, micro: int, unit: str, phase: str, members: dict[str, list[str]]) -> Gather | None:
    ms = members.get(unit, [unit])
    if len(ms) != 1:
        return None
    for g in step.gathers:
        if g.unit == ms[0] and g.phase == phase and g.micro == micro:
            return g
    return None


def _recorded_issues(step: StepProgram, micro: int, phase: str) -> dict[tuple[str, str, str], list[str]]:
    out: dict[tuple[str, str, str], list[str]] = {}
    for g in step.gathers:
        if (g.micro == micro and g.phase == phase and g.issued_in is not None and g.issued_in[1] == phase
                and g.issued_in[0] != g.unit):
            out.setdefault(g.issued_in, []).append(g.unit)
    return out


def _prefetch_targets(recorded: dict[tuple[str, str, str], list[str]] | None, p: Pass, order: list[str], unit: str,
                      phase: str, prefetch: str) -> list[str]:
    """The units whose all-gathers pass ``p`` issues besides its own: as recorded (a replay), else
    by the rule of ``prefetch``."""
    if recorded is not None:
        return recorded.get(p.key, [])
    if unit not in order:
        return []
    i = order.index(unit)
    if prefetch.isdigit():
        return order[i + 1:i + 1 + int(prefetch)]
    if prefetch == "implicit" and phase == BACKWARD:
        return order[i + 1:i + 2]  # FSDP2 prefetches the next unit in backward
    return []


def unit_reshard(rec: Recording, settings: Settings, units: list[str],
                 members: dict[str, list[str]]) -> dict[str, bool]:
    """Per unit of the setting (``members``: the recorded units it holds), whether it reshards after
    forward: the last ``keep_last_units`` and the root keep their parameters; else as set, else as
    recorded."""
    out = {}
    kept = set([u for u in units if u != ROOT_UNIT][-settings.keep_last_units:]) if settings.keep_last_units > 0 else set()
    for unit in units:
        if unit in kept:
            out[unit] = False
        elif unit == ROOT_UNIT:
            out[unit] = rec.reshard_after_forward.get(ROOT_UNIT, False)
        elif settings.reshard_after_forward is not None:
            out[unit] = settings.reshard_after_forward
        else:
            out[unit] = all(rec.reshard_after_forward.get(u, True) for u in members[unit])
    return out


def _compute_scale(rec: Recording, settings: Settings) -> float:
    """On CPU, ranks beyond a host's cores share them: compute slows by the extra share. A host holds
    at most every rank of the run: more per node than the run has ranks puts them all on one."""
    if rec.device != "cpu" or not rec.cpu_count:
        return 1.0
    before = rec.ranks_per_host
    world = settings.world_size or rec.world_size
    after = min(settings.gpus_per_node, world) if settings.gpus_per_node else min(world, rec.ranks_per_host)
    return max(1.0, after / rec.cpu_count) / max(1.0, before / rec.cpu_count)


def zero3_bucket(rec: Recording, settings: Settings) -> int | None:
    """The prefetch bucket (parameter elements) a ZeRO-3 setting writes, where it is not the recorded one
    and run.json lists the units' parameters (DeepSpeed's gathers carry parameters, its bucket counts
    their elements); None otherwise."""
    bucket = written_bucket(rec, settings)
    return None if bucket is None or bucket == rec.prefetch_args.get("stage3_prefetch_bucket_size") else bucket


def written_bucket(rec: Recording, settings: Settings) -> int | None:
    """The prefetch bucket a ZeRO-3 setting's depth writes, the recorded one included (None: not ZeRO-3, the
    prefetch unchanged, or run.json lists no parameters)."""
    if (rec.framework != ZERO3 or not rec.unit_params or settings.prefetch == "recorded"
            or not settings.prefetch_changed(rec.prefetch)):
        return None
    numels = [rec.unit_numels.get(u, 0) for u in rec.units]
    bucket = (prefetch_args.arguments(ZERO3, settings.prefetch, numels) or {}).get("stage3_prefetch_bucket_size")
    return bucket if isinstance(bucket, int) and not isinstance(bucket, bool) else None


def element_bytes_of(rec: Recording) -> int:
    """The bytes of one parameter element, over the units run.json lists (0: unknown)."""
    numel = sum(rec.unit_numels.get(u, 0) for u in rec.units)
    nbytes = sum(max(rec.unit_bytes.get(u, 0), 0) for u in rec.units)
    return nbytes // numel if numel else 0


class _Fetch:
    """ZeRO-3's forward fetches under a prefetch bucket (:func:`.zero3_fetch.forward_gathers`, read off
    DeepSpeed's coordinator, ``fetch_sub_module``): at each unit's fetch, a gather of its own parameters
    not gathered yet, the wait for every gather that carries them (the first wait on a coalesced gather
    copies it out), then one prefetch gather of the parameters next in the queue, up to the bucket. A
    unit fetched again in the same forward finds its parameters gathered and issues nothing. Parameters
    of a unit the recording never gathered (DeepSpeed keeps those under
    ``stage3_param_persistence_threshold`` whole on every rank) are in no gather."""

    def __init__(self, order: list[str], rec: Recording, bucket: int, world: int) -> None:
        gathered = rec.gathered_units
        self.params = {u: p for u, p in rec.unit_params.items() if u in gathered}
        self.plan = zero3_fetch.forward_gathers(order, self.params, bucket, max(world, 1))
        self.issued_at: dict[str, list[int]] = {}  # unit -> the planned gathers its fetch issues, in order
        self.carrying: dict[str, list[int]] = {}  # unit -> the planned gathers that carry its parameters
        for k, g in enumerate(self.plan):
            self.issued_at.setdefault(g.issuer, []).append(k)
            for u in dict.fromkeys(u for u, _ in g.params):
                self.carrying.setdefault(u, []).append(k)
        self.ids: dict[int, int] = {}  # planned gather -> its simulated gather
        self.waited: set[int] = set()

    def at(self, unit: str, ops: list[Op], gathers: list[SimGather], costs: CostModel, settings: Settings,
           element_bytes: int) -> None:
        """The ops of ``unit``'s fetch."""
        mine = [k for k in self.issued_at.get(unit, []) if k not in self.ids]
        own = [k for k in mine if all(u == unit for u, _ in self.plan[k].params)]
        for k in own:
            self._issue(k, ops, gathers, costs, settings, element_bytes)
        for k in self.carrying.get(unit, []):
            if k not in self.waited and k in self.ids:
                ops.append(CopyOutOp(self.ids[k]))
                self.waited.add(k)
        for k in mine:
            if k not in own:
                self._issue(k, ops, gathers, costs, settings, element_bytes)

    def _issue(self, k: int, ops: list[Op], gathers: list[SimGather], costs: CostModel, settings: Settings,
               element_bytes: int) -> None:
        g = self.plan[k]
        nbytes = sum(self.params[u][i] for u, i in g.params) * element_bytes
        self.ids[k] = _issue(ops, gathers, costs.bucket_gather(g.params[0][0], nbytes, first=not gathers), settings)
