"""The advised setting as each stack takes it (fsdpviz/whatif/stacks.py), read back through the stacks'
own code: transformers' ``TrainingArguments`` builds accelerate's FSDP plugin arguments from the
written ``fsdp_config``, ``accelerate launch``'s own parser and environment build the plugin from the
written flags, Lightning's ``FSDPStrategy`` keeps the written keywords for FSDP1, and DeepSpeed's
``DeepSpeedZeroConfig`` reads the written JSON. Only what the setting changes is written; what a stack
cannot say has no form and says why.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from fsdpviz.naming import ROOT_UNIT
from fsdpviz.replay.recorded import Recording
from fsdpviz.replay.settings import GIVEN, Settings, Wrap
from fsdpviz.vocabulary import FSDP1, FSDP2, ZERO3
from fsdpviz.whatif.apply import apply_code
from fsdpviz.whatif.stacks import (
    ACCELERATE,
    DEEPSPEED,
    HF_TRAINER,
    LIGHTNING,
    launch_flags,
    launched_by,
    set_keys,
)

UNITS = [ROOT_UNIT, "blocks.0", "blocks.1", "blocks.2"]
PARAMS = {ROOT_UNIT: ["embed.weight"], **{u: [f"{u}.fc.weight"] for u in UNITS[1:]}}
HF_BASE = {"transformer_layer_cls_to_wrap": ["Block"]}  # the user's own fsdp_config, kept


def _recording(framework: str, prefetch: str = "implicit", prefetch_args: dict[str, object] | None = None,
               ) -> Recording:
    return Recording(framework=framework, device="cpu", world_size=2, units=list(UNITS),
                     unit_bytes=dict.fromkeys(UNITS, 4096), modules={u: [u] for u in UNITS},
                     reshard_after_forward={u: u != ROOT_UNIT for u in UNITS}, prefetch=prefetch, steps=[],
                     ranks_per_host=2, cpu_count=0, prefetch_args=prefetch_args or {},
                     prefetch_depths=(0, 0) if framework == FSDP2 else None,
                     unit_numels=dict.fromkeys(UNITS, 1024))


def _forms(rec: Recording, settings: Settings) -> dict[str, dict[str, Any]]:
    apply = apply_code(rec, PARAMS, settings, "test")
    return {f.stack: f.to_json() for f in apply.stacks}


def _hf_plugin_args(fsdp_config: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """What transformers hands accelerate's FSDP plugin for ``fsdp_config``."""
    transformers = pytest.importorskip("transformers")
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), use_cpu=True, report_to=[],
                                          fsdp="full_shard auto_wrap", fsdp_config=dict(fsdp_config))
    return dict(args.fsdp_plugin_args)


def _accelerate_plugin(flags: list[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """accelerate's FSDP plugin as ``accelerate launch FLAGS`` builds it in a worker (its parser, its
    environment, the plugin reading that environment)."""
    pytest.importorskip("accelerate")
    from accelerate.commands.launch import launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
                                               "--dynamo_backend", "no", "--use_fsdp", *flags, "train.py"])
    for key, value in prepare_multi_gpu_env(args).items():
        if key.startswith("FSDP_"):
            monkeypatch.setenv(key, value)
    return FullyShardedDataParallelPlugin()


RESHARD_FALSE = Settings(reshard_after_forward=False, sources={"reshard_after_forward": GIVEN})
ROOT = Settings(wrap=Wrap("root"), sources={"wrap": GIVEN})


def test_fsdp2_reshard_false_in_each_stacks_own_terms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    forms = _forms(_recording(FSDP2), RESHARD_FALSE)
    assert forms[HF_TRAINER]["changes"] == {"reshard_after_forward": False}
    plugin = _hf_plugin_args(set_keys(HF_BASE, forms[HF_TRAINER]["changes"]), tmp_path)
    # the change, and the user's own wrap kept
    assert plugin["reshard_after_forward"] is False and plugin["transformer_cls_names_to_wrap"] == "Block"
    assert plugin["fsdp_version"] == 2
    assert forms[ACCELERATE]["changes"] == {"fsdp_reshard_after_forward": False}
    recorded = ["--fsdp_version", "2", "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP",
                "--fsdp_transformer_layer_cls_to_wrap", "Block"]
    assert _accelerate_plugin(recorded, monkeypatch).reshard_after_forward is True
    accelerated = _accelerate_plugin([*recorded, *launch_flags(forms[ACCELERATE]["changes"])], monkeypatch)
    assert accelerated.reshard_after_forward is False and accelerated.transformer_cls_names_to_wrap == ["Block"]
    assert "fsdp_reshard_after_forward: false" in forms[ACCELERATE]["text"]
    # Lightning's ModelParallelStrategy runs the user's fully_shard calls: the code form inside parallelize
    assert "fully_shard(m(\"blocks.2\"), reshard_after_forward=False" in forms[LIGHTNING]["text"]
    assert 'def parallelize(model, device_mesh):' in forms[LIGHTNING]["text"]


