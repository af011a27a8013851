"""A Hugging Face ``Trainer`` run with FSDP, the way its users write it (a tiny Llama from a config).

    torchrun --nproc_per_node 2 tests/clients/hf_trainer.py --log-losses out-{rank}.txt

``fsdp="full_shard auto_wrap"`` with the decoder layer as the wrap class asks accelerate for FSDP2.
On a machine without GPUs accelerate runs the processes as ``MULTI_CPU`` and silently wraps the
model in ``DistributedDataParallel`` instead. ``--force-fsdp`` makes accelerate take the FSDP path
anyway (its state says a multi-GPU job before the Accelerator is created, so the FSDP plugin is
applied; the model stays on the CPU), which is how FSDP can be exercised on CPU. ``--fsdp-config FILE``
passes a JSON file as ``fsdp_config``, as HF users keep it (``TrainingArguments`` reads the file itself).
"""

from __future__ import annotations

import argparse
import os

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

VOCAB, SEQ = 128, 16


class Tokens(Dataset):
    """Fixed random token sequences (the same in every run)."""

    def __init__(self, n: int) -> None:
        generator = torch.Generator().manual_seed(7)
        self.data = torch.randint(VOCAB, (n, SEQ), generator=generator)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.data[i], "labels": self.data[i]}


class LossLog(TrainerCallback):
    """Each step's training loss, as this rank's Trainer logged it."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))


def force_fsdp() -> None:
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    PartialState().distributed_type = DistributedType.MULTI_GPU


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--force-fsdp", action="store_true")
    parser.add_argument("--log-losses", default="")
    parser.add_argument("--out", default="hf-out")
    parser.add_argument("--fsdp-config", default=None, help="a JSON file for TrainingArguments(fsdp_config=...)")
    parser.add_argument("--tie-embeddings", action="store_true", help="the output layer shares the input embedding")
    args = parser.parse_args()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=SEQ,
                         tie_word_embeddings=args.tie_embeddings)
    model = LlamaForCausalLM(config)
    training = TrainingArguments(
        output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=2, learning_rate=1e-3,
        logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0,
        fsdp="full_shard auto_wrap",
        fsdp_config=args.fsdp_config or {"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]},
        seed=0, disable_tqdm=True,
    )
    if args.force_fsdp:
        force_fsdp()
    log = LossLog()
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(64), callbacks=[log])
    trainer.train()
    if args.log_losses:
        with open(args.log_losses.format(rank=int(os.environ.get("RANK", "0"))), "w") as out:
            out.writelines(f"{i} {v.hex()}\n" for i, v in enumerate(log.losses))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
