"""Colours stable per unit, byte formats, and the peak-preserving memory curve."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fsdpviz import formatting as fmt
from fsdpviz.analysis import memory as analysis_memory
from fsdpviz.formatting import NS_PER_MS
from fsdpviz.report import style
from fsdpviz.report.timeline import memory
from fsdpviz.report.timeline.steps import StepChoice


def test_unit_colour_depends_on_unit_not_on_which_units_are_present() -> None:
    orders = {f"blocks.{i}": i for i in range(40)}
    everything = style.unit_colors(orders, orders)
    subset = style.unit_colors(["blocks.7", "blocks.30"], orders)
    assert subset == {"blocks.7": everything["blocks.7"], "blocks.30": everything["blocks.30"]}
    # neighbours in forward order never share a colour
    assert all(everything[f"blocks.{i}"] != everything[f"blocks.{i + 1}"] for i in range(39))
    assert style.EXPOSED_COLOR not in style.UNIT_PALETTE


def test_unit_colour_without_order_is_a_stable_hash() -> None:
    a = style.unit_color("encoder.layers.3", None)
    assert a == style.unit_color("encoder.layers.3", -1) == style.unit_color("encoder.layers.3", None)
    names = [f"m{i}" for i in range(200)]
    assert len({style.unit_color(n, None) for n in names}) == len(style.UNIT_PALETTE)


def test_format_bytes_and_ms() -> None:
    assert fmt.format_bytes(512) == "512 B"
    assert fmt.format_bytes(1536) == "1.5 KiB"
    assert fmt.format_bytes(3 * fmt.GIB) == "3 GiB"
    assert fmt.format_bytes(-1) == ""
    assert fmt.format_ms(12.345) == "12.3 ms"
    assert fmt.format_ms(0.25) == "250 µs"
    assert fmt.format_ms(float("nan")) == "n/a"
    assert fmt.bytes_scale(5 * fmt.MIB) == (float(fmt.MIB), "MiB")


def test_terminal_and_json_formats() -> None:
    """The fixed formats of the terminal, the findings and the JSON numbers."""
    assert fmt.bytes_text(3 * fmt.GIB // 2) == "1.50 GiB"
    assert fmt.bytes_text(-5 * fmt.MIB) == "-5.00 MiB"
    assert fmt.bytes_text(1023) == "1023 B"
    assert fmt.bytes_text(None) == "-"
    assert fmt.mib_text(1234.5 * fmt.MIB) == "1,234.5 MiB"
    assert fmt.mib_text(None) == "-"
    assert fmt.change_text(200 * fmt.MIB, 150 * fmt.MIB, "bytes") == "-50.0 MiB (-25.0 %)"
    # a small run's peak and change keep their hundredths (1.35 MiB, not 1.4; +0.10 MiB, not +0.1)
    assert fmt.mib_text(1.35 * fmt.MIB) == "1.35 MiB" and fmt.mib_text(9.994 * fmt.MIB) == "9.99 MiB"
    assert fmt.mib_text(10 * fmt.MIB) == "10.0 MiB" and fmt.mib_text(9.996 * fmt.MIB) == "10.0 MiB"
    assert fmt.change_text(1.35 * fmt.MIB, 1.45 * fmt.MIB, "bytes") == "+0.10 MiB (+7.4 %)"
    assert fmt.mib_change_text(-0.004 * fmt.MIB) == "-0.00 MiB"
    assert fmt.change_text(10.0, 12.5, "ms") == "+2.50 ms (+25.0 %)"
    assert fmt.change_text(None, 1.0, "ms") == ""
    assert fmt.ms_text(12.3456) == "12.35 ms"
    assert fmt.ms(1_234_567) == 1.235
    assert fmt.ms(float("nan")) is None and fmt.ms(None) is None
    assert fmt.rounded_ms(2_000_499) == 2.0


def _mem(rank: int, device: str, t_ns: np.ndarray, alloc: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"rank": rank, "device": device, "t_ns": t_ns, "allocated_bytes": alloc,
                         "reserved_bytes": alloc + 100, "delta_bytes": 0, "addr": -1})


def test_drawn_curve_is_the_analysis_curve_with_every_extreme() -> None:
    """The report draws the analysis' thinned curve: a one-sample spike and the lowest level of
    50,000 samples survive, and the step's cut adds nothing but its entry level and end."""
    rng = np.random.default_rng(3)
    n = 50_000
    t = np.arange(n, dtype=np.int64) * 1_000
    alloc = rng.integers(0, 1_000_000, n)
    alloc[31_337] = 5_000_000  # a one-sample spike
    curve = analysis_memory.curves(_mem(0, "cuda:0", t, alloc), max_points=1_000)
    assert len(curve) <= 1_002
    assert curve["allocated_bytes"].max() == 5_000_000 and curve["allocated_bytes"].min() == alloc.min()
    assert curve["t_ns"].is_monotonic_increasing
    choice = StepChoice(label="median step 1", step=1, origin_ns=int(t[10_000]), end_ns=int(t[40_000]),
                        duration_ms=30.0)
    drawn = memory.memory_curves(curve, choice, [0])
    inside = curve[(curve["t_ns"] >= choice.origin_ns) & (curve["t_ns"] <= choice.end_ns)]
    assert len(drawn) == len(inside) + 2  # the entry level and the level held to the step's end
    assert drawn["allocated_bytes"].max() == 5_000_000


def test_memory_curve_of_a_step_prefers_gpu_and_starts_at_the_entry_level() -> None:
    t = np.array([0, 10, 20, 30, 40]) * NS_PER_MS
    gpu = _mem(0, "cuda:0", t, np.array([100, 200, 300, 400, 500]))
    cpu = _mem(0, "cpu", t, np.array([1, 2, 3, 4, 5]))
    choice = StepChoice(label="median step 1", step=1, origin_ns=15 * NS_PER_MS, end_ns=35 * NS_PER_MS,
                        duration_ms=20.0)
    curve = memory.memory_curves(analysis_memory.curves(pd.concat([cpu, gpu])), choice, [0])
    assert set(curve["device"]) == {"cuda:0"}
    # entry level (sample at 10 ms) moved to 0 ms, samples at 20 and 30 ms, level held to the end
    assert curve["t_ms"].tolist() == [0.0, 5.0, 15.0, 20.0]
    assert curve["allocated_bytes"].tolist() == [200, 300, 400, 400]


def test_memory_ranks_are_capped_to_rank0_and_highest_peaks() -> None:
    parts = [_mem(r, "cpu", np.array([0, 1]), np.array([r * 10, r * 10])) for r in range(20)]
    chosen = memory.choose_memory_ranks(pd.concat(parts), max_ranks=4)
    assert chosen == [0, 17, 18, 19]
