"""The recording options and how they travel from the launcher to every rank.

``fsdpviz record`` runs the user's command unchanged, so the only channel to the training
processes is their environment: the launcher encodes :class:`RecordOptions` as ``FSDPVIZ_*``
variables and the rank-side agent decodes them. Both sides import this module, which therefore
imports neither torch nor anything heavy.

The run folder's file names are :mod:`fsdpviz.runfolder`'s.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final, Literal

Mode = Literal["profile", "timers", "both"]
MODES: Final = ("profile", "timers", "both")

# --- environment ---------------------------------------------------------------------------------
ENV_RUN_DIR: Final = "FSDPVIZ_RUN_DIR"  # set = record in this process tree
ENV_STEPS: Final = "FSDPVIZ_STEPS"
ENV_WARMUP: Final = "FSDPVIZ_WARMUP"
ENV_MODE: Final = "FSDPVIZ_MODE"
ENV_MEMORY: Final = "FSDPVIZ_MEMORY"
ENV_STACK: Final = "FSDPVIZ_STACK"
ENV_UNIT_TIMER_STEPS: Final = "FSDPVIZ_UNIT_TIMER_STEPS"
# Set by a process that records, so that its own children (helpers, dataloader workers) don't.
ENV_OWNER_PID: Final = "FSDPVIZ_OWNER_PID"
ENV_RUN_ID: Final = "FSDPVIZ_RUN_ID"  # the recording's id, written into every trace (runfolder.TRACE_RUN_ID_KEY)
# Time-window fallback for scripts that never step a torch optimizer (seconds).
ENV_FALLBACK_AFTER_S: Final = "FSDPVIZ_FALLBACK_AFTER_S"
ENV_WINDOW_S: Final = "FSDPVIZ_WINDOW_S"
# The bootstrap folder exactly as ``fsdpviz record`` put it on PYTHONPATH: a rank takes that entry out
# again even where its own import of fsdpviz names the folder by another path (a symlink, another copy)
ENV_BOOTSTRAP: Final = "FSDPVIZ_BOOTSTRAP"

# What ``fsdpviz record`` adds to the command's environment; a recording rank takes them out again
# (agent.py), so that the script sees the environment of a bare run.
LAUNCHER_VARIABLES: Final = (ENV_RUN_DIR, ENV_STEPS, ENV_WARMUP, ENV_MODE, ENV_MEMORY, ENV_STACK, ENV_UNIT_TIMER_STEPS,
                             ENV_OWNER_PID, ENV_RUN_ID, ENV_FALLBACK_AFTER_S, ENV_WINDOW_S, ENV_BOOTSTRAP)

DEFAULT_STEPS: Final = 3
# Step 0 warms up (allocation, caches), step 1 warms the profiler up, steps 2-4 are profiled: a script of
# 5 steps gets a full trace. The run's step time comes from the clean steps timed after the profiled
# ones (the steady pace; docs/recording.md, "The schedule"), so 8 steps give the full headline.
DEFAULT_WARMUP: Final = 2
# Per-unit timers run in their own steps, never in the clean ones the step time is measured on. One by
# default: the step after the trace export, which is never a clean step anyway (docs/recording.md).
DEFAULT_UNIT_TIMER_STEPS: Final = 1
DEFAULT_FALLBACK_AFTER_S: Final = 10.0
DEFAULT_WINDOW_S: Final = 5.0


@dataclass(frozen=True, kw_only=True, slots=True)
class RecordOptions:
    """What to record. Checked on construction so that both sides see only valid options."""

    run_dir: Path
    """The run folder (absolute)."""
    steps: int = DEFAULT_STEPS
    """Optimizer steps to profile with torch.profiler."""
    warmup: int = DEFAULT_WARMUP
    """Optimizer steps before profiling; the last of them warms the profiler up. The run's step time
    comes from the unprofiled steps timed after the profiled ones (and before them, with a larger value)."""
    mode: Mode = "both"
    """``profile``: torch.profiler traces only; ``timers``: per-step timers only; ``both``."""
    memory: bool = True
    """Record allocator events in the traces (``profile_memory``) and peak memory per step."""
    stack: bool = False
    """Record each op's Python stack in the traces (``with_stack``: the Python frames and the
    ``nn.Module`` forwards an op runs in): where an op comes from, in Perfetto. The profiled steps ran
    1.3-1.8x their clean pace on the example trainer's 2 CPU ranks, against 1.0-1.4x with
    ``--no-memory``; the clean steps the step time comes from are not profiled and do not pay it."""
    unit_timer_steps: int = DEFAULT_UNIT_TIMER_STEPS
    """Steps, right after the profiled ones, whose units the timers clock (per-unit intervals): never clean
    steps, so the run's step time is measured on steps the recorder only marks the ends (and on a CPU the
    phases) of."""
    fallback_after_s: float = DEFAULT_FALLBACK_AFTER_S
    """Start a time-window recording if no optimizer has stepped this long after the first forward."""
    window_s: float = DEFAULT_WINDOW_S
    """Length of that time window."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"--steps must be at least 1, got {self.steps}")
        if self.warmup < 0:
            raise ValueError(f"--warmup must be 0 or more, got {self.warmup}")
        if self.unit_timer_steps < 0:
            raise ValueError(f"--unit-timer-steps must be 0 or more, got {self.unit_timer_steps}")
        if self.mode not in MODES:
            raise ValueError(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.fallback_after_s <= 0 or self.window_s <= 0:
            raise ValueError("time-window settings must be positive")

    @property
    def profile(self) -> bool:
        return self.mode in ("profile", "both")

    @property
    def timers(self) -> bool:
        return self.mode in ("timers", "both")

    def to_env(self) -> dict[str, str]:
        """The ``FSDPVIZ_*`` variables that carry these options to the ranks."""
        return {
            ENV_RUN_DIR: str(self.run_dir),
            ENV_STEPS: str(self.steps),
            ENV_WARMUP: str(self.warmup),
            ENV_MODE: self.mode,
            ENV_MEMORY: "1" if self.memory else "0",
            ENV_STACK: "1" if self.stack else "0",
            ENV_UNIT_TIMER_STEPS: str(self.unit_timer_steps),
            ENV_FALLBACK_AFTER_S: repr(self.fallback_after_s),
            ENV_WINDOW_S: repr(self.window_s),
        }

    def to_json(self) -> dict[str, object]:
        """The options as recorded in run.json."""
        data = asdict(self)
        data["run_dir"] = str(self.run_dir)
        return data


def options_from_env(env: Mapping[str, str] | None = None) -> RecordOptions | None:
    """Decode the options a launcher left in ``env``; ``None`` when not running under ``fsdpviz record``."""
    env = os.environ if env is None else env
    run_dir = env.get(ENV_RUN_DIR)
    if not run_dir:
        return None
    return RecordOptions(
        run_dir=Path(run_dir),
        steps=int(env.get(ENV_STEPS, DEFAULT_STEPS)),
        warmup=int(env.get(ENV_WARMUP, DEFAULT_WARMUP)),
        mode=env.get(ENV_MODE, "both"),  # type: ignore[arg-type]  # checked in __post_init__
        memory=env.get(ENV_MEMORY, "1") != "0",
        stack=env.get(ENV_STACK, "0") == "1",
        unit_timer_steps=int(env.get(ENV_UNIT_TIMER_STEPS, DEFAULT_UNIT_TIMER_STEPS)),
        fallback_after_s=float(env.get(ENV_FALLBACK_AFTER_S, DEFAULT_FALLBACK_AFTER_S)),
        window_s=float(env.get(ENV_WINDOW_S, DEFAULT_WINDOW_S)),
    )