def test_fsdp2_root_wrap_cannot_be_said_by_accelerate(monkeypatch: pytest.MonkeyPatch) -> None:
    """accelerate's NO_WRAP is a policy of no blocks, yet under FSDP2 accelerate still shards the embedding
    and [final norm, lm_head] apart (the HF Trainer's recording of NO_WRAP holds three units): no form."""
    forms = _forms(_recording(FSDP2), ROOT)
    for stack in (HF_TRAINER, ACCELERATE):
        assert forms[stack]["text"] is None and "fsdp2_prepare_model" in forms[stack]["note"]
    plugin = _accelerate_plugin(["--fsdp_version", "2", "--fsdp_auto_wrap_policy", "NO_WRAP"], monkeypatch)
    assert plugin.auto_wrap_policy is None  # the policy is off; the carving is fsdp2_prepare_model's own


@pytest.mark.parametrize("settings, why", [
    (Settings(wrap=Wrap("merge", k=2), sources={"wrap": GIVEN}), "wraps by module class"),
    (Settings(keep_last_units=2, sources={"keep_last_units": GIVEN}), "every unit at once"),
    (Settings(prefetch="2", sources={"prefetch": GIVEN}), "not supported in FSDP2"),
], ids=["merge2", "keep-last-2", "prefetch2"])
def test_what_the_hf_trainer_and_accelerate_cannot_say_points_at_the_code(settings: Settings, why: str) -> None:
    forms = _forms(_recording(FSDP2), settings)
    for stack in (HF_TRAINER, ACCELERATE):
        assert forms[stack]["text"] is None and forms[stack]["changes"] == {}
        assert why in forms[stack]["note"] and "--code --stack code" in forms[stack]["note"]


def test_fsdp1_prefetch_writes_only_the_arguments_it_changes(tmp_path: Path) -> None:
    """Recorded BACKWARD_POST without forward prefetch: prefetch 1 adds forward prefetch and keeps
    POST; none turns backward prefetch off; a wrap change writes no prefetch key at all."""
    rec = _recording(FSDP1, prefetch="implicit",
                     prefetch_args={"forward_prefetch": False, "backward_prefetch": "BACKWARD_POST"})
    one = _forms(rec, Settings(prefetch="1", sources={"prefetch": GIVEN}))
    assert one[HF_TRAINER]["changes"] == {"forward_prefetch": True}
    plugin = _hf_plugin_args(set_keys({**HF_BASE, "version": 1, "backward_prefetch": "BACKWARD_POST"},
                                      one[HF_TRAINER]["changes"]), tmp_path)
    assert (plugin["forward_prefetch"], plugin["backward_prefetch"]) == (True, "BACKWARD_POST")
    assert one[ACCELERATE]["changes"] == {"fsdp_forward_prefetch": True}
    none = _forms(rec, Settings(prefetch="none", sources={"prefetch": GIVEN}))
    assert none[HF_TRAINER]["changes"] == {"backward_prefetch": "NO_PREFETCH"}
    assert none[LIGHTNING]["changes"] == {"backward_prefetch": None}
    root = _forms(rec, ROOT)
    assert root[HF_TRAINER]["changes"] == {"auto_wrap_policy": "NO_WRAP"}
    assert root[LIGHTNING]["changes"] == {"auto_wrap_policy": None}


def test_fsdp1_lightning_strategy_takes_the_written_arguments() -> None:
    pytest.importorskip("lightning")
    from lightning.pytorch.strategies import FSDPStrategy
    from torch.distributed.fsdp import BackwardPrefetch

    rec = _recording(FSDP1, prefetch="none", prefetch_args={"forward_prefetch": False, "backward_prefetch": None})
    form = _forms(rec, Settings(prefetch="1", sources={"prefetch": GIVEN}))[LIGHTNING]
    assert form["changes"] == {"forward_prefetch": True, "backward_prefetch": "BACKWARD_PRE"}
    assert "FSDPStrategy(..., forward_prefetch=True, backward_prefetch=BackwardPrefetch.BACKWARD_PRE)" in form["text"]
    kwargs = {k: getattr(BackwardPrefetch, v) if k == "backward_prefetch" else v for k, v in form["changes"].items()}
    strategy = FSDPStrategy(**kwargs)
    assert strategy.kwargs["backward_prefetch"] is BackwardPrefetch.BACKWARD_PRE and strategy.kwargs["forward_prefetch"]


