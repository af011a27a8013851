"""The schema helpers: empty tables are typed, conform() casts and rejects missing columns."""

from __future__ import annotations

import pandas as pd
import pytest

from fsdpviz.trace import schema


def test_make_empty_has_schema_columns_and_dtypes() -> None:
    df = schema.make_empty(schema.EVENTS)
    assert list(df.columns) == list(schema.EVENTS)
    assert len(df) == 0
    assert str(df["start_ns"].dtype) == "int64"
    assert str(df["lane"].dtype) == "category"


def test_conform_casts_orders_and_drops_extra_columns() -> None:
    raw = pd.DataFrame(
        {"end_ns": [20.0], "extra": ["x"], "rank": [1], "step": [3], "start_ns": [10]}
    )
    out = schema.conform(raw, schema.STEPS, table="steps")
    assert list(out.columns) == ["rank", "step", "start_ns", "end_ns"]
    assert out["end_ns"].tolist() == [20]
    assert str(out["end_ns"].dtype) == "int64"
    assert str(out["rank"].dtype) == "int32"


def test_conform_names_missing_columns() -> None:
    with pytest.raises(ValueError, match=r"steps: missing columns \['end_ns'\]"):
        schema.conform(pd.DataFrame({"rank": [0], "step": [1], "start_ns": [0]}), schema.STEPS, table="steps")


@pytest.mark.parametrize("lazy", [True, False], ids=["copy-on-write", "new-frame"])
@pytest.mark.parametrize("order", [["rank", "step", "start_ns", "end_ns"], ["end_ns", "rank", "start_ns", "step"],
                                   ["end_ns", "extra", "rank", "start_ns", "step"]],
                         ids=["in-order", "reordered", "extra-column"])
def test_conform_leaves_its_input_as_it_was(order: list[str], lazy: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table already in the schema's order (most of them), in another or with a column more, built
    either way (a lazy copy under copy-on-write, a new frame otherwise): the schema's table, and a table of
    its own: writing into it changes nothing of the input, which keeps its dtypes."""
    monkeypatch.setattr(schema, "_copy_on_write", lambda: lazy)
    raw = pd.DataFrame({"rank": [1, 0], "step": [3, 4], "start_ns": [10, 11], "end_ns": [20, 21], "extra": ["a", "b"]},
                       index=pd.Index([7, 5], name="row"))[order]
    raw.attrs["source"] = "trace"
    raw.columns.name = "field"
    out = schema.conform(raw, schema.STEPS, table="steps")
    expected = pd.DataFrame({"rank": pd.array([1, 0], dtype="int32"), "step": pd.array([3, 4], dtype="int32"),
                             "start_ns": [10, 11], "end_ns": [20, 21]}, index=pd.Index([7, 5], name="row"))
    expected.columns.name = "field"
    pd.testing.assert_frame_equal(out, expected, check_exact=True)
    assert str(raw["rank"].dtype) == "int64" and str(raw["step"].dtype) == "int64"
    assert out.attrs == {"source": "trace"}
    out.loc[7, "start_ns"] = 99
    out["end_ns"] = 0
    assert raw["start_ns"].tolist() == [10, 11] and raw["end_ns"].tolist() == [20, 21]
    assert list(raw.columns) == order


def test_conform_takes_a_named_column_where_labels_repeat() -> None:
    """Columns the schema does not name may repeat (a join's leftovers): the schema's are taken by name."""
    raw = pd.DataFrame([[9, 1, 3, 10, 20, 8]], columns=["x", "rank", "step", "start_ns", "end_ns", "x"])
    out = schema.conform(raw, schema.STEPS, table="steps")
    assert out.to_dict("list") == {"rank": [1], "step": [3], "start_ns": [10], "end_ns": [20]}
    assert [str(t) for t in out.dtypes] == ["int32", "int32", "int64", "int64"]
