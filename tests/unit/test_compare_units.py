"""Unit matching across runs: names that match, pairs of blocks, ZeRO-3 submodules, root wrapping.

Unit tables mirror what ``fsdpviz record`` writes into run.json for the example trainer (names,
parameter bytes, parents), e.g. FSDP2 ``--wrap pair`` names its units ``blocks.0+1``.
"""

from __future__ import annotations

import pandas as pd

from fsdpviz.analysis.compare.model import _bucketed
from fsdpviz.analysis.compare.units import (
    BUCKET_KEY,
    RunUnit,
    color_slots,
    group_values,
    match_units,
    unit_keys,
)

BLOCK_BYTES = 50_816
ROOT_BYTES = 69_888


def _block() -> list[RunUnit]:
    return [RunUnit("(root)", 0, ROOT_BYTES), *(RunUnit(f"blocks.{i}", i + 1, BLOCK_BYTES) for i in range(4))]


def _pair() -> list[RunUnit]:
    return [RunUnit("(root)", 0, ROOT_BYTES), RunUnit("blocks.0+1", 1, 2 * BLOCK_BYTES),
            RunUnit("blocks.2+3", 2, 2 * BLOCK_BYTES)]


def _root() -> list[RunUnit]:
    return [RunUnit("(root)", 0, ROOT_BYTES + 4 * BLOCK_BYTES)]


def _zero3() -> list[RunUnit]:
    """ZeRO-3 fetching submodules: embeddings, norm and head on their own, block parts with a parent."""
    units = [RunUnit("tok_emb", 0, 32_768), RunUnit("pos_emb", 1, 4_096)]
    for b in range(4):
        units += [RunUnit(f"blocks.{b}.qkv", len(units), 20_000, parent=f"blocks.{b}"),
                  RunUnit(f"blocks.{b}.fc", len(units) + 1, BLOCK_BYTES - 20_000, parent=f"blocks.{b}")]
    return units + [RunUnit("norm", len(units), 256), RunUnit("head", len(units) + 1, ROOT_BYTES - 32_768 - 4_096 - 256)]


def test_unit_keys_read_pairs_and_fsdp2_groups() -> None:
    assert unit_keys("blocks.0+1") == ["blocks.0", "blocks.1"]
    assert unit_keys("layers.4+5+6") == ["layers.4", "layers.5", "layers.6"]
    assert unit_keys("a, b.c") == ["a", "b.c"]
    assert unit_keys("(root)") == ["(root)"]
    assert unit_keys("blocks.3") == ["blocks.3"]


def test_block_against_pair_groups_two_blocks_per_pair_and_root_whole_model() -> None:
    match = match_units({"block": _block(), "pair": _pair(), "root": _root()})
    assert match.whole_model == {"root": "(root)"}
    names = [g.name for g in match.groups]
    assert names == ["(root)", "blocks.0+1", "blocks.2+3"]
    pair01 = match.groups[1]
    assert pair01.members == {"block": ["blocks.0", "blocks.1"], "pair": ["blocks.0+1"], "root": []}
    assert pair01.held_by == {"root": "(root)"}
    assert pair01.param_bytes == {"block": 2 * BLOCK_BYTES, "pair": 2 * BLOCK_BYTES}
    assert not any(g.bytes_differ for g in match.groups)


def test_same_names_match_one_to_one() -> None:
    match = match_units({"a": _block(), "b": _block()})
    assert [g.members["a"] for g in match.groups] == [[u.name] for u in _block()]
    assert all(g.members["a"] == g.members["b"] for g in match.groups)
    assert match.whole_model == {}


def test_two_root_runs_compare_their_root_units() -> None:
    match = match_units({"a": _root(), "b": _root()})
    assert match.whole_model == {}
    assert [(g.name, g.members) for g in match.groups] == [("(root)", {"a": ["(root)"], "b": ["(root)"]})]


