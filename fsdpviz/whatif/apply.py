"""The advised setting as code: ``shard_model(model)`` applying it to an unsharded model of the recorded architecture.

The code addresses modules by the names the recording's units hold, checked against the parameter
names run.json lists for each unit (``units[].params``): a module is named only where one of its
unit's parameters lies under it (or it is the root). Where run.json does not list them (traces
recorded without fsdpviz), or a setting cannot be said in the framework's own terms, there is no code
and ``note`` says what could not be resolved, instead of a guess.

- FSDP2: one ``fully_shard`` call per unit (a list of modules for a unit of several), a unit after
  the units nested in it (FSDP2 shards children before parents), then the root, each with its
  ``reshard_after_forward``; explicit prefetch as ``set_modules_to_forward_prefetch`` /
  ``set_modules_to_backward_prefetch`` lists of the next units. No prefetch at all cannot be said: FSDP2
  prefetches one unit ahead in backward wherever a unit's list is empty.
- FSDP1: ``FullyShardedDataParallel`` on the model with a ``CustomPolicy`` that wraps exactly the
  units' modules, and the prefetch arguments (:mod:`fsdpviz.replay.prefetch_args`; the recorded ones,
  ``BACKWARD_POST`` included, where the setting keeps the recorded prefetch). FSDP1 wraps one module per unit:
  a unit of several sibling modules cannot be said.
- ZeRO-3: the config keys (``zero_optimization``), as ``zero_config(config)``, which sets them in a
  DeepSpeed config dict.

Beside the code, ``stacks`` holds the setting as each stack built on the framework takes it (the HF
Trainer's ``fsdp_config``, accelerate's config keys, Lightning's strategy, the DeepSpeed JSON:
:mod:`.stacks`), and ``stack`` the one the recorded launcher names.

``**fsdp_kwargs`` of ``shard_model`` pass on what the setting does not decide (mixed precision, the
device mesh, the device).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from fsdpviz.naming import ROOT_UNIT, WRAPPER_COMPONENTS
from fsdpviz.replay import prefetch_args
from fsdpviz.replay import program as prog
from fsdpviz.replay.recorded import Recording
from fsdpviz.replay.settings import GIVEN, Settings
from fsdpviz.vocabulary import FSDP1, FSDP2, ZERO3
from fsdpviz.whatif import stacks as stack_forms
from fsdpviz.whatif.stacks import StackForm

FSDP2_IMPORT: Final = '''try:
    from torch.distributed.fsdp import fully_shard
except ImportError:  # torch < 2.6
    from torch.distributed._composable.fsdp import fully_shard
'''
# The written code finds modules by the paths fsdpviz names them with: a model still wrapped by
# activation checkpointing or torch.compile (their wrapper segments are not in those paths,
# naming.clean_fqn) resolves to the outermost module at each path, the one a user shards.
FINDER: Final = f'''
# wrapper segments fsdpviz leaves out of module paths (activation checkpointing, FSDP1, torch.compile)
WRAPPER_SEGMENTS = {tuple(sorted(WRAPPER_COMPONENTS))!r}


def submodules(model):
    """Path as fsdpviz names it (no WRAPPER_SEGMENTS) -> the outermost module at that path."""
    found = {{}}
    for name, module in model.named_modules():
        found.setdefault(".".join(p for p in name.split(".") if p not in WRAPPER_SEGMENTS), module)
    return found.__getitem__
'''
FSDP1_IMPORT: Final = '''from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
'''
CUSTOM_POLICY_IMPORT: Final = "from torch.distributed.fsdp.wrap import CustomPolicy\n"  # with the units it names


@dataclass(slots=True)
class Apply:
    """``whatif --json`` ``apply``: the setting as code, or why there is none."""

    framework: str
    code: str | None
    lines: list[str] = field(default_factory=list)
    note: str = ""
    stack: str = ""
    """The stack the recorded launcher names (:func:`.stacks.launched_by`); "" where it names none."""
    stacks: list[StackForm] = field(default_factory=list)
    """The setting as each stack on the framework takes it (:mod:`.stacks`)."""

    def to_json(self) -> dict[str, Any]:
        return {"framework": self.framework, "code": self.code, "lines": self.lines, "note": self.note,
                "stack": self.stack, "stacks": [f.to_json() for f in self.stacks]}

    def form(self, stack: str) -> StackForm | None:
        """The form of ``stack`` (:data:`.stacks.STACKS`), None where the framework has none."""
        return next((f for f in self.stacks if f.stack == stack), None)


def apply_code(rec: Recording, params: dict[str, list[str]], settings: Settings, describe: str,
               launcher: str = "") -> Apply:
    """``settings`` (filled in: every value known) as code for ``rec``'s framework, and as each stack
    on it takes it; ``params``: each recorded unit's parameter names (run.json), ``describe``: the
    setting in words, for the docstring; ``launcher``: the stack the recorded command names."""
    out = _code(rec, params, settings, describe)
    out.stack = launcher
    bucket = None
    if rec.framework == ZERO3 and settings.prefetch_changed(rec.prefetch) and rec.unit_numels:
        numels = [rec.unit_numels.get(u, 0) for u in rec.units]
        value = (prefetch_args.arguments(ZERO3, settings.prefetch, numels) or {}).get("stage3_prefetch_bucket_size")
        bucket = value if isinstance(value, int) else None
    fsdp1 = fsdp1_arguments(rec, settings) if rec.framework == FSDP1 else {}
    out.stacks = stack_forms.forms(rec, settings, fsdp1, bucket, out.code)
    return out


def _code(rec: Recording, params: dict[str, list[str]], settings: Settings, describe: str) -> Apply:
    if rec.framework == ZERO3:
        return _zero3(rec, settings, describe)
    _, new_units, members = prog.regrouped(rec, settings)
    # a unit is its members' modules, a match: unit of several too (program._match names it by them)
    modules = {n: [m for u in members[n] for m in rec.modules.get(u, [u])] for n in new_units if n != ROOT_UNIT}
    missing = list(dict.fromkeys(m for n, ms in modules.items() for m in _unresolved(ms, [p for u in members[n]
                                                                                         for p in params.get(u, [])])))
    if missing:
        return Apply(rec.framework, None, note=(
            f"not resolved: {', '.join(missing)}: the parameter names the recording lists (run.json units[].params) "
            "do not place these modules (none listed: traces recorded without fsdpviz record; or names under none "
            "of their unit's modules), so no code names them"))
    notes = _launch_notes(rec, settings)
    if rec.framework == FSDP1:
        return _fsdp1(rec, settings, modules, describe, notes)
    if rec.framework == FSDP2:
        reshard = prog.unit_reshard(rec, settings, new_units, members)
        return _fsdp2(rec, settings, new_units, modules, reshard, describe, notes)
    return Apply(rec.framework, None, note=f"{rec.framework}: no code is written for this framework")


def _unresolved(modules: list[str], params: list[str]) -> list[str]:
    """The modules of one unit its recorded parameter names (run.json) do not place: every module where
    none are recorded; where a parameter lies under none of them (the names disagree), the modules none
    lies under. A module none lies under, in a unit whose every parameter lies under another of its
    modules, holds parameters tied to another module's (a tied output embedding: named_parameters() lists
    a shared parameter once) or none: its path is the framework's label of it."""
    if not params:
        return modules
    under = {m: any(p.startswith(f"{m}.") for p in params) for m in modules}
    if all(any(p.startswith(f"{m}.") for m in modules) for p in params) and any(under.values()):
        return []
    return [m for m, placed in under.items() if not placed] or modules


