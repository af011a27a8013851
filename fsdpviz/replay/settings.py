"""The settings a prediction changes, how they are written on the command line, and where each comes from.

``--wrap``: ``root`` (one unit), ``merge:K`` (every K consecutive non-root units in forward order
become one; the root stays), ``match:REGEX`` (the units are the modules whose FQN matches; the rest
stays in the root). ``--prefetch``: ``implicit`` (the framework's own default), ``none`` (an all-gather starts
only when its unit's compute needs it), ``N`` (explicit forward and backward prefetch of the next N
units). ``--reshard-after-forward``: for every non-root unit. ``--world-size``: the same model and
per-rank batch on N ranks; ``--gpus-per-node`` (ranks per host) and ``--inter-node-gbps`` say when
and how much slower collectives cross hosts.
"""

from __future__ import annotations

import math
import numbers
import operator
import re
import shlex
from dataclasses import dataclass, field, replace
from typing import Final, Literal

from fsdpviz.errors import UsageError

RECORDED: Final = "recorded"
GIVEN: Final = "given"
DEFAULT: Final = "default"
Source = Literal["recorded", "given", "default"]


@dataclass(frozen=True, slots=True)
class Wrap:
    """How units are formed: as recorded, one root unit, K-merges, or a module regex."""

    kind: Literal["recorded", "root", "merge", "match"] = "recorded"
    k: int = 1
    pattern: str = ""

    def __str__(self) -> str:
        return {"recorded": "recorded", "root": "root", "merge": f"merge:{self.k}",
                "match": f"match:{self.pattern}"}[self.kind]


@dataclass(frozen=True, slots=True)
class Settings:
    """One setting to predict. ``sources`` says, per field, recorded / given / default."""

    wrap: Wrap = Wrap()
    prefetch: str = "implicit"  # "implicit", "none" or a number of units
    reshard_after_forward: bool | None = None  # None: each unit as recorded
    keep_last_units: int = 0  # the last K non-root units in forward order keep their parameters (no reshard)
    world_size: int = 0
    gpus_per_node: int = 0
    inter_node_gbps: float = 0.0
    sources: dict[str, Source] = field(default_factory=dict)

    @property
    def prefetch_depth(self) -> int | None:
        """Explicit prefetch depth, or None for implicit / none."""
        return int(self.prefetch) if self.prefetch.isdigit() else None

    def prefetch_changed(self, recorded: str) -> bool:
        """Whether this setting changes the recording's prefetch (``recorded``: its depth): given, and
        other than recorded."""
        return self.sources.get("prefetch") == GIVEN and self.prefetch != recorded

    def to_json(self) -> dict[str, dict[str, object]]:
        values: dict[str, object] = {
            "wrap": str(self.wrap), "prefetch": self.prefetch,
            "reshard_after_forward": "recorded" if self.reshard_after_forward is None else self.reshard_after_forward,
            # none kept: each unit's resharding as recorded (as ``reshard_after_forward``), not a count
            # of 0 that ``--keep-last-units`` refuses; decided on the count, as the replay decides
            "keep_last_units": self.keep_last_units if self.keep_last_units > 0 else "recorded",
            "world_size": self.world_size, "gpus_per_node": self.gpus_per_node,
            "inter_node_gbps": self.inter_node_gbps,
        }
        return {k: {"value": v, "source": self.sources.get(k, RECORDED)} for k, v in values.items()}

    def describe(self) -> str:
        """The changed settings in one line (``prefetch 1, world size 16``), or ``as recorded``."""
        given = {k for k, v in self.sources.items() if v == GIVEN}
        if not given:
            return "as recorded"
        values = self.to_json()
        words = []
        for key in values:
            if key not in given:
                continue
            if key == "keep_last_units":
                n = self.keep_last_units
                words.append(f"no reshard after forward for the last {n} unit{'s' if n != 1 else ''}")
            else:
                value = values[key]["value"]
                words.append(f"{key.replace('_', ' ')} {str(value).lower() if isinstance(value, bool) else value}")
        return ", ".join(words)

    def flags(self) -> str:
        """The changed settings as ``fsdpviz whatif``'s options (``--wrap root --prefetch 2``,
        ``--keep-last-units 1``): every setting whatif predicts, the advisor's too, has its option."""
        given = {k for k, v in self.sources.items() if v == GIVEN}
        values = {k: v["value"] for k, v in self.to_json().items()}
        # a bool as the option spells it (true / false); a wrap's pattern as given, quoted for a shell
        return " ".join(f"--{key.replace('_', '-')} "
                        f"{str(values[key]).lower() if isinstance(values[key], bool) else shlex.quote(str(values[key]))}"
                        for key in values if key in given)

    def with_(self, **changes: object) -> Settings:
        """A copy with ``changes`` given (their source becomes ``given``)."""
        sources = dict(self.sources)
        for key in changes:
            sources[key] = GIVEN
        return replace(self, sources=sources, **changes)  # type: ignore[arg-type]


def setting_name(key: str, device: str) -> str:
    """A setting's name as whatif's words and pages show it: ``gpus_per_node`` is ``ranks per node`` on a
    CPU run, whose ranks are processes, not GPUs."""
    return "ranks per node" if key == "gpus_per_node" and device == "cpu" else key.replace("_", " ")


