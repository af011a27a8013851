"""The advised setting as each stack takes it: the keys or arguments a user of the HF Trainer,
accelerate, Lightning or DeepSpeed changes, and only those -- everything the setting does not decide
stays as the user has it.

Each stack's own source is the reference for what a key does:

- HF Trainer (transformers ``TrainingArguments._process_fsdp_args``): ``fsdp_config`` keys. FSDP2
  (``version`` 2, the default) takes ``reshard_after_forward`` (a bool, every unit the same) and
  ``auto_wrap_policy`` (``TRANSFORMER_BASED_WRAP`` by class, ``SIZE_BASED_WRAP``, ``NO_WRAP``; under FSDP2
  accelerate shards the embeddings and the final norm apart whatever the policy, so one unit for the
  whole model cannot be said); FSDP1
  (``version`` 1) also ``backward_prefetch`` (``BACKWARD_PRE`` / ``BACKWARD_POST`` / ``NO_PREFETCH``) and
  ``forward_prefetch``. ZeRO-3 runs from the DeepSpeed JSON given as ``deepspeed=``.
- accelerate (``FullyShardedDataParallelPlugin``, ``accelerate launch``'s FSDP arguments): the same
  settings as ``fsdp_``-prefixed keys of the config file's ``fsdp_config`` section, or launch flags.
  Under FSDP2 accelerate drops ``backward_prefetch`` and ``forward_prefetch`` ("not supported in
  FSDP2"): explicit prefetch cannot be said there.
- Lightning: ``ModelParallelStrategy`` runs the user's own ``fully_shard`` calls (Fabric's
  ``parallelize_fn``, a ``LightningModule``'s ``configure_model()`` under the Trainer, whose strategy
  takes no such function), so the code form is what replaces them; ``FSDPStrategy(...)`` (FSDP1, GPUs only) passes
  ``auto_wrap_policy``, ``sharding_strategy`` and further keywords (``backward_prefetch``,
  ``forward_prefetch``) to FSDP1.
- DeepSpeed (``DeepSpeedZeroConfig``, ``PartitionedParameterCoordinator.fetch_sub_module``):
  ``zero_optimization.stage3_prefetch_bucket_size`` in parameter elements. The prefetch actually
  fetched is ``min(stage3_max_live_parameters - parameters already live, bucket)``, and parameters
  under ``stage3_param_persistence_threshold`` are never partitioned, so never fetched: both stay as
  recorded, and both can hold the bucket back. The HF Trainer fills ``"auto"`` buckets as
  ``0.9 * hidden_size ** 2``; the written number replaces such an ``"auto"``.

A setting a stack cannot express (a merge of arbitrary units in a class-based wrap, one unit's
resharding, FSDP2 prefetch under accelerate) has no form there: ``note`` says why and points at the
code form, which every stack can run (a custom wrap policy, or the user's own sharding code).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from fsdpviz.replay.recorded import Recording
from fsdpviz.replay.settings import GIVEN, Settings
from fsdpviz.vocabulary import FSDP1, FSDP2, ZERO3

HF_TRAINER: Final = "hf_trainer"
ACCELERATE: Final = "accelerate"
LIGHTNING: Final = "lightning"
DEEPSPEED: Final = "deepspeed"
CODE: Final = "code"  # the framework's own calls (fully_shard / FSDP / the DeepSpeed config dict)
STACKS: Final = (CODE, HF_TRAINER, ACCELERATE, LIGHTNING, DEEPSPEED)
NO_WRAP: Final = "NO_WRAP"
NO_PREFETCH: Final = "NO_PREFETCH"  # HF's and accelerate's word for FSDP1's backward_prefetch=None
CODE_FORM: Final = "the code form (fsdpviz whatif ... --code --stack code) says it"


@dataclass(slots=True)
class StackForm:
    """One stack's form of a setting: the keys it changes and how the user writes them, or why the
    stack cannot say it (``text`` None)."""

    stack: str
    where: str  # where the keys go, in the stack's own words
    changes: dict[str, Any] = field(default_factory=dict)  # key -> new value; only what the setting changes
    text: str | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"stack": self.stack, "where": self.where, "changes": self.changes, "text": self.text,
                "note": self.note}


def launched_by(command: Sequence[str]) -> str:
    """The stack the recorded command names through its launcher (``accelerate launch``, the
    ``deepspeed`` runner, ``lightning run``/``fabric run``), else "": torchrun or python say nothing
    of the library a script trains with."""
    words = [os.path.basename(w) for w in command]
    for i, word in enumerate(words):
        if word in ("accelerate", "accelerate-launch") or word == "accelerate.commands.launch":
            return ACCELERATE
        if word in ("deepspeed", "deepspeed.launcher.runner"):
            return DEEPSPEED
        if word in ("lightning", "fabric") and words[i + 1:i + 2] == ["run"]:
            return LIGHTNING
    return ""


@dataclass(frozen=True, slots=True)
class _Change:
    """What a filled-in setting changes against the recording, in the model's terms."""

    wrap: str  # "" (as recorded), "root", or another wrap's words (merge:K, match:REGEX)
    reshard: bool | None  # every unit's reshard_after_forward, where given
    keep_last: int  # units whose own resharding changes (keep_last_units)
    prefetch: dict[str, object] | None  # FSDP1's changed arguments, or {} where FSDP2/ZeRO-3 prefetch changes
    bucket: int | None  # ZeRO-3's new stage3_prefetch_bucket_size


