"""The example trainer, pausing after optimizer step K so that a test can signal it at a known point.

    torchrun --nproc_per_node 2 pausing_train.py K MARKER_DIR [examples/train.py flags...]

After step K every rank writes ``MARKER_DIR/rank{R}.pid`` (its pid) and sleeps for up to a
minute, as a rank stuck in a collective or a slow data loader would; a signal ends the pause the
way it would end real work: SIGINT raises KeyboardInterrupt, SIGTERM runs the handlers.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "train.py"
PAUSE_S = 60.0


def main() -> None:
    pause_at, marker_dir = int(sys.argv[1]), Path(sys.argv[2])
    example = runpy.run_path(str(EXAMPLE))
    args = example["parse_args"](sys.argv[3:])
    rank = os.environ.get("RANK", "0")

    def after_step(step: int, loss: float) -> None:
        if step == pause_at:
            marker = marker_dir / f"rank{rank}.pid"
            marker.with_suffix(".tmp").write_text(str(os.getpid()))
            marker.with_suffix(".tmp").replace(marker)
            time.sleep(PAUSE_S)

    example["train"](args, after_step=after_step)


if __name__ == "__main__":
    main()
