"""The example trainer, failing on purpose: ``RuntimeError`` after optimizer step K on rank 0.

    torchrun --nproc_per_node 2 failing_train.py K [examples/train.py flags...]

Rank 1 then fails too (its peer is gone) or is stopped by torchrun, as in a real crash.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "train.py"


def main() -> None:
    fail_at = int(sys.argv[1])
    example = runpy.run_path(str(EXAMPLE))
    args = example["parse_args"](sys.argv[2:])

    def after_step(step: int, loss: float) -> None:
        if step == fail_at and os.environ.get("RANK") == "0":
            raise RuntimeError(f"injected failure at step {step}")

    example["train"](args, after_step=after_step)


if __name__ == "__main__":
    main()
