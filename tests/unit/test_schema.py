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