def _launch_notes(rec: Recording, settings: Settings) -> list[str]:
    if settings.sources.get("world_size") == GIVEN and settings.world_size != rec.world_size:
        return [(f"the world size is the launcher's, not the code's: run on {settings.world_size} ranks "
                 "(torchrun --nnodes ... --nproc_per_node ...)")]
    return []


def _ref(module: str) -> str:
    return "model" if module == ROOT_UNIT else f'm("{module}")'


def _fsdp2(rec: Recording, settings: Settings, units: list[str], modules: dict[str, list[str]],
           reshard: dict[str, bool], describe: str, notes: list[str]) -> Apply:
    lines = []
    order = [u for u in units if u != ROOT_UNIT]
    # FSDP2 shards children before parents: a parent sharded first takes its nested unit's
    # parameters as its own, and fully_shard on the nested module then fails (_init_sharding_spec:
    # "Invariant encountered: value was None")
    post_order = shard_order(order, modules)
    for unit in post_order:
        refs = [_ref(m) for m in modules[unit]]
        target = refs[0] if len(refs) == 1 else f"[{', '.join(refs)}]"
        lines.append(f"fully_shard({target}, reshard_after_forward={_reshard_value(rec, settings, unit, reshard)}, "
                     "**fsdp_kwargs)")
    lines.append(f"fully_shard(model, reshard_after_forward={reshard.get(ROOT_UNIT, False)}, **fsdp_kwargs)")
    depth = settings.prefetch
    if depth == "none":
        return Apply(FSDP2, None, note=f"prefetch none: set_modules_to_backward_prefetch {prefetch_args.NO_FSDP2_NONE}")
    forward, backward = _fsdp2_depths(rec, settings)
    if (forward or backward) and order:
        # a unit of several modules shares one FSDP state: its first module stands for it
        lines.append("units = [model, " + ", ".join(_ref(modules[u][0]) for u in order) + "]  # forward order")
    if forward and order:
        lines.append("for i, unit in enumerate(units):")
        lines.append(f"    unit.set_modules_to_forward_prefetch(units[i + 1 : i + {1 + forward}])")
    if backward and order:
        if post_order == order:
            lines.append("backward = [model, *reversed(units[1:])]")
        else:
            # a unit's pre-backward runs when its output's gradient arrives: after the units nested
            # in it have ended their forward, so backward runs the post-forward order reversed
            lines.append("backward = [model, " + ", ".join(_ref(modules[u][0]) for u in reversed(post_order))
                         + "]  # backward order")
        lines.append("for i, unit in enumerate(backward):")
        lines.append(f"    unit.set_modules_to_backward_prefetch(backward[i + 1 : i + {1 + backward}])")
    body = "\n".join(f"    {line}" for line in ["m = submodules(model)", *lines, "return model"])
    code = (f"{FSDP2_IMPORT}{FINDER}\n\ndef shard_model(model, **fsdp_kwargs):\n"
            f'    """{describe}: FSDP2 units as fsdpviz whatif predicts them (the root last)."""\n{body}\n')
    return Apply(FSDP2, code, lines, "; ".join(notes))