def _change(rec: Recording, settings: Settings, fsdp1_args: dict[str, object],
            bucket: int | None) -> _Change:
    wrap = "" if settings.sources.get("wrap") != GIVEN or settings.wrap.kind == "recorded" else str(settings.wrap)
    reshard = settings.reshard_after_forward if settings.sources.get("reshard_after_forward") == GIVEN else None
    prefetch: dict[str, object] | None = None
    if settings.prefetch_changed(rec.prefetch):
        # FSDP1: only the arguments that differ from the recorded ones (a recorded BACKWARD_POST stays)
        prefetch = {k: v for k, v in fsdp1_args.items() if rec.prefetch_args.get(k, object()) != v} \
            if rec.framework == FSDP1 else {}
    return _Change(wrap, reshard, settings.keep_last_units, prefetch, bucket)


def forms(rec: Recording, settings: Settings, fsdp1_args: dict[str, object], bucket: int | None,
          code: str | None) -> list[StackForm]:
    """Every stack's form of ``settings`` for ``rec``'s framework (``fsdp1_args``: FSDP1's prefetch
    arguments for it, ``bucket``: ZeRO-3's, ``code``: the code form, None where there is none)."""
    change = _change(rec, settings, fsdp1_args, bucket)
    if rec.framework == FSDP2:
        return [_hf_fsdp(change, 2), _accelerate_fsdp(change, 2), _lightning_fsdp2(code)]
    if rec.framework == FSDP1:
        return [_hf_fsdp(change, 1), _accelerate_fsdp(change, 1), _lightning_fsdp1(change, code)]
    if rec.framework == ZERO3:
        return [_deepspeed(rec, change)]
    return []


def _cannot(change: _Change, stack: str, version: int) -> list[str]:
    """Why the HF Trainer's / accelerate's FSDP settings cannot say ``change`` (empty: they can)."""
    why = []
    if change.wrap and change.wrap != "root":
        why.append(f"--wrap {change.wrap}: {stack} wraps by module class (TRANSFORMER_BASED_WRAP) or size "
                   "(SIZE_BASED_WRAP), not by a list of modules")
    if change.wrap == "root" and version == 2:
        # accelerate's fsdp2_prepare_model shards the input embedding and [final norm, output embedding]
        # as units of their own whatever the policy: NO_WRAP leaves three units, not one
        why.append(f"--wrap root: {stack} under FSDP2 always shards the input embedding and the final norm with "
                   "the output embedding as units of their own (accelerate's fsdp2_prepare_model), NO_WRAP included")
    if change.keep_last:
        why.append(f"keeping the last {change.keep_last} unit(s)' parameters: {stack} sets "
                   "reshard_after_forward for every unit at once")
    if change.reshard is not None and version == 1:
        why.append("reshard after forward under FSDP1 is the sharding strategy of every unit (SHARD_GRAD_OP)")
    if change.prefetch is not None and version == 2:
        why.append("FSDP2 prefetch: accelerate passes no prefetch to FSDP2 (its plugin drops backward_prefetch and "
                   "forward_prefetch: \"not supported in FSDP2\")")
    return why