def test_zero3_submodules_group_by_parent_block_and_root_holds_the_rest() -> None:
    match = match_units({"fsdp2": _block(), "zero3": _zero3()})
    by_name = {g.name: g for g in match.groups}
    assert list(by_name) == ["(root)", "blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    assert by_name["blocks.2"].members == {"fsdp2": ["blocks.2"], "zero3": ["blocks.2.qkv", "blocks.2.fc"]}
    # FSDP2's root unit holds embeddings, final norm and head, which ZeRO-3 fetches one by one.
    assert by_name["(root)"].members["zero3"] == ["tok_emb", "pos_emb", "norm", "head"]
    assert all(g.param_bytes["fsdp2"] == g.param_bytes["zero3"] for g in match.groups)


def test_nested_unit_joins_the_unit_that_holds_it_elsewhere() -> None:
    nested = [RunUnit("(root)", 0, 10), RunUnit("blocks.0", 1, 6), RunUnit("blocks.0.mlp", 2, 4)]
    flat = [RunUnit("(root)", 0, 10), RunUnit("blocks.0", 1, 10)]
    match = match_units({"nested": nested, "flat": flat})
    group = next(g for g in match.groups if g.name == "blocks.0")
    assert group.members == {"nested": ["blocks.0", "blocks.0.mlp"], "flat": ["blocks.0"]}
    assert not group.bytes_differ


def test_parent_that_is_a_unit_is_nesting_not_grouping() -> None:
    # Traces without run.json: the analysis reports the enclosing unit as parent, here the root.
    a = [RunUnit("(root)", 0, 10), RunUnit("blocks.0", 1, 5, parent="(root)"), RunUnit("blocks.1", 2, 5, parent="(root)")]
    match = match_units({"a": a, "b": _block()[:3]})
    assert [g.name for g in match.groups] == ["(root)", "blocks.0", "blocks.1"]
    assert match.groups[0].bytes_differ  # 10 vs ROOT_BYTES: flagged, not hidden


def test_group_values_sum_times_and_take_the_highest_peak() -> None:
    match = match_units({"block": _block(), "pair": _pair()})
    group = match.groups[1]
    units = {"blocks.0": {"exposed_comm_ms": 1.25, "all_gather_ms": 2.0, "peak_allocated_bytes": 700, "param_bytes": 3},
             "blocks.1": {"exposed_comm_ms": 0.5, "all_gather_ms": 1.0, "peak_allocated_bytes": 900, "param_bytes": 4}}
    values = group_values(group, "block", units)
    assert values["exposed_comm_ms"] == 1.75 and values["all_gather_ms"] == 3.0
    assert values["peak_allocated_bytes"] == 900 and values["param_bytes"] == 7
    assert values["forward_ms"] is None  # missing in the unit entries: unknown, not zero
    assert group_values(group, "root", units)["exposed_comm_ms"] is None


def _spans(*collectives: tuple[str, int, list[str]]) -> pd.DataFrame:
    """A spans table holding ``(kind, start_ns, units)`` collectives: one row per unit a collective carried,
    as the analysis writes a bucket (rank 0, step 3, one lane), and a compute span naming two units (no
    collective: it joins nothing)."""
    rows = [{"rank": 0, "step": 3, "unit": u, "phase": "backward", "kind": kind, "lane": "gloo 0", "start_ns": start,
             "end_ns": start + 10, "n_units": len(units)} for kind, start, units in collectives for u in units]
    rows += [{"rank": 0, "step": 3, "unit": u, "phase": "forward", "kind": "compute", "lane": "gloo 0",
              "start_ns": 100, "end_ns": 105, "n_units": 2} for u in ("c", "e")]
    return pd.DataFrame(rows)


def test_buckets_join_every_unit_their_collectives_carried() -> None:
    """Two reduce-scatters share unit b (a with b, then b with c): one bucket of a, b and c, as far as a
    group must hold it whole; d's collective carried it alone, and a compute span naming c and e (at a
    collective's start, on its lane) joins nothing."""
    spans = _spans(("reduce_scatter", 100, ["a", "b"]), ("reduce_scatter", 200, ["b", "c"]),
                   ("all_gather", 300, ["d"]), ("all_gather", 400, ["f", "g"]))
    buckets = _bucketed(spans)
    assert buckets == {u: frozenset("abc") for u in "abc"} | {u: frozenset("fg") for u in "fg"}
    assert _bucketed(_spans(("all_gather", 300, ["d"]))) == {} and _bucketed(None) == {}


def test_a_group_has_exposed_time_only_where_it_holds_its_buckets_whole() -> None:
    """Units a and b share a bucket. A group of both keeps its exposed time (the bucket's waits are its
    own, wherever they were counted); a group of a alone has none (null, not its 0.0), while its own
    share of the collectives stays."""
    def entry(exposed: float, reduce: float, bucket: list[str] | None) -> dict:
        out = {"exposed_comm_ms": exposed, "exposed_reduce_scatter_ms": exposed, "reduce_scatter_ms": reduce}
        return out | ({BUCKET_KEY: bucket} if bucket else {})

    units = {"blocks.0": entry(3.0, 0.5, ["blocks.0", "blocks.1"]), "blocks.1": entry(0.0, 0.75, ["blocks.0", "blocks.1"]),
             "blocks.2": entry(1.0, 0.25, None)}
    match = match_units({"block": _block(), "pair": _pair()})
    whole = next(g for g in match.groups if g.name == "blocks.0+1")  # block's blocks.0 + blocks.1
    values = group_values(whole, "block", units)
    assert values["exposed_comm_ms"] == 3.0 and values["reduce_scatter_ms"] == 1.25
    part = match_units({"block": _block(), "block2": _block()}).groups[1]  # blocks.0 alone
    assert part.members["block"] == ["blocks.0"]
    values = group_values(part, "block", units)
    assert values["exposed_comm_ms"] is None and values["exposed_reduce_scatter_ms"] is None
    assert values["reduce_scatter_ms"] == 0.5
    alone = match_units({"block": _block(), "block2": _block()}).groups[3]  # blocks.2: no bucket
    assert alone.members["block"] == ["blocks.2"] and group_values(alone, "block", units)["exposed_comm_ms"] == 1.0


def test_color_slots_follow_modules_across_runs() -> None:
    labels = ["block", "pair", "root"]
    match = match_units({"block": _block(), "pair": _pair(), "root": _root()})
    slots = color_slots(match, labels)
    assert slots["pair"]["blocks.0+1"] == slots["block"]["blocks.0"]
    assert slots["pair"]["blocks.2+3"] == slots["block"]["blocks.2"]
    assert len(set(slots["block"].values())) == 5  # neighbours differ
    assert slots["root"]["(root)"] == slots["block"]["(root)"]