def _reshard_value(rec: Recording, settings: Settings, unit: str, reshard: dict[str, bool]) -> str:
    """``reshard_after_forward``'s value for a new unit: the recorded ``<int>`` (HSDP, resharding to
    fewer ranks after forward) where the unit is a recorded one, the setting leaves resharding as
    recorded and the unit still reshards; else the predicted bool."""
    size = rec.reshard_sizes.get(unit)
    unchanged = settings.sources.get("reshard_after_forward") != GIVEN and settings.keep_last_units <= 0
    if size is not None and unchanged and reshard[unit]:
        return str(size)
    return str(reshard[unit])


def _fsdp2_depths(rec: Recording, settings: Settings) -> tuple[int, int]:
    """The explicit prefetch depths to write, (forward, backward), 0 for FSDP2's default: the
    setting's N in both passes where it changes prefetch, else the recorded lists' depths (which may
    differ between the passes, or be backward only), so code that keeps the prefetch keeps it whole."""
    if not settings.prefetch_changed(rec.prefetch) and rec.prefetch_depths is not None:
        return rec.prefetch_depths
    depth = int(settings.prefetch) if settings.prefetch.isdigit() else 0
    return depth, depth


def fsdp1_arguments(rec: Recording, settings: Settings) -> dict[str, object]:
    """FSDP1's prefetch arguments for a filled-in setting: as recorded where it does not change
    prefetch, else those that give its depth -- keeping the recorded ``backward_prefetch`` where the
    new depth prefetches in backward too: ``BACKWARD_PRE`` and ``BACKWARD_POST`` both fetch one unit
    ahead (torch's ``_get_handle_to_prefetch``; POST after the current unit's gradients, holding less),
    the model's depth says which unit, not which hook, so a recorded POST is no part of the change."""
    recorded = rec.prefetch_args
    if not {"forward_prefetch", "backward_prefetch"} <= set(recorded):
        return prefetch_args.arguments(FSDP1, settings.prefetch, []) or {}
    if not settings.prefetch_changed(rec.prefetch):
        return dict(recorded)
    out = prefetch_args.arguments(FSDP1, settings.prefetch, []) or {}
    if out.get("backward_prefetch") is not None and recorded["backward_prefetch"] is not None:
        out["backward_prefetch"] = recorded["backward_prefetch"]
    return out


