"""Beyond 32 ranks the "Across steps and ranks" section draws rank x step heat maps, not one box or bar per rank."""

from __future__ import annotations

from pathlib import Path

import holoviews as hv
import pytest
from synth import Scenario, generate_run, make_root, make_units

from fsdpviz.analysis.pipeline import analyse
from fsdpviz.report.data import prepare_report
from fsdpviz.report.steps.section import HEATMAP_RANKS, steps_section


def _section(tmp: Path, ranks: int):
    sc = Scenario(units=make_units(2, numel=1_000_000), root=make_root(), world_size=ranks, steps=(3, 4, 5),
                  kernels_per_unit=2)
    run = analyse([generate_run(sc, tmp, run_folder=True).folder], cache=False)
    data = prepare_report(run)
    return data, steps_section(data)


def _heatmaps(section) -> list[hv.HeatMap]:
    return [v for v in section.views.get("steps", []) if isinstance(v, hv.HeatMap)]


@pytest.mark.parametrize("ranks", [HEATMAP_RANKS + 8])
def test_many_ranks_get_heatmaps_with_every_rank_step(ranks: int, tmp_path: Path) -> None:
    data, section = _section(tmp_path, ranks)
    step_map, exposed_map = _heatmaps(section)
    cells = step_map.dframe()
    times = data.step_times
    assert len(cells) == len(times) == ranks * times["step"].nunique()
    merged = cells.merge(times.assign(step_cell=times["step"].astype(str)),
                         left_on=["rank_cell", "step_cell"], right_on=["rank", "step_cell"])
    assert len(merged) == len(cells) and (merged["cell_ms"] == merged["ms"]).all()
    exposed = exposed_map.dframe()
    rank_times = data.rank_step_times
    assert len(exposed) == len(rank_times)
    assert sorted(exposed["cell_ms"]) == pytest.approx(sorted(rank_times["exposed_comm_ns"] / 1e6))
    assert not any(isinstance(v, hv.Bars) for v in section.views["steps"])  # no bar per rank
    assert any("heat maps" in n for n in section.notes)


def test_few_ranks_keep_boxes_and_bars(tmp_path: Path) -> None:
    _, section = _section(tmp_path, 4)
    assert not _heatmaps(section)
    assert any(isinstance(v, hv.Bars) for v in section.views["steps"])
