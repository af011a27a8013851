"""The example trainer, also starting a plain Python helper process from each rank.

    torchrun --nproc_per_node 2 spawning_train.py OUT_DIR [examples/train.py flags...]

The helper imports torch (so an agent would arm if the helper were mistaken for a rank) and
writes ``OUT_DIR/helper-rank{R}.json``: its pid and whether fsdpviz's agent module is loaded.
A dataloader-like worker is also forked after training started, and reports the same.
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "train.py"
HELPER = (
    "import json, os, sys, torch\n"
    "json.dump({'pid': os.getpid(), 'agent_loaded': 'fsdpviz.record.agent' in sys.modules,\n"
    "           'owner_pid': os.environ.get('FSDPVIZ_OWNER_PID'),\n"
    "           'fsdpviz_env': sorted(k for k in os.environ if k.startswith('FSDPVIZ_'))}, open(sys.argv[1], 'w'))\n"
)


def report_forked(path: Path) -> None:
    """Fork a child (as a fork-based dataloader worker would) that reports whether it would record."""
    pid = os.fork()
    if pid == 0:
        from fsdpviz.record import agent

        a = agent.current()
        path.write_text(json.dumps({"pid": os.getpid(), "agent_active": bool(a and a.recording and not a.finished)}))
        os._exit(0)
    os.waitpid(pid, 0)


def main() -> None:
    out_dir = Path(sys.argv[1])
    example = runpy.run_path(str(EXAMPLE))
    args = example["parse_args"](sys.argv[2:])
    rank = os.environ.get("RANK", "0")

    def after_step(step: int, loss: float) -> None:
        if step == 1:  # after the agent started recording in this rank
            subprocess.run([sys.executable, "-c", HELPER, str(out_dir / f"helper-rank{rank}.json")], check=True)
            report_forked(out_dir / f"forked-rank{rank}.json")

    example["train"](args, after_step=after_step)


if __name__ == "__main__":
    main()
