"""The report's terms and their definitions, shown on hover wherever the page uses them.

A reader meets "exposed" or "prefetch lead" in a finding before any explanation; the page marks
each term in running text (``<abbr title=...>``, see :func:`mark_terms`) and in the unit table's
headers, so that its definition is one hover away and reads the same everywhere.
"""

from __future__ import annotations

import re
from typing import Final

from markupsafe import Markup, escape

# term -> definition; longer terms first, so that "exposed communication" wins over "exposed"
TERMS: Final = {
    "exposed communication": "Communication during which the rank computed nothing: time it waited for data. "
                             "Lower is better.",
    "exposed comm": "Exposed communication: communication during which the rank computed nothing, so it waited.",
    "exposed": "Exposed: the part of a collective during which the rank computed nothing, so it waited for it.",
    "prefetch lead": "How long before a unit's compute began its all-gather had finished. "
                     "Negative: the compute waited for the gather.",
    "issue depth": "How many units ahead of its compute a unit's all-gather was started: 0 means only "
                   "after the previous unit had finished computing (no prefetch).",
    "overlap": "The share of communication time that ran while the same rank was computing.",
    "reduce-scatter": "The collective that sums each unit's gradients over the ranks and leaves each rank "
                      "its shard.",
    "all-gather": "The collective that collects a unit's full parameters from their shards on every rank, "
                  "before the unit computes.",
}
_PATTERN: Final = re.compile(r"(?<![\w-])(" + "|".join(re.escape(t) for t in TERMS) + r")(?![\w-])",
                             flags=re.IGNORECASE)


def mark_terms(text: str) -> Markup:
    """``text`` escaped, with the first use of each glossary term wrapped in an ``<abbr>`` whose
    title is its definition (later uses stay plain: one underline per term is enough to find it)."""
    seen: set[str] = set()
    out: list[str] = []
    last = 0
    plain = str(text)
    for match in _PATTERN.finditer(plain):
        term = match.group(1).lower()
        if term in seen:
            continue
        seen.add(term)
        out.append(str(escape(plain[last:match.start()])))
        out.append(f'<abbr class="term" title="{escape(TERMS[term])}">{escape(match.group(1))}</abbr>')
        last = match.end()
    out.append(str(escape(plain[last:])))
    return Markup("".join(out))
