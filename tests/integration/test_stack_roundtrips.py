"""The advised setting in the user's own stack's terms, recorded for real: record a client program of
``tests/clients/``, ask whatif for a setting, apply the keys its stack form writes the way that stack's
users do (a JSON ``fsdp_config`` file for the HF Trainer, accelerate's config file for ``accelerate
launch --config_file``, Lightning Fabric's ``parallelize_fn`` for its FSDP2 strategy, a DeepSpeed JSON
config file), record again.

The second run.json -- what the recorder read from FSDP's and DeepSpeed's own state -- must hold the
predicted units with the written setting, the peak must be within 3 % of the prediction (on CPU the
allocator's peak is exact; the round trip's target in docs/whatif.md), and the losses must be the first
run's bit for bit where the setting leaves the maths alone. Marker ``clients`` (``make test-clients``).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.jobs import NO_OUTPUT, REPO, fsdpviz, record_env, retried, torchrun, unused_port
from helpers.roundtrip import losses, peak_bytes, recorded_units, typical_peak, whatif_json

from fsdpviz.whatif.stacks import ACCELERATE, DEEPSPEED, HF_TRAINER, LIGHTNING, set_keys

pytestmark = [pytest.mark.slow, pytest.mark.clients]

CLIENTS = REPO / "tests" / "clients"
STEPS = ("--steps", "6")
RECORD = (*NO_OUTPUT, "--warmup", "2", "--steps", "3")
HF_CONFIG = {"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}  # the client's own fsdp_config
# tests/clients/accelerate_loop.py's FSDP2 per block, as its user keeps it: an accelerate config file
# (accelerate reads a .json one as it reads its YAML)
ACCELERATE_CONFIG = {
    "compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP", "num_machines": 1, "num_processes": 2,
    "machine_rank": 0, "mixed_precision": "no",
    "fsdp_config": {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                    "fsdp_transformer_layer_cls_to_wrap": "Block"},
}
DS_CONFIG = {  # tests/clients/deepspeed_json.py's own config, as its user keeps it in a file
    "train_micro_batch_size_per_gpu": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    "steps_per_print": 10**9,
}


def _record(run_dir: Path, script: str, *args: str, env: dict[str, str] | None = None,
            launcher: tuple[str, ...] = ()) -> Path:
    """``script`` recorded into ``run_dir`` under torchrun, or under ``launcher`` (its command line)."""
    logged = (*STEPS, *args, "--log-losses", f"{run_dir}.loss-{{rank}}")
    command = [*launcher, str(CLIENTS / script), *logged] if launcher else torchrun(CLIENTS / script, *logged)
    proc = retried(lambda: fsdpviz("record", "--out", str(run_dir), *RECORD, "--", *command,
                                   env=record_env(**(env or {})), timeout=600),
                   tidy=lambda: shutil.rmtree(run_dir, ignore_errors=True))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def _form(predicted: dict[str, Any], stack: str) -> dict[str, Any]:
    return next(f for f in predicted["apply"]["stacks"] if f["stack"] == stack)


@pytest.fixture(scope="module")
def hf_trainer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    return _record(tmp_path_factory.mktemp("hf") / "hf-trainer", "hf_trainer.py", "--force-fsdp", "--out",
                   str(tmp_path_factory.mktemp("hf-out")))


def test_hf_trainer_fsdp_config_records_the_predicted_units(hf_trainer: Path) -> None:
    """The HF Trainer (FSDP2 through accelerate), reshard after forward false: the written ``fsdp_config``
    key, merged into the client's own config and passed as a JSON file, gives the predicted units (each
    kept gathered after forward) and peak."""
    predicted = whatif_json(hf_trainer, "--reshard-after-forward", "false")
    form = _form(predicted, HF_TRAINER)
    assert form["changes"] == {"reshard_after_forward": False} and form["text"] is not None
    config = hf_trainer.parent / "fsdp_config.json"
    config.write_text(json.dumps(set_keys(HF_CONFIG, form["changes"])))
    again = _record(hf_trainer.parent / "hf-reshard-false", "hf_trainer.py", "--force-fsdp", "--fsdp-config",
                    str(config), "--out", str(hf_trainer.parent / "hf-out"))
    _kept_gathered_as_predicted(again, predicted, hf_trainer)


def test_hf_trainer_says_it_cannot_wrap_the_model_as_one_unit(hf_trainer: Path) -> None:
    """accelerate's FSDP2 shards the embedding and [norm, lm_head] apart whatever the policy (recorded:
    the per-layer run's units): whatif --wrap root has no fsdp_config form, and says why."""
    assert {"model.embed_tokens", "[model.norm, lm_head]"} <= set(recorded_units(hf_trainer))
    form = _form(whatif_json(hf_trainer, "--wrap", "root"), HF_TRAINER)
    assert form["text"] is None and "fsdp2_prepare_model" in form["note"]
    proc = fsdpviz("whatif", str(hf_trainer), "--wrap", "root", "--code", "--stack", HF_TRAINER, "-q")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "fsdp2_prepare_model" in proc.stderr