def test_zero3_bucket_in_the_deepspeed_json() -> None:
    pytest.importorskip("deepspeed")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    rec = _recording(ZERO3, prefetch="implicit", prefetch_args={"stage3_prefetch_bucket_size": 50_000_000})
    form = _forms(rec, Settings(prefetch="2", sources={"prefetch": GIVEN}))[DEEPSPEED]
    assert form["changes"] == {"zero_optimization.stage3_prefetch_bucket_size": 2048}  # two units of 1024
    user = {"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": "auto",
                                  "stage3_max_live_parameters": 10**9}}
    config = set_keys(user, form["changes"])
    zero = DeepSpeedZeroConfig(**config["zero_optimization"])
    assert zero.prefetch_bucket_size == 2048 and zero.max_live_parameters == 10**9
    assert "stage3_max_live_parameters" in form["note"] and "stage3_param_persistence_threshold" in form["note"]
    kept = _forms(rec, Settings())[DEEPSPEED]
    assert kept["changes"] == {} and kept["note"] == "as recorded"


def test_the_deepspeed_form_is_json_the_hf_trainer_and_accelerate_read(capsys: pytest.CaptureFixture[str],
                                                                      tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``whatif --code --stack deepspeed`` prints plain JSON: transformers' ``HfDeepSpeedConfig`` (what the
    HF Trainer's ``deepspeed=`` and accelerate's ``deepspeed_config_file`` read, with ``json.load``) takes
    the file as printed. The prediction's comment lines go to stderr beside it, with -q too."""
    import json

    pytest.importorskip("transformers")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    from helpers.cli import run_here
    from transformers.integrations import HfDeepSpeedConfig

    sample = Path(__file__).parents[2] / "sample_traces" / "zero3-cpu-2rank"
    done = run_here(capsys, "whatif", str(sample), "--prefetch", "1", "--code", "--stack", "deepspeed", "--no-cache", "-q")
    assert done.returncode == 0, done.stderr
    (tmp_path / "ds.json").write_text(done.stdout)
    config = HfDeepSpeedConfig(str(tmp_path / "ds.json"))
    bucket = json.loads(done.stdout)["zero_optimization"]["stage3_prefetch_bucket_size"]
    assert config.get_value("zero_optimization.stage3_prefetch_bucket_size") == bucket > 0
    assert "# fsdpviz whatif: prefetch 1" in done.stderr and "measurable" in done.stderr


def test_an_hf_trainer_form_asked_of_deepspeed_points_to_its_config_file(capsys: pytest.CaptureFixture[str]) -> None:
    """An HF Trainer user of ZeRO-3 asks for the Trainer's form first: the one error line names the form
    that run takes (its DeepSpeed config file), exit code 2."""
    from helpers.cli import run_here

    sample = Path(__file__).parents[2] / "sample_traces" / "zero3-cpu-2rank"
    done = run_here(capsys, "whatif", str(sample), "--prefetch", "1", "--code", "--stack", "hf_trainer", "--no-cache",
                    "-q")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "error: --stack hf_trainer: no form for a zero3 recording (forms: code, deepspeed); a hf_trainer run of "
        "DeepSpeed takes the deepspeed form in the config file it passes")


@pytest.mark.parametrize("command, stack", [
    (["/v/bin/python", "-m", "accelerate.commands.launch", "--use_fsdp", "train.py"], ACCELERATE),
    (["accelerate", "launch", "train.py"], ACCELERATE),
    (["/usr/bin/deepspeed", "--num_gpus", "2", "train.py"], DEEPSPEED),
    (["fabric", "run", "train.py"], LIGHTNING),
    (["torchrun", "--nproc_per_node", "2", "train.py"], ""),
    (["python", "hf_trainer.py", "--deepspeed", "ds.json"], ""),
])
def test_the_launcher_names_the_stack(command: list[str], stack: str) -> None:
    assert launched_by(command) == stack
