"""What a finding's suggested knob would gain, predicted: the words the report adds to a finding.

A finding suggests a knob only where the trace shows its cause (``analysis/findings.py``). Where the
model covers that knob -- explicit prefetch, one unit more of prefetch, keeping the first backward
unit's parameters -- the knob is predicted on the recording and the finding quotes the result:
``predicted -8.2 ms/step (-12 %), peak +3.0 MiB``.
"""

from __future__ import annotations

from collections.abc import Iterable

from fsdpviz.errors import FsdpvizError
from fsdpviz.formatting import MIB
from fsdpviz.whatif.predict import Model, predict
from fsdpviz.whatif.settings import Settings


def setting_for(knob: str, model: Model) -> Settings | None:
    """The setting a finding's knob text stands for, or None when the model does not cover it."""
    rec = model.recording
    depth = int(rec.prefetch) if rec.prefetch.isdigit() else 0
    if knob.startswith("reshard_after_forward=False for "):
        return Settings().with_(keep_last_units=1)
    if knob.startswith("prefetch one more unit ahead") or "stage3_prefetch_bucket_size" in knob:
        return Settings().with_(prefetch=str(max(depth, 1) + 1))
    if "prefetch" in knob and depth == 0:  # FSDP2's set_modules_to_*_prefetch, FSDP1's forward/backward_prefetch
        return Settings().with_(prefetch="1")
    return None


def describe_gain(model: Model, settings: Settings) -> str:
    """``predicted -8.2 ms/step (-12 %), peak +3.0 MiB`` for ``settings``; "" when it cannot be predicted."""
    try:
        p = predict(model, settings)
    except FsdpvizError:
        return ""
    base, new = p.baseline, p.predicted
    diff = new.step_time_ms - base.step_time_ms
    text = f"predicted {diff:+.2f} ms/step"
    if base.step_time_ms:
        text += f" ({100 * diff / base.step_time_ms:+.1f} %)"
    if base.peak_allocated_bytes is not None and new.peak_allocated_bytes is not None:
        text += f", peak {(new.peak_allocated_bytes - base.peak_allocated_bytes) / MIB:+.1f} MiB"
    return text


def gains(model: Model, knobs: Iterable[str]) -> dict[str, str]:
    """Knob text -> the predicted gain, for the knobs the model covers (each predicted once)."""
    out: dict[str, str] = {}
    done: dict[str, str] = {}
    for knob in dict.fromkeys(k for k in knobs if k):
        settings = setting_for(knob, model)
        if settings is None:
            continue
        key = settings.describe()
        if key not in done:
            done[key] = describe_gain(model, settings)
        if done[key]:
            out[knob] = f"{done[key]} (fsdpviz whatif: {key})"
    return out