def _kept_gathered_as_predicted(again: Path, predicted: dict[str, Any], base: Path) -> None:
    """The run recorded again under the written "reshard after forward false": the predicted units, each
    kept gathered after forward, the predicted peak within 3 %, and the first run's losses bit for bit."""
    recorded = recorded_units(again)
    assert list(recorded) == [u["name"] for u in predicted["predicted"]["units"]]
    assert {u["reshard_after_forward"] for u in recorded.values()} == {False}
    assert peak_bytes(again) == pytest.approx(predicted["predicted"]["peak_allocated_bytes"], rel=0.03)
    assert losses(again, ranks=2) == losses(base, ranks=2)


def _accelerate_launch(config: Path) -> tuple[str, ...]:
    return (sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
            "--main_process_port", str(unused_port()))


def test_accelerate_config_records_the_predicted_units(tmp_path: Path) -> None:
    """``accelerate launch`` with FSDP2 from its config file (``--force-fsdp``: accelerate applies its FSDP
    plugin on CPU ranks), reshard after forward false: the written ``fsdp_config`` key, set in the
    user's config file, gives the predicted units (each kept gathered after forward) and peak."""
    pytest.importorskip("accelerate")
    config = tmp_path / "accelerate.json"
    config.write_text(json.dumps(ACCELERATE_CONFIG))
    base = _record(tmp_path / "accelerate", "accelerate_loop.py", "--force-fsdp", launcher=_accelerate_launch(config))
    assert list(recorded_units(base)) == ["(root)", "blocks.0", "blocks.1"]  # the class policy, as accelerate ran it
    predicted = whatif_json(base, "--reshard-after-forward", "false")
    form = _form(predicted, ACCELERATE)
    assert form["changes"] == {"fsdp_reshard_after_forward": False}
    assert "--fsdp_reshard_after_forward false" in form["text"]
    changed = tmp_path / "accelerate-reshard-false.json"
    changed.write_text(json.dumps({**ACCELERATE_CONFIG, "fsdp_config": set_keys(ACCELERATE_CONFIG["fsdp_config"],
                                                                                 form["changes"])}))
    again = _record(tmp_path / "accelerate-reshard-false", "accelerate_loop.py", "--force-fsdp",
                    launcher=_accelerate_launch(changed))
    _kept_gathered_as_predicted(again, predicted, base)