def _fsdp_changes(change: _Change, prefix: str, version: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if change.wrap == "root":
        out[f"{prefix}auto_wrap_policy"] = NO_WRAP  # one unit, the model (FSDP_AUTO_WRAP_POLICY[2])
    if change.reshard is not None and version == 2:
        out[f"{prefix}reshard_after_forward"] = change.reshard
    for key, value in (change.prefetch or {}).items():
        out[f"{prefix}{key}"] = (NO_PREFETCH if value is None else value) if key == "backward_prefetch" else value
    return out


def _empty(change: _Change) -> bool:
    return not (change.wrap or change.reshard is not None or change.keep_last or change.prefetch is not None
                or change.bucket is not None)


def _hf_fsdp(change: _Change, version: int) -> StackForm:
    where = "TrainingArguments(fsdp=..., fsdp_config=...): keys of fsdp_config (a dict, or the JSON file named there)"
    why = _cannot(change, "the HF Trainer", version)
    if why:
        return StackForm(HF_TRAINER, where, note="; ".join(why) + f": {CODE_FORM}")
    changes = _fsdp_changes(change, "", version)
    if not changes:
        return StackForm(HF_TRAINER, where, {}, "# fsdp_config: no key changes", "as recorded")
    text = ("# TrainingArguments(fsdp=..., fsdp_config=fsdp_config): set these keys, keep the others as they are\n"
            f"fsdp_config.update({_py(changes)})\n")
    return StackForm(HF_TRAINER, where, changes, text)


def _accelerate_fsdp(change: _Change, version: int) -> StackForm:
    where = "accelerate's FSDP config: the fsdp_config section of accelerate launch --config_file, or its launch flags"
    why = _cannot(change, "accelerate", version)
    if why:
        return StackForm(ACCELERATE, where, note="; ".join(why) + f": {CODE_FORM}")
    changes = _fsdp_changes(change, "fsdp_", version)
    if not changes:
        return StackForm(ACCELERATE, where, {}, "# fsdp_config: no key changes", "as recorded")
    text = ("# accelerate config file (accelerate launch --config_file FILE): set these keys, keep the others\n"
            "fsdp_config:\n" + "".join(f"  {k}: {_yaml(v)}\n" for k, v in changes.items())
            + "# or as launch flags: accelerate launch " + " ".join(launch_flags(changes)) + " ...\n")
    return StackForm(ACCELERATE, where, changes, text)


def launch_flags(changes: dict[str, Any]) -> list[str]:
    """accelerate launch's flags for accelerate config ``changes`` (``--fsdp_reshard_after_forward false``)."""
    return [w for k, v in changes.items() for w in (f"--{k}", _yaml(v))]


def _lightning_fsdp2(code: str | None) -> StackForm:
    where = ("ModelParallelStrategy: Fabric's parallelize_fn, or the fully_shard calls of your LightningModule's "
             "configure_model()")
    if code is None:
        return StackForm(LIGHTNING, where, note=f"the code form cannot say it either: {CODE_FORM}")
    text = (f"{code}\n\n# Lightning's ModelParallelStrategy: the calls above, on its mesh, in place of your own\n"
            "# fully_shard calls. Fabric: ModelParallelStrategy(parallelize_fn=parallelize). Trainer: in your\n"
            "# LightningModule's configure_model(), parallelize(self.<the model>, self.device_mesh). The module\n"
            "# names above are the recorded ones, relative to the model FSDP sharded as its root unit.\n"
            "def parallelize(model, device_mesh):\n"
            '    return shard_model(model, mesh=device_mesh["data_parallel"])\n')
    return StackForm(LIGHTNING, where, {}, text)


def _lightning_fsdp1(change: _Change, code: str | None) -> StackForm:
    where = "FSDPStrategy(...): its arguments (keywords it does not know go to FSDP1)"
    changes: dict[str, Any] = {}
    lines = []
    if change.wrap == "root":
        changes["auto_wrap_policy"] = None
        lines.append("auto_wrap_policy=None")
    elif change.wrap:
        if code is None:
            return StackForm(LIGHTNING, where, note=f"--wrap {change.wrap}: FSDP1 cannot say it: {CODE_FORM}")
        # FSDPStrategy passes any FSDP1 policy through: the code form's CustomPolicy of the modules
        changes["auto_wrap_policy"] = "CustomPolicy (the code form's)"
        lines.append("auto_wrap_policy=policy")
    for key, value in (change.prefetch or {}).items():
        changes[key] = value
        lines.append(f"{key}={'None' if value is None else f'BackwardPrefetch.{value}'}" if key == "backward_prefetch"
                     else f"{key}={value!r}")
    if not changes:
        return StackForm(LIGHTNING, where, {}, "# FSDPStrategy: no argument changes", "as recorded")
    head = ("# policy: the code form's CustomPolicy (wrap = {...}, built from your LightningModule)\n"
            if changes.get("auto_wrap_policy") else "")
    text = (f"{head}# FSDPStrategy(...): set these arguments, keep the others as they are\n"
            f"strategy = FSDPStrategy(..., {', '.join(lines)})\n")
    return StackForm(LIGHTNING, where, changes, text)


def _deepspeed(rec: Recording, change: _Change) -> StackForm:
    where = ("the DeepSpeed JSON config's zero_optimization (deepspeed.initialize(config=...), the HF Trainer's "
             "deepspeed=..., accelerate's deepspeed_config_file)")
    limits = ("stage3_max_live_parameters caps what is fetched ahead (min(max_live - parameters live, bucket)) and "
              "parameters under stage3_param_persistence_threshold are never partitioned, so never fetched: both "
              "stay as recorded, and a max_live below the bucket holds it back; an \"auto\" bucket (the HF Trainer "
              "fills it as 0.9 * hidden_size ** 2) is replaced by the number")
    if change.bucket is None:
        return StackForm(DEEPSPEED, where, {}, "{}\n", "as recorded")
    changes = {"zero_optimization.stage3_prefetch_bucket_size": change.bucket}
    # plain JSON (the keys to set in the user's config, the others kept): the HF Trainer and accelerate
    # read it with json.load, so the prediction's comment lines are not in it
    text = json.dumps({"zero_optimization": {"stage3_prefetch_bucket_size": change.bucket}}, indent=2) + "\n"
    return StackForm(DEEPSPEED, where, changes, text, limits)


def set_keys(config: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``config`` with ``changes`` set (``a.b`` keys into nested objects), the rest kept: how a user (or a
    test) applies a form's changes to their own config."""
    out = json.loads(json.dumps(config))
    for key, value in changes.items():
        *path, last = key.split(".")
        node = out
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def _py(changes: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k!r}: {v!r}" for k, v in changes.items()).replace("'", '"') + "}"


def _yaml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