def parse_wrap(text: str) -> Wrap:
    """``root``, ``merge:K`` or ``match:REGEX``."""
    if text == "root":
        return Wrap("root")
    if text.startswith("merge:"):
        value = text.split(":", 1)[1]
        if not value.isdigit() or int(value) < 1:
            raise UsageError(f"--wrap {text}: merge:K needs a whole number K of at least 1 (merge:2 pairs units)")
        return Wrap("merge", k=int(value))
    if text.startswith("match:"):
        pattern = text.split(":", 1)[1]
        try:
            re.compile(pattern)
        except re.error as exc:
            raise UsageError(f"--wrap {text}: not a regular expression ({exc})") from None
        if not pattern:
            raise UsageError("--wrap match: needs a regular expression, e.g. match:'blocks\\.\\d+$'")
        return Wrap("match", pattern=pattern)
    hint = wrap_hint(text)
    raise UsageError(f"--wrap {text!r}: use root (one unit for the whole model), merge:K (every K consecutive "
                     f"units become one: merge:2 pairs them) or match:REGEX" + (f"; did you mean --wrap {hint}?"
                                                                                if hint else ""))


# Words users write for the wrap policies ("pair", "whole"), and what fsdpviz spells them.
_WRAP_WORDS = {"pair": "merge:2", "pairs": "merge:2", "paired": "merge:2", "two": "merge:2", "double": "merge:2",
               "triple": "merge:3", "triples": "merge:3", "three": "merge:3", "merge": "merge:2",
               "whole": "root", "model": "root", "one": "root", "single": "root", "none": "root", "full": "root"}


def wrap_hint(text: str) -> str | None:
    """The spelling of ``--wrap`` that ``text`` most likely meant (``pair`` -> ``merge:2``, ``merge2`` ->
    ``merge:2``), or None."""
    word = text.strip().lower()
    merged = re.fullmatch(r"(?:merge|pair|group)\W*(\d+)", word)
    if merged:
        return f"merge:{merged.group(1)}"
    if word.isdigit() and int(word) >= 1:
        return f"merge:{word}"
    if word.startswith(("match", "regex")) and len(word) > 5:
        return "match:" + re.sub(r"^(?:match|regex)\W?", "", text.strip())
    return _WRAP_WORDS.get(word)


def parse_prefetch(text: str) -> str:
    if text in ("implicit", "none"):
        return text
    if text.isdigit() and int(text) >= 1:
        return str(int(text))  # 01 is 1, as merge:02 is merge:2
    raise UsageError(f"--prefetch {text!r}: use implicit, none or a number of units (1, 2, ...)")


def parse_bool(text: str, option: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "yes", "1"):
        return True
    if lowered in ("false", "no", "0"):
        return False
    raise UsageError(f"{option} {text!r}: use true or false")


def _whole(value: object) -> object:
    """A notebook's whole number of any type (numpy's, 4.0) as an int, as the command line reads one; else as given."""
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral):
        return operator.index(value)
    if isinstance(value, numbers.Real) and float(value).is_integer():
        return int(float(value))
    return value


def settings_of(*, wrap: str | None = None, prefetch: int | str | None = None,
                reshard_after_forward: bool | str | None = None,
                keep_last_units: int | None = None, world_size: int | None = None, gpus_per_node: int | None = None,
                inter_node_gbps: float | None = None) -> Settings:
    """The setting ``fsdpviz whatif``'s options (and the notebook's ``Run.whatif``) ask for, each given one
    checked as the command checks it (:class:`UsageError` naming the option); None: as recorded."""
    settings = Settings()
    if wrap is not None:
        settings = settings.with_(wrap=parse_wrap(str(wrap)))
    if prefetch is not None:
        settings = settings.with_(prefetch=parse_prefetch(str(_whole(prefetch))))
    if reshard_after_forward is not None:
        if isinstance(reshard_after_forward, str):
            reshard_after_forward = parse_bool(reshard_after_forward, "--reshard-after-forward")
        elif isinstance(getattr(reshard_after_forward, "item", lambda: None)(), bool):  # numpy's bool
            reshard_after_forward = bool(reshard_after_forward)
        if not isinstance(reshard_after_forward, bool):  # a notebook's 0, 1 or 2: true or false, as the command
            raise UsageError(f"--reshard-after-forward {reshard_after_forward!r}: use true or false")
        settings = settings.with_(reshard_after_forward=reshard_after_forward)
    # the notebook's values are not checked for their type before here: any object may come
    counts: tuple[tuple[str, object, str, str], ...] = (
            ("keep_last_units", keep_last_units, "--keep-last-units", "needs at least 1 unit"),
            ("world_size", world_size, "--world-size", "needs at least 1 rank"),
            ("gpus_per_node", gpus_per_node, "--gpus-per-node", "needs at least 1"))
    for key, given, option, why in counts:
        if given is None:
            continue
        count = _whole(given)  # 4.0 and numpy's 4, which the command line takes as 4
        if isinstance(count, bool) or not isinstance(count, int):
            raise UsageError(f"{option} {count!r}: needs a whole number")
        if count < 1:
            raise UsageError(f"{option} {count}: {why}")
        settings = settings.with_(**{key: count})
    if inter_node_gbps is not None:
        if isinstance(inter_node_gbps, bool) or not isinstance(inter_node_gbps, numbers.Real):
            raise UsageError(f"--inter-node-gbps {inter_node_gbps!r}: needs a number")
        gbps = float(inter_node_gbps)
        if not 0 < gbps < math.inf:  # nan and inf too: no link has either, and JSON holds neither
            raise UsageError(f"--inter-node-gbps {inter_node_gbps}: needs a finite bandwidth above 0")
        settings = settings.with_(inter_node_gbps=gbps)
    return settings