def shard_order(units: list[str], modules: dict[str, list[str]]) -> list[str]:
    """``units`` (forward order) with every unit after the units nested in it (post-order: the order
    FSDP2 needs them sharded in, and the order their forwards end in), siblings in forward order. A
    unit is nested in another when each of its modules lies under one of the other's."""
    def inside(inner: str, outer: str) -> bool:
        return inner != outer and all(any(m.startswith(f"{x}.") for x in modules[outer]) for m in modules[inner])

    out: list[str] = []

    def emit(unit: str) -> None:
        if unit in out:
            return
        for other in units:
            if inside(other, unit):
                emit(other)
        out.append(unit)

    for unit in units:
        emit(unit)
    return out


def _fsdp1(rec: Recording, settings: Settings, modules: dict[str, list[str]], describe: str,
           notes: list[str]) -> Apply:
    several = [u for u, ms in modules.items() if len(ms) > 1]
    if several:
        return Apply(FSDP1, None, note=(
            f"FSDP1 wraps one module per unit: {', '.join(several)} would need a module of their own holding just "
            "them (an nn.Sequential of the blocks, as examples/train.py --wrap pair builds)"))
    arguments = fsdp1_arguments(rec, settings)
    names = [ms[0] for ms in modules.values()]
    # one root unit: no policy, over any the caller's fsdp_kwargs carry (FSDP1 then wraps the model alone)
    lines = [f"wrap = {{{', '.join(_ref(n) for n in names)}}}",
             "policy = CustomPolicy(lambda module: module in wrap)"] if names else []
    setting = ["auto_wrap_policy=policy" if names else "auto_wrap_policy=None"]
    if "backward_prefetch" in arguments:
        backward = arguments["backward_prefetch"]
        setting.append(f"backward_prefetch={'None' if backward is None else f'BackwardPrefetch.{backward}'}")
    if "forward_prefetch" in arguments:
        setting.append(f"forward_prefetch={bool(arguments['forward_prefetch'])}")
    strategy = rec.fsdp1_strategy
    if strategy is not None and strategy != "FULL_SHARD":  # FSDP1's default is not written
        setting.append(f"sharding_strategy=ShardingStrategy.{strategy}")
    if strategy is None:
        notes.append("run.json's units do not tell the recorded sharding strategy (the outermost unit alone, which "
                     "FSDP1 never reshards after forward; units that disagree or do not say; a shard group of one rank, "
                     "where FSDP1 shards nothing): pass yours in fsdp_kwargs")
    elif "HYBRID" in strategy:
        notes.append(f"{strategy} shards within a group and replicates across groups: pass the process groups or the "
                     "device mesh the run used in fsdp_kwargs")
    # the setting's own arguments over any of the same name the caller's fsdp_kwargs carry (a script's
    # usual FSDP arguments, passed through whole): the predicted setting is what runs, never a TypeError
    lines.append(f"setting = dict({', '.join(setting)})")
    lines.append("return FSDP(model, **{**fsdp_kwargs, **setting})")
    body = "\n".join(f"    {line}" for line in [*(["m = submodules(model)"] if names else []), *lines])
    code = (f"{FSDP1_IMPORT}{CUSTOM_POLICY_IMPORT + FINDER if names else ''}\n\ndef shard_model(model, **fsdp_kwargs):\n"
            f'    """{describe}: FSDP1 units as fsdpviz whatif predicts them."""\n{body}\n')
    return Apply(FSDP1, code, lines, "; ".join(notes))


def _zero3(rec: Recording, settings: Settings, describe: str) -> Apply:
    numels = [rec.unit_numels.get(u, 0) for u in rec.units]
    arguments = prefetch_args.arguments(ZERO3, settings.prefetch, numels) if rec.unit_numels else None
    if not settings.prefetch_changed(rec.prefetch) and "stage3_prefetch_bucket_size" in rec.prefetch_args:
        # a recorded bucket other than DeepSpeed's default reads as "implicit": written back as recorded
        arguments = {"stage3_prefetch_bucket_size": rec.prefetch_args["stage3_prefetch_bucket_size"]}
    if arguments is None:
        return Apply(ZERO3, None, note="the prefetch bucket is counted in parameter elements, which only run.json's "
                                       "units give: no key is written")
    lines = [f'config.setdefault("zero_optimization", {{}})["{key}"] = {value!r}' for key, value in arguments.items()]
    body = "\n".join(f"    {line}" for line in [*lines, "return config"])
    code = (f"def zero_config(config):\n    \"\"\"{describe}: DeepSpeed ZeRO-3 keys as fsdpviz whatif predicts them.\"\"\"\n"
            f"{body}\n")
    return Apply(ZERO3, code, lines, "; ".join(_launch_notes(rec, settings)))
