"""The example trainer whose data loader fails on purpose: fetching the batch of step K raises
``OSError`` on rank 0, before that step's forward, as a loader whose file went missing does.

    torchrun --nproc_per_node 2 failing_loader_train.py K [examples/train.py flags...]

Rank 1 then fails too (its peer is gone) or is stopped by torchrun, as in a real crash.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "train.py"


class FailingBatches(Sequence):
    """The example's batches, read step by step; the read of step ``fail_at``'s raises on rank 0."""

    def __init__(self, batches: list[Any], fail_at: int, per_step: int) -> None:
        self.batches, self.fail_at, self.per_step = batches, fail_at, per_step

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: Any) -> Any:
        first = index.start if isinstance(index, slice) else index
        if first == self.fail_at * self.per_step and os.environ.get("RANK") == "0":
            raise OSError(f"injected data loader failure at step {self.fail_at}")
        return self.batches[index]


def main() -> None:
    fail_at = int(sys.argv[1])
    example = runpy.run_path(str(EXAMPLE))
    args = example["parse_args"](sys.argv[2:])
    make_batches = example["make_batches"]
    train = example["train"]
    train.__globals__["make_batches"] = lambda a, ddp: FailingBatches(make_batches(a, ddp), fail_at, a.grad_accum)
    train(args)


if __name__ == "__main__":
    main()