def test_fabric_parallelize_records_the_predicted_units(tmp_path: Path) -> None:
    """Lightning Fabric's FSDP2 (``ModelParallelStrategy``, which runs on CPU ranks; ``FSDPStrategy``
    refuses them), reshard after forward false: the written ``parallelize(model, device_mesh)``, in
    place of the client's own, gives the predicted units (each kept gathered) and peak."""
    pytest.importorskip("lightning")
    fabric = (sys.executable,)  # Fabric starts its own processes
    base = _record(tmp_path / "fabric", "fabric_fsdp2.py", "--devices", "2", launcher=fabric)
    predicted = whatif_json(base, "--reshard-after-forward", "false")
    proc = fsdpviz("whatif", str(base), "--reshard-after-forward", "false", "--code", "--stack", LIGHTNING, "-q")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "def parallelize(model, device_mesh):" in proc.stdout
    code = tmp_path / "parallelize.py"
    code.write_text(proc.stdout)
    again = _record(tmp_path / "fabric-reshard-false", "fabric_fsdp2.py", "--devices", "2", "--parallelize",
                    str(code), launcher=fabric)
    assert [u["name"] for u in predicted["predicted"]["units"]] == ["(root)", "blocks.0", "blocks.1"]
    _kept_gathered_as_predicted(again, predicted, base)


@pytest.fixture(scope="module")
def zero3_json(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, Any]]:
    """The DeepSpeed client recorded from its JSON file, and again from the file with the keys whatif
    wrote for ``--prefetch 1``."""
    pytest.importorskip("deepspeed")
    env = {"DS_ACCELERATOR": "cpu"}
    folder = tmp_path_factory.mktemp("ds")
    config = folder / "ds_config.json"
    config.write_text(json.dumps(DS_CONFIG))
    base = _record(folder / "zero3", "deepspeed_json.py", "--deepspeed_config", str(config), env=env)
    predicted = whatif_json(base, "--prefetch", "1")
    changed = folder / "ds_config-prefetch1.json"
    changed.write_text(json.dumps(set_keys(DS_CONFIG, _form(predicted, DEEPSPEED)["changes"])))
    again = _record(folder / "zero3-prefetch1", "deepspeed_json.py", "--deepspeed_config", str(changed), env=env)
    return base, again, predicted


def test_zero3_json_key_records_the_predicted_bucket(zero3_json: tuple[Path, Path, dict[str, Any]]) -> None:
    """ZeRO-3 through its JSON: the written ``zero_optimization.stage3_prefetch_bucket_size`` is the bucket
    DeepSpeed ran with (read by the recorder from the engine), the units are unchanged, the maths too."""
    base, again, predicted = zero3_json
    bucket = predicted["predicted"]["settings"]["prefetch"]["arguments"]["stage3_prefetch_bucket_size"]
    assert _form(predicted, DEEPSPEED)["changes"] == {"zero_optimization.stage3_prefetch_bucket_size": bucket}
    recorded = recorded_units(again)
    assert {u["forward_prefetch"] for u in recorded.values() if u["forward_prefetch"] is not None} == {bucket}
    # the recorded units in forward order are the predicted ones (the root where it holds parameters)
    assert [u for u, v in recorded.items() if u != "(root)" or v["param_numel"]] == [
        u["name"] for u in predicted["predicted"]["units"]]
    assert losses(again, ranks=2) == losses(base, ranks=2)


def test_zero3_json_peak_within_3_percent(zero3_json: tuple[Path, Path, dict[str, Any]]) -> None:
    """The smaller bucket gathers the parameters in other sets, each flat buffer alive until its last
    parameter is waited for (replay/zero3_fetch.py, from DeepSpeed's coordinator): the peak falls by
    the default bucket's whole-model buffer, and the recording of the written JSON says by how much.
    The smaller bucket's many small gathers each leave gloo a buffer to let go of, late under load,
    so the recording is read at the peak most of its steps reach (:func:`typical_peak`); its highest
    step, which a late buffer can only raise, is never below the prediction by more than 3 %. (A
    recorded buffer gloo held into the next step, seen in a base recording under load, is the
    default bucket's: the prediction leaves it out, replay/memory.py ``_held_over``.)"""
    base, again, predicted = zero3_json
    peak = predicted["predicted"]["peak_allocated_bytes"]
    assert peak < 0.9 * peak_bytes(base)  # the change is no noise
    assert typical_peak(again) == pytest.approx(peak, rel=0.03)
    assert peak_bytes(again) >= 0.97 * peak
